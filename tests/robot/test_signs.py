"""The sign demo end to end: FakeVector shows known images, the real SDK client watches,
a real model classifies (ONNX Runtime here, LiteRT through the CLI), the debouncer decides,
and the fake robot records what was said."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgekit.bundle import BundleWriter, load_bundle
from edgekit.errors import UsageError
from edgekit.imaging.image import InputSpec
from robot.openset import Gate, fit_margin
from robot.signs import Debouncer, background_index, main, run_demo
from tests.helpers.real_models import Hooked, onnx_runtime

pytest.importorskip("anki_vector", reason="needs wirepod_vector_sdk (pip install 'edgekit-vision[vector]')")

from edgekit.vector.camera import VectorSource  # noqa: E402
from edgekit.vector.fake import FakeVector  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LABELS = ["a", "b", "background"]
# the seed's preprocessing (gray, centre 200x200 of the 640x360 frame, /255) at a tiny input size
SPEC = InputSpec(shape=(1, 32, 32, 1), colour="gray", crop=(200, 200), mean=(0.0,), std=(255.0,))
BRIGHTNESS = {"a": 30, "b": 220, "background": 128}
# a: dark centre, b: bright centre, background: grey; logits linear in the crop's mean
WEIGHTS = np.array([[-20.0, 20.0, 0.0]], np.float32)
BIAS = np.array([5.0, -15.0, 0.0], np.float32)


def sign_frame(label: str, seed: int = 0) -> np.ndarray:
    """A 640x360 BGR frame: textured surroundings, the 'sign' in the centre crop."""
    rng = np.random.default_rng(seed)
    frame = rng.integers(60, 120, (360, 640, 3), dtype=np.uint8)
    frame[80:280, 220:420] = BRIGHTNESS[label]
    return frame


def brightness_model():
    """The real model (ONNX Runtime): softmax of logits linear in the crop's mean, as the
    LiteRT bundle below computes."""
    return onnx_runtime(SPEC, weights=WEIGHTS[0].tolist(), bias=BIAS.tolist())


def write_frames(folder: Path, labels: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, label in enumerate(labels):
        cv2.imwrite(str(folder / f"{i:03d}.png"), sign_frame(label, i))
    return folder


# ---------------------------------------------------------------------------------------------
# the debouncer on its own


def announced(debouncer: Debouncer, votes) -> list[int]:
    out = []
    for vote in votes:
        got = debouncer.update(*vote)
        if got is not None:
            out.append(got)
    return out


def test_debouncer_needs_n_agreeing_confident_frames_and_says_each_sign_once():
    d = Debouncer(agree=3, min_confidence=0.8, background=2)
    assert announced(d, [(0, 0.9)] * 2) == []
    assert announced(d, [(0, 0.9)]) == [0]
    assert announced(d, [(0, 0.95)] * 10) == []  # held up: said once
    assert announced(d, [(1, 0.9), (0, 0.9), (1, 0.9), (1, 0.9)]) == []  # flicker never reaches 3
    assert announced(d, [(1, 0.9)]) == [1]


def test_debouncer_ignores_low_confidence_and_background_and_rearms_after_background():
    d = Debouncer(agree=2, min_confidence=0.8, background=2, rearm_s=0.5)
    assert announced(d, [(0, 0.79), (0, 0.79), (0, 0.5)]) == []
    assert announced(d, [(0, 0.9), (0, 0.7), (0, 0.9)]) == []  # an unsure frame breaks the streak
    assert announced(d, [(0, 0.9)]) == [0]
    assert announced(d, [(2, 0.99)] * 5) == []  # background is never said, and 5 frames (0.33 s) do not re-arm
    assert announced(d, [(0, 0.9)] * 4) == []  # the same item back after a short gap: not said twice
    assert announced(d, [(2, 0.99)] * 8) == []  # 8 frames at 15 fps: 0.53 s without it
    assert announced(d, [(0, 0.9)] * 2) == [0]  # a new appearance


def test_debouncer_held_item_is_said_once_and_the_next_different_item_is_never_masked():
    d = Debouncer(agree=3, min_confidence=0.8, background=2, rearm_s=1.0)
    frames = [(0, 0.95, 0.9, i / 15) for i in range(150)]  # held 10 s
    frames[40] = frames[90] = (1, 0.6, 0.3, 40 / 15)  # flickers do not re-arm it
    frames[90] = (1, 0.6, 0.3, 90 / 15)
    assert announced(d, frames) == [0]
    assert announced(d, [(1, 0.9, 0.8, 10 + i / 15) for i in range(3)]) == [1]  # said at once, not masked
    assert announced(d, [(0, 0.9, 0.8, 11 + i / 15) for i in range(3)]) == [0]  # a different label: new again


def test_gate_needs_the_margin_over_the_runner_up():
    d = Debouncer(agree=2, min_confidence=0.5, background=None, min_margin=0.4)
    assert announced(d, [(0, 0.6, 0.3)] * 5) == []  # confident enough, but the runner-up is close
    assert announced(d, [(0, 0.6, 0.45)] * 2) == [0]
    assert Gate(0.5, 0.4, background=3).accepts(3, 0.99, 0.99) is False  # background never counts


def test_margin_is_fitted_to_the_false_rate_on_held_out_scenes():
    items = np.array([0.9, 0.95, 0.99, 0.5])
    ok = np.array([True, True, True, True])
    scenes = np.array([0.1, 0.2, 0.6, 0.7])
    passes = np.array([False, True, True, True])
    fitted = fit_margin(items, ok, scenes, passes, max_false_rate=0.25)
    assert 0.6 < fitted["min_margin"] <= 0.7 + 1e-5  # only the 0.7 scene still counts: 1 of 4
    assert fitted["background_false_rate"] == 0.25 and fitted["item_recall"] == 0.75
    assert fit_margin(items, ok, scenes, passes, 0.0)["min_margin"] > 0.7


def test_background_index_by_name_or_seed_layout():
    assert background_index(["a", "Background", "b"]) == 1
    assert background_index([chr(97 + i) for i in range(26)] + ["nothing"]) == 26
    assert background_index(["a", "b"]) is None
    assert background_index(["a", "none"], "none") == 1


# ---------------------------------------------------------------------------------------------
# end to end with the real SDK client and FakeVector


@pytest.mark.slow  # asserts on wall-clock time
def test_demo_says_each_shown_sign_once_and_shows_it(tmp_path):
    # 6 frames of background, a held 8 frames, a one-frame b flicker, a again, background, b
    sequence = ["background"] * 6 + ["a"] * 8 + ["b"] + ["a"] * 8 + ["background"] * 6 + ["b"] * 8
    frames = [sign_frame(label, i) for i, label in enumerate(sequence)]
    runtime = brightness_model()
    with FakeVector(frames, fps=20, loop=False) as fake, \
            VectorSource(fake.serial, config_home=fake.home, connect_timeout_s=2) as cam:
        report = run_demo(
            cam, runtime, LABELS,
            say=lambda text: cam.say(text, wait=False),
            show=lambda text: cam.show(text, duration_s=0.5, wait=False),
            debouncer=Debouncer(agree=3, min_confidence=0.8, background=2),
            until=lambda frame: fake.exhausted.is_set() and frame.index >= fake.frame_count,
            warmup=2,
        )
        said, shown = list(fake.said), list(fake.shown)
    assert report.said == ["a", "b"]
    assert said == ["a", "b"]  # what the robot really received, once each
    assert len(shown) == 2 and shown[0].max() == 255  # the labels drawn on its face
    m = report.metrics
    assert m["frames"] >= len(sequence) - 3  # processed nearly every frame: no backlog at 20 fps
    assert report.source["received"] == len(sequence)
    assert m["stages"]["inference"]["count"] > 0 and m["fps"] > 10
    assert report.announcements[0].frame > 6 + 2  # not before a was held for 3 frames
    assert report.errors == []


def test_robot_lost_mid_demo_keeps_the_measurements_and_reports_the_failure():
    frames = [sign_frame("a", i) for i in range(5)]
    with FakeVector(frames, fps=20) as fake, \
            VectorSource(fake.serial, config_home=fake.home, connect_timeout_s=2) as cam:
        def vanish(calls):
            if calls == 8:
                fake.vanish()  # the robot drives out of Wi-Fi range mid-run
        # fault injection on cue around the real model: the robot goes at the 9th inference
        runtime = Hooked(brightness_model(), vanish)
        report = run_demo(cam, runtime, LABELS, say=lambda text: cam.say(text, wait=False), warmup=2)
    assert report.failure is not None and report.failure.reason == "disconnected"
    assert report.said == ["a"]
    assert 8 <= report.metrics["frames"] <= 11
    assert report.to_dict()["failure"].startswith("Vector")


def test_cli_with_an_injected_runtime_prints_labels_fps_and_percentiles(tmp_path):
    frames = write_frames(tmp_path / "frames", ["background", "a", "b", "background", "a"])
    out = io.StringIO()
    rc = main(["--fake", str(frames), "--fps", "25", "--hold", "6", "--agree", "3", "--json",
               str(tmp_path / "report.json")], runtime=brightness_model(), labels=LABELS, out=out)
    text = out.getvalue()
    assert rc == 0, text
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["said"] == ["a", "b", "a"]
    assert "said (3): a b a" in text
    assert "frames: camera" in text and "processed:" in text
    for stage in ("preprocess", "inference", "end_to_end", "announce"):
        assert any(line.startswith(stage) for line in text.splitlines()), stage
    assert report["source"]["received"] == 30


def test_cli_errors_are_one_line_with_a_fix(tmp_path, capsys):
    rc = main(["--fake", str(tmp_path / "nothing-here")], runtime=brightness_model(),
              labels=LABELS)
    err = capsys.readouterr().err
    assert rc == 2 and "robot.signs: error:" in err and "does not exist" in err
    rc = main(["--fake", str(tmp_path)])
    assert rc == 2 and "no bundle given" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# a real .tflite bundle, converted with the real TFLite converter (TensorFlow only here)


@pytest.fixture(scope="session")
def sign_bundle(tmp_path_factory) -> Path:
    """A 3-class float32 LiteRT bundle whose model computes ``brightness_model`` exactly."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tf = pytest.importorskip("tensorflow")
    import keras
    from keras import layers

    inp = keras.Input((32, 32, 1))
    x = layers.GlobalAveragePooling2D()(inp)
    dense = layers.Dense(3, activation="softmax")
    model = keras.Model(inp, dense(x))
    dense.set_weights([WEIGHTS, BIAS])
    work = tmp_path_factory.mktemp("signmodel")
    model.export(str(work / "saved"), input_signature=[tf.TensorSpec((1, 32, 32, 1), tf.float32)], verbose=False)
    tflite = tf.lite.TFLiteConverter.from_saved_model(str(work / "saved")).convert()
    dest = work / "signs-cpu"
    with BundleWriter(dest) as w:
        (w.dir / "model.tflite").write_bytes(tflite)
        (w.dir / "labels.txt").write_text("\n".join(LABELS) + "\n")
        w.commit({
            "name": "signs", "target": "cpu", "default_model": "fp32",
            "models": [{"name": "fp32", "file": "model.tflite", "format": "tflite", "precision": "fp32",
                        "input": SPEC.to_dict(), "outputs": [{"shape": [1, 3], "dtype": "float32"}]}],
            "labels": "labels.txt",
            "runtime": {"adapter": "edgekit.runtime.litert:LiteRTRuntime", "options": {}},
        })
    return dest


def test_real_tflite_bundle_through_the_cli_never_imports_tensorflow(sign_bundle, tmp_path):
    assert load_bundle(sign_bundle).labels == LABELS
    frames = write_frames(tmp_path / "frames", ["background", "a", "a", "background", "b"])
    probe = ("import sys; from robot.signs import main; rc = main(sys.argv[1:]); "
             "print('tensorflow imported:', 'tensorflow' in sys.modules); sys.exit(rc)")
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-c", probe, "--bundle", str(sign_bundle), "--fake", str(frames), "--fps", "20",
         "--hold", "6", "--json", str(report)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "tensorflow imported: False" in done.stdout
    data = json.loads(report.read_text())
    assert data["said"] == ["a", "b"]  # a held over two images is still said once
    assert "ai_edge_litert" in done.stdout  # the real LiteRT runtime ran the model
    assert data["pipeline"]["stages"]["inference"]["count"] > 10


# ---------------------------------------------------------------------------------------------
# the acceptance summary (--truth)


def test_acceptance_scores_latency_misses_repeats_and_false_announcements(tmp_path):
    from robot.acceptance import frame_truth, score_run
    from robot.demo import Announcement

    for i in range(6):
        cv2.imwrite(str(tmp_path / f"{i}.png"), np.zeros((8, 8), np.uint8))
    (tmp_path / "truth.csv").write_text("file,label\n1.png,a\n2.png,a\n4.png,b\n5.png,background\n")
    truth = frame_truth(tmp_path / "truth.csv", tmp_path, hold=10)  # 60 frames: a 10-29, b 40-49
    assert truth[:10] == [""] * 10 and truth[10:30] == ["a"] * 20 and truth[40:50] == ["b"] * 10

    def said(label, frame):
        return Announcement(label, 0, frame, 0.9, t_ns=2_000_000, t_capture_ns=1_000_000)

    acc = score_run([said("a", 14), said("a", 25), said("c", 36), said("a", 58)], truth, fps=10,
                    background="background")
    assert [(r["label"], r["said"], r["latency_s"]) for r in acc["items"]] == [("a", 2, 0.301), ("b", 0, None)]
    assert acc["missed"] == 1 and acc["repeated"] == 1
    assert [f["said"] for f in acc["false"]] == ["c", "a"] and acc["false_on_background"] == 2
    assert acc["background_s"] == 3.0 and acc["false_per_min_background"] == 40.0
    assert {"truth": "b", "said": "(missed)", "count": 1} in acc["confusion"]
    (tmp_path / "bad.csv").write_text("file,label\nnope.png,a\n")
    with pytest.raises(UsageError, match="not in"):
        frame_truth(tmp_path / "bad.csv", tmp_path, hold=1)


# ---------------------------------------------------------------------------------------------
# announcements the robot did not deliver


@pytest.mark.slow  # asserts on wall-clock time
def test_speaker_waits_once_in_all_and_names_each_undelivered_action():
    import concurrent.futures
    import time

    from robot.demo import Speaker

    never, broken, fine = (concurrent.futures.Future() for _ in range(3))
    broken.set_exception(RuntimeError())  # an exception without a message
    fine.set_result(None)
    futures = iter([never, broken, fine])
    speaker = Speaker({"speech": lambda text: next(futures), "face": None}, None)
    top = type("Top", (), {"label": "a", "index": 0, "score": 0.9})
    said = [speaker.announce(top, i) for i in range(3)]
    t0 = time.perf_counter()
    errors = speaker.finish(wait_s=0.3)
    assert time.perf_counter() - t0 < 1.0  # one deadline, not 0.3 s per pending action
    assert errors == ["'a' (frame 0): speech not finished after 0.3 s", "'a' (frame 1): speech failed: RuntimeError"]
    assert [s.failed is None for s in said] == [False, False, True]


def test_speech_that_fails_on_the_robot_is_not_counted_as_said_and_the_exit_code_says_so(tmp_path, monkeypatch):
    import grpc

    def crash(robot, protocol, request, context):
        context.abort(grpc.StatusCode.INTERNAL, "tts engine crashed")

    folder = write_frames(tmp_path / "frames", ["background"] * 4 + ["a"] * 6)
    runtime = brightness_model()
    out = io.StringIO()
    with FakeVector(folder, fps=20, loop=False, handlers={"SayText": crash}) as fake:
        monkeypatch.setenv("HOME", str(fake.home))
        code = main(["--serial", fake.serial, "--connect-timeout", "2", "--max-frames", "10",
                     "--json", str(tmp_path / "run.json")], runtime=runtime, labels=LABELS, out=out)
    text = out.getvalue()
    assert code == 1
    assert "said (0): -" in text and "speech failed: " in text and "INTERNAL" in text
    data = json.loads((tmp_path / "run.json").read_text(encoding="utf-8"))
    assert data["said"] == [] and data["announcements"][0]["label"] == "a"
    assert "speech failed" in data["announcements"][0]["failed"]


def test_the_frames_line_is_plain_when_no_frame_came():
    from robot.report import _frames_line

    assert _frames_line({"camera_fps": None, "received": 3, "delivered": 0, "undecodable": 3}) == \
        "frames: no camera frame rate (received 3, delivered 0, undecodable 3)"
    assert _frames_line({}) == "frames: n/a (the source keeps no counts)"
    assert _frames_line({"camera_fps": 15.0, "received": 30, "delivered": 29, "skipped": 1}) == \
        "frames: camera 15.0 fps, received 30, delivered 29, skipped 1"


def test_quiet_prints_no_header_log_or_tables_but_still_writes_the_json(tmp_path, capsys):
    """Issue 39 item 9: ``robot.signs -q`` printed its report tables anyway; its help says "only the
    summary and errors"."""
    frames = write_frames(tmp_path / "frames", ["background", "a", "b", "background", "a"])
    out = io.StringIO()
    rc = main(["--fake", str(frames), "--fps", "25", "--hold", "6", "--agree", "3", "-q", "--json-file",
               str(tmp_path / "report.json")], runtime=brightness_model(), labels=LABELS, out=out)
    captured = capsys.readouterr()
    assert rc == 0 and out.getvalue() == "said (3): a b a\n"  # the summary only: no header, log, tables
    assert captured.out == "" and captured.err == ""
    assert json.loads((tmp_path / "report.json").read_text())["said"] == ["a", "b", "a"]
