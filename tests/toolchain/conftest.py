"""The fake toolchain every test here runs its child processes in (tests/helpers/toolchains.py)."""

from tests.helpers.toolchains import fake_toolchain  # noqa: F401 - a fixture
