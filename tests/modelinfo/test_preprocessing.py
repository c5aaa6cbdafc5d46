"""``--interpolation area|linear|nearest|cubic``: one of the preprocessing flags of build, run and bench."""

from __future__ import annotations

import json

import pytest

from edgekit.cli import build_parser
from edgekit.cli import main as cli
from edgekit.errors import UsageError
from edgekit.imaging import imgops
from edgekit.model import open_model
from edgekit.modelinfo.preprocessing import INTERPOLATIONS, preprocess_flags, preprocessing
from tests.helpers.detector_model import detector_bundle
from tests.helpers.rescale_models import rescale_onnx


def test_the_flag_lists_what_the_resize_does():
    assert INTERPOLATIONS == imgops.INTERPOLATIONS  # written twice: argparse must not import numpy


@pytest.mark.parametrize("verb", [["build", "--model", "m.keras", "--target", "cpu", "--calib", "c"],
                                  ["run", "m.onnx", "--camera", "synthetic"], ["bench", "m.onnx"]])
def test_build_run_and_bench_take_it(verb, capsys):
    for choice in INTERPOLATIONS:
        args = build_parser(verb[0]).parse_args([*verb, "--interpolation", choice])
        assert preprocess_flags(args) == {"interpolation": choice}
    assert "interpolation" not in preprocess_flags(build_parser(verb[0]).parse_args(verb))
    with pytest.raises(SystemExit) as exc:
        build_parser(verb[0]).parse_args([*verb, "--interpolation", "lanczos"])
    assert exc.value.code == 2 and "invalid choice: 'lanczos'" in capsys.readouterr().err
    with pytest.raises(UsageError, match="bad interpolation 'lanczos'"):  # a sidecar's value is checked too
        preprocessing({"interpolation": "lanczos"}, 3)


def test_a_bare_model_takes_it_and_says_so_a_bundle_refuses_it(tmp_path, capsys):
    model = rescale_onnx(tmp_path / "m.onnx")
    assert cli(["run", str(model), "--camera", "synthetic:64x48", "--max-frames", "1", "--interpolation", "cubic",
                "--json"]) == 0
    header = json.loads(capsys.readouterr().out.splitlines()[0])
    assert header["input_from"]["interpolation"] == "flag" and "interpolation cubic (flag)" in header["assumed_input"]
    with open_model(model, preprocess={"interpolation": "linear"}) as m:
        assert m.runtime.input_spec.interpolation == "linear"
    bundle = detector_bundle(tmp_path / "det")
    assert cli(["run", str(bundle), "--camera", "synthetic", "--interpolation", "cubic"]) == 2
    assert "--interpolation applies to a bare model" in capsys.readouterr().err
