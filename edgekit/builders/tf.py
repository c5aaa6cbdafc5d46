"""TensorFlow for the build side: imported on first use with its C++ log level set, the logger its
native lines go to, and its converter's errors in plain words. The bottom room of builders/: every
stage that touches TensorFlow takes it from here."""

from __future__ import annotations

import logging
import os
import sys

NATIVE_LOG = logging.getLogger("edgekit.builders.native")
"""TensorFlow's converter and quantiser write to fd 2 from C++; their lines go here (DEBUG: -vv)."""


def import_tf():
    """TensorFlow, imported on first use (BackendUnavailable with the install hint when missing).

    The import's native lines go to :data:`NATIVE_LOG`: absl writes what comes before its
    ``InitializeLog`` straight to fd 2 whatever ``TF_CPP_MIN_LOG_LEVEL`` says, so each build showed
    two "I0000 ... port.cc:153] oneDNN custom operations are on" lines."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    from edgekit.util.quiet import converter_level, native_stderr_to_log

    try:
        with native_stderr_to_log(NATIVE_LOG, converter_level):
            import tensorflow as tf
    except ImportError as exc:
        from edgekit.errors import BackendUnavailable

        raise BackendUnavailable("building needs TensorFlow", "pip install 'edgekit-vision[build]'") from exc
    return tf


def converter_error(text: str) -> str:
    """What a TFLite converter error says in plain words: the ops it could not map, else the first
    ``'tf.Op' op ...`` diagnostic, else its first line (at most 300 characters).

    The converter's text opens with MLIR source locations (``loc(callsite(fused[...]))``) that name
    nothing a user recognises; the op list comes further down.
    """
    import re

    ops = re.search(r"^(Custom|Flex) ops: (.+)$", text, re.MULTILINE)
    if ops:
        kind = "as custom ops" if ops.group(1) == "Custom" else "as TensorFlow (flex) ops"
        return f"no TFLite builtin kernel for {ops.group(2).strip()[:200]} (the converter would need them {kind})"
    op = re.search(r"'(tf\.\w+)' op ([^\n]+)", text)
    if op:
        return f"{op.group(1)} {op.group(2).strip()}"[:300]
    lines = text.strip().splitlines()
    return lines[0][:300] if lines else ""
