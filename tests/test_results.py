"""Decoding outputs: dequantisation, softmax detection, top-k with labels."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from edgekit.results import (
    Classification,
    Decoder,
    Prediction,
    dequantize,
    looks_like_probabilities,
    output_quantization,
    softmax,
    top_k,
)


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
