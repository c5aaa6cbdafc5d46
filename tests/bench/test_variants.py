"""Which variants a bench opens and what it calls them: two bundles of one name told apart by the
shortest path that differs, ``--label NAME=PATH``, ``#2`` for one given twice (issue 39 item 5).
What ``--skip-unavailable`` leaves out is in tests/test_errors_exit_codes.py (exit codes)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgekit.bench.variants import distinct_labels
from edgekit.cli import main as cli
from edgekit.errors import UsageError
from tests.helpers.detector_model import detector_bundle


def test_shared_names_get_the_shortest_path_that_differs(tmp_path):
    a, b, c = tmp_path / "dist/demo-cpu", tmp_path / "other/demo-cpu", tmp_path / "x/dist/demo-cpu"
    models = [(a, "demo-cpu:int8", "int8"), (b, "demo-cpu:int8", "int8"), (a, "demo-cpu:fp32", "fp32"),
              (tmp_path / "m.onnx", "m.onnx", None)]
    assert distinct_labels(models) == ["dist/demo-cpu:int8", "other/demo-cpu:int8", "demo-cpu:fp32", "m.onnx"]
    deeper = [(a, "demo-cpu:int8", "int8"), (c, "demo-cpu:int8", "int8")]
    assert distinct_labels(deeper) == [f"{tmp_path.name}/dist/demo-cpu:int8", "x/dist/demo-cpu:int8"]
    twice = [(a, "demo-cpu:int8", "int8"), (a, "demo-cpu:int8", "int8"), (a, "demo-cpu:int8", "int8")]
    assert distinct_labels(twice) == ["demo-cpu:int8", "demo-cpu:int8#2", "demo-cpu:int8#3"]
    backends = [(a, "demo-cpu:int8@litert", "int8"), (b, "demo-cpu:int8@litert", "int8")]
    assert distinct_labels(backends) == ["dist/demo-cpu:int8@litert", "other/demo-cpu:int8@litert"]


def test_label_names_a_bundle_or_one_variant(tmp_path):
    a, b = tmp_path / "dist/demo-cpu", tmp_path / "other/demo-cpu"
    models = [(a, "demo-cpu:fp32", "fp32"), (a, "demo-cpu:int8", "int8"), (b, "demo-cpu:int8", "int8")]
    assert distinct_labels(models, {"new": str(b)}) == ["demo-cpu:fp32", "demo-cpu:int8", "new:int8"]
    assert distinct_labels(models, {"small": f"{a}:int8"}) == ["demo-cpu:fp32", "small", "demo-cpu:int8"]
    with pytest.raises(UsageError, match="--label x=nope: no model of this bench is nope"):
        distinct_labels(models, {"x": "nope"})


def test_bench_tells_two_copies_of_one_bundle_apart_in_rows_progress_and_json(tmp_path, capsys):
    first = detector_bundle(tmp_path / "dist/twobox-cpu")
    shutil.copytree(first, tmp_path / "other/twobox-cpu")
    argv = ["bench", f"{first}:fp32", str(tmp_path / "other/twobox-cpu:fp32"), "--min-duration", "0",
            "--min-count", "3", "--repeats", "1", "--frames", "2", "--warmup", "0"]
    assert cli([*argv, "--json"]) == 0
    out, err = capsys.readouterr()
    names = [v["name"] for v in json.loads(out)["variants"]]
    assert names == ["dist/twobox-cpu:fp32", "other/twobox-cpu:fp32"]
    assert "repeat 1/1  dist/twobox-cpu:fp32" in err and "repeat 1/1  other/twobox-cpu:fp32" in err
    assert cli([*argv, "--label", f"copy={Path(tmp_path / 'other/twobox-cpu')}"]) == 0
    assert "copy:fp32" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        cli([*argv, "--label", "nothing"])
    assert exc.value.code == 2 and "is not NAME=PATH" in capsys.readouterr().err
