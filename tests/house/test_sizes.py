"""The house's size limits: no module of edgekit over 400 lines, no function of edgekit or robot over 60.

Small modules with one idea each are what make the rooms readable; this keeps them that way.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "edgekit"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def test_no_module_over_400_lines():
    big = [f"{p.relative_to(PACKAGE.parent)}: {n}" for p in sorted(PACKAGE.rglob("*.py"))
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]
    assert big == []


def test_no_function_over_60_lines():
    long = []
    for path in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "robot").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}(): {n}")
    assert long == []


MAX_PARAMETERS = 12


def test_no_public_function_takes_more_than_12_parameters():
    """A long parameter list is a request that wants a type (the build's: builders/request.py)."""
    import ast

    long = []
    for path in sorted((ROOT / "edgekit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                a = node.args
                names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)] + [
                    x.arg for x in (a.vararg, a.kwarg) if x is not None]
                count = len([n for n in names if n not in ("self", "cls")])
                if count > MAX_PARAMETERS:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({count})")
    assert long == []
