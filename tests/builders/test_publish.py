"""Publishing a bundle over an earlier one says so: ``replaced dist/demo-cpu (it held fp32, fp16,
int8; now fp32, int8)``, a warning naming what is lost (issue 39 item 5)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from edgekit.builders.log import BuildLog
from edgekit.builders.publish import _held, _say_replaced
from tests.helpers.detector_model import detector_bundle


def _said(held, manifest, dest="dist/demo-cpu") -> list[str]:
    log = BuildLog(quiet=True)
    _say_replaced(SimpleNamespace(log=log), dest, held, manifest)
    return [line.split("] ", 1)[1] for line in log.lines]


def test_what_the_bundle_held_and_holds_now_is_said():
    models = {"models": [{"name": "fp32"}, {"name": "int8"}]}
    assert _said((["fp32", "fp16", "int8"], False), models) == [
        "WARNING: replaced dist/demo-cpu (it held fp32, fp16, int8; now fp32, int8): fp16 no longer there"]
    assert _said((["fp32", "int8"], False), models) == ["replaced dist/demo-cpu (it held fp32, int8; now fp32, int8)"]
    assert _said((["fp32", "int8"], True), models) == [
        "WARNING: replaced dist/demo-cpu (it held fp32, int8; now fp32, int8): its open-set fit no longer there"]
    assert _said((["int8"], False), None) == ["WARNING: removed dist/demo-cpu (it held int8): int8 no longer there"]
    assert _said(None, models) == []  # nothing was there


def test_held_reads_the_bundle_there(tmp_path):
    assert _held(tmp_path / "none") is None
    bundle = detector_bundle(tmp_path / "twobox-cpu")
    assert _held(bundle) == (["fp32"], False)
    (bundle / "edgekit.json").write_text("{")
    assert _held(bundle) == ([], False)
    assert _said(_held(bundle), {"models": [{"name": "fp32"}]}) == [
        "replaced dist/demo-cpu (it held an unreadable manifest; now fp32)"]


@pytest.mark.slow
def test_a_rebuild_with_fewer_variants_warns(tmp_path, capsys):
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras

    from edgekit.cli import main as cli
    from tests.helpers.rescale_models import colour_folder

    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(2, 1), keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(2, activation="softmax")])
    model.save(tmp_path / "m.keras")
    calib = colour_folder(tmp_path, "green")
    argv = ["build", "--model", str(tmp_path / "m.keras"), "--target", "cpu", "--calib", str(calib),
            "--out", str(tmp_path / "dist")]
    assert cli([*argv, "--variants", "fp32,fp16"]) == 0
    assert "replaced" not in capsys.readouterr().err
    assert cli([*argv, "--variants", "fp32"]) == 0
    assert (f"WARNING: replaced {tmp_path / 'dist/m-cpu'} (it held fp32, fp16; now fp32): fp16 no longer there"
            in capsys.readouterr().err)
