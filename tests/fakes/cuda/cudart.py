"""Fake ``cuda.cudart``: the old import path, the same module as ``cuda.bindings.runtime``."""

import sys

from cuda.bindings import runtime as _runtime

sys.modules[__name__] = _runtime
