"""The tests mirror the package: a module's tests are found by its path, never by grep.

- every sub-package ``edgekit/<package>/`` has its folder ``tests/<package>/``, and every package
  inside one (``edgekit/builders/gate/``) its folder inside that (``tests/builders/gate/``);
- a test file directly in ``tests/`` belongs to a top-level module (``tests/test_<module>*.py``);
- no test file is named by history (``...2.py``) and no test folder but the house's own is left
  without a package of that name.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE, TESTS = ROOT / "edgekit", ROOT / "tests"
# folders of tests/ that are not edgekit sub-packages: the house rules, the robot demo and make's
# scripts (both outside the wheel), edgekit/deploy/ (data files), the fault catalogues that cross every
# area, shared helpers, recording fakes and fixture files
NOT_PACKAGES = {"house", "robot", "scripts", "deploy", "faults", "helpers", "fakes", "fixtures"}


def sub_packages() -> set[str]:
    return {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def nested_packages() -> list[Path]:
    return [p.parent.relative_to(PACKAGE) for p in PACKAGE.glob("*/*/__init__.py")]


def test_every_sub_package_has_its_test_folder():
    assert sorted(p for p in sub_packages() if not (TESTS / p).is_dir()) == []


def test_every_package_inside_a_sub_package_has_its_test_folder():
    nested = nested_packages()
    assert nested, "the rule must see the packages it checks"
    assert sorted(str(p) for p in nested if not (TESTS / p).is_dir()) == []


def test_a_test_folder_inside_a_package_folder_is_a_package_there():
    folders = [p.relative_to(TESTS) for p in TESTS.glob("*/*") if p.is_dir() and p.parent.name not in NOT_PACKAGES
               and not p.name.startswith((".", "__"))]
    assert sorted(str(f) for f in folders if not (PACKAGE / f / "__init__.py").exists()) == []


def test_every_test_folder_is_a_package_or_a_named_exception():
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert sorted(folders - sub_packages() - NOT_PACKAGES) == []


def test_a_flat_test_file_belongs_to_a_top_level_module():
    top = {p.stem for p in PACKAGE.glob("*.py") if not p.name.startswith("_")}
    flat = [p.name for p in TESTS.glob("test_*.py")]
    assert flat, "the rule must see the flat files it checks"
    strays = [name for name in flat if not any(name == f"test_{m}.py" or name.startswith(f"test_{m}_") for m in top)]
    assert strays == []


def test_no_test_file_is_named_by_its_history():
    numbered = [str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py") if re.search(r"\d\.py$", p.name)]
    assert numbered == []
