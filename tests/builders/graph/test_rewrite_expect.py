"""What a graph rewrite that changes an output (a YOLO output's pixel boxes normalised and clamped,
builders/graph/yolo.py) tells the rest of the build: verification compares the rewritten model with
the original transformed the same way (builders/context.py), the quantisation report gives no
"normalise the boxes" hint for it (builders/int8/report.py), and the manifest's task options say
``box_units: normalized``, which the detect head reads (builders/graph/rewrite.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from edgekit.builders.context import _expected
from edgekit.builders.gate.verify import Comparison
from edgekit.builders.graph.rewrite import Rewrite, accelerator_rewrites, manifest_extra, source_expect
from tests.helpers.yolo_graph import images, run, yolo_tflite

SIZE, NC = 32, 2


@pytest.fixture(scope="module")
def rewritten():
    """``(original, rewritten, rewrites, originals' outputs, rewritten outputs)`` on 4 images."""
    original = yolo_tflite(SIZE, NC)
    blob, done, _ = accelerator_rewrites(original, original, images(2, SIZE))
    xs = images(4, SIZE, seed=3)
    refs = np.concatenate([run(original, x) for x in xs])
    outs = np.concatenate([run(blob, x) for x in xs])
    return original, blob, done, refs, outs


def _cosine(refs: list[np.ndarray], outs: list[np.ndarray]) -> float:
    comparison = Comparison(["output0"], None)
    comparison.add(refs, outs)
    return comparison.result()["outputs"]["output0"]["cosine"]


def test_the_yolo_rewrite_carries_its_transform_and_the_units(rewritten):
    _, _, done, _, _ = rewritten
    yolo = next(r for r in done if r.op == "YOLO pixel boxes")
    assert yolo.expect is not None and yolo.task_options == {"box_units": "normalized"}
    assert "box_units=normalized" in yolo.into
    assert "task_options" not in yolo.to_dict() and "expect" not in yolo.to_dict()  # the manifest's list as it was


def test_verification_compares_like_with_like(rewritten):
    _, _, done, refs, outs = rewritten
    expect = source_expect(done, [0])
    assert expect is not None and callable(expect[0])
    unlike = _cosine([refs], [outs])  # pixel boxes against normalised ones: what the build compared
    like = _cosine(_expected([refs], expect), [outs])
    assert unlike < 0.99 and like > 0.99999, (unlike, like)
    np.testing.assert_allclose(_expected([refs], expect)[0], outs, atol=1e-4)


def test_the_transform_follows_a_transposed_original(rewritten):
    _, _, done, refs, outs = rewritten
    expect = source_expect(done, [0])
    flipped = _expected([np.swapaxes(refs, 1, 2)], expect)[0]  # [n, N, 4 + nc], the other export layout
    np.testing.assert_allclose(np.swapaxes(flipped, 1, 2), outs, atol=1e-4)


def test_no_transform_without_a_rewrite_that_changed_an_output():
    plain = [Rewrite("HARD_SWISH", 2, "x * RELU6(x + 3) / 6")]
    assert source_expect([], [0]) is None and source_expect(plain, [0, 1]) is None
    refs = [np.ones((2, 3), np.float32)]
    assert _expected(refs, None) is refs


def test_each_source_output_gets_its_own_position_s_transform():
    def double(a):
        return a * 2

    rewrite = Rewrite("x", 1, "y", expect=(None, double))  # the graph's output 1 changed
    expect = source_expect([rewrite], [1, 0])  # the source's output 0 lies at the graph's position 1
    assert expect[1] is None
    np.testing.assert_array_equal(expect[0](np.ones(2)), [2, 2])
    refs = [np.ones(2), np.ones(3)]
    got = _expected(refs, expect)
    np.testing.assert_array_equal(got[0], [2, 2])
    assert got[1] is refs[1]


def test_the_manifest_entry_says_the_boxes_are_normalised(rewritten):
    _, _, done, _, _ = rewritten
    extra = manifest_extra(done, {"task_options": {"output_index": 0}})
    assert extra["task_options"] == {"output_index": 0, "box_units": "normalized"}
    assert [r["op"] for r in extra["rewrites"]] == [r.op for r in done]
    assert manifest_extra([], {"a": 1}) == {"a": 1}
    plain = manifest_extra([Rewrite("HARD_SWISH", 1, "...")], {})
    assert "task_options" not in plain and plain["rewrites"][0]["op"] == "HARD_SWISH"


def test_the_detect_head_reads_the_units_from_the_options(rewritten):
    from edgekit.detect import yolo
    from edgekit.detect.head import detect_config
    from edgekit.imaging.image import InputSpec

    _, _, done, refs, outs = rewritten
    spec = InputSpec(shape=(1, SIZE, SIZE, 3))
    options = manifest_extra(done, {})["task_options"]
    config = detect_config(spec, NC, {"score_threshold": 0.3, **options})
    assert config.box_units == "normalized"
    # an int8 output whose range reads as pixels is still taken as the manifest says
    assert yolo.quantised_units(config, (0.5, 0), np.dtype(np.uint8)) is None
    plain = detect_config(spec, NC, {"score_threshold": 0.3})
    for ref, out in zip(refs, outs):
        want = yolo.candidates([ref[None]], plain, [None])
        got = yolo.candidates([out[None]], config, [None])
        assert len(want.scores) > 0
        np.testing.assert_allclose(got.boxes, np.clip(want.boxes, 0, SIZE), atol=1e-3 * SIZE)


def _report_ctx(values: np.ndarray):
    from edgekit.builders.sources.spool import Spool

    spool = Spool(dtype=np.float32)
    spool.extend(values)
    return SimpleNamespace(reference={"eval": [spool]}, source=SimpleNamespace(output_names=["output0"]),
                           task="detect", class_output=None, representative=lambda: [])


def test_no_normalise_hint_for_an_output_the_rewrite_normalised(rewritten):
    from edgekit.builders.int8.report import quantization_report

    _, _, done, refs, _ = rewritten
    ctx = _report_ctx(refs)

    def no_converter(rep):
        raise RuntimeError("no converter in this test")

    before = quantization_report(ctx, no_converter)
    after = quantization_report(ctx, no_converter, expect=source_expect(done, [0]))
    assert [f["output"] for f in before["mixed_ranges"]] == ["output0"]
    assert "normalise the boxes" in before["hints"][0]
    assert after["mixed_ranges"] == [] and after["hints"] == []
    assert after["error"].startswith("QuantizationDebugger failed")
