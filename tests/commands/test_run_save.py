"""``edgekit run --save``: frames with the detector's boxes drawn, as JPEGs or a video, and the
ways writing them can fail. The detector is a real ONNX model run by ONNX Runtime."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgekit import camera
from edgekit.camera import Frame
from edgekit.cli import main as cli
from tests.helpers.detector_model import FRAME_H, FRAME_W, detector_bundle, expected_box, scene

# what each frame shows: (left half bright -> cat, right half bright -> dog)
SEQUENCE = [(True, False), (False, True), (True, True), (False, False), (True, False)]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return detector_bundle(tmp_path_factory.mktemp("det") / "twobox-cpu")


@pytest.fixture(scope="module")
def frames(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("frames")
    for i, (left, right) in enumerate(SEQUENCE):
        cv2.imwrite(str(d / f"{i:03d}.png"), scene(left, right, seed=i))
    return d


def _shown(left: bool, right: bool) -> list[str]:
    return [label for label, on in (("cat", left), ("dog", right)) if on]


def _outline_change(saved: np.ndarray, original: np.ndarray, box) -> tuple[float, float]:
    """Mean colour change on the box's left and right edges (middle rows), and inside the box."""
    x1, y1, x2, y2 = (int(round(v)) for v in box)
    diff = np.abs(saved.astype(int) - original.astype(int)).max(axis=-1)
    rows = slice(y1 + 30, y2 - 30)
    edges = np.concatenate([diff[rows, x1], diff[rows, x2 - 1]])
    return float(edges.mean()), float(diff[rows, x1 + 10:x2 - 10].mean())


def test_save_dir_writes_a_jpeg_per_frame_with_the_boxes_where_the_json_says(bundle, frames, tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli(["run", str(bundle), "--camera", f"folder:{frames}", "--save", str(out), "--json", "--warmup", "0"])
    stdout, err = capsys.readouterr()
    assert rc == 0, err
    lines = [json.loads(line) for line in stdout.splitlines()]
    results = [r for r in lines if "frame" in r]
    assert len(results) == len(SEQUENCE) and "summary" in lines[-1]
    saved = sorted(p for p in out.iterdir() if p.name != ".edgekit-save")  # the marker: a recording, replaceable
    # each image keeps its name (000.png drawn on is 000.jpg) and each JSON line names its file
    assert [p.name for p in saved] == [f"{i:03d}.jpg" for i in range(len(SEQUENCE))]
    assert [r["source"] for r in results] == [str(frames / f"{i:03d}.png") for i in range(len(SEQUENCE))]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary folder left beside it
    for (left, right), record, path in zip(SEQUENCE, results, saved):
        # JSON lines: boxes in the source frame's pixels, through the letterbox
        assert sorted(d["label"] for d in record["detections"]) == _shown(left, right)
        assert record["count"] == len(record["detections"]) and record["image_size"] == [FRAME_W, FRAME_H]
        image = cv2.imread(str(path))
        original = scene(left, right, seed=record["frame"])
        assert image.shape == original.shape
        for d in record["detections"]:
            n = ["cat", "dog"].index(d["label"])
            np.testing.assert_allclose(d["box"], expected_box(n), atol=0.5)
            edges, inside = _outline_change(image, original, d["box"])
            assert edges > 40 and inside < 12, (record["frame"], d)  # drawn on the outline, not over the object
        for n in {0, 1} - {["cat", "dog"].index(d["label"]) for d in record["detections"]}:
            edges, _ = _outline_change(image, original, expected_box(n))
            assert edges < 12  # no box where nothing was detected
    assert "decode" in lines[-1]["summary"]["stages"] and "nms" in lines[-1]["summary"]["stages"]


def test_text_output_prints_the_detections_of_each_frame(bundle, frames, capsys):
    rc = cli(["run", str(bundle), "--camera", f"folder:{frames}", "--every", "0", "--warmup", "0"])
    out = capsys.readouterr().out
    assert rc == 0
    lines = [line for line in out.splitlines() if line.startswith("frame ")]
    assert len(lines) == len(SEQUENCE)
    assert "cat 0.65 [20, 40, 140, 200]" in lines[0] and "dog" not in lines[0]
    assert "dog 0.65 [180, 40, 300, 200]" in lines[1]
    assert "nothing detected" in lines[3]
    for stage in ("decode", "nms"):
        assert any(line.split()[:1] == [stage] for line in out.splitlines()), stage


# .mp4: H.264 when PyAV is installed (a dev dependency), else MPEG-4 part 2, which FFmpeg reads back
# as FMP4 whatever tag wrote it
MP4 = {"H264", "AVC1"} if importlib.util.find_spec("av") else {"MP4V", "FMP4"}


@pytest.mark.parametrize("suffix, fourccs", [(".mp4", MP4), (".avi", {"MJPG"})])
def test_save_video_is_readable_with_every_frame(bundle, frames, tmp_path, capsys, suffix, fourccs):
    video = tmp_path / f"boxes{suffix}"
    rc = cli(["run", str(bundle), "--camera", f"folder:{frames}", "--save", str(video), "--warmup", "0"])
    assert rc == 0, capsys.readouterr().err
    assert f"saved {len(SEQUENCE)} frames to {video}" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == [video.name]
    cap = cv2.VideoCapture(str(video))
    try:
        assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == len(SEQUENCE)
        assert (int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))) == (FRAME_W, FRAME_H)
        assert int(cap.get(cv2.CAP_PROP_FOURCC)).to_bytes(4, "little").decode().upper() in fourccs
        decoded = []
        while True:
            ok, image = cap.read()
            if not ok:
                break
            decoded.append(image)
    finally:
        cap.release()
    assert len(decoded) == len(SEQUENCE)
    edges, _ = _outline_change(decoded[0], scene(True, False, seed=0), expected_box(0))
    assert edges > 40  # the cat's box is in the first frame of the video


def test_a_video_from_a_source_with_a_frame_rate_keeps_it(bundle, tmp_path, capsys):
    clip = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"MJPG"), 12.5, (FRAME_W, FRAME_H))
    for i in range(6):
        writer.write(scene(i % 2 == 0, i % 3 == 0, seed=i))
    writer.release()
    video = tmp_path / "out" / "boxes.mp4"  # the folder is made
    rc = cli(["run", str(bundle), "--camera", f"file:{clip}", "--save", str(video), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    cap = cv2.VideoCapture(str(video))
    assert cap.get(cv2.CAP_PROP_FPS) == pytest.approx(12.5, abs=0.01)
    assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == 6
    cap.release()


def _one_line_error(capsys, rc: int, *words: str) -> str:
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err
    first = err.strip().splitlines()[0]
    assert first.startswith("edgekit run: error:") and all(w in first for w in words), err
    return err


@pytest.mark.parametrize("name", ["out", "out.mp4", "out.avi"])
def test_an_unwritable_target_is_one_line_before_the_model_runs(bundle, frames, tmp_path, capsys, name):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    target = blocker / name
    rc = cli(["run", str(bundle), "--camera", f"folder:{frames}", "--save", str(target)])
    _one_line_error(capsys, rc, "--save", "cannot write there")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_targets_that_are_not_a_recording_are_refused(bundle, frames, tmp_path, capsys):
    rc = cli(["run", str(bundle), "--camera", f"folder:{frames}", "--save", str(tmp_path / "boxes.gif")])
    _one_line_error(capsys, rc, ".gif", "not a video format")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    rc = cli(["run", str(bundle), "--camera", f"folder:{frames}", "--save", str(busy)])
    _one_line_error(capsys, rc, "other files")
    assert [p.name for p in busy.iterdir()] == ["notes.txt"]


def test_a_second_run_replaces_an_earlier_recording(bundle, frames, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli(["run", str(bundle), "--camera", f"folder:{frames}", "--save", str(out), "--quiet"]) == 0
    assert cli(["run", str(bundle), "--camera", f"folder:{frames}", "--save", str(out), "--quiet",
                "--max-frames", "2"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [".edgekit-save", "000.jpg", "001.jpg"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert cli(["run", str(bundle), "--camera", "synthetic", "--save", str(out), "--quiet", "--max-frames", "1"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [".edgekit-save", "frame_000001.jpg"]  # a camera's frames


def test_a_folder_recording_never_writes_one_name_twice(tmp_path):
    from edgekit.outputs.recording import FolderRecording

    recording = FolderRecording(tmp_path / "out")
    image = scene(True, False)
    for i, name in enumerate(["eval/a/000.png", "eval/b/000.jpg", "eval/a/000.png", "x/A.JPEG", "y/a.jpeg", None,
                              "frame_000007.jpg", None, "eval/.hidden.jpg"]):
        recording.write(image, i, name)
    recording.finish()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([
        ".edgekit-save", "000.jpg", "000-2.jpg", "000-3.jpg", "A.JPEG", "a-2.jpeg", "frame_000006.jpg",
        "frame_000007.jpg", "frame_000008.jpg", ".hidden.jpg"])


class VanishingFolderSource:
    """Frames as a camera would give them; after two, the folder being written disappears
    (a USB stick pulled, a cleanup job): the third frame's write fails."""

    def __init__(self, parent: Path):
        self.parent = parent

    def __iter__(self):
        for i in range(6):
            if i == 2:
                for staged in self.parent.glob(".out.*"):
                    shutil.rmtree(staged)
            yield Frame(scene(True, False, seed=i), 0, i)

    def close(self):
        pass

    def stats(self):
        return {}


def test_a_write_failure_mid_run_is_one_line_and_leaves_nothing(bundle, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(camera, "open_camera", lambda uri, runtime=None, /, **kw: VanishingFolderSource(tmp_path))
    rc = cli(["run", str(bundle), "--camera", "synthetic", "--save", str(tmp_path / "out")])
    err = _one_line_error(capsys, rc, "--save", "frame_000003.jpg")
    assert "No such file or directory" in err
    assert list(tmp_path.iterdir()) == []


def test_sigterm_finishes_the_video(bundle, tmp_path):
    video = tmp_path / "endless.mp4"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "edgekit.cli", "run", str(bundle), "--camera", "synthetic:320x240@30",
           "--save", str(video), "--every", "0"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as p:
        try:
            seen = 0
            for line in p.stdout:
                seen += line.startswith("frame ")
                if seen == 12:
                    break
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=30)
        finally:
            p.kill()
    assert p.returncode == 128 + signal.SIGTERM, err  # stopped: 143, with the video still finished
    assert "interrupted" in out and "saved" in out and "Traceback" not in err
    assert [x.name for x in tmp_path.iterdir()] == ["endless.mp4"]
    cap = cv2.VideoCapture(str(video))
    assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) >= 12
    assert cap.get(cv2.CAP_PROP_FPS) == pytest.approx(30, abs=0.01)  # the synthetic camera's stated rate
    cap.release()


def test_without_pyav_an_mp4_is_mpeg4_part_2_and_the_run_says_browsers_will_not_play_it(
        bundle, frames, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)  # import av fails: a lean install
    video = tmp_path / "boxes.mp4"
    assert cli(["run", str(bundle), "--camera", f"folder:{frames}", "--save", str(video), "--warmup", "0"]) == 0
    # what the user reads: the command line's stderr handler (propagation off, so caplog's root handler
    # heard it only when an earlier case in the same process had left the edgekit logger set up otherwise)
    said = "MPEG-4 Part 2, which browsers do not play (pip install 'edgekit-vision[video]'"
    assert said in capsys.readouterr().err
    cap = cv2.VideoCapture(str(video))
    try:
        assert int(cap.get(cv2.CAP_PROP_FOURCC)).to_bytes(4, "little").decode().upper() in {"MP4V", "FMP4"}
    finally:
        cap.release()


def test_an_odd_sized_frame_is_padded_for_h264(tmp_path):
    pytest.importorskip("av")
    from edgekit.outputs.recording import open_recording

    rec = open_recording(tmp_path / "odd.mp4", fps=10)
    for i in range(12):
        rec.write(np.full((37, 51, 3), 20 * i, np.uint8))
    path = rec.finish()
    cap = cv2.VideoCapture(str(path))
    try:
        assert rec.codec == "h264" and int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == 12
        assert (int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))) == (52, 38)
    finally:
        cap.release()


@pytest.mark.parametrize("fps", [95.917, 29.97, 12.345])
def test_a_measured_rate_with_three_decimals_still_opens_the_mpeg4_writer(tmp_path, monkeypatch, fps):
    # Under load a folder's capture rate measured 95.917 fps: MPEG-4 refuses a 95917/1000 time base, and
    # the run failed with "cannot write .mp4 video here".
    monkeypatch.setitem(sys.modules, "av", None)  # the OpenCV (MPEG-4 Part 2) path
    from edgekit.outputs.recording import open_recording

    rec = open_recording(tmp_path / "rate.mp4", fps=fps)
    for i in range(5):
        rec.write(np.full((48, 64, 3), 40 * i, np.uint8))
    cap = cv2.VideoCapture(str(rec.finish()))
    try:
        assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == 5 and abs(cap.get(cv2.CAP_PROP_FPS) - fps) < 0.01
    finally:
        cap.release()
