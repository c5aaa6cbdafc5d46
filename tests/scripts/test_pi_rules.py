"""make pi-check's comparison rules and table (scripts/pi_rules.py): pure functions, no emulator needed."""

from __future__ import annotations

import numpy as np

from scripts.pi_rules import (
    FAIL,
    INFO,
    OK,
    Row,
    compare_bundle,
    compare_outputs,
    detection_difference,
    failed,
    format_table,
    human_size,
    raw_difference,
    top1_agreement,
)


def test_int8_outputs_may_differ_by_one_lsb_not_two():
    a = np.array([[0, 127, 255]], np.uint8)
    assert raw_difference(a, a) == (True, 0.0, "LSB")
    assert raw_difference(a, np.array([[1, 126, 254]], np.uint8))[:2] == (True, 1.0)
    assert raw_difference(a, np.array([[2, 127, 255]], np.uint8))[:2] == (False, 2.0)
    # int8: the difference is taken in a wide type, so -128 vs 127 is 255 LSB, not a wrapped 1
    assert raw_difference(np.array([-128], np.int8), np.array([127], np.int8))[:2] == (False, 255.0)


def test_float_outputs_within_1e4_of_the_tensors_largest_magnitude():
    a = np.array([10.0, 0.0001, -3.0], np.float32)
    ok, rel, unit = raw_difference(a, a + np.array([0.0009, 0.0, 0.0], np.float32))
    assert ok and unit == "rel" and rel < 1e-4
    ok, rel, _ = raw_difference(a, a + np.array([0.0, 0.0, 0.002], np.float32))
    assert not ok and rel > 1e-4
    # an element near zero may differ by far more than 1e-4 of itself
    assert raw_difference(a, a + np.array([0.0, 0.0001, 0.0], np.float32))[0]


def test_shape_dtype_and_nan_differences_fail():
    a = np.zeros((1, 4), np.float32)
    assert not raw_difference(a, np.zeros((1, 5), np.float32))[0]
    assert not raw_difference(a, np.zeros((1, 4), np.float64))[0]
    nan = np.array([np.nan, 1.0], np.float32)
    assert raw_difference(nan, nan.copy())[0]
    assert not raw_difference(nan, np.array([0.0, 1.0], np.float32))[0]


def _cls(index: int) -> dict:
    return {"top": [{"index": index, "label": str(index), "score": 0.9}]}


def test_top1_agreement_and_the_995_rule():
    ref = [_cls(i % 5) for i in range(200)]
    one_off = [*ref[:-1], _cls(9)]
    assert top1_agreement(ref, ref) == 1.0
    assert top1_agreement(ref, one_off) == 0.995
    assert top1_agreement(ref, ref[:-1]) == 0.0  # a frame missing is no agreement at all
    raw = (True, "max 0 LSB")
    assert compare_bundle("classify", {"results": ref}, {"results": one_off}, raw)[0] == OK
    two_off = [*one_off[:-2], _cls(9), _cls(9)]
    status, detail = compare_bundle("classify", {"results": ref}, {"results": two_off}, raw)
    assert status == FAIL and "99.0% of 200" in detail
    assert compare_bundle("classify", {"results": ref}, {"results": ref}, (False, "max 2 LSB"))[0] == FAIL


def _det(*boxes: tuple[int, list[float]]) -> dict:
    return {"detections": [{"index": i, "label": str(i), "score": 0.5, "box": b} for i, b in boxes]}


def test_boxes_within_one_pixel_with_the_same_labels_in_any_tie_order():
    ref = _det((0, [10, 10, 50, 50]), (1, [60, 60, 90, 90]))
    assert detection_difference(ref, _det((1, [60.5, 60, 90, 91]), (0, [10, 10, 50, 50.9]))) == (True, 1.0)
    assert not detection_difference(ref, _det((0, [10, 10, 50, 51.5]), (1, [60, 60, 90, 90])))[0]
    assert not detection_difference(ref, _det((0, [10, 10, 50, 50]), (2, [60, 60, 90, 90])))[0]  # label
    assert not detection_difference(ref, _det((0, [10, 10, 50, 50])))[0]  # one box lost
    assert detection_difference(_det(), _det()) == (True, 0.0)


def test_a_detector_that_cannot_decode_fails_with_the_reason():
    ref = {"results": [_det((0, [1, 1, 5, 5]))]}
    cannot = {"results": [], "error": "decode: needs OpenCV"}
    status, detail = compare_bundle("detect", ref, cannot, (True, "max 0 LSB"))
    assert status == FAIL and detail.endswith("decode: needs OpenCV") and "max 0 LSB" in detail
    status, detail = compare_bundle("detect", ref, dict(ref), (True, "max 0 LSB"))
    assert status == OK and "1/1 frames" in detail


def test_compare_outputs_names_the_worst_figure_per_kind():
    ref = {"b0_f0_o0": np.array([1, 2], np.uint8), "b0_f1_o0": np.array([1.0, 2.0], np.float32),
           "b1_f0_o0": np.array([5], np.uint8)}
    got = {"b0_f0_o0": np.array([2, 2], np.uint8), "b0_f1_o0": np.array([1.0, 2.0], np.float32)}
    assert compare_outputs(ref, got, "b0_") == (True, "max 1 LSB, max rel 0.0e+00")
    assert compare_outputs(ref, got, "b1_") == (False, "0/1 outputs came back")


def test_table_is_aligned_and_failures_are_counted():
    rows = [Row("lean", "import edgekit", OK, "none"), Row("full", "run detector-cpu:int8", FAIL, "boxes 3 px"),
            Row("lean", "site-packages", INFO, "98.9 MiB")]
    lines = format_table(rows).splitlines()
    assert lines[0].split() == ["install", "check", "result", "detail"]
    assert lines[2].index("none") == lines[3].index("boxes") == lines[4].index("98.9")  # the detail column
    assert lines[2].index("ok") == lines[3].index("FAIL") == lines[4].index("info")
    assert failed(rows) == [rows[1]]
    assert human_size(3 * 2**20 + 2**19) == "3.5 MiB"


def test_the_emulated_python_gets_a_pis_cpuinfo_and_no_host_site_packages(tmp_path):
    import os

    from scripts import pi_userland as ul

    ul._write_cpuinfo(tmp_path, "cortex-a76")
    text = (tmp_path / "proc" / "cpuinfo").read_text()
    assert text.count("CPU part\t: 0xd0b") == (os.cpu_count() or 1) and "Raspberry Pi 5" in text
    cmd = ul.python_command("aarch64", tmp_path, "/usr/bin/qemu-aarch64-static", "cortex-a72")
    assert cmd == ["/usr/bin/qemu-aarch64-static", "-cpu", "cortex-a72", "-L", str(tmp_path),
                   str(tmp_path / "usr/bin/python3.11"), "-S", "-P"]
    assert ul.python_command("x86_64", None, None, "cortex-a72")[1:] == ["-S", "-P"]
