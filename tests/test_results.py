"""Decoding outputs: the task heads table, dequantisation, softmax detection, top-k with labels."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from edgekit.camera import Frame
from edgekit.errors import BackendUnavailable, UsageError
from edgekit.image import InputSpec
from edgekit.pipeline import Pipeline
from edgekit.results import (
    TASK_HEADS,
    Classification,
    Decoder,
    Prediction,
    TaskHead,
    dequantize,
    looks_like_probabilities,
    make_decoder,
    output_quantization,
    softmax,
    top_k,
)
from edgekit.runtime.fake import FakeRuntime


def test_dequantize_widens_before_subtracting_the_zero_point():
    q = np.array([3, 128, 255], dtype=np.uint8)
    # In uint8 arithmetic 3 - 128 wraps to 131; the real value is negative.
    assert (q - np.uint8(128))[0] == 131
    np.testing.assert_allclose(dequantize(q, 0.5, 128), [-62.5, 0.0, 63.5])
    q8 = np.array([-128, 0, 127], dtype=np.int8)
    np.testing.assert_allclose(dequantize(q8, 1 / 256, -128), [0.0, 0.5, 255 / 256])
    assert dequantize(q8, 1 / 256, -128).dtype == np.float32


def test_dequantize_without_quantisation_only_casts():
    x = np.array([0.25, 0.75], dtype=np.float16)
    out = dequantize(x, None, None)
    assert out.dtype == np.float32 and out.tolist() == [0.25, 0.75]
    assert dequantize(x, 0.0, 0).tolist() == [0.25, 0.75]


def test_softmax_is_stable_and_normalised():
    p = softmax(np.array([1000.0, 1001.0, 1002.0]))
    assert np.isfinite(p).all() and p.sum() == pytest.approx(1.0)
    assert p.argmax() == 2


def test_probability_detection():
    assert looks_like_probabilities(np.array([0.1, 0.7, 0.2]))
    assert looks_like_probabilities(np.array([0.1, 0.69, 0.2]))  # quantisation rounding
    assert not looks_like_probabilities(np.array([2.0, -1.0, 0.5]))  # logits
    assert not looks_like_probabilities(np.array([0.5, 0.5, 0.5]))  # sums to 1.5 (sigmoid outputs)


def test_top_k_orders_by_score_keeps_ties_in_index_order_and_labels():
    preds = top_k(np.array([0.1, 0.4, 0.4, 0.1]), k=3, labels=["a", "b", "c"])
    assert [p.index for p in preds] == [1, 2, 0]
    assert [p.label for p in preds] == ["b", "c", "a"]
    assert top_k(np.array([0.0, 0.0, 0.0, 1.0]), k=1, labels=["a"])[0].label == "3"  # no such label
    assert len(top_k(np.array([1.0, 2.0]), k=10)) == 2


def test_decoder_on_quantised_probabilities():
    # A uint8 softmax output (scale 1/256, zero point 0) of batch 1.
    out = np.array([[10, 200, 46]], dtype=np.uint8)
    result = Decoder(["cat", "dog", "bird"], k=2, quantization=(1 / 256, 0))([out])
    assert isinstance(result, Classification)
    assert result.top == Prediction(1, "dog", pytest.approx(200 / 256))
    assert not result.softmax_applied
    assert [p.label for p in result.predictions] == ["dog", "bird"]


def test_decoder_applies_softmax_to_logits_only():
    logits = np.array([[2.0, -1.0, 0.5]], dtype=np.float32)
    r = Decoder(k=3)([logits])
    assert r.softmax_applied and sum(p.score for p in r.predictions) == pytest.approx(1.0)
    assert Decoder(softmax="never")([logits]).top.score == 2.0
    probs = np.array([[0.2, 0.5, 0.3]], dtype=np.float32)
    assert Decoder(softmax="always")([probs]).softmax_applied
    with pytest.raises(ValueError):
        Decoder(softmax="sometimes")


def test_results_are_frozen_and_serialisable():
    r = Decoder(["x", "y"], k=2)([np.array([[0.25, 0.75]], dtype=np.float32)])
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.top.score = 1.0  # type: ignore[misc]
    d = r.to_dict()
    assert d["top"][0] == {"index": 1, "label": "y", "score": 0.75}
    assert str(r) == "y 0.750  x 0.250"


def test_output_quantization_from_runtimes():
    class WithQuant:
        output_quantization = [(0.5, 3), None]

    assert output_quantization(WithQuant()) == (0.5, 3)
    assert output_quantization(WithQuant(), 1) is None
    assert output_quantization(object()) is None


# ---------------------------------------------------------------------------------------- task heads
class QuantisedOutput:
    """A runtime as far as decoders care: uint8 scores with scale 1/256."""

    output_quantization = [(1 / 256, 0)]


@dataclasses.dataclass(frozen=True)
class Mean:
    """A result of the test-only 'mean' head."""

    value: float

    def to_dict(self):
        return {"mean": self.value}


def mean_head(labels, runtime, scale=1.0):
    """A second task head, to show the table picks decoders (as 'detect' will)."""
    return lambda outputs: Mean(float(np.mean(outputs[0])) * scale)


def test_classify_head_from_the_table_matches_the_decoder():
    out = [np.array([[10, 200, 46]], dtype=np.uint8)]
    labels = ["cat", "dog", "bird"]
    decoder = make_decoder("classify", labels, QuantisedOutput(), k=2)
    assert decoder(out) == Decoder(labels, k=2, quantization=(1 / 256, 0))(out)
    assert make_decoder(labels=labels, runtime=QuantisedOutput(), top_k=1)(out).top.label == "dog"
    assert make_decoder(softmax="always")([np.array([[0.2, 0.8]], np.float32)]).softmax_applied
    assert make_decoder(output_index=1)([np.zeros((1, 2)), np.array([[0.9, 0.1]])]).top.index == 0


def test_unknown_task_or_option_is_a_usage_error_naming_it():
    with pytest.raises(UsageError, match="unknown task 'detekt'") as exc:
        make_decoder("detekt")
    assert "classify" in exc.value.hint
    with pytest.raises(UsageError, match="task 'classify' has no option 'topk'") as exc:
        make_decoder("classify", topk=3)
    assert "top_k" in exc.value.hint
    with pytest.raises(UsageError, match="k=2 and top_k=3"):
        make_decoder(k=2, top_k=3)
    for bad in ({"softmax": "sometimes"}, {"k": 0}, {"k": "3"}, {"output_index": -1}):
        with pytest.raises(UsageError):
            make_decoder(**bad)


def test_the_table_resolves_heads_lazily_by_dotted_path(monkeypatch):
    monkeypatch.setitem(TASK_HEADS, "mean", TaskHead(f"{__name__}:mean_head", ("scale",), "mean score"))
    assert make_decoder("mean", scale=2.0)([np.array([[1.0, 3.0]])]) == Mean(4.0)
    monkeypatch.setitem(TASK_HEADS, "gone", TaskHead("edgekit_no_such_module:head", (), "x", "pip install gone"))
    with pytest.raises(BackendUnavailable) as exc:
        make_decoder("gone")
    assert exc.value.hint == "pip install gone"


def test_pipeline_chooses_its_decoder_by_task(monkeypatch):
    monkeypatch.setitem(TASK_HEADS, "mean", TaskHead(f"{__name__}:mean_head", ("scale",), "mean score"))
    spec = InputSpec(shape=(1, 4, 4, 1), colour="gray")
    # FakeRuntime for exact outputs: the test checks which head decodes, so the scores must be known to the digit
    runtime = FakeRuntime(lambda x: [np.array([[0.25, 0.75]], np.float32)], spec)
    frame = Frame(np.zeros((4, 4), np.uint8), 0, 7)
    classify = Pipeline(runtime, ["a", "b"], top_k=1, warmup=0).step(frame)
    assert classify.result is classify.classification and classify.to_dict()["top"][0]["label"] == "b"
    assert len(classify.classification.predictions) == 1  # top_k became the head's k
    never = Pipeline(runtime, warmup=0, task_options={"softmax": "always", "k": 2}).step(frame)
    assert never.classification.softmax_applied and len(never.classification.predictions) == 2
    mean = Pipeline(runtime, warmup=0, task="mean", task_options={"scale": 4.0}).step(frame)
    assert mean.result == Mean(2.0) and mean.to_dict()["mean"] == 2.0 and mean.to_dict()["frame"] == 7
    with pytest.raises(AttributeError, match="not a Classification"):
        mean.classification
    with pytest.raises(UsageError, match="no option 'scale'"):
        Pipeline(runtime, task_options={"scale": 1.0})


class _TwoOutputs:
    """A runtime's output side as the raw head reads it: names and per-output quantisation."""

    output_quantization = [(0.5, 128), None]

    def output_details(self):
        return [{"name": "scores", "shape": [1, 3]}, {"name": "box", "shape": [1, 4]}]


def test_raw_head_summarises_every_output_and_never_ranks_classes():
    decode = make_decoder("raw", ["a", "b", "c"], _TwoOutputs())
    result = decode([np.array([[128, 130, 126]], np.uint8), np.array([[0.1, 0.2, 0.3, 0.4]], np.float32)])
    d = result.to_dict()
    assert [o["name"] for o in d["outputs"]] == ["scores", "box"] and "top" not in d
    scores, box = d["outputs"]
    assert scores["shape"] == [1, 3] and scores["dtype"] == "uint8"
    assert (scores["min"], scores["max"], scores["mean"]) == (-1.0, 1.0, 0.0)  # dequantised, widened first
    assert box["mean"] == pytest.approx(0.25) and "values" not in box
    assert str(result).startswith("scores 1x3 mean 0 [-1, 1]  box 1x4 mean 0.25")


def test_raw_head_gives_tensors_only_when_asked_and_names_from_the_bundle():
    decode = make_decoder("raw", runtime=_TwoOutputs(), names=["class", "regression"], tensors=True)
    d = decode([np.array([[128, 129, 130]], np.uint8), np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)]).to_dict()
    assert [o["name"] for o in d["outputs"]] == ["class", "regression"]
    assert d["outputs"][0]["values"] == [[0.0, 0.5, 1.0]] and d["outputs"][1]["values"] == [[1.0, 2.0, 3.0, 4.0]]
    with pytest.raises(UsageError, match="task 'classify' has no option 'tensors'"):
        make_decoder("classify", runtime=_TwoOutputs(), tensors=True)
    with pytest.raises(UsageError, match="raw tensors must be true or false"):
        make_decoder("raw", runtime=_TwoOutputs(), tensors="yes")


@pytest.mark.parametrize(("shapes", "task"), [
    ([[1, 10]], "classify"), ([["N", 10]], "classify"), ([[10]], "classify"),
    ([[1, 4, 8400]], "raw"), ([[1, 10], [1, 4]], "raw"), ([[1, 21, 64, 64]], "raw"),
])
def test_a_model_that_does_not_say_is_a_classifier_only_with_one_vector_output(shapes, task):
    from edgekit.results import default_task

    assert default_task(shapes) == task


# --- int8 outputs with a non-zero zero point (issue 18) ----------------------------------------------


def test_decoder_on_an_int8_softmax_output_subtracts_the_zero_point():
    # A TFLite int8 softmax output: scale 1/256, zero point -128 (uint8's 0 moved into int8's range).
    out = np.array([[-128 + 64, -128 + 128, -128 + 64]], np.int8)
    decoder = Decoder(["cat", "dog", "bird"], k=3, quantization=(1 / 256, -128))
    values, applied = decoder.scores([out])
    np.testing.assert_allclose(values, [0.25, 0.5, 0.25])
    assert applied is False  # already probabilities once dequantised; ignoring -128 makes them look like logits
    result = decoder([out])
    assert [p.label for p in result.predictions] == ["dog", "cat", "bird"] and result.top.score == 0.5


@pytest.fixture(scope="module")
def int8_io_bundle(tmp_path_factory):
    """The demo model built for cpu as one int8 variant with ``io_dtype="int8"`` (real converter)."""
    from edgekit.builders.build import build
    from tests.conftest import CALIB, DEMO_MODEL, EVAL

    [r] = build(DEMO_MODEL, ["cpu"], [CALIB], out=tmp_path_factory.mktemp("int8io"), eval_dir=EVAL, quiet=True,
                variants=["int8"], io_dtype="int8")
    return r


@pytest.mark.slow  # one int8 conversion with calibration, ~5 s on 2 cores
def test_io_dtype_int8_model_decodes_through_its_zero_point(int8_io_bundle):
    """A real int8-in/int8-out model: the output zero point is not 0, and the decoded scores match Keras's."""
    import keras

    from edgekit.image import Preprocessor, read_image
    from edgekit.model import open_model
    from tests.conftest import DEMO_MODEL, EVAL

    assert int8_io_bundle.passed
    entry = int8_io_bundle.manifest["models"][0]
    assert entry["input"]["dtype"] == "int8"
    images = sorted(EVAL.glob("*/*.png"))[::40][:6]
    assert len(images) == 6
    original = keras.saving.load_model(DEMO_MODEL)
    float_spec = InputSpec.from_dict({**entry["input"], "dtype": "float32", "scale": None, "zero_point": None})
    with open_model(int8_io_bundle.bundle) as m:
        (scale, zero_point), = m.runtime.output_quantization
        assert zero_point != 0 and m.runtime.infer(np.zeros(m.runtime.input_spec.shape, np.int8))[0].dtype == np.int8
        decoder, prep = make_decoder(m.task, m.labels, m.runtime), Preprocessor(m.runtime.input_spec)
        for path in images:
            frame = read_image(path)
            values, applied = decoder.scores(m.runtime.infer(prep(frame)))
            expected = np.asarray(original(Preprocessor(float_spec)(frame)))[0]
            assert applied is False and abs(values.sum() - 1) < 0.05, path
            np.testing.assert_allclose(values, expected, atol=0.05, err_msg=str(path))
