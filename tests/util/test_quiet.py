"""edgekit/util/quiet.py: native chatter on fd 2 is caught and logged; our own log lines, from any
thread, are never caught and re-labelled."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import logging, os, sys, threading, time
    from edgekit.util.quiet import native_stderr_to_log

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


def test_converter_chatter_goes_to_debug_and_errors_stay_warnings():
    import logging

    from edgekit.util.quiet import converter_level

    assert converter_level("fully_quantize: 0, inference_type: 6, input_inference_type: UINT8") == logging.DEBUG
    assert converter_level("W0000 00:00:1700000000.0 123 tf_tfl_flatbuffer_helpers.cc:365] Ignored output_format.") \
        == logging.DEBUG
    for line in ("E0000 00:00 failed to legalize op", "error: 'tf.Foo' op is neither a custom op nor a flex op",
                 "ValueError: bad", "Check failed: x == y"):
        assert converter_level(line) == logging.WARNING


def test_a_python_write_inside_the_block_still_reaches_the_screen():
    script = textwrap.dedent("""
        import logging, os, sys
        from edgekit.util.quiet import converter_level, native_stderr_to_log
        with native_stderr_to_log(logging.getLogger("x"), converter_level):
            print("progress 50%", file=sys.stderr)
            os.write(2, b"fully_quantize: 0\\n")
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stderr.splitlines() == ["progress 50%"]


def test_calibration_images_already_shaped_like_the_crop_are_not_called_undersized():
    import numpy as np

    from edgekit.builders.sources.images import _count_undersized

    counts: dict[str, int] = {}
    _count_undersized(np.zeros((28, 28), np.uint8), (200, 200), counts)  # a dataset item: the crop, smaller
    _count_undersized(np.zeros((90, 160), np.uint8), (200, 200), counts)  # a small frame: cut differently
    _count_undersized(np.zeros((360, 640), np.uint8), (200, 200), counts)  # a camera frame
    assert counts == {"crop_shaped": 1, "under_crop": 1}


def test_crop_shaped_images_beside_camera_frames_are_an_info_line_alone_a_warning():
    from edgekit.builders.sources.images import _warn_undersized

    class Drawn:  # what _warn_undersized reads of an ImageSet: its size and its counts
        def __init__(self, counts, n):
            self.undersized, self.n = dict(counts), n

        def __len__(self):
            return self.n

    class Log:
        def __init__(self):
            self.kinds = []

        def info(self, msg):
            self.kinds.append("info")

        def warn(self, msg):
            self.kinds.append("warn")

    def said(counts, n):
        log = Log()
        _warn_undersized(Drawn(counts, n), (200, 200), log)
        return log.kinds

    assert said({"crop_shaped": 400}, 464) == ["info"]  # make demo: items beside 64 camera frames
    assert said({"crop_shaped": 400}, 400) == ["warn"]  # nothing fills the crop: say so
