"""The frame -> preprocess -> infer -> decode -> record loop: a real ONNX model (ONNX Runtime) on
real and scripted sources; FakeRuntime only where the test controls time or makes inference fail."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from edgekit.camera import Frame, open_camera
from edgekit.errors import CameraError, ModelError
from edgekit.imaging.image import InputSpec
from edgekit.model import open_model, split_model_spec
from edgekit.pipeline import Pipeline, is_valid_frame
from edgekit.runtime.fake import FakeRuntime
from tests.helpers.real_models import onnx_runtime

SPEC = InputSpec(shape=(1, 8, 8, 1), colour="gray")


class FakeClock:
    def __init__(self):
        self.t = 10_000_000

    def __call__(self) -> int:
        return self.t

    def advance(self, ms: float) -> None:
        self.t += int(ms * 1e6)


def brightness_model():
    """The real model: class 1 ('bright') when the mean input is above 0.5, else class 0 (logits
    64 * (mean - 0.5) apart, so a frame a little off mid-grey is still sure)."""
    return onnx_runtime(SPEC, weights=[-32.0, 32.0], bias=[16.0, -16.0], softmax=False)


def timed_runtime(clock: FakeClock, infer_ms: float) -> FakeRuntime:
    """FakeRuntime for timing control: each inference advances the fake clock by exactly
    ``infer_ms``, so stage timings are known to the digit (a real model's are not)."""

    def fn(x: np.ndarray) -> list[np.ndarray]:
        clock.advance(infer_ms)
        p = float(x.mean() > 0.5)
        return [np.array([[1 - p, p]], dtype=np.float32)]

    return FakeRuntime(fn, SPEC)


def inferences(pipe: Pipeline) -> int:
    """How many times the model ran (every frame with warmup=0 is counted by the metrics)."""
    return pipe.metrics.summary()["stages"]["inference"]["count"]


def frames(values, clock=None, indices=None):
    for i, v in zip(indices or itertools.count(), values):
        arr = v if isinstance(v, np.ndarray) or v is None else np.full((36, 64, 3), v, np.uint8)
        yield Frame(arr, clock() if clock else 0, i)


def test_results_follow_the_frames():
    pipe = Pipeline(brightness_model(), ["dark", "bright"], top_k=2, warmup=0)
    results = list(pipe.run(frames([10, 250, 240, 5])))
    assert [r.classification.top.label for r in results] == ["dark", "bright", "bright", "dark"]
    assert [r.index for r in results] == [0, 1, 2, 3]
    assert inferences(pipe) == 4
    assert results[0].to_dict()["top"][0]["label"] == "dark"


def test_a_result_names_the_frames_source():
    pipe = Pipeline(brightness_model(), ["dark", "bright"], warmup=0)
    named, unnamed = pipe.run([Frame(np.full((36, 64, 3), 10, np.uint8), 0, 0, "eval/x/000.jpg"),
                               Frame(np.full((36, 64, 3), 10, np.uint8), 0, 1)])
    assert named.source == "eval/x/000.jpg" and list(named.to_dict())[:4] == ["frame", "source", "captured", "top"]
    assert named.to_dict()["source"] == "eval/x/000.jpg"
    assert unnamed.source is None and "source" not in unnamed.to_dict()  # a frame made by hand names nothing


def test_stage_timings_come_from_the_clock():
    clock = FakeClock()
    rt = timed_runtime(clock, infer_ms=7)

    def source():
        for i in range(4):
            clock.advance(3)  # the camera takes 3 ms to deliver...
            yield Frame(np.full((36, 64), 200, np.uint8), clock() - 1_000_000, i)  # ...captured 1 ms earlier

    pipe = Pipeline(rt, warmup=1, clock=clock)
    results = list(pipe.run(source()))
    t = results[-1].timings_ms
    assert t["capture_wait"] == pytest.approx(3.0)
    assert t["inference"] == pytest.approx(7.0)
    assert t["preprocess"] == 0 and t["postprocess"] == 0
    assert t["end_to_end"] == pytest.approx(8.0)  # 1 ms before delivery + 7 ms inference
    s = pipe.metrics.summary()
    assert s["stages"]["inference"]["count"] == 3  # one warm-up frame set aside
    assert s["first_inference_ms"] == pytest.approx(7.0)
    assert s["fps"] == pytest.approx(100.0)  # a frame every 3 + 7 ms


def test_max_frames_and_duration_stop_an_endless_source():
    pipe = Pipeline(brightness_model(), warmup=0)
    assert len(list(pipe.run(frames(itertools.repeat(100)), max_frames=7))) == 7
    clock = FakeClock()
    rt = timed_runtime(clock, infer_ms=10)
    pipe = Pipeline(rt, warmup=0, clock=clock)
    assert len(list(pipe.run(frames(itertools.repeat(100), clock), duration_s=0.1))) == 10


def test_index_gaps_count_as_skipped_frames():
    pipe = Pipeline(brightness_model(), warmup=0)
    list(pipe.run(frames([1, 2, 3], indices=[0, 4, 5])))
    assert pipe.metrics.skipped == 3


def test_corrupt_frames_are_skipped_and_counted():
    bad = [np.zeros((0, 0, 3), np.uint8), np.zeros((36, 64, 3), np.float32), None]
    pipe = Pipeline(brightness_model(), warmup=0)
    results = list(pipe.run(frames([100, *bad, 200])))
    assert len(results) == 2 and pipe.metrics.corrupt == 3 and inferences(pipe) == 2


def test_a_camera_sending_only_garbage_is_reported():
    pipe = Pipeline(brightness_model(), warmup=0, max_corrupt=5)
    garbage = frames(itertools.repeat(np.zeros((36, 64, 2), np.uint8)))
    with pytest.raises(CameraError, match="5 unusable frames in a row"):
        list(pipe.run(garbage))


def test_count_and_continue_policy_never_raises():
    pipe = Pipeline(brightness_model(), warmup=0, max_corrupt=None)
    source = frames([*[np.zeros((36, 64, 2), np.uint8)] * 50, 200])
    results = list(pipe.run(source))
    assert len(results) == 1 and pipe.metrics.corrupt == 50


def test_a_frame_the_preprocessor_rejects_counts_as_corrupt():
    import cv2

    pipe = Pipeline(brightness_model(), warmup=0, max_corrupt=2)
    real = pipe.preprocess

    def picky(array):  # a driver's odd frame: valid on the surface, refused by OpenCV or the spec
        if array.shape[1] == 7:
            raise cv2.error("OpenCV(5.0) resize.cpp:4000: error: (-215:Assertion failed) !dsize.empty()")
        if array.shape[1] == 9:
            raise ValueError("frames must be uint8")
        return real(array)

    pipe.preprocess = picky
    odd, odder, good = np.zeros((4, 7, 3), np.uint8), np.zeros((4, 9, 3), np.uint8), np.zeros((4, 8, 3), np.uint8)
    assert pipe.step(Frame(odd, 0, 0)) is None and pipe.step(Frame(good, 0, 1)) is not None
    assert pipe.metrics.corrupt == 1 and inferences(pipe) == 1
    pipe.step(Frame(odd, 0, 2))
    with pytest.raises(CameraError, match=r"2 unusable frames in a row \(last: frames must be uint8\)"):
        pipe.step(Frame(odder, 0, 3))


def test_inference_errors_reach_the_caller():
    def broken(x):
        raise RuntimeError("USB transfer error")

    # FakeRuntime for fault injection: an inference that raises, as a failing accelerator does
    pipe = Pipeline(FakeRuntime(broken, SPEC), warmup=0, max_corrupt=None)
    with pytest.raises(RuntimeError, match="USB transfer error"):
        pipe.step(Frame(np.zeros((36, 64, 3), np.uint8), 0, 0))
    assert pipe.metrics.frames == 0 and pipe.metrics.corrupt == 0


def test_a_bounded_pipeline_does_not_grow_and_a_sink_can_be_shared():
    pipe = Pipeline(brightness_model(), warmup=0, window=10)
    list(pipe.run(frames(itertools.repeat(100)), max_frames=100))
    assert pipe.metrics.frames == 100 and len(pipe.metrics.stages["inference"]) == 10
    assert pipe.metrics.summary()["stages"]["inference"]["count"] == 100
    again = Pipeline(brightness_model(), metrics=pipe.metrics)  # e.g. a reopened model
    list(again.run(frames([100, 200], indices=[100, 101])))
    assert again.metrics is pipe.metrics and pipe.metrics.frames == 102 and pipe.metrics.skipped == 0


def test_steps_yield_the_frame_with_its_result():
    pipe = Pipeline(brightness_model(), ["dark", "bright"], warmup=0)
    pairs = list(pipe.steps(frames([10, None, 250])))
    assert [(f.index, r.index, r.classification.top.label) for f, r in pairs] == [(0, 0, "dark"), (2, 2, "bright")]


def test_is_valid_frame():
    assert is_valid_frame(np.zeros((4, 4), np.uint8)) and is_valid_frame(np.zeros((4, 4, 4), np.uint8))
    assert not is_valid_frame(np.zeros((4, 4, 2), np.uint8)) and not is_valid_frame("frame")


def test_with_the_real_synthetic_camera():
    with open_camera("synthetic:320x180") as cam:
        pipe = Pipeline(brightness_model(), ["dark", "bright"], warmup=2)
        results = list(pipe.run(cam, max_frames=20))
    assert len(results) == 20
    s = pipe.metrics.summary()
    assert s["stages"]["end_to_end"]["count"] == 18
    assert s["stages"]["end_to_end"]["min_ms"] >= s["stages"]["inference"]["min_ms"]
    assert s["stages"]["preprocess"]["p50_ms"] > 0


def test_split_model_spec(tmp_path):
    assert split_model_spec("dist/demo-cpu:fp16") == (tmp_path.__class__("dist/demo-cpu"), "fp16")
    assert split_model_spec("model.tflite")[1] is None
    odd = tmp_path / "a:b"
    odd.mkdir()
    assert split_model_spec(str(odd)) == (odd, None)  # an existing path is taken whole


def _onnx_model(path):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
    w = helper.make_tensor("w", TensorProto.FLOAT, [64, 2], np.tile([[-1.0, 1.0]], (64, 1)).ravel().tolist())
    b = helper.make_tensor("b", TensorProto.FLOAT, [2], [32.0, -32.0])  # logit 1 > logit 0 iff mean > 0.5
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, 64])
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "w"], ["l"]),
        helper.make_node("Add", ["l", "b"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y], [w, b, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_open_model_bare_file_with_labels(tmp_path):
    model = _onnx_model(tmp_path / "m.onnx")
    (tmp_path / "labels.txt").write_text("dark\n\nbright\n")
    with open_model(model, labels=tmp_path / "labels.txt") as m:
        assert m.labels == ["dark", "bright"] and m.variant is None
        pipe = Pipeline(m.runtime, m.labels, warmup=0)
        r = list(pipe.run(frames([250, 5]), max_frames=2))
    assert [x.classification.top.label for x in r] == ["bright", "dark"]
    assert r[0].classification.softmax_applied  # the model emits logits


def test_open_model_errors(tmp_path):
    model = _onnx_model(tmp_path / "m.onnx")
    with pytest.raises(ModelError, match="not a bundle"):
        open_model(f"{model}:fp16")
    with pytest.raises(ModelError, match="does not exist"):
        open_model(tmp_path / "missing.onnx")
    with pytest.raises(ModelError, match="labels"):
        open_model(model, labels=tmp_path / "nope.txt")


def test_a_result_says_when_its_frame_was_captured_on_the_wall_clock():
    import datetime as dt
    import time as clock

    from edgekit.pipeline import FrameResult

    captured = clock.perf_counter_ns() - 2_000_000_000  # two seconds ago, by the monotonic clock
    result = FrameResult(7, captured, None, {}, "v4l2:0")
    when = dt.datetime.fromisoformat(result.captured.replace("Z", "+00:00"))
    ago = dt.datetime.now(dt.timezone.utc) - when
    assert result.captured.endswith("Z") and dt.timedelta(seconds=1.5) < ago < dt.timedelta(seconds=30)
