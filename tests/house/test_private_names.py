"""No private name crosses a module: a ``_name`` of one edgekit module is neither imported by another
nor read through the module (``edit._opcode``). What another module needs is public, with a docstring.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def crossings(path: Path, root: Path = ROOT) -> list[str]:
    """Every private name of another edgekit module that ``path`` imports or reads."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules: dict[str, str] = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("edgekit"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.relative_to(root)}:{node.lineno} from {node.module} import {alias.name}")
                modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            modules.update({a.asname: a.name for a in node.names if a.name.startswith("edgekit") and a.asname})
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{path.relative_to(root)}:{node.lineno} {modules[node.value.id]}.{node.attr}")
    return found


def test_the_rule_sees_both_kinds_of_crossing(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from edgekit.a import _hidden\nfrom edgekit.b import edit\nedit._opcode(1)\nedit.public(2)\n")
    assert len(crossings(sample, tmp_path)) == 2


def test_no_private_name_crosses_a_module():
    bad = [line for path in sorted((ROOT / "edgekit").rglob("*.py")) for line in crossings(path)]
    assert bad == []
