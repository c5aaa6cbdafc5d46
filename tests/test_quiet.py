"""edgekit/quiet.py: native chatter on fd 2 is caught and logged; our own log lines, from any
thread, are never caught and re-labelled."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import logging, os, sys, threading, time
    from edgekit.quiet import native_stderr_to_log

    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("edgekit.serve")
    inside = threading.Event()

    def daemon_thread():
        inside.wait()
        log.info("frame 1 published")  # another thread, while fd 2 is redirected

    t = threading.Thread(target=daemon_thread)
    t.start()
    with native_stderr_to_log(logging.getLogger("edgekit.runtime")):
        os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\\n")
        os.write(2, b"E0000 native error line\\n")
        inside.set()
        time.sleep(0.3)  # the other thread's log call waits for the block to end
    t.join()
""")


def test_another_threads_log_line_is_not_caught_while_native_stderr_is_redirected():
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert lines.count("INFO edgekit.serve: frame 1 published") == 1
    assert not [line for line in lines if "frame 1" in line and line.startswith("WARNING")]
    assert "WARNING edgekit.runtime: E0000 native error line" in lines  # native errors still seen
    assert not [line for line in lines if "XNNPACK delegate" in line]  # INFO chatter at DEBUG: hidden
