"""Decoding outputs: the task heads table, dequantisation, softmax detection, top-k with labels."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from edgekit.camera import Frame
from edgekit.errors import BackendUnavailable, UsageError
from edgekit.heads.classify import Classification, Decoder
from edgekit.heads.table import TASK_HEADS, TaskHead, make_decoder
from edgekit.heads.tensors import Prediction, dequantize, looks_like_probabilities, output_quantization, softmax, top_k
from edgekit.imaging.image import InputSpec
from edgekit.pipeline import Pipeline
from edgekit.util.optionspec import Option
from tests.helpers.real_models import onnx_runtime


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


MEAN_HEAD = TaskHead(f"{__name__}:mean_head", None, "mean score", (Option("scale", "float"),))


def test_the_table_resolves_heads_lazily_by_dotted_path(monkeypatch):
    monkeypatch.setitem(TASK_HEADS, "mean", MEAN_HEAD)
    assert make_decoder("mean", scale=2.0)([np.array([[1.0, 3.0]])]) == Mean(4.0)
    monkeypatch.setitem(TASK_HEADS, "gone", TaskHead("edgekit_no_such_module:head", "pip install gone", "x", ()))
    with pytest.raises(BackendUnavailable) as exc:
        make_decoder("gone")
    assert exc.value.hint == "pip install gone"


def test_pipeline_chooses_its_decoder_by_task(monkeypatch):
    monkeypatch.setitem(TASK_HEADS, "mean", MEAN_HEAD)
    spec = InputSpec(shape=(1, 4, 4, 1), colour="gray")
    # a real model (ONNX Runtime) whose logits are 0.25 + mean, 0.75 - mean: exactly [0.25, 0.75] on the black frame
    runtime = onnx_runtime(spec, weights=[1.0, -1.0], bias=[0.25, 0.75], softmax=False)
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
    from edgekit.heads.table import default_task

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

    from edgekit.imaging.image import Preprocessor, read_image
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


# --- values, boundaries and branches the mutation run found unpinned (issue 18, docs/mutation.md) ------


def test_softmax_computes_in_float64_and_returns_float32_whatever_the_input():
    # a float16 output (an fp16 ONNX model) must not be exponentiated in float16: exp(-10) loses digits there
    x16 = np.array([0.0, 10.0], np.float16)
    p = softmax(x16)
    assert p.dtype == np.float32
    np.testing.assert_allclose(p, [np.exp(-10) / (1 + np.exp(-10)), 1 / (1 + np.exp(-10))], rtol=1e-6)


def test_softmax_normalises_each_row_of_a_batch_on_its_own():
    # rows of very different magnitude: a shared maximum would underflow the second row to 0 / 0
    p = softmax(np.array([[1000.0, 1001.0, 1002.0], [0.0, 1.0, 2.0]]))
    assert p.shape == (2, 3) and p.dtype == np.float32
    np.testing.assert_allclose(p.sum(axis=-1), [1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(p[0], p[1], rtol=1e-6)  # softmax ignores a constant shift


def test_softmax_along_another_axis_in_float32_work_precision():
    # the detect head's [C, N] score maps: classes along axis 0, computed in float32 (thousands of boxes)
    x = np.array([[0.0, 5.0], [1.0, 5.0], [2.0, 5.0]], np.float32)
    p = softmax(x, axis=0, work=np.float32)
    assert p.dtype == np.float32
    np.testing.assert_allclose(p.sum(axis=0), [1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(p[:, 0], softmax(x[:, 0]), rtol=1e-6)
    np.testing.assert_allclose(p[:, 1], [1 / 3] * 3, rtol=1e-6)


def test_probability_check_boundaries():
    assert looks_like_probabilities(np.array([1.0]))  # one class
    assert looks_like_probabilities(np.array([0.0, 1.0]))  # a confident, exact 0/1 output
    assert not looks_like_probabilities(np.array([]))
    assert not looks_like_probabilities(np.array([-0.5, 0.5, 1.0]))  # sums to 1 but holds a negative
    assert looks_like_probabilities(np.array([-1e-6, 0.5, 0.500001]))  # -1e-6 is still rounding noise
    # the tolerance is inclusive on both checks: max exactly 1 + tolerance, sum exactly 1 + tolerance
    assert looks_like_probabilities(np.array([1.25, 0.0]), tolerance=0.25)
    assert not looks_like_probabilities(np.array([1.25, 0.0]), tolerance=0.2)
    # a score above 1 + tolerance is refused even when rounding noise below 0 brings the sum back to 1
    assert not looks_like_probabilities(np.concatenate([[1.2], np.full(200_000, -1e-6)]))
    # the sum is taken in float64: in float16 1.050018 rounds to 1.0498, inside the tolerance
    assert not looks_like_probabilities(np.array([0.5, 0.5, 0.050018310546875], np.float16))


def test_top_k_keeps_five_by_default_and_ties_in_index_order_past_insertion_sort():
    assert len(top_k(np.arange(10.0))) == 5
    # 80 scores: numpy's default quicksort is not stable at this size, so index order must be asked for
    scores = np.array([0.1] * 40 + [0.5] * 40)
    assert [p.index for p in top_k(scores, k=45)] == list(range(40, 80)) + [0, 1, 2, 3, 4]
    preds = top_k(np.array([[0.1, 0.9], [0.3, 0.2]]), k=4)  # any shape is read flat, row by row
    assert [p.index for p in preds] == [1, 2, 3, 0]


def test_decoder_defaults_and_batches():
    ten = [np.arange(10.0, dtype=np.float32)[None]]
    assert len(Decoder()(ten).predictions) == 5
    assert len(make_decoder()(ten).predictions) == 5
    assert len(make_decoder(top_k=2)(ten).predictions) == 2
    # a batch of two: only the first item is decoded
    batch = np.array([[0.25, 0.5, 0.25], [0.9, 0.05, 0.05]], np.float32)
    r = Decoder(["a", "b", "c"], k=6)([batch])
    assert [(p.label, p.score) for p in r.predictions] == [("b", 0.5), ("a", 0.25), ("c", 0.25)]
    # a vector output without a batch axis is the scores themselves, not its first element
    r = Decoder(["a", "b", "c"], k=3)([np.array([0.25, 0.5, 0.25], np.float32)])
    assert [p.label for p in r.predictions] == ["b", "a", "c"] and not r.softmax_applied
    # a conv head's [1, 1, 1, N] output gives a flat vector of N scores
    values, applied = Decoder().scores([np.array([[[[0.25, 0.5, 0.25]]]], np.float32)])
    assert values.shape == (3,) and values.tolist() == [0.25, 0.5, 0.25] and not applied


def test_decoder_json_form_rounds_to_six_digits_and_names_every_field():
    r = Decoder(["a", "b"], k=2, softmax="never")([np.array([[1 / 3, 2 / 3]], np.float32)])
    assert r.to_dict() == {"top": [{"index": 1, "label": "b", "score": 0.666667},
                                   {"index": 0, "label": "a", "score": 0.333333}], "softmax_applied": False}


def test_decoder_and_classify_refusals_say_what_is_wrong():
    with pytest.raises(ValueError, match="softmax must be auto, always or never, not 'sometimes'"):
        Decoder(softmax="sometimes")
    with pytest.raises(UsageError) as exc:
        make_decoder(k=2, top_k=3)
    assert exc.value.hint == "give one of them"
    with pytest.raises(UsageError, match=r"classify k must be a whole number of at least 1, not 0"):
        make_decoder(k=0)
    with pytest.raises(UsageError, match="classify softmax must be one of: auto, always, never, not 'sometimes'"):
        make_decoder(softmax="sometimes")
    for bad in (-1, True):
        with pytest.raises(UsageError, match=f"classify output_index must be a whole number from 0 .* not {bad!r}"):
            make_decoder(output_index=bad)
    logits = [np.array([[2.0, -1.0]], np.float32)]
    assert make_decoder(softmax="never")(logits).top.score == 2.0
    with pytest.raises(UsageError) as exc:
        make_decoder("detekt")
    assert exc.value.hint.startswith("known tasks: classify, raw")
    with pytest.raises(UsageError) as exc:
        make_decoder("classify", topk=3)
    assert exc.value.hint == "did you mean 'top_k'?"  # the option spec's one did-you-mean
    with pytest.raises(UsageError) as exc:
        make_decoder("classify", colour=3)
    assert exc.value.hint == "classify accepts: k, top_k, softmax, output_index"


def test_classify_reads_the_quantisation_of_the_output_it_decodes():
    class TwoQuantised:
        output_quantization = [(1.0, 0), (1 / 256, 0)]

    out = [np.array([[0, 0]], np.uint8), np.array([[64, 192]], np.uint8)]
    values, applied = make_decoder(runtime=TwoQuantised(), output_index=1).scores(out)
    assert values.tolist() == [0.25, 0.75] and not applied


def test_output_quantization_past_the_last_output_is_none():
    class WithQuant:
        output_quantization = [(0.5, 3), None]

    assert output_quantization(WithQuant(), 2) is None


def test_a_model_with_a_dynamic_batch_of_minus_one_is_a_classifier():
    from edgekit.heads.table import default_task

    assert default_task([[-1, 10]]) == "classify" and default_task([[2, 10]]) == "raw"


def test_raw_json_form_rounds_every_statistic_to_six_digits():
    from edgekit.heads.raw import RawDecoder

    out = np.array([[1 / 3, 2 / 3, 1 / 7]], np.float64)
    d = RawDecoder(tensors=True)([out]).to_dict()["outputs"][0]
    a = out.astype(np.float32)
    assert (d["min"], d["max"], d["mean"], d["std"]) == (
        round(float(a.min()), 6), round(float(a.max()), 6), round(float(a.mean()), 6), round(float(a.std()), 6))
    assert d["min"] == 0.142857 and d["max"] == 0.666667 and d["std"] != 0
    assert d["values"] == [[0.333333, 0.666667, 0.142857]]


def test_raw_decoder_defaults_and_outputs_past_its_names_and_quantisation():
    from edgekit.heads.raw import RawDecoder

    decode = RawDecoder(names=["first"], quantization=[(0.5, 0)])
    result = decode([np.array([4], np.uint8), np.array([4], np.uint8), np.zeros((1, 0), np.float32)])
    first, second, empty = result.outputs
    assert first.values is None  # tensors only when asked
    assert (first.name, first.mean) == ("first", 2.0) and (second.name, second.mean) == ("output_1", 4.0)
    assert empty.name == "output_2" and empty.shape == (1, 0)
    assert (empty.min, empty.max, empty.mean, empty.std) == (0.0, 0.0, 0.0, 0.0)


def test_raw_head_names_outputs_without_details_by_position():
    class QuantOnly:  # a runtime that reports quantisation but no output details
        output_quantization = [None, None]

    class Unnamed:
        output_quantization = [None]

        def output_details(self):
            return [{"shape": [1, 2]}]

    outs = [np.zeros((1, 2), np.float32), np.ones((1, 2), np.float32)]
    assert [o.name for o in make_decoder("raw", runtime=QuantOnly())(outs).outputs] == ["output_0", "output_1"]
    assert [o.name for o in make_decoder("raw", runtime=Unnamed())(outs[:1]).outputs] == ["output_0"]
