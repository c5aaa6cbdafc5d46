"""The bench table (edgekit/bench/report.py): every row names its variant whole."""

from __future__ import annotations

from tests.bench.test_caveats import _report, _variant


def test_a_long_bundle_name_keeps_each_rows_variant_and_the_columns_line_up():
    long = "ch_PP-OCRv4_rec_infer-cpu"
    fp32, fp16 = _variant(f"{long}:fp32", "rec.onnx", 84.0), _variant(f"{long}:fp16", "rec.onnx", 108.0)
    fp32.default = True
    head, rule, *rows, legend = _report([fp32, fp16]).table().splitlines()
    assert rows[0].startswith(f"{long}:fp32 * ") and rows[1].startswith(f"{long}:fp16 ")
    column = head.index("runtime")
    assert all(row[column - 1] == " " and row[column:].startswith("litert") for row in rows)
    assert len(rule) == len(head) and "default variant" in legend
