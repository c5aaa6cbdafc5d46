"""``edgekit serve`` with the Raspberry Pi AI Camera: an ``imx500`` camera and an imx500 bundle.

Against the fake ``picamera2`` (tests/fakes/picamera2): each request's number is its metadata's
``SensorTimestamp``, and the network's outputs for request ``n`` make class ``n % 10`` win, so a
published result says which request's outputs it carries. The backend's first wait takes requests
1-3 (two while the network uploads), so the source's frame ``k`` is request ``k + 4`` of its
``Picamera2``: a result whose top class is ``(frame + 4) % 10`` carries its own frame's outputs.
Results go through a real mosquitto.
"""

from __future__ import annotations

import json
from concurrent.futures import TimeoutError as FutureTimeoutError
from pathlib import Path

import pytest

from edgekit.bundle import FORMAT_VERSION, sha256_file
from edgekit.imaging.image import InputSpec
from edgekit.serve.config.load import override
from edgekit.serve.daemon import Daemon
from tests.helpers.faults import assert_refused, edgekit
from tests.helpers.waiting import wait_until
from tests.serve.test_daemon_services import Subscriber, broker, make_config, running  # noqa: F401

pytest.importorskip("prometheus_client", reason="pip install 'edgekit-vision[serve]'")

SPEC = InputSpec(shape=(1, 28, 28, 1), layout="NHWC", colour="gray")
LABELS = [f"c{i}" for i in range(10)]
FIRST = 4  # the source's frame 0 is request 4 of its Picamera2 (the backend's first wait took 1-3)


# every request's outputs name its number (tests/conftest.py's fake_picamera2): a published result says
# which request's outputs it carries
pytestmark = pytest.mark.fake_picamera2(numbered=True)


@pytest.fixture
def fake(fake_picamera2, monkeypatch):
    """The fake picamera2, each request's outputs naming its number, every Picamera2 counted as it opens."""
    picamera2 = fake_picamera2
    picamera2.OPEN_AT_CREATION = []  # how many Picamera2 were open as each one was created
    create = picamera2.Picamera2.__init__

    def counted(self, camera_num=0):
        picamera2.OPEN_AT_CREATION.append(sum(not cam.closed for cam in picamera2.INSTANCES))
        create(self, camera_num)

    monkeypatch.setattr(picamera2.Picamera2, "__init__", counted)
    return picamera2


def _bundle(folder: Path, target: str = "imx500") -> Path:
    """An imx500 bundle after ``imx500-package`` on the Pi (or, ``target="cpu"``, a CPU bundle's manifest)."""
    folder.mkdir()
    imx = target == "imx500"
    model = "packerOut.zip" if imx else "model.tflite"
    (folder / model).write_bytes(b"PK fake" if imx else b"TFL3 fake")
    (folder / "network.rpk").write_bytes(b"rpk fake")
    (folder / "labels.txt").write_text("\n".join(LABELS) + "\n")
    adapter = "edgekit.runtime.imx500:Imx500Runtime" if imx else "edgekit.runtime.litert:LiteRTRuntime"
    manifest = {
        "format_version": FORMAT_VERSION, "name": "demo", "target": target, "labels": "labels.txt",
        "default_model": "int8", "runtime": {"adapter": adapter},
        "models": [{"name": "int8", "file": model, "format": "imx500" if imx else "tflite", "precision": "int8",
                    "input": SPEC.to_dict(), "outputs": []}],
        "files": {n: sha256_file(folder / n) for n in (model, "labels.txt")},
    }  # fmt: skip
    (folder / "edgekit.json").write_text(json.dumps(manifest))
    return folder


@pytest.fixture
def bundle(tmp_path):
    return _bundle(tmp_path / "demo-imx500")


def _config(tmp_path, bundle, port, **camera):
    options = {"timeout_s": 0.4, "open_timeout_s": 2.0, **camera}
    return make_config(tmp_path, port, model={"path": str(bundle)},
                       camera={"uri": "imx500", "options": options, "reconnect_min_s": 0.05,
                               "reconnect_max_s": 0.2, "stall_timeout_s": 1.0})


def _results(sub: Subscriber) -> list[dict]:
    return [json.loads(payload) for payload, _ in sub.on("/result")]


def _own_outputs(result: dict) -> bool:
    """The result's top class is the one the sensor's network gave its own frame."""
    return result["top"][0]["index"] == (result["frame"] + FIRST) % 10


def test_serve_publishes_each_frames_own_outputs_from_the_sensors_frames(
    tmp_path, broker, fake, bundle, monkeypatch  # noqa: F811
):
    sub = Subscriber(broker.port)
    try:
        daemon = Daemon(_config(tmp_path, bundle, broker.port))
        with running(daemon):
            def own_frame(self, wait=None):
                raise AssertionError("the backend captured a frame of its own")

            # from now on the backend may only read the outputs a frame carries, never the sensor's newest
            monkeypatch.setattr(fake.Picamera2, "capture_metadata", own_frame)
            results = wait_until(lambda: len({r["top"][0]["label"] for r in _results(sub)}) == 10 and _results(sub),
                                 30, what="results naming every class (frames skipped when the model is busy)")
            stats = daemon.stats()
    finally:
        sub.close()
    assert all(_own_outputs(r) for r in results), [(r["frame"], r["top"][0]["index"]) for r in results]
    frames = [r["frame"] for r in results]
    assert frames == sorted(set(frames)) and frames[-1] - frames[0] >= 9
    assert stats["runtime"]["backend"] == "imx500" and stats["camera"]["kind"] == "imx500"
    assert stats["errors"]["inference"] == 0 and stats["errors"]["camera"] == 0
    assert len(fake.INSTANCES) == 1 and fake.INSTANCES[0].closed  # one Picamera2, closed at the stop
    assert not fake.HELD  # every request went back to the camera
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert lines and all(_own_outputs(r) for r in lines)


def test_a_camera_that_stops_is_reopened_with_its_backend_never_two_picamera2_open(
    tmp_path, broker, fake, bundle, monkeypatch  # noqa: F811
):
    loose: list = []  # the Picamera2 whose cable came loose: its requests never complete
    wait = fake.Picamera2.wait

    def dead(self, job, timeout=None):
        if self in loose:
            if not self._released.wait(timeout):
                raise FutureTimeoutError()
            raise RuntimeError("Camera closed")
        return wait(self, job, timeout)

    monkeypatch.setattr(fake.Picamera2, "wait", dead)
    sub = Subscriber(broker.port)
    try:
        daemon = Daemon(_config(tmp_path, bundle, broker.port))
        with running(daemon):
            wait_until(lambda: len(_results(sub)) >= 3, 20, what="results from the first camera")
            loose.append(fake.INSTANCES[0])
            wait_until(lambda: not daemon.health()[0], 10, what="the camera reported down")
            wait_until(lambda: len(fake.INSTANCES) == 2 and fake.INSTANCES[0].closed, 20, what="a new backend")
            before = len(_results(sub))
            wait_until(lambda: len(_results(sub)) >= before + 5, 20, what="results from the reopened camera")
            wait_until(lambda: daemon.health()[0], 10, what="healthy again")
            stats = daemon.stats()
    finally:
        sub.close()
    assert fake.OPEN_AT_CREATION == [0, 0]  # the second Picamera2 came after the first was closed
    assert [c[0] for c in fake.CALLS].count("IMX500") == 2  # the network loaded into the new camera first
    assert stats["reconnects"]["camera"] >= 1 and stats["reconnects"]["model"] == 1
    assert stats["errors"]["camera"] >= 1 and stats["errors"]["inference"] == 0
    results = _results(sub)
    assert all(_own_outputs(r) for r in results), [(r["frame"], r["top"][0]["index"]) for r in results]
    assert all(cam.closed for cam in fake.INSTANCES) and not fake.HELD


def test_a_model_reopened_after_inference_errors_is_read_again_without_a_third_backend(
    tmp_path, broker, fake, bundle, monkeypatch  # noqa: F811
):
    from edgekit.errors import DeviceError
    from edgekit.runtime.imx500 import Imx500Runtime

    failing = []  # inferences left to fail
    infer = Imx500Runtime.infer

    def flaky(self, tensor, metadata=None):
        if failing:
            failing.pop()
            raise DeviceError("IMX500: the sensor answered garbage")
        return infer(self, tensor, metadata)

    monkeypatch.setattr(Imx500Runtime, "infer", flaky)
    sub = Subscriber(broker.port)
    try:
        config = override(_config(tmp_path, bundle, broker.port), "model", reopen_after_errors=2)
        daemon = Daemon(config)
        with running(daemon):
            wait_until(lambda: len(_results(sub)) >= 3, 20, what="results from the first backend")
            failing.extend([1, 1])
            wait_until(lambda: len(fake.INSTANCES) == 2, 20, what="the model reopened")
            before = len(_results(sub))
            wait_until(lambda: len(_results(sub)) >= before + 5, 20, what="results from the reopened model")
            stats = daemon.stats()
    finally:
        sub.close()
    # the source on the closed backend ended; the capture read the new backend's camera, no third backend
    assert [c[0] for c in fake.CALLS].count("IMX500") == 2 and fake.OPEN_AT_CREATION == [0, 0]
    assert stats["reconnects"]["model"] == 1 and stats["errors"]["inference"] == 2
    assert all(_own_outputs(r) for r in _results(sub))


def test_a_reload_is_refused_before_a_second_network_opens_and_the_camera_goes_on(tmp_path, broker, fake, bundle):  # noqa: F811
    sub = Subscriber(broker.port)
    try:
        daemon = Daemon(_config(tmp_path, bundle, broker.port))
        with running(daemon):
            wait_until(lambda: len(_results(sub)) >= 3, 20, what="results")
            manifest = json.loads((bundle / "edgekit.json").read_text())
            (bundle / "edgekit.json").write_text(json.dumps({**manifest, "name": "demo2"}))  # a new bundle
            daemon.request_reload("SIGHUP")
            wait_until(lambda: daemon.swaps.get("refused") == 1, 20, what="the reload refused")
            before = len(_results(sub))
            wait_until(lambda: len(_results(sub)) >= before + 3, 20, what="results after the refusal")
            stats = daemon.stats()
    finally:
        sub.close()
    assert len(fake.INSTANCES) == 1 and len(fake.NETWORKS) == 1  # no network, no camera opened beside
    assert "cannot be opened beside the running one" in stats["swaps"]["last"]
    assert all(_own_outputs(r) for r in _results(sub))


def test_a_model_known_only_once_open_is_paired_then(tmp_path, fake, bundle):
    """A caller's runtime (or a fleet's bundle) is checked once it opened, and closed when refused."""
    from edgekit.errors import UsageError
    from edgekit.runtime.imx500 import Imx500Runtime
    from tests.serve.test_daemon_services import real_runtime

    def sensor():
        return Imx500Runtime(bundle / "packerOut.zip", input_spec=SPEC)

    cases = [(make_config(tmp_path, None), sensor, "its one camera must be uri = \"imx500\""),
             (_config(tmp_path, bundle, None), real_runtime, "the AI Camera's outputs come from a network")]
    for config, factory, said in cases:
        daemon = Daemon(config, runtime_factory=factory, labels=LABELS[:3] if factory is real_runtime else LABELS)
        with pytest.raises(UsageError, match=said):
            daemon.start()
    assert len(fake.INSTANCES) == 1 and fake.INSTANCES[0].closed  # the refused backend let the camera go


def test_the_command_line_serves_the_ai_camera(capsys, fake, bundle):
    outcome = edgekit(capsys, "serve", bundle, "--camera", "imx500", "--max-frames", "5", "--http", "off")
    assert outcome.code == 0, outcome.text
    lines = [json.loads(line) for line in outcome.out.splitlines()]
    assert len(lines) == 5 and all(_own_outputs(r) and r["source"] == "imx500" for r in lines)
    assert len(fake.INSTANCES) == 1 and fake.INSTANCES[0].closed


def test_the_documented_ai_camera_config_loads(tmp_path, capsys, fake, bundle):
    text = (Path(__file__).resolve().parents[2] / "docs" / "serve.md").read_text()
    toml = text.split("### Raspberry Pi AI Camera (IMX500)", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "serve.toml"
    path.write_text(toml.replace("/opt/edgekit/bundles/demo-imx500", str(bundle)))
    outcome = edgekit(capsys, "serve", "--config", path, "--print-config")
    assert outcome.code == 0, outcome.text
    assert json.loads(outcome.out)["camera"]["uri"] == "imx500"


def _toml(path: Path, model: Path, cameras: list[str], extra: str = "") -> Path:
    tables = "".join(f"[[camera]]\nname = \"c{i}\"\nuri = \"{uri}\"\n" for i, uri in enumerate(cameras))
    if len(cameras) == 1:
        tables = f"[camera]\nuri = \"{cameras[0]}\"\n"
    path.write_text(f"[model]\npath = \"{model}\"\n{extra}\n{tables}[http]\nlisten = \"off\"\n"
                    "[output]\njsonl = \"-\"\n")
    return path


@pytest.mark.parametrize(("cameras", "target", "extra", "said", "fix"), [
    (["imx500"], "cpu", "", "does not run there", "--target imx500"),
    (["v4l2:0"], "imx500", "", "runs in the AI Camera's sensor", "uri = \"imx500\""),
    (["imx500", "synthetic"], "imx500", "", "cannot share the model with 1 other camera", "second daemon"),
    (["imx500", "imx500"], "imx500", "", "2 imx500 cameras (c0, c1) cannot share one model", "second daemon"),
    (["imx500"], "imx500", "watch = true", "[model] watch with an imx500 camera", "restart the service"),
    (["imx500"], "imx500", "[[stage]]\nmodel = \"{model}\"", "runs in the AI Camera's sensor, which sees its own",
     "for this device's CPU"),
])  # fmt: skip
def test_a_pairing_the_sensor_cannot_serve_is_refused_at_load_in_one_line(
    tmp_path, capsys, fake, cameras, target, extra, said, fix
):
    model = _bundle(tmp_path / f"demo-{target}", target)
    config = _toml(tmp_path / "serve.toml", model, cameras, extra.format(model=model))
    for argv in (["--print-config"], ["--duration", "2"]):  # what --print-config approves starts, and only that
        outcome = edgekit(capsys, "serve", "--config", config, *argv)
        assert_refused(outcome, said)
        assert fix in outcome.err.split("fix:", 1)[1]
    assert not fake.INSTANCES and not fake.NETWORKS  # refused before anything opened the camera
