"""The suite's own contract: a case hears edgekit's log records through caplog whatever ran before
it on the same worker, including a module-scoped fixture that set the logger up as the command line
does (level from -q, a stderr handler, propagate off). CI of stop 44 lost six cases to this."""

from __future__ import annotations

import argparse
import logging

import pytest

from edgekit.util.logs import log_to_stderr


@pytest.fixture(scope="module")
def a_quiet_command_ran_in_a_module_fixture():
    log_to_stderr(argparse.Namespace(quiet=True, verbose=0))
    return logging.getLogger("edgekit")


def test_a_case_after_a_module_fixture_set_up_the_cli_logger_still_hears_warnings(
    a_quiet_command_ran_in_a_module_fixture, caplog
):
    logging.getLogger("edgekit.some.module").warning("a warning a test waits for")
    assert [r.getMessage() for r in caplog.records] == ["a warning a test waits for"]


def test_the_next_case_starts_from_a_fresh_processs_logger(a_quiet_command_ran_in_a_module_fixture):
    logger = a_quiet_command_ran_in_a_module_fixture
    assert (logger.level, logger.handlers, logger.propagate) == (logging.NOTSET, [], True)
