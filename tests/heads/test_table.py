"""The task head table (edgekit/heads/table.py): one row shape, options from the heads' own specs, and
plug-ins that never import the table that names them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from edgekit.errors import UsageError
from edgekit.heads.table import TASK_HEADS, make_decoder
from edgekit.util.optionspec import Option

ROOT = Path(__file__).resolve().parents[2]


def test_every_row_has_the_one_row_shape():
    for task, head in TASK_HEADS.items():
        module, _, attr = head.path.partition(":")
        assert module.startswith("edgekit.") and attr, task
        assert head.summary and all(isinstance(o, Option) for o in head.options), task
        assert head.option_names == tuple(o.name for o in head.options)


def test_every_plug_in_table_names_its_plug_ins_the_same_way():
    from edgekit.camera.table import SCHEMES
    from edgekit.runtime.registry import BACKENDS

    for row in (*TASK_HEADS.values(), *SCHEMES.values(), *BACKENDS.values()):
        assert ":" in row.path and hasattr(row, "install_hint") and hasattr(row, "summary"), row
    assert all(all(isinstance(o, Option) for o in s.options) for s in SCHEMES.values())


def test_the_rows_carry_the_heads_own_option_lists():
    from edgekit.detect.config import OPTIONS as DETECT
    from edgekit.heads import classify, raw

    assert TASK_HEADS["classify"].options is classify.OPTIONS
    assert TASK_HEADS["raw"].options is raw.OPTIONS
    assert TASK_HEADS["detect"].options is DETECT


def test_no_plug_in_imports_the_table():
    # the cycle check counts rows as edges; this says which modules may never name the table
    plugins = {head.path.partition(":")[0] for head in TASK_HEADS.values()}
    plugins |= {"edgekit.heads.tensors", "edgekit.heads.options", "edgekit.detect.config", "edgekit.detect.scores",
                "edgekit.detect.ssd", "edgekit.detect.yolo", "edgekit.detect.decoded", "edgekit.detect.postprocess"}
    for module in sorted(plugins):
        tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8"))
        named = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "edgekit.heads.table" not in named, module


@pytest.mark.parametrize("task, options, message, fix", [
    ("classify", {"topk": 3}, "task 'classify' has no option 'topk'", "did you mean 'top_k'?"),
    ("raw", {"tensor": True}, "task 'raw' has no option 'tensor'", "did you mean 'tensors'?"),
    ("detect", {"iou": 0.5}, "task 'detect' has no option 'iou'", "detect accepts: layout, score_threshold"),
    ("classify", {"k": 0}, "classify k must be a whole number of at least 1, not 0", "e.g. -T k=5"),
    ("raw", {"tensors": "yes"}, "raw tensors must be true or false, not 'yes'", "e.g. -T tensors=false"),
])
def test_option_errors_are_one_line_with_a_fix(task, options, message, fix):
    with pytest.raises(UsageError) as err:
        make_decoder(task, **options)
    assert err.value.message == message and err.value.hint.startswith(fix)
