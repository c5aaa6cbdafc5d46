"""Camera sources: URIs, newest-frame semantics, pacing, and every way a camera fails.

Real OpenCV reads real video files (made here from scikit-image's bundled photos) and a
real HTTP MJPEG stream on 127.0.0.1; picamera2 is a fake module (tests/fakes/picamera2)
because the real one only imports on a Raspberry Pi.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import cv2
import numpy as np
import pytest
from skimage import data

from edgekit.camera import (
    PICAMERA2_TO_BGR,
    SCHEMES,
    CameraOptionError,
    Frame,
    FrameSource,
    ImageFolderSource,
    LatestFrameSource,
    OpenCVSource,
    Picamera2Source,
    Scheme,
    SyntheticSource,
    VideoFileSource,
    camera_uri_forms,
    open_camera,
    synthetic_frame,
)
from edgekit.camera.base import _Counters
from edgekit.camera.mailbox import FrameMailbox
from edgekit.camera.table import camera_value
from edgekit.errors import BackendUnavailable, CameraError, UsageError
from edgekit.metrics import fps as metrics_fps
from edgekit.util.optionspec import Option
from edgekit.util.plugins import resolve

FAKES = Path(__file__).parents[1] / "fakes"
W, H, FPS, N = 160, 120, 30, 60


def _scene() -> np.ndarray:
    return cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR)


def _clip_frames(n: int = N) -> list[np.ndarray]:
    """A camera panning across the astronaut photo."""
    img = _scene()
    return [cv2.resize(img[i * 2 : i * 2 + 360, i * 3 : i * 3 + 480], (W, H), interpolation=cv2.INTER_AREA)
            for i in range(n)]  # fmt: skip


def _write(path: Path, frames: list[np.ndarray], fourcc: str, fps: float) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, (W, H))
    assert writer.isOpened()
    for f in frames:
        writer.write(f)
    writer.release()
    return path


def _decode_all(path: Path) -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    out = []
    while True:
        ok, f = cap.read()
        if not ok:
            break
        out.append(f)
    cap.release()
    return out


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return _write(tmp_path_factory.mktemp("clip") / "clip.avi", _clip_frames(), "MJPG", FPS)


@pytest.fixture(scope="module")
def clip_frames(clip) -> list[np.ndarray]:
    frames = _decode_all(clip)
    assert len(frames) == N
    return frames


# ----------------------------------------------------------------------------------------------
# open_camera: URIs and options
# ----------------------------------------------------------------------------------------------


def test_uris_pick_the_right_source(clip, tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    cv2.imwrite(str(folder / "a.png"), _clip_frames(1)[0])
    cases = {
        f"file:{clip}": VideoFileSource,
        str(clip): VideoFileSource,
        f"folder:{folder}": ImageFolderSource,
        str(folder): ImageFolderSource,
        "synthetic": SyntheticSource,
        "synthetic:64x48@10": SyntheticSource,
    }
    for uri, cls in cases.items():
        with open_camera(uri) as cam:
            assert type(cam) is cls, uri
            assert isinstance(cam, FrameSource)
            frame = next(cam)
            assert isinstance(frame, Frame) and frame.array.dtype == np.uint8 and frame.index == 0
        assert cam.closed
    with open_camera("synthetic:64x48@10") as cam:
        assert next(cam).array.shape == (48, 64, 3)
        assert cam.stats()["nominal_fps"] == 10


@pytest.mark.parametrize(
    "uri, words",
    [
        ("foo:bar", "unknown camera"),
        ("missing.mp4", "no such video file"),
        ("file:missing.avi", "no such video file"),
        ("folder:/definitely/not/here", "no such folder"),
        ("v4l2:abc", "bad camera URI"),
        ("synthetic:big", "bad camera URI"),
        ("picamera2:x", "bad camera URI"),
        ("vector:", "bad camera URI"),
    ],
)
def test_bad_uris_raise_camera_error(uri, words):
    with pytest.raises(CameraError, match=words) as info:
        open_camera(uri)
    assert info.value.hint


def test_unknown_option_is_named(clip):
    with pytest.raises(UsageError, match="looop") as info:
        open_camera(str(clip), looop=True)
    assert "loop" in info.value.hint


def test_existing_non_video_file_and_undecodable_video(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(CameraError, match="not a video file"):
        open_camera(str(text))
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"not a video" * 100)
    with pytest.raises(CameraError, match="not a video OpenCV can read"):
        open_camera(str(junk))


# ----------------------------------------------------------------------------------------------
# The scheme table: URI forms, option names, types and ranges
# ----------------------------------------------------------------------------------------------


def test_unknown_scheme_error_lists_the_forms_from_the_table(monkeypatch):
    forms = camera_uri_forms()
    for form in ("v4l2:N", "v4l2:/dev/videoN", "N", "rtsp://...", "http(s)://...", "file:PATH", "PATH.mp4",
                 "folder:DIR", "DIR", "picamera2[:N]", "synthetic[:WxH[@FPS]]", "vector:SERIAL"):  # fmt: skip
        assert form in forms
    with pytest.raises(CameraError, match="unknown camera 'teapot:3'") as info:
        open_camera("teapot:3")
    assert info.value.hint == f"use one of: {' | '.join(forms)}"
    # A row added to the table is opened by it and shows up in the list (nothing else to edit).
    row = Scheme("pattern", "edgekit.camera.synthetic:open_synthetic", ("pattern[:WxH]",),
                 (Option("frames", "int", ge=0),), accepts=r"(\d+x\d+)?", bare=True)  # fmt: skip
    monkeypatch.setitem(SCHEMES, "pattern", row)
    assert camera_uri_forms()[-1] == "pattern[:WxH]"
    with open_camera("pattern:32x16", frames="2") as cam:
        assert [f.array.shape for f in cam] == [(16, 32, 3)] * 2
    with pytest.raises(CameraError, match="bad camera URI") as info:
        open_camera("pattern:big")
    assert info.value.hint == "write pattern[:WxH]"


@pytest.mark.parametrize("uri", ["synthetic", "v4l2:99", "http://127.0.0.1:1/x", "picamera2", "vector:00e20100"])
def test_unknown_option_key_names_the_key_and_lists_the_accepted_ones(uri):
    # Checked before anything is opened or imported: no camera, stream, picamera2 or SDK needed.
    with pytest.raises(UsageError, match="unknown camera option.* fsp") as info:
        open_camera(uri, fsp=15)
    assert isinstance(info.value, CameraError) and isinstance(info.value, CameraOptionError)
    scheme = next(s for s in SCHEMES.values() if s.name in uri or (s.name == "stream" and "://" in uri))
    assert info.value.hint == f"{scheme.name} takes: {', '.join(o.name for o in scheme.options)}"
    assert "timeout_s" in info.value.hint or "fps" in info.value.hint


def test_string_options_are_coerced_to_the_declared_types(tmp_path):
    with open_camera("synthetic", size="16x8", frames="3", loop="no") as cam:
        assert [f.array.shape for f in cam] == [(8, 16, 3)] * 3
    with open_camera("synthetic", fps="12.5", loop="1") as cam:
        stats = cam.stats()
    assert stats["nominal_fps"] == 12.5 and stats["paced"] is True and stats["loop"] is True
    folder = tmp_path / "imgs"
    folder.mkdir()
    cv2.imwrite(str(folder / "a.png"), _clip_frames(1)[0])
    with open_camera(str(folder), loop="TRUE") as cam:
        assert [next(cam).index for _ in range(3)] == [0, 1, 2]
    # Python values keep working, and None means "the source's default".
    with open_camera("synthetic:8x8", frames=2, loop=False, fps=None, size=[8, 8]) as cam:
        assert len(list(cam)) == 2


@pytest.mark.parametrize(
    "uri, options, words",
    [
        ("synthetic", {"fps": "fast"}, "option fps='fast' is not a number"),
        ("synthetic", {"fps": "0"}, "option fps='0' must be >=0.001"),
        ("synthetic", {"fps": -5}, "option fps=-5 must be >=0.001"),
        ("synthetic", {"fps": "nan"}, "option fps='nan' is not a number"),
        ("synthetic", {"loop": "maybe"}, "option loop='maybe' is not true or false"),
        ("synthetic", {"frames": "2.5"}, "option frames='2.5' is not a whole number"),
        ("synthetic", {"frames": True}, "option frames=True is not a whole number"),
        ("synthetic", {"frames": "-1"}, "option frames='-1' must be >=0"),
        ("synthetic", {"size": "64x"}, "option size='64x' is not a size"),
        ("v4l2:99", {"timeout_s": "0"}, "option timeout_s='0' must be >0"),
        ("v4l2:99", {"buffer_size": "0"}, "option buffer_size='0' must be >=1"),
        ("rtsp://u:secret@127.0.0.1:1/x", {"open_timeout_s": "-1"}, r"rtsp://\*\*\*@127.0.0.1:1/x: option open_"),
        ("vector:00e20100", {"backoff_s": "0.5,0"}, "option backoff_s='0.5,0' must be >0"),
        ("vector:00e20100", {"timeout_s": 1, "frame_timeout_s": 2}, "give frame_timeout_s or timeout_s, not both"),
    ],
)
def test_bad_option_values_are_one_line_errors_naming_the_key(uri, options, words):
    with pytest.raises(CameraOptionError, match=words) as info:
        open_camera(uri, **options)
    assert "\n" not in str(info.value) and "secret" not in str(info.value)
    assert info.value.hint


def test_option_types():
    assert Option("x", "bool").coerce("Yes") is True and Option("x", "bool").coerce("0") is False
    assert Option("x", "ints").coerce("1, 2,3") == [1, 2, 3]
    assert Option("x", "ints").coerce((4, 5)) == [4, 5]
    assert Option("x", "pair").coerce("0.5,8") == (0.5, 8.0)
    size = next(o for o in SCHEMES["synthetic"].options if o.name == "size")  # the one frame-size parser
    assert camera_value(size, " 640 x 480 ", "t") == (640, 480)
    assert Option("x", "float", gt=0).coerce(15) == 15.0
    assert Option("x", "path").coerce(Path("a")) == Path("a")
    assert Option("fps", "float", 5.0, gt=0).describe() == "fps=float>0 (default 5)"
    with pytest.raises(CameraOptionError, match="option x=3 is not a string"):
        camera_value(Option("x", "str"), 3, "t")


def _declared_defaults(obj) -> dict:
    params = inspect.signature(obj).parameters.values()
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def test_table_defaults_are_the_sources_defaults():
    """The table documents defaults the sources apply: they must not drift apart."""
    for scheme in SCHEMES.values():
        if scheme.name == "vector":
            continue  # below, against the module that defines it
        opener = resolve(scheme.opener)
        real = _declared_defaults(opener)
        cls = {"stream": OpenCVSource, "v4l2": OpenCVSource, "file": VideoFileSource,
               "picamera2": Picamera2Source, "synthetic": SyntheticSource}.get(scheme.name)  # fmt: skip
        if cls is not None:  # openers that pass options on take the class's defaults
            real = {**_declared_defaults(cls), **real}
        for option in scheme.options:
            assert option.name in real, (scheme.name, option.name)
            assert option.default == real[option.name], (scheme.name, option.name)


def test_vector_options_are_vector_sources():
    vector_camera = pytest.importorskip("edgekit.vector.camera")
    real = inspect.signature(vector_camera.VectorSource).parameters
    for option in SCHEMES["vector"].options:
        name = option.to or option.name
        assert name in real, name
        if option.to is None:
            want = real[name].default
            assert option.default == (want if want is not inspect.Parameter.empty else None), name


# ----------------------------------------------------------------------------------------------
# Video files
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow  # asserts on wall-clock time
def test_unpaced_file_delivers_every_frame_in_order_then_ends(clip, clip_frames):
    with open_camera(f"file:{clip}", pace=False) as cam:
        frames = list(cam)
        stats = cam.stats()
    assert [f.index for f in frames] == list(range(N))
    for got, want in zip(frames, clip_frames):
        np.testing.assert_array_equal(got.array, want)
    assert stats["captured"] == stats["delivered"] == N
    assert stats["skipped"] == stats["read_errors"] == 0
    assert stats["size"] == (W, H) and stats["frame_count"] == N
    # capture timestamps are real perf_counter_ns readings, increasing
    ts = [f.t_capture_ns for f in frames]
    assert ts == sorted(ts) and ts[-1] <= time.perf_counter_ns()


@pytest.mark.slow  # asserts on wall-clock time
def test_paced_file_runs_at_the_file_rate(clip):
    t0 = time.perf_counter()
    with open_camera(str(clip)) as cam:
        frames = [next(cam) for _ in range(10)]
        stats = cam.stats()
    elapsed = time.perf_counter() - t0
    assert elapsed >= 9 / FPS - 0.005  # never ahead of the clock
    # a fast consumer misses nothing on a quiet machine; on one running two suites the test's own thread
    # was once held past a frame's due time, and a paced source then rightly gives the newest due frame
    indices = [f.index for f in frames]
    missed = indices[-1] - (len(indices) - 1)
    assert indices[0] == 0 and np.all(np.diff(indices) >= 1) and missed <= 3, indices
    gaps = np.diff([f.t_capture_ns for f in frames])
    assert np.all(np.abs(gaps - np.diff(indices) * 1e9 / FPS) <= 1)  # capture time = each frame's due time
    assert stats["capture_fps"] == pytest.approx(FPS, rel=1e-6)
    assert stats["paced"] is True and stats["skipped"] == missed


@pytest.mark.slow  # asserts on wall-clock time
def test_paced_file_gives_a_slow_consumer_the_newest_frame(clip, clip_frames):
    """The consumer needs 3.5 frame periods per frame: it must get the newest due frame
    (index jumps of 3-4), never an old queued one, and the skips are counted."""
    work_s = 3.5 / FPS
    delivered = []
    with open_camera(str(clip)) as cam:
        for frame in cam:
            age_s = (time.perf_counter_ns() - frame.t_capture_ns) / 1e9
            delivered.append((frame, age_s))
            time.sleep(work_s)
        stats = cam.stats()
    indices = [f.index for f, _ in delivered]
    assert indices[0] == 0 and indices[-1] >= N - 4
    steps = np.diff(indices)
    assert np.all(steps >= 1)
    assert np.median(steps) >= 3
    # the frame was due less than one period (+ decode and scheduling slack) before it was
    # handed over: the newest frame, not a queued one
    ages = [age for _, age in delivered]
    assert np.median(ages) < 1 / FPS + 0.03 and max(ages) < 1 / FPS + 0.1  # a queue: 2.5 periods older per frame
    # skipped = the index gaps + the frames passed over at the end when the clip ran out
    assert stats["skipped"] == int(np.sum(steps - 1)) + (N - 1 - indices[-1]) > 0
    assert stats["captured"] == stats["delivered"] + stats["skipped"] == N
    # skipping without decoding must still land on the right frame
    for frame, _ in delivered:
        np.testing.assert_array_equal(frame.array, clip_frames[frame.index])


@pytest.mark.slow  # asserts on wall-clock time
def test_close_from_another_thread_ends_a_paced_wait(clip):
    cam = open_camera(str(clip), fps=0.5)  # next frame due in 2 s
    next(cam)
    threading.Timer(0.1, cam.close).start()
    t0 = time.monotonic()
    with pytest.raises(StopIteration):
        next(cam)
    assert time.monotonic() - t0 < 1


def test_file_loop_keeps_counting(clip, clip_frames):
    with open_camera(str(clip), pace=False, loop=True) as cam:
        frames = [next(cam) for _ in range(2 * N + 5)]
    assert [f.index for f in frames] == list(range(2 * N + 5))
    np.testing.assert_array_equal(frames[N].array, clip_frames[0])
    np.testing.assert_array_equal(frames[2 * N + 4].array, clip_frames[4])


@pytest.mark.slow  # asserts on wall-clock time
def test_fps_option_overrides_the_file_rate(clip):
    t0 = time.perf_counter()
    with open_camera(str(clip), fps=200) as cam:
        frames = [next(cam) for _ in range(20)]
    assert time.perf_counter() - t0 < 10 / FPS  # much faster than the file's 30 fps
    # the timestamps step by the asked-for 5 ms; a consumer slowed by a loaded machine gets the
    # newest frame, so a step may span several periods, never a fraction of one
    steps = np.diff([f.t_capture_ns for f in frames]) / 5e6
    assert np.all(steps >= 1) and np.all(np.abs(steps - np.round(steps)) <= 1e-6) and np.median(steps) == 1


def test_mp4v_mp4_by_path(tmp_path):
    path = _write(tmp_path / "clip.mp4", _clip_frames(20), "mp4v", 25)
    with open_camera(str(path), pace=False) as cam:
        frames = list(cam)
        assert cam.stats()["nominal_fps"] == 25
    assert len(frames) == 20 and frames[0].array.shape == (H, W, 3)


def test_truncated_file_ends_normally_and_counts_the_missing_frames(clip, tmp_path):
    raw = clip.read_bytes()
    cut = tmp_path / "cut.avi"
    cut.write_bytes(raw[: int(len(raw) * 0.6)])  # the index still claims 60 frames
    with open_camera(str(cut), pace=False) as cam:
        frames = list(cam)
        stats = cam.stats()
    assert 20 < len(frames) < N
    assert 0 < stats["read_errors"] <= 3
    assert [f.index for f in frames] == list(range(len(frames)))


def test_damaged_frames_in_a_file_do_not_crash(clip, tmp_path):
    """FFMPEG conceals damaged JPEG payloads (it decodes garbage and logs): the source must
    keep going and deliver every frame."""
    raw = bytearray(clip.read_bytes())
    starts = [i for i in range(len(raw) - 1) if raw[i] == 0xFF and raw[i + 1] == 0xD8]
    for k in (10, 11, 30):
        raw[starts[k] : starts[k] + 200] = bytes(200)
    bad = tmp_path / "bad.avi"
    bad.write_bytes(bytes(raw))
    with open_camera(str(bad), pace=False) as cam:
        frames = list(cam)
    assert len(frames) == N


def test_file_with_no_readable_frame_is_an_error(tmp_path, clip):
    raw = clip.read_bytes()
    head = tmp_path / "head.avi"
    head.write_bytes(raw[: raw.index(b"\xff\xd8") + 100])  # headers and a sliver of frame 0
    cam = open_camera(str(head), pace=False)
    with pytest.raises(CameraError, match="no readable frame"):
        list(cam)
    assert cam.closed


# ----------------------------------------------------------------------------------------------
# Image folders
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def folder(tmp_path) -> Path:
    d = tmp_path / "frames"
    d.mkdir()
    for i, f in enumerate(_clip_frames(12)):
        cv2.imwrite(str(d / f"frame_{i}.png"), f)  # frame_10 must come after frame_9
    (d / "frame_3.png").write_bytes(b"\x89PNG broken")
    jpg = cv2.imencode(".jpg", _clip_frames(1)[0])[1].tobytes()
    (d / "frame_5.jpg").write_bytes(jpg[: len(jpg) // 2])  # truncated JPEG
    (d / "frame_5.png").unlink()
    (d / "readme.txt").write_text("not an image")
    return d


def test_folder_natural_order_skips_corrupt_images(folder):
    frames_ref = _clip_frames(12)
    with open_camera(f"folder:{folder}") as cam:
        frames = list(cam)
        stats = cam.stats()
    assert [f.index for f in frames] == [0, 1, 2, 4, 6, 7, 8, 9, 10, 11]  # gaps where files are bad
    for f in frames:
        np.testing.assert_array_equal(f.array, frames_ref[f.index])
    assert stats["read_errors"] == 2 and stats["delivered"] == 10 and stats["frame_count"] == 12


@pytest.mark.slow  # asserts on wall-clock time
def test_folder_paced_and_looped(folder):
    t0 = time.perf_counter()
    with open_camera(str(folder), fps=100, loop=True) as cam:
        frames = [next(cam) for _ in range(20)]
    assert time.perf_counter() - t0 >= 0.19
    assert frames[-1].index > 12  # looped, index keeps counting


def test_empty_or_all_corrupt_folder(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CameraError, match="no images"):
        open_camera(str(empty))
    bad = tmp_path / "bad"
    bad.mkdir()
    for i in range(3):
        (bad / f"{i}.png").write_bytes(b"garbage")
    with pytest.raises(CameraError, match="no readable frame"), open_camera(str(bad), loop=True) as cam:
        next(cam)  # loops over nothing but errors: must stop, not spin


# ----------------------------------------------------------------------------------------------
# Synthetic pattern
# ----------------------------------------------------------------------------------------------


def test_synthetic_is_deterministic_and_moves():
    with open_camera("synthetic:96x64", frames=30) as cam:
        frames = list(cam)
    assert len(frames) == 30
    for f in frames[::7]:
        np.testing.assert_array_equal(f.array, synthetic_frame(f.index, 96, 64))
    assert np.abs(frames[0].array.astype(int) - frames[10].array).mean() > 5


def test_synthetic_paced_slow_consumer_gets_newest():
    with open_camera("synthetic:64x48@200") as cam:
        frames = []
        for _ in range(8):
            frames.append(next(cam))
            time.sleep(0.02)  # 4 frame periods
        stats = cam.stats()
    steps = np.diff([f.index for f in frames])
    assert np.median(steps) >= 3 and stats["skipped"] == int(np.sum(steps - 1))
    for f in frames:
        np.testing.assert_array_equal(f.array, synthetic_frame(f.index, 64, 48))


# ----------------------------------------------------------------------------------------------
# Live sources: grabber thread, OpenCV
# ----------------------------------------------------------------------------------------------


class RateCapture:
    """A real cv2.VideoCapture on a clip, looped and slowed to a camera's frame rate."""

    def __init__(self, path, fps):
        self.path, self.period = str(path), 1.0 / fps
        self.cap = cv2.VideoCapture(self.path, cv2.CAP_FFMPEG)
        self.next_t = time.perf_counter()
        self.released = threading.Event()

    def isOpened(self):
        return self.cap.isOpened()

    def read(self):
        self.next_t += self.period
        time.sleep(max(0.0, self.next_t - time.perf_counter()))
        ok, frame = self.cap.read()
        if not ok:
            self.cap.release()
            self.cap = cv2.VideoCapture(self.path, cv2.CAP_FFMPEG)
            ok, frame = self.cap.read()
        return ok, frame

    def release(self):
        self.cap.release()
        self.released.set()


@pytest.mark.slow  # asserts on wall-clock time
def test_grabber_keeps_only_the_newest_frame(clip):
    """Camera at 200 fps, consumer at ~40 fps: each frame handed over is at most about one
    camera period old, the indices jump, the skips are counted, and nothing piles up."""
    cap = RateCapture(clip, fps=200)
    ages, indices = [], []
    with OpenCVSource(cap, name="ratecam") as cam:
        for frame in cam:
            ages.append((time.perf_counter_ns() - frame.t_capture_ns) / 1e9)
            indices.append(frame.index)
            if len(indices) == 15:
                break
            time.sleep(0.025)
        stats = cam.stats()
    assert cap.released.wait(2)  # the grabber released the capture on its own thread
    steps = np.diff(indices)
    assert np.all(steps >= 1) and np.median(steps) >= 3
    # every frame between two handed over was skipped; frames the camera made after the last one
    # handed over may be counted too (the grabber runs on until stats() is read: a clean-clone run
    # beside another suite counted 67 against 66)
    between = int(np.sum(steps - 1))
    assert stats["captured"] >= indices[-1] + 1
    assert between <= stats["skipped"] <= between + stats["captured"] - 1 - indices[-1]
    # newest, not queued: age stays around one camera period and does not grow (generous bounds:
    # a queue would age each frame ~20 ms more than the last, ~0.14 s at the median, ~0.25 s at the end)
    assert np.median(ages) < 0.05 and max(ages[-5:]) < 0.1
    assert stats["capture_fps"] == pytest.approx(200, rel=0.3)


@pytest.mark.slow  # asserts on wall-clock time
def test_opencv_source_on_a_plain_file(clip, clip_frames):
    """Any OpenCV-openable source goes through the same grabber; index = capture number."""
    with OpenCVSource(str(clip), api=cv2.CAP_FFMPEG, timeout_s=0.3) as cam:
        frame = next(cam)
        np.testing.assert_array_equal(frame.array, clip_frames[frame.index])
        assert cam.stats()["backend"] == "FFMPEG" and cam.stats()["nominal_fps"] == FPS
        # the file ends: for a live source that is a camera that stopped
        t0 = time.monotonic()
        with pytest.raises(CameraError, match="stopped delivering"):
            while True:
                f = next(cam)
                np.testing.assert_array_equal(f.array, clip_frames[f.index])
        assert time.monotonic() - t0 < 2
        assert cam.stats()["read_errors"] > 0


class StopsAfter:
    """Delivers n frames of a real clip, then reads fail (camera unplugged) or block (a hung
    driver or network stream) until released."""

    def __init__(self, path, n, mode):
        self.cap = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
        self.n, self.mode, self.count = n, mode, 0
        self.unblock = threading.Event()
        self.released = threading.Event()

    def read(self):
        if self.count >= self.n:
            if self.mode == "block":
                self.unblock.wait()
            return False, None
        self.count += 1
        time.sleep(0.005)
        return self.cap.read()

    def release(self):
        self.cap.release()
        self.released.set()


@pytest.mark.slow  # asserts on wall-clock time
@pytest.mark.parametrize("mode", ["fail", "block"])
def test_camera_that_stops_mid_run_raises_not_hangs(clip, mode):
    cap = StopsAfter(clip, 5, mode)
    cam = OpenCVSource(cap, name="usbcam", timeout_s=0.3)
    got = 0
    t0 = time.monotonic()
    with pytest.raises(CameraError, match="usbcam: camera stopped delivering frames") as info:
        for _ in cam:
            got += 1
    assert 1 <= got <= 5 and time.monotonic() - t0 < 2
    assert info.value.hint
    t1 = time.monotonic()
    cam.close()
    assert time.monotonic() - t1 < 1.5  # close never hangs, even with a read stuck inside
    with pytest.raises(StopIteration):
        next(cam)
    if mode == "block":
        assert not cap.released.is_set()  # still inside read(); released when it returns
        cap.unblock.set()
    assert cap.released.wait(2)


def test_corrupt_reads_are_counted_and_skipped(clip_frames):
    script = [(True, clip_frames[0]), (True, None), (False, None), "raise", (True, np.empty((0, 0, 3), np.uint8)),
              (True, clip_frames[1])]  # fmt: skip
    step = iter(range(10**6))

    def read():
        i = next(step)
        time.sleep(0.002)
        item = script[i] if i < len(script) else (True, clip_frames[2])
        if item == "raise":
            raise cv2.error("corrupt JPEG data")
        return item

    with LatestFrameSource(read, name="flaky") as cam:
        seen = []
        while len(seen) < 3:
            f = next(cam)
            seen.append(f.array)
            time.sleep(0.01)
        stats = cam.stats()
    assert stats["read_errors"] == 4
    np.testing.assert_array_equal(seen[-1], clip_frames[2])


@pytest.mark.slow  # asserts on wall-clock time
def test_a_crashing_grabber_is_reported_at_once():
    """A bug in a read function (not a bad frame) must surface, not look like a slow camera."""

    class Boom(BaseException):
        pass

    def read():
        raise Boom("bug in read()")

    cam = LatestFrameSource(read, name="buggy", open_timeout_s=5)
    t0 = time.monotonic()
    with pytest.raises(CameraError, match=r"buggy: frame grabber failed \(Boom: bug in read\(\)\)"):
        next(cam)
    assert time.monotonic() - t0 < 1
    cam.close()


@pytest.mark.slow  # asserts on wall-clock time
def test_frame_mailbox_keeps_the_newest_and_close_is_sticky():
    box = FrameMailbox()
    assert box.put("a") is False and box.put("b") is True  # "a" was replaced untaken
    assert box.take(0) == "b" and box.take(0) is None
    threading.Timer(0.05, box.wake).start()
    t0 = time.monotonic()
    assert box.take(5) is None and time.monotonic() - t0 < 1  # wake releases a waiting take
    box.put("c")
    box.close()
    assert box.closed and box.take(5) == "c"  # a frame put before close can still be taken
    t0 = time.monotonic()
    assert box.take(5) is None and time.monotonic() - t0 < 1  # closed and empty: no 5 s wait


def test_every_source_names_its_frames(clip, tmp_path, monkeypatch):
    """An image by its path as the folder was given, a clip by its path, a camera by its name."""
    monkeypatch.chdir(tmp_path)
    Path("imgs").mkdir()
    for name in ("b10.png", "b2.png"):
        cv2.imwrite(f"imgs/{name}", np.zeros((4, 4, 3), np.uint8))
    with ImageFolderSource("imgs") as folder:
        assert [f.source for f in folder] == ["imgs/b2.png", "imgs/b10.png"]
    with VideoFileSource(clip, pace=False) as video:
        assert {next(video).source for _ in range(3)} == {str(clip)}
    with SyntheticSource((32, 24), frames=1) as synthetic:
        assert next(synthetic).source == "synthetic:32x24"
    with LatestFrameSource(lambda: (True, np.zeros((2, 2), np.uint8)), name="rtsp://***@cam/1") as live:
        assert next(iter(live)).source == "rtsp://***@cam/1"  # the name open_camera gives it: redacted


def test_live_source_goes_through_the_frame_mailbox_and_counts_every_frame():
    ticks = iter(range(10**6))

    def read():
        time.sleep(0.001)
        return True, np.full((2, 2), next(ticks) % 256, np.uint8)

    with LatestFrameSource(read, name="counter") as cam:
        assert isinstance(cam._mailbox, FrameMailbox)
        frames = []
        for frame in cam:
            frames.append(frame)
            time.sleep(0.01)
            if len(frames) == 5:
                break
    cam._thread.join(2)
    stats = cam.stats()
    assert [f.array[0, 0] for f in frames] == [f.index % 256 for f in frames]
    assert stats["delivered"] == 5 and stats["skipped"] == frames[-1].index - 4
    # at most one frame captured after the last delivery is neither delivered nor skipped
    assert stats["captured"] - stats["delivered"] - stats["skipped"] >= 0


def test_capture_fps_uses_the_metrics_formula():
    counters = _Counters()
    assert counters.snapshot()["capture_fps"] is None
    stamps = [0, 10_000_000, 30_000_000, 40_000_000]  # 4 frames, 3 intervals over 40 ms
    for t in stamps:
        counters.on_capture(t)
    assert counters.snapshot()["capture_fps"] == pytest.approx(metrics_fps(stamps)) == pytest.approx(75.0)


@pytest.mark.slow  # asserts on wall-clock time
def test_a_grabber_crashing_after_a_frame_delivers_it_then_reports_at_once():
    class Boom(BaseException):
        pass

    calls = iter(range(10))

    def read():
        if next(calls) == 0:
            return True, np.zeros((2, 2), np.uint8)
        raise Boom("late bug")

    cam = LatestFrameSource(read, name="late", open_timeout_s=5, timeout_s=5)
    assert next(cam).index == 0
    t0 = time.monotonic()
    with pytest.raises(CameraError, match="late: frame grabber failed"):
        next(cam)
    assert time.monotonic() - t0 < 1
    cam.close()


@pytest.mark.slow  # asserts on wall-clock time
def test_first_frame_timeout(clip):
    cam = LatestFrameSource(lambda: (False, None), name="silent", open_timeout_s=0.2)
    t0 = time.monotonic()
    with pytest.raises(CameraError, match="silent: opened but delivered no frame within 0.2 s"):
        next(cam)
    assert time.monotonic() - t0 < 1
    cam.close()


@pytest.mark.slow  # asserts on wall-clock time
def test_close_wakes_a_waiting_consumer():
    gate = threading.Event()
    cam = LatestFrameSource(lambda: (gate.wait(5), None), name="waiting", open_timeout_s=5)
    threading.Timer(0.1, cam.close).start()
    t0 = time.monotonic()
    assert list(cam) == []
    assert time.monotonic() - t0 < 1
    gate.set()


@pytest.mark.slow  # asserts on wall-clock time
def test_missing_v4l2_device_fails_fast():
    t0 = time.monotonic()
    with pytest.raises(CameraError, match="v4l2:99: cannot open") as info:
        open_camera("v4l2:99")
    assert time.monotonic() - t0 < 1
    assert "/dev/video" in info.value.hint
    with pytest.raises(CameraError, match="v4l2:98"):
        open_camera(98)


@pytest.mark.hardware
@pytest.mark.skipif(not Path("/dev/video0").exists(), reason="needs a USB/V4L2 camera at /dev/video0")
def test_real_usb_camera():
    with open_camera("v4l2:0", size=(640, 480), fps=30) as cam:
        frames = [next(cam) for _ in range(30)]
        stats = cam.stats()
    assert frames[0].array.ndim == 3 and stats["delivered"] == 30 and stats["capture_fps"] > 5


# ----------------------------------------------------------------------------------------------
# Network streams: a real MJPEG-over-HTTP server on 127.0.0.1 (what IP cameras serve)
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def mjpeg_server():
    jpeg = cv2.imencode(".jpg", _clip_frames(1)[0], [cv2.IMWRITE_JPEG_QUALITY, 95])[1].tobytes()
    stall = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
            self.end_headers()
            try:
                for i in range(400):
                    if i == 25:
                        stall.wait(10)  # the camera freezes with the connection still open
                        return
                    head = b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n" % len(jpeg)
                    self.wfile.write(head + jpeg + b"\r\n")
                    time.sleep(0.01)
            except OSError:
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], jpeg
    stall.set()
    server.shutdown()
    server.server_close()


@pytest.mark.slow  # asserts on wall-clock time
def test_http_mjpeg_stream_then_stall(mjpeg_server):
    port, jpeg = mjpeg_server
    want = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    uri = f"http://user:secret@127.0.0.1:{port}/stream.mjpg"
    with open_camera(uri, timeout_s=0.5) as cam:
        assert "secret" not in cam.name and "secret" not in str(cam.stats())
        frames = [next(cam) for _ in range(5)]
        # FFMPEG's JPEG decoder rounds differently from libjpeg: near-equal, not equal
        assert np.abs(frames[-1].array.astype(int) - want).mean() < 3
        t0 = time.monotonic()
        with pytest.raises(CameraError, match="stopped delivering"):
            for _ in cam:
                pass
        assert time.monotonic() - t0 < 3


@pytest.mark.slow  # asserts on wall-clock time
def test_unreachable_streams_fail_fast():
    for uri in ("http://127.0.0.1:1/stream.mjpg", "rtsp://127.0.0.1:1/live"):
        t0 = time.monotonic()
        with pytest.raises(CameraError, match="cannot open"):
            open_camera(uri, open_timeout_s=1)
        assert time.monotonic() - t0 < 2


# ----------------------------------------------------------------------------------------------
# picamera2 (fake module at the import boundary)
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def fake_picamera2(monkeypatch):
    monkeypatch.syspath_prepend(str(FAKES))
    monkeypatch.delitem(sys.modules, "picamera2", raising=False)
    import picamera2

    picamera2.reset()
    picamera2.SCENE = cv2.cvtColor(data.coffee(), cv2.COLOR_RGB2BGR)
    yield picamera2
    picamera2.reset()
    sys.modules.pop("picamera2", None)


def _calls(fake, name):
    return [c for c in fake.CALLS if c[0] == name]


@pytest.mark.parametrize("fmt", ["RGB888", "BGR888", "XRGB8888", "XBGR8888"])
def test_picamera2_channel_order_gives_opencv_bgr(fake_picamera2, fmt):
    want = cv2.resize(fake_picamera2.SCENE, (224, 160), interpolation=cv2.INTER_AREA)
    with open_camera("picamera2", size=(224, 160), format=fmt) as cam:
        frame = next(cam)
    np.testing.assert_array_equal(frame.array, want)  # exactly BGR, whatever the byte order
    (config,) = _calls(fake_picamera2, "create_video_configuration")
    assert config[1]["main"] == {"format": fmt, "size": (224, 160)} and config[1]["lores"] is None
    assert config[1]["queue"] is False
    assert ("capture_array", "main", False) in fake_picamera2.CALLS


def test_picamera2_table_covers_the_documented_orders():
    bgr = np.array([[[10, 20, 30]]], np.uint8)  # B=10 G=20 R=30
    assert PICAMERA2_TO_BGR["RGB888"](bgr).tolist() == [[[10, 20, 30]]]
    assert PICAMERA2_TO_BGR["BGR888"](bgr[..., ::-1].copy()).tolist() == [[[10, 20, 30]]]
    assert PICAMERA2_TO_BGR["XRGB8888"](np.array([[[10, 20, 30, 255]]], np.uint8)).tolist() == [[[10, 20, 30]]]
    assert PICAMERA2_TO_BGR["XBGR8888"](np.array([[[30, 20, 10, 255]]], np.uint8)).tolist() == [[[10, 20, 30]]]


def test_picamera2_lores_stream_at_model_size(fake_picamera2):
    """main at 1280x720 for the user, lores YUV420 at the model size (200 is not a multiple
    of 64: the stride padding must be stripped) delivered as BGR."""
    want = cv2.resize(fake_picamera2.SCENE, (200, 150), interpolation=cv2.INTER_AREA)
    with open_camera("picamera2:0", size="200x150", main_size=(1280, 720), fps=50) as cam:
        frames = [next(cam) for _ in range(3)]
        stats = cam.stats()
    assert frames[-1].array.shape == (150, 200, 3)
    assert np.abs(frames[-1].array.astype(int) - want).mean() < 3  # YUV 4:2:0 round trip
    (config,) = _calls(fake_picamera2, "create_video_configuration")
    assert config[1]["main"] == {"size": (1280, 720), "format": "RGB888"}
    assert config[1]["lores"] == {"size": (200, 150), "format": "YUV420"}
    assert config[1]["controls"] == {"FrameRate": 50.0}
    assert ("capture_array", "lores", False) in fake_picamera2.CALLS
    assert stats["stream"] == "lores" and stats["size"] == (200, 150)
    order = [c[0] for c in fake_picamera2.CALLS if c[0] != "capture_array"]
    assert order == ["__init__", "create_video_configuration", "configure", "start", "stop", "close"]


def test_picamera2_default_size_comes_from_the_configuration(fake_picamera2):
    with open_camera("picamera2") as cam:
        assert next(cam).array.shape == (480, 640, 3)
    with open_camera("picamera2", main_size=(320, 240)) as cam:  # main_size alone: main at that size
        assert next(cam).array.shape == (240, 320, 3)


def test_picamera2_errors(fake_picamera2):
    with pytest.raises(CameraError, match=r"picamera2:3: cannot open \(IndexError") as info:
        open_camera("picamera2:3")
    assert "rpicam-hello" in info.value.hint
    with pytest.raises(CameraError, match="unsupported format"):
        open_camera("picamera2", format="NV12")
    with pytest.raises(CameraError, match="cannot configure"):
        open_camera("picamera2", size=(1920, 1080), main_size=(640, 480))  # lores larger than main
    assert fake_picamera2.INSTANCES[-1].closed  # a failed configure still closes the camera


@pytest.mark.slow  # asserts on wall-clock time
def test_picamera2_that_stops_mid_run(fake_picamera2):
    fake_picamera2.HANG_AFTER = 3
    cam = Picamera2Source(0, size=(64, 48), timeout_s=0.3)
    with pytest.raises(CameraError, match="stopped delivering"):
        for _ in cam:
            pass
    t0 = time.monotonic()
    cam.close()
    assert time.monotonic() - t0 < 1.5
    cam._thread.join(2)
    assert fake_picamera2.INSTANCES[0].closed


def test_picamera2_missing_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "picamera2", None)  # import fails like on a non-Pi
    with pytest.raises(BackendUnavailable) as info:
        open_camera("picamera2")
    assert "apt install python3-picamera2" in info.value.hint


# ----------------------------------------------------------------------------------------------
# Vector: resolved lazily, constructed as VectorSource(serial, **options)
# ----------------------------------------------------------------------------------------------


def test_vector_source_is_resolved_lazily(monkeypatch):
    made = {}

    class VectorSource:
        def __init__(self, serial, **options):
            made.update(serial=serial, options=options)

        def __iter__(self):
            return iter(())

        def close(self):
            pass

    module = types.ModuleType("edgekit.vector.camera")
    module.VectorSource = VectorSource
    monkeypatch.setitem(sys.modules, "edgekit.vector.camera", module)
    cam = open_camera("vector:00e20100", timeout_s=2)
    assert isinstance(cam, VectorSource) and isinstance(cam, FrameSource)
    assert made == {"serial": "00e20100", "options": {"frame_timeout_s": 2}}


def test_vector_missing_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "edgekit.vector.camera", None)
    with pytest.raises(BackendUnavailable) as info:
        open_camera("vector:00e20100")
    assert "edgekit-vision[vector]" in info.value.hint


# ----------------------------------------------------------------------------------------------
# Boundaries
# ----------------------------------------------------------------------------------------------


def test_camera_module_stays_light():
    code = (
        "import sys; from edgekit.camera import open_camera\n"
        "with open_camera('synthetic:32x32') as c: next(c)\n"
        "bad = [m for m in ('tensorflow', 'keras', 'torch', 'edgekit.build', 'edgekit.builders') if m in sys.modules]\n"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_picamera2_yuv420_conversion_is_opencvs_without_opencv():
    # numpy I420 -> BGR with OpenCV's BT.601 fixed-point constants: bit-identical, stride padding dropped.
    from edgekit.camera.picamera import _yuv420_to_bgr

    rng = np.random.default_rng(3)
    w, h = 64, 48
    i420 = rng.integers(0, 256, (h * 3 // 2, w), dtype=np.uint8)
    want = cv2.cvtColor(i420, cv2.COLOR_YUV2BGR_I420)
    np.testing.assert_array_equal(_yuv420_to_bgr(i420, w, h), want)
    padded = np.zeros((h * 3 // 2, w + 32), np.uint8)  # the same image in rows of 96 bytes
    padded[:h, :w] = i420[:h]
    halves, chroma = padded.reshape(-1, (w + 32) // 2), i420[h:].reshape(-1, w // 2)
    halves[2 * h : 3 * h, : w // 2] = chroma
    np.testing.assert_array_equal(_yuv420_to_bgr(padded, w, h), want)


def test_picamera2_channel_orders_match_opencv():
    from edgekit.camera.picamera import PICAMERA2_TO_BGR

    a = np.random.default_rng(4).integers(0, 256, (6, 5, 4), dtype=np.uint8)
    np.testing.assert_array_equal(PICAMERA2_TO_BGR["XRGB8888"](a), cv2.cvtColor(a, cv2.COLOR_BGRA2BGR))
    np.testing.assert_array_equal(PICAMERA2_TO_BGR["XBGR8888"](a), cv2.cvtColor(a, cv2.COLOR_RGBA2BGR))
    rgb = np.ascontiguousarray(a[..., :3])
    np.testing.assert_array_equal(PICAMERA2_TO_BGR["BGR888"](rgb), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))


# ----------------------------------------------------------------------------------------------
# decode_size=: compressed MJPEG packets decoded at reduced scale
# ----------------------------------------------------------------------------------------------


def test_reduced_scale_keeps_the_frame_at_least_the_size_asked():
    from edgekit.camera.opencv import reduced_scale

    assert reduced_scale((1920, 1440), (224, 224)) == 4  # 480x360; 1/8 would be 240x180
    assert reduced_scale((1920, 1080), (224, 224)) == 4  # 480x270
    assert reduced_scale((640, 480), (80, 60)) == 8
    assert reduced_scale((642, 482), (81, 61)) == 8  # libjpeg rounds up: 81x61
    assert reduced_scale((640, 480), (321, 10)) == 1


def test_decode_size_decodes_an_mjpeg_file_at_reduced_scale(clip, clip_frames):
    """Packets read raw and decoded by cv2.imdecode at 1/2: half size, the same picture."""
    want = (W // 2 - 5, H // 2 - 5)  # 1/4 is too small, so 1/2
    with OpenCVSource(str(clip), api=cv2.CAP_FFMPEG, decode_size=f"{want[0]}x{want[1]}", timeout_s=0.3) as cam:
        frame = next(cam)
        stats = cam.stats()
    assert frame.array.shape == (H // 2, W // 2, 3) and frame.array.dtype == np.uint8
    assert stats["decode"] == "imdecode 1/2" and stats["size"] == (W // 2, H // 2)
    full = cv2.resize(clip_frames[frame.index], (W // 2, H // 2), interpolation=cv2.INTER_AREA)
    assert np.abs(frame.array.astype(int) - full).mean() < 4  # DCT scaling ~ an area resize


def test_decode_size_on_a_stream_that_is_not_mjpeg_decodes_in_full_and_says_so(tmp_path, caplog):
    path = _write(tmp_path / "clip.mp4", _clip_frames(3), "mp4v", FPS)
    with caplog.at_level("WARNING", logger="edgekit.camera.opencv"), OpenCVSource(
            str(path), api=cv2.CAP_FFMPEG, decode_size="100x100", timeout_s=0.3) as cam:
        frame = next(cam)
    assert frame.array.shape == (H, W, 3)
    assert "decode_size= needs an MJPEG stream" in caplog.text and cam.stats()["decode"] == "full (not MJPEG)"


@pytest.mark.parametrize("value", ["0x10", "abc", "10", "-4x4"])
def test_decode_size_bad_values_are_refused_by_the_table(value):
    for uri in ("rtsp://127.0.0.1:9/x", "v4l2:/dev/video-none"):
        with pytest.raises(CameraOptionError, match="decode_size"):
            open_camera(uri, decode_size=value)


def test_decode_size_is_refused_with_a_crop_in_pixels():
    from edgekit.serve.capture import check_reduced_decode

    with pytest.raises(UsageError, match=r"crops \[200, 200\] pixels"):
        check_reduced_decode({"decode_size": "224x224"}, (200, 200))
    check_reduced_decode({"decode_size": "224x224"}, "square")  # a fraction of the frame: fine
    check_reduced_decode({}, (200, 200))


class RecordingCapture:
    """Stands in for ``cv2.VideoCapture`` on a V4L2 device (none on the test machines): records the
    open arguments and every property set, reports back what a UVC camera would, serves frames."""

    opened: list = []

    def __init__(self, source, api, params):
        self.calls: list[tuple[int, float]] = []
        self.props = {cv2.CAP_PROP_FPS: 0.0, cv2.CAP_PROP_FOURCC: 0.0}
        self.released = False
        RecordingCapture.opened.append((source, api, params, self))

    def isOpened(self):  # noqa: N802 - OpenCV's name
        return True

    def set(self, prop, value):
        self.calls.append((prop, value))
        self.props[prop] = float(value)
        return True

    def get(self, prop):
        return self.props.get(prop, 0.0)

    def getBackendName(self):  # noqa: N802 - OpenCV's name
        return "V4L2"

    def read(self):
        time.sleep(0.001)  # a camera paces its frames; a tight loop would only spin the grabber thread
        return True, np.full((480, 640, 3), 7, np.uint8)

    def release(self):
        self.released = True


def test_v4l2_setup_asks_for_mjpg_then_size_fps_and_a_one_frame_queue(monkeypatch):
    RecordingCapture.opened = []
    monkeypatch.setattr(cv2, "VideoCapture", RecordingCapture)
    monkeypatch.setattr(sys, "platform", "linux")
    with open_camera("v4l2:0", size="640x480", fps=30) as cam:
        frames = [f.array.shape for f, _ in zip(cam, range(3))]
        info = cam.stats()
    [(source, api, params, cap)] = RecordingCapture.opened
    assert (source, api, params) == (0, cv2.CAP_V4L2, [])
    # the pixel format first: a driver may refuse a size that exists only for MJPG
    assert cap.calls == [(cv2.CAP_PROP_FOURCC, cv2.VideoWriter_fourcc(*"MJPG")), (cv2.CAP_PROP_FRAME_WIDTH, 640),
                         (cv2.CAP_PROP_FRAME_HEIGHT, 480), (cv2.CAP_PROP_FPS, 30), (cv2.CAP_PROP_BUFFERSIZE, 1)]
    assert frames == [(480, 640, 3)] * 3 and cap.released
    assert (info["backend"], info["fourcc"], info["nominal_fps"]) == ("V4L2", "MJPG", 30.0)


def test_v4l2_setup_by_path_with_other_choices_sets_only_what_was_asked(monkeypatch):
    RecordingCapture.opened = []
    monkeypatch.setattr(cv2, "VideoCapture", RecordingCapture)
    monkeypatch.setattr(sys, "platform", "linux")
    with open_camera("v4l2:/dev/video2", fourcc="YUYV", buffer_size=4) as cam:
        assert cam.stats()["fourcc"] == "YUYV" and cam.stats()["nominal_fps"] is None
    [(source, api, _, cap)] = RecordingCapture.opened
    assert (source, api) == ("/dev/video2", cv2.CAP_V4L2)
    assert cap.calls == [(cv2.CAP_PROP_FOURCC, cv2.VideoWriter_fourcc(*"YUYV")), (cv2.CAP_PROP_BUFFERSIZE, 4)]
