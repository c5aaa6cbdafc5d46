"""Fault catalogue, cameras: bad URIs and options, through `edgekit run` in this process.

Each must be one line with a fix and exit 2 (a stream that refuses the connection: exit 1, a
runtime failure, see test_fault_exit_codes.py), quickly (no retrying forever, no MemoryError, no
cv2.error traceback on the first frame).
"""

from __future__ import annotations

import pytest

from tests.helpers.faults import assert_refused, edgekit

# Found by these cases, left to edgekit/camera/'s owner (the packaging helper is editing it):
# a MemoryError traceback for a huge synthetic size, and "" taken as the current directory.
CAMERA_OWNER = "edgekit/camera/ is being edited by another helper: reported, not fixed here"
KNOWN_CAMERA: set[str] = set()  # every case once reported here is fixed


def _run(capsys, bundle, uri: str, *options: str):
    opts = [f"-O{o}" for o in options]
    return edgekit(capsys, "run", str(bundle), "--camera", uri, *opts, "--max-frames", "2", "--quiet")


@pytest.mark.parametrize("uri,needle", [
    ("synthetic:320x240@-5", "synthetic"),
    ("synthetic:100000x100000", "synthetic"),
    ("synthetic:0x0", "size"),
    ("synthetic:axb", "synthetic"),
    ("synthetic:320x240@nan", "synthetic"),
    ("synthetic:-320x240", "synthetic"),
    ("nope:1", "camera"),
    ("", "camera"),
    ("   ", "camera"),
    ("v4l2:abc", "v4l2"),
    ("v4l2:", "v4l2"),
    ("picamera2:x", "picamera2"),
    ("file:/nonexistent/clip.mp4", "clip.mp4"),
    ("folder:/nonexistent/dir", "dir"),
    ("/nonexistent/clip.mp4", "clip.mp4"),
    ("vector:", "vector"),
])
def test_bad_camera_uri(capsys, cpu_bundle, uri, needle, request):
    if uri in KNOWN_CAMERA:
        request.applymarker(pytest.mark.xfail(reason=CAMERA_OWNER, strict=False))
    assert_refused(_run(capsys, cpu_bundle, uri), needle)


@pytest.mark.parametrize("options,needle", [
    (("bogus=1",), "bogus"),
    (("fps=-1",), "fps"),
    (("fps=abc",), "fps"),
    (("fps=inf",), "fps"),
    (("size=0x0",), "size"),
    (("size=100000x100000",), "size"),
    (("size=abc",), "size"),
    (("frames=-1",), "frames"),
    (("loop=maybe",), "loop"),
    (("timeout_s=0",), ""),
    (("novalue",), "novalue"),
    (("=1",), ""),
])
def test_bad_camera_option(capsys, cpu_bundle, options, needle, request):
    if set(options) & KNOWN_CAMERA:
        request.applymarker(pytest.mark.xfail(reason=CAMERA_OWNER, strict=False))
    assert_refused(_run(capsys, cpu_bundle, "synthetic:64x64", *options), needle)


def test_empty_image_folder(tmp_path, capsys, cpu_bundle):
    (tmp_path / "frames").mkdir()
    assert_refused(_run(capsys, cpu_bundle, f"folder:{tmp_path / 'frames'}"), "")


def test_folder_of_garbage_images(tmp_path, capsys, cpu_bundle):
    d = tmp_path / "frames"
    d.mkdir()
    for i in range(3):
        (d / f"{i}.png").write_bytes(b"not an image")
    assert_refused(_run(capsys, cpu_bundle, f"folder:{d}"), "")


@pytest.mark.parametrize("name,data", [("garbage.mp4", b"not a video" * 100), ("empty.mp4", b"")])
def test_unreadable_video(tmp_path, capsys, cpu_bundle, name, data):
    clip = tmp_path / name
    clip.write_bytes(data)
    assert_refused(_run(capsys, cpu_bundle, f"file:{clip}"), name)


def test_plain_file_that_is_not_a_video(tmp_path, capsys, cpu_bundle):
    f = tmp_path / "notes.txt"
    f.write_text("x")
    assert_refused(_run(capsys, cpu_bundle, str(f)), "notes.txt")


def test_stream_nobody_serves(capsys, cpu_bundle):
    """A refused TCP connection on loopback: an error within the open timeout, not a hang; exit 1
    (the URI is right, the stream is not there: a runtime failure, not a usage error)."""
    assert_refused(_run(capsys, cpu_bundle, "rtsp://127.0.0.1:9/none", "open_timeout_s=2"), "", code=1)


def test_ffmpegs_own_words_stay_off_the_screen_beside_our_error_line(cpu_bundle):
    """FFmpeg wrote '[tcp @ 0x...] Connection refused' straight to fd 2 next to edgekit's one line."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "edgekit.cli", "run", str(cpu_bundle), "--camera",
                          "rtsp://127.0.0.1:9/none", "-O", "open_timeout_s=2"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 1 and "cannot open" in run.stderr
    assert "tcp @" not in run.stderr and "Traceback" not in run.stderr
