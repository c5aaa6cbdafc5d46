"""A test that asserts on wall-clock time is marked ``slow``: on a loaded machine (CI's is a busy
2-core one) it is the only kind of test that can fail without a bug, so ``make test-fast``
(``-m "not slow"``) must hold none. A timeout on a wait (``assert time.monotonic() < deadline``)
is no speed claim and stays fast."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
CLOCKS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns"}


def _reads_clock(node: ast.AST, names: set[str]) -> bool:
    for n in ast.walk(node):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in CLOCKS
                and isinstance(n.func.value, ast.Name) and n.func.value.id == "time"):
            return True
        if isinstance(n, ast.Name) and n.id in names:
            return True
    return False


def _clock_names(func: ast.FunctionDef) -> set[str]:
    """Names bound to a clock reading, directly or through another (t0, then elapsed = ... - t0)."""
    names: set[str] = set()
    while True:
        found = {t.id for node in ast.walk(func) if isinstance(node, ast.Assign) and _reads_clock(node.value, names)
                 for target in node.targets for t in ast.walk(target)
                 if isinstance(t, ast.Name) and "deadline" not in t.id}
        if found <= names:
            return names
        names |= found


def asserts_on_time(func: ast.FunctionDef) -> bool:
    """Whether an assert of ``func`` compares a clock reading (a deadline comparison excepted)."""
    names = _clock_names(func)
    for node in ast.walk(func):
        if not isinstance(node, ast.Assert):
            continue
        for cmp in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
            sides = [cmp.left, *cmp.comparators]
            if not any("deadline" in ast.unparse(s) for s in sides) and any(_reads_clock(s, names) for s in sides):
                return True
    return False


def _marked_slow(decorators: list[ast.expr]) -> bool:
    return any("slow" in ast.unparse(d) for d in decorators)


def _module_slow(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)
               and "slow" in ast.unparse(node.value) for node in tree.body)


def test_every_test_that_asserts_on_wall_clock_time_is_marked_slow():
    unmarked, timed = [], 0
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")):
            if asserts_on_time(func):
                timed += 1
                if not (_module_slow(tree) or _marked_slow(func.decorator_list)):
                    unmarked.append(f"{path.relative_to(TESTS)}::{func.name}")
    assert timed > 10  # the rule must see the timed tests it guards
    assert unmarked == [], "mark them @pytest.mark.slow (with slack in the bound)"


def test_the_rule_tells_a_speed_claim_from_a_timeout():
    def parse(src: str) -> ast.FunctionDef:
        return ast.parse(src).body[0]

    assert asserts_on_time(parse("def test_a():\n    t0 = time.monotonic()\n    f()\n"
                                 "    assert time.monotonic() - t0 < 1\n"))
    assert asserts_on_time(parse("def test_b():\n    t0 = time.perf_counter()\n    elapsed = time.perf_counter() - t0\n"
                                 "    assert elapsed < 2.0\n"))
    assert not asserts_on_time(parse("def test_c():\n    deadline = time.monotonic() + 5\n"
                                     "    while x():\n        assert time.monotonic() < deadline\n"))
    assert not asserts_on_time(parse("def test_d():\n    assert f() == 3\n"))
