"""``edgekit build --task segment``: the head's options checked before any model loads, each variant
judged by its masks' IoU with the original's (mean and 5th percentile over images, both empty or both
under 0.5 % of the grid: 1, counted),
where the masks part named in one line (builders/gate/segment.py).

The unit tests feed the gate masks and figures by hand (a known IoU, the boundary of each limit); one
small Keras model (a sigmoid mask from two random convolutions) is built for real: fp32 keeps IoU 1, int8 moves
a few border pixels, so an IoU limit of 1 passes fp32 (``>=``) and fails int8 with the IoU line.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from edgekit.builders.contract import BuiltModel, TargetBuild
from edgekit.builders.gate.figures import figures, judged
from edgekit.builders.gate.segment import (
    NEAR_EMPTY,
    Limits,
    SegmentGate,
    Tally,
    iou,
    judge,
    log_text,
    near_empty_classes,
    table_figure,
)
from edgekit.builders.int8.recovery import _figure, _hopeless, _row
from edgekit.builders.int8.stability import gate_of, skip_reason
from edgekit.builders.outcome import gate_fix
from edgekit.builders.request import BuildRequest
from edgekit.commands.build import format_table
from edgekit.errors import UsageError
from edgekit.heads.segment import SegmentDecoder
from edgekit.imaging.image import InputSpec
from tests.conftest import CALIB
from tests.helpers.build_cli import build_cli, refused_before_loading

SIDE = 16  # the test model's input and mask, pixels

# --- the gate on masks and figures given by hand -------------------------------------------------------


def _figures(mean: float, p5: float, images: int = 40, worst: float | None = None) -> dict:
    return {"mask_iou": {"mean": mean, "p5": p5, "min": worst if worst is not None else p5, "images": images,
                         "under": {"0.7": 1, "0.9": 6}, "worst": [{"index": 12, "image": "people/x.jpg",
                                                                   "iou": worst if worst is not None else p5}]}}


def test_each_limit_passes_a_figure_equal_to_it_and_fails_one_just_under():
    limits = Limits()
    assert (limits.mean, limits.p5) == (0.9, 0.7)
    assert judge(_figures(0.9, 0.7), limits) == {"passed": True}
    under_mean = judge(_figures(0.8999, 0.7), limits)
    assert under_mean["passed"] is False and list(under_mean["gate_failures"]) == ["--min-mask-iou"]
    under_p5 = judge(_figures(0.9, 0.6999), limits)
    assert list(under_p5["gate_failures"]) == ["--min-mask-iou-p5"]
    assert judge({"mask_iou": {"mean": None}}, limits)["passed"] is False
    assert judge(_figures(0.5, 0.1), Limits(0.0, 0.0)) == {"passed": True}  # 0 turns the gate off


def test_a_failing_figure_is_one_line_saying_where_the_masks_part():
    lines = judge(_figures(0.851, 0.6, worst=0.388), Limits())["gate_failures"]
    assert lines["--min-mask-iou"] == ("mask IoU 0.851 mean < 0.9 (--min-mask-iou); 6 of 40 images under 0.9, "
                                       "worst 0.388 on people/x.jpg")
    assert lines["--min-mask-iou-p5"].startswith("mask IoU 0.600 p5 < 0.7 (--min-mask-iou-p5); 1 of 40 images under")


def test_iou_is_the_mean_over_the_classes_either_mask_holds_and_both_empty_is_one():
    a = np.zeros((1, 4, 4), bool)
    b = a.copy()
    assert iou(a, b) == 1.0  # nothing in either: nothing to miss
    a[0, :2, :2] = True  # 4 pixels
    b[0, :2, 1:3] = True  # 4 pixels, 2 shared: IoU 2 / 6
    assert iou(a, b) == pytest.approx(1 / 3)
    two_a, two_b = np.zeros((2, 4, 4), bool), np.zeros((2, 4, 4), bool)
    two_a[0], two_b[0] = a[0], b[0]  # class 1 empty in both: left out of the mean
    assert iou(two_a, two_b) == pytest.approx(1 / 3)
    two_a[1, 3, 3] = True  # class 1 in one mask only: IoU 0
    assert iou(two_a, two_b) == pytest.approx(1 / 6)


def _grid(cells: int, start: int = 0) -> np.ndarray:
    """One class's mask on a 100 x 100 grid (10 000 cells) with ``cells`` set from cell ``start`` on."""
    mask = np.zeros(100 * 100, bool)
    mask[start:start + cells] = True
    return mask.reshape(1, 100, 100)


def test_masks_both_under_the_near_empty_share_agree_and_one_side_over_it_is_judged_strictly():
    share = NEAR_EMPTY
    assert share == 0.005  # 50 cells of 10 000
    empty, speck, large = _grid(0), _grid(30), _grid(4000)
    assert iou(empty, empty, share) == 1.0 and near_empty_classes(empty, empty, share) == 0  # both empty: as before
    assert iou(empty, speck) == 0.0  # strictly the speck is a whole object missed (selfie's beach photo)
    assert iou(empty, speck, share) == 1.0 and iou(speck, empty, share) == 1.0
    assert near_empty_classes(empty, speck, share) == 1
    assert iou(_grid(49), _grid(49, start=60), share) == 1.0  # two disjoint specks: both say "nothing there"
    assert iou(empty, _grid(50), share) == 0.0  # 0.5 % is not under 0.5 %: judged strictly
    assert iou(empty, large, share) == 0.0 and iou(large, empty, share) == 0.0  # a real miss still scores 0
    assert iou(speck, large, share) == pytest.approx(30 / 4000) and near_empty_classes(speck, large, share) == 0
    assert iou(_grid(2000), _grid(2000, start=1000), share) == pytest.approx(1000 / 3000)  # a known IoU, untouched
    two_a, two_b = np.concatenate([_grid(2000), empty]), np.concatenate([_grid(2000, start=1000), speck])
    assert iou(two_a, two_b, share) == pytest.approx((1 / 3 + 1) / 2)  # per class: the speck's class agrees
    assert iou(two_a, two_b, 0.0) == pytest.approx(1 / 6)  # 0 turns the rule off


def test_the_tally_counts_the_images_the_near_empty_rule_judged_and_keeps_the_strict_figures():
    decoder = SegmentDecoder(None, (), (), threshold=0.5)
    ref = np.zeros((4, 100, 100, 1), np.float32)
    conv = ref.copy()
    conv[0, 0, :30] = 0.9  # image 0: empty original, a 0.3 % speck in the variant
    ref[1, :40], conv[1, :40] = 0.9, 0.9  # image 1: the same 40 % in both: IoU 1
    conv[2, :40] = 0.9  # image 2: empty original, a 40 % variant: a miss, 0
    ref[3, 0, :20], conv[3, 0, 50:70] = 0.9, 0.9  # image 3: two disjoint 0.2 % specks
    tally = Tally(decoder, ["beach.jpg", "b.jpg", "c.jpg", "d.jpg"])
    tally.add([ref], [conv])
    m = tally.result()["mask_iou"]
    assert (m["mean"], m["min"], m["near_empty"], m["near_empty_share"]) == (0.75, 0.0, 2, 0.005)
    assert m["strict"] == {"mean": 0.25, "p5": 0.0} and m["worst"][0]["image"] == "c.jpg"
    res = {"mask_iou": m}
    assert table_figure(res) == f"IoU 0.750 mean, {m['p5']:.3f} p5, 2 near-empty"
    assert ("on 4 images (2 with both masks near-empty, under 0.50% of the grid, counted as agreeing; strictly "
            "0.2500 mean, 0.0000 p5)") in log_text(res)
    strict = Tally(decoder, limits=Limits(near_empty=0.0))  # --mask-near-empty 0: the rule off, nothing counted
    strict.add([ref], [conv])
    m0 = strict.result()["mask_iou"]
    assert (m0["mean"], m0["near_empty"], "strict" in m0) == (0.25, 0, False)
    assert table_figure({"mask_iou": m0}).endswith(" p5") and "near-empty" not in log_text({"mask_iou": m0})


def test_the_tally_decodes_both_models_with_the_head_and_counts_per_image():
    decoder = SegmentDecoder(None, (), (), threshold=0.5)
    ref = np.zeros((3, 4, 4, 1), np.float32)
    conv = ref.copy()
    ref[0, :2, :2], conv[0, :2, 1:3] = 0.9, 0.9  # image 0: IoU 1/3
    ref[1, :, :], conv[1, :, :] = 0.8, 0.6  # image 1: both whole: IoU 1
    conv[2, 0, 0] = 0.49  # image 2: both empty (0.49 is under the threshold): IoU 1
    tally = Tally(decoder, ["a.jpg", "b.jpg", "c.jpg"])
    tally.add([ref[:2]], [conv[:2]])  # two chunks, as verify gives them
    tally.add([ref[2:]], [conv[2:]])
    res = tally.result()
    m = res["mask_iou"]
    assert (m["mean"], m["min"], m["images"]) == (round((1 / 3 + 2) / 3, 4), 0.3333, 3)
    assert m["p5"] == round(float(np.percentile([1 / 3, 1, 1], 5)), 4) and m["under"] == {"0.7": 1, "0.9": 1}
    assert m["worst"][0] == {"index": 0, "image": "a.jpg", "iou": 0.3333}
    assert res["mask_area"] == {"original": round((0.25 + 1) / 3, 4), "converted": round((0.25 + 1) / 3, 4)}
    assert "mask IoU vs the original 0.7778 mean" in log_text(res) and "(a.jpg)" in log_text(res)
    assert table_figure(res) == f"IoU {m['mean']:.3f} mean, {m['p5']:.3f} p5"


@dataclass
class _Output:
    name: str
    shape: tuple

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


@dataclass
class _Source:
    outputs: list = field(default_factory=lambda: [_Output("mask", (SIDE, SIDE, 1)), _Output("score", (1,))])


def _gate(**options) -> SegmentGate:
    request = BuildRequest(model=Path("m.keras"), targets="cpu", calib="c", task="segment", task_options=options)
    return SegmentGate.for_model(request, _Source())


def test_a_bundle_records_the_head_options_with_each_files_own_output_index():
    gate = _gate(activation="sigmoid")
    assert gate.limits.to_dict() == {"min_mean_iou": 0.9, "min_p5_iou": 0.7, "near_empty_share": 0.005}
    assert gate.task_options([{"name": "mask"}, {"name": "score"}]) == {"activation": "sigmoid"}
    assert gate.task_options([{"name": "score"}, {"name": "mask"}]) == {"activation": "sigmoid", "output": 1}


@pytest.mark.parametrize("options,message", [
    ({"output": 2}, "segment output 2: the model has 2 outputs (0: mask [16, 16, 1]"),
    ({"channels": [2]}, "channel 2 asked for, the mask output has 1 (output 0: mask [16, 16, 1])"),
])
def test_options_the_model_cannot_meet_are_one_line(options, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        _gate(**options)


def test_a_logit_read_as_a_probability_is_one_line_naming_the_activation():
    gate = _gate()
    gate.check_reference([np.full((2, SIDE, SIDE, 1), 0.7, np.float32), np.zeros((2, 1))])  # probabilities: fine
    with pytest.raises(UsageError, match=r"spans \[-3, 4\], not probabilities") as err:
        gate.check_reference([np.linspace(-3, 4, 2 * SIDE * SIDE).reshape(2, SIDE, SIDE, 1), np.zeros((2, 1))])
    assert err.value.hint == "give -T activation=sigmoid (it gives logits)"


@pytest.mark.parametrize("extra,message", [
    (("-T", "activation=relu"), "segment activation must be one of"),
    (("-T", "treshold=0.4"), "task 'segment' has no option 'treshold'"),
    (("--min-mask-iou", "1.5"), "--min-mask-iou 1.5 makes no sense"),
    (("--min-mask-iou-p5", "-0.1"), "--min-mask-iou-p5 -0.1 makes no sense"),
])
def test_a_bad_option_is_one_line_and_exit_2_before_the_model_loads(tmp_path, monkeypatch, extra, message):
    code, errors, err = refused_before_loading(monkeypatch, tmp_path, "segment", *extra)
    assert code == 2 and len(errors) == 1 and message in errors[0], err


# --- what reads the figures: recovery, the calibration check, the table, the fix line ----------------


def _verification(mean: float, passed: bool) -> dict:
    return {"eval": {**_figures(mean, mean - 0.1), "passed": passed, "cosine": 0.99,
                     "mask_gate": {"min_mean_iou": 0.9, "min_p5_iou": 0.7},
                     **({} if passed else {"gate_failures": {"--min-mask-iou": "mask IoU ..."}})},
            "holdout": {**_figures(0.5, 0.4), "cosine": 0.98}}  # with an eval set: reported, not judged


def _model(verification: dict) -> BuiltModel:
    spec = InputSpec.from_dict({"shape": [1, SIDE, SIDE, 1], "layout": "NHWC", "dtype": "float32"})
    return BuiltModel(name="int8", file="m_int8.tflite", format="tflite", precision="int8", input=spec, outputs=(),
                      convert_seconds=1.0, bytes=1, verification=verification)


def test_recovery_and_the_calibration_check_judge_a_segmenter_by_its_mean_iou():
    missed, closer = _model(_verification(0.85, False)), _model(_verification(0.88, False))
    assert judged(missed.verification, "segment") == ("IoU mean", 0.85)  # the eval set's, not the held-back one
    assert figures(missed.verification, "segment") == {"IoU mean": 0.85, "IoU p5": 0.75}
    row = _row("as built", missed, None, "segment")
    assert (row["figure_name"], row["figure"], row["missed"][0]["figure"], row["missed"][0]["limit"]) == \
        ("IoU mean", 0.85, "IoU mean", 0.9)
    assert _figure(closer, "segment") > _figure(missed, "segment") and not _hopeless(row, missed)
    near = gate_of("segment", 0.99, 0.98, _verification(0.93, True))
    assert (near.name, near.flag, near.threshold, near.figure, near.higher) == \
        ("mask IoU mean", "--min-mask-iou", 0.9, 0.93, True)
    assert skip_reason(near, (np.arange(3), "disjoint")) is None  # within half a margin (0.05): checked
    far = gate_of("segment", 0.99, 0.98, _verification(0.99, True))
    assert "0.99 is 0.09 above the gate 0.9" in skip_reason(far, (np.arange(3), "disjoint"))


def test_the_table_shows_the_mask_iou_and_the_fix_names_the_iou_flag():
    lost = {"file": "m_int8.tflite", "kept_in": "m-cpu.rejected", "bytes": 1024,
            "verification": _verification(0.851, False)}
    manifest = {"task": "segment", "models": [{"name": "fp32", "file": "m_fp32.tflite", "bytes": 2048}],
                "verification": {"gated": True, "rejected": {"int8": lost},
                                 "models": {"fp32": {"eval": {**_figures(1.0, 1.0), "cosine": 1.0, "passed": True}}}}}
    result = TargetBuild("cpu", Path("d/m-cpu"), False, 2.0, manifest, "why", ("int8",))
    table = format_table([result]).splitlines()
    assert table[0].split()[4:9] == ["mask", "IoU", "mask", "cosine", "gate"]
    assert "IoU 1.000 mean, 1.000 p5  1.000000     PASS" in table[2]
    assert "IoU 0.851 mean, 0.751 p5  0.990000     FAIL" in table[3]
    mask_only = dict(lost, verification={"eval": {**lost["verification"]["eval"], "mask_output": "mask",
                                                  "outputs": {"mask": {"cosine": 0.97}, "score": {"cosine": 0.1}}}})
    manifest["verification"]["rejected"]["int8"] = mask_only  # a model of several outputs: the mask's cosine
    assert "IoU 0.851 mean, 0.751 p5  0.970000     FAIL" in format_table([result]).splitlines()[3]
    assert "lower --min-mask-iou" in gate_fix([result])


def test_an_eval_folder_of_images_without_class_folders_loads_by_name(tmp_path):
    from edgekit.builders.log import BuildLog
    from edgekit.builders.sources.images import load_images_eval
    from edgekit.imaging.image import Preprocessor

    for name in sorted(p.name for p in CALIB.iterdir())[:3]:
        shutil.copy(CALIB / name, tmp_path / name)
    (tmp_path / "notes.txt").write_text("not an image")
    spec = InputSpec.from_dict({"shape": [1, SIDE, SIDE, 1], "layout": "NHWC", "dtype": "float32"})
    images = load_images_eval(tmp_path, Preprocessor(spec), BuildLog(quiet=True))
    assert len(images) == 3 and images.names == sorted(p.name for p in tmp_path.glob("*.png"))
    assert images.labels is None and images.skipped == 1


# --- a real build ------------------------------------------------------------------------------------


def _mask_model(path: Path) -> Path:
    """A sigmoid mask of a 16 x 16 grey input from two small random convolutions (seed 0): its border
    pixels lie near 0.5 on the calibration images, where int8's rounding moves some of them."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    inp = keras.Input((SIDE, SIDE, 1))
    x = layers.Conv2D(4, 3, padding="same", activation="relu")(inp)
    keras.Model(inp, layers.Conv2D(1, 3, padding="same", activation="sigmoid", name="mask")(x)).save(path)
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """fp32 and int8 built for cpu with --eval a flat folder and --min-mask-iou 1: fp32 reaches it (equal
    passes), int8 does not. (exit code, stdout, stderr, dist)."""
    tmp = tmp_path_factory.mktemp("segment")
    model = _mask_model(tmp / "masks.keras")
    people = tmp / "eval"
    people.mkdir()
    for name in sorted(p.name for p in CALIB.iterdir())[-12:]:
        shutil.copy(CALIB / name, people / name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGEKIT_BUILD_TIMING_S", "0")
        code, out, err = build_cli("--model", model, "--target", "cpu", "--calib", CALIB, "--eval", people, "--out",
                              tmp / "dist", "--calib-count", "40", "--variants", "fp32,int8", "--task", "segment",
                              "--min-mask-iou", "1", "--allow-partial", "--no-recover")
    return code, out, err, tmp / "dist"


def test_fp32_keeps_every_mask_and_the_manifest_records_the_iou(built):
    code, out, err, dist = built
    assert code == 0, err
    manifest = json.loads((dist / "masks-cpu" / "edgekit.json").read_text())
    v = manifest["verification"]
    assert manifest["task"] == "segment" and v["metric"] == "mask_iou" and v["gated"]
    assert v["mask_gate"] == {"min_mean_iou": 1.0, "min_p5_iou": 0.7, "near_empty_share": 0.005}
    assert v["mask_iou"]["mean"] == 1.0 and v["mask_iou"]["images"] == 12 and v["dataset"]["eval_images"] == 12
    fp32 = v["models"]["fp32"]
    assert fp32["eval"]["passed"] and "passed" not in fp32["holdout"]  # the eval set is judged, the rest reported
    assert fp32["holdout"]["mask_iou"]["images"] == 8 and 0 < v["mask_area"]["original"] < 1
    assert fp32["eval"]["mask_output"] == "mask"
    assert "fp32 on 12 eval images: mask IoU vs the original 1.0000 mean" in err
    (row,) = [ln for ln in out.splitlines() if "masks_fp32" in ln]
    assert "IoU 1.000 mean, 1.000 p5" in row and "PASS" in row


def test_an_int8_under_the_iou_limit_fails_with_the_iou_line(built):
    code, out, err, dist = built
    manifest = json.loads((dist / "masks-cpu" / "edgekit.json").read_text())
    lost = manifest["verification"]["rejected"]["int8"]
    m = lost["verification"]["eval"]["mask_iou"]
    assert 0.5 < m["mean"] < 1.0 and m["min"] <= m["p5"] <= m["mean"]
    line = f"int8 mask IoU {m['mean']:.3f} mean < 1 (--min-mask-iou); {m['under']['1']} of 12 images under 1, worst"
    assert lost["reason"].startswith(line) and m["worst"][0]["image"] in lost["reason"], lost["reason"]
    assert lost["verification"]["eval"]["outputs"]["mask"]["mean_abs_diff"] > 0  # the MAE, in probability units
    (row,) = [ln for ln in out.splitlines() if "masks_int8" in ln]
    assert f"IoU {m['mean']:.3f} mean" in row and "FAIL" in row


def test_the_bundle_decodes_masks_with_the_options_it_was_built_with(built):
    from edgekit.heads.segment import Segmentation
    from edgekit.heads.table import make_decoder
    from edgekit.model import open_model

    with open_model(built[3] / "masks-cpu") as opened:
        assert opened.task == "segment"
        decode = make_decoder(opened.task, opened.labels, opened.runtime, **opened.task_options)
        frame = np.zeros((1, SIDE, SIDE, 1), np.float32)
        frame[0, 4:12, 4:12] = 1.0  # a bright square
        outputs = opened.runtime.infer(frame)
        result = decode(outputs, frame_shape=(32, 32, 3))  # twice the input: every box doubles
    assert isinstance(result, Segmentation) and result.labels == ("mask",)
    on = np.asarray(outputs[0])[0, :, :, 0] >= 0.5
    assert result.segments[0].area == pytest.approx(on.mean())
    rows, cols = np.flatnonzero(on.any(axis=1)), np.flatnonzero(on.any(axis=0))
    assert result.segments[0].box == (2.0 * cols[0], 2.0 * rows[0], 2.0 * cols[-1] + 2, 2.0 * rows[-1] + 2)
