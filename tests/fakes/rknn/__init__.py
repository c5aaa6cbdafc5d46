"""A fake ``rknn`` (RKNN-Toolkit2) package for the child-process protocol tests.

It is imported by the job scripts in a fake toolchain's interpreter (tests/toolchain/conftest.py),
never into edgekit's process. ``api.RKNN`` checks the order and arguments of the calls the real
toolkit takes and writes what the real one writes (the ``.rknn``, ``error_analysis.txt``);
``FAKE_RKNN_FAIL=<method>`` makes that call return -1, as the toolkit does on failure.
"""

__version__ = "2.5.0-fake"
