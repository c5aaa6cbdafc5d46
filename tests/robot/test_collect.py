"""Data collection: key presses save centre crops from the (fake) robot's camera."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgekit.camera import Frame
from edgekit.errors import UsageError
from robot.collect import (
    SEED_LABELS,
    DatasetWriter,
    ScriptedKeys,
    StreamKeys,
    assign_keys,
    collect,
    crop_for_dataset,
    main,
    rotations,
)

ROOT = Path(__file__).resolve().parents[2]


def frames(n: int):
    """Frames whose centre 200x200 is a flat gray level 10*i, surrounded by white."""
    for i in range(n):
        f = np.full((360, 640, 3), 255, np.uint8)
        f[80:280, 220:420] = 10 * i
        yield Frame(f, i, i)


def test_key_assignment_follows_the_seed_labels():
    keys = assign_keys(SEED_LABELS)
    assert keys["a"] == "a" and keys["z"] == "z" and len(keys) == 27
    assert keys["0"] == "background"  # its letters are all taken by a-z
    assert assign_keys(["yes", "no", "background"]) == {"y": "yes", "n": "no", "b": "background"}
    with pytest.raises(UsageError):
        assign_keys(["a", "a"])


def test_crop_and_rotations():
    frame = next(frames(2))
    crop = crop_for_dataset(frame.array, 200)
    assert crop.shape == (200, 200) and crop.max() == 0  # the centre only, gray
    assert crop_for_dataset(frame.array, 200, "bgr").shape == (200, 200, 3)
    flat = np.full((200, 200), 100, np.uint8)
    turned = rotations(flat)
    assert [a for a, _ in turned] == [-10.0, -5.0, 5.0, 10.0]
    for _, img in turned:
        assert img.shape == flat.shape and img.min() == 100  # reflected borders: no black corners
    marked = flat.copy()
    marked[:, :20] = 0
    assert not np.array_equal(rotations(marked, [10.0])[0][1], marked)  # it really turns


def test_collect_saves_an_imagefolder_and_continues_numbering(tmp_path):
    keys = ScriptedKeys([None, "a", None, "0", "a", "?", "\n", "b", "\x1b", "a"])
    saved = collect(frames(20), keys, tmp_path, SEED_LABELS)
    assert saved == {"a": 2, "background": 1, "b": 1}
    a_files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert a_files == ["a_0.png", "a_1.png"]
    img = cv2.imread(str(tmp_path / "a" / "a_0.png"), cv2.IMREAD_UNCHANGED)
    assert img.shape == (200, 200) and int(img.mean()) == 10  # frame 1 was showing when 'a' was read
    assert (tmp_path / "background" / "background_0.png").exists()
    # a second session adds to the dataset, never overwrites
    collect(frames(3), ScriptedKeys(["a", "a"]), tmp_path, SEED_LABELS, augment=True)
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert "a_2.png" in names and "a_3.png" in names and "a_0.png" in names
    assert "a_2_r-10.png" in names and "a_3_r10.png" in names
    assert len(names) == 4 + 2 * 4
    assert DatasetWriter(tmp_path, ["a"])._next["a"] == 4


def test_stream_keys_reads_a_pipe_one_character_at_a_time():
    keys = StreamKeys(io.StringIO("ab"))
    assert [keys.read_key(0), keys.read_key(0), keys.read_key(0)] == ["a", "b", ""]


def test_cli_against_the_fake_robot_with_keys_from_a_pipe(tmp_path):
    pytest.importorskip("anki_vector", reason="needs wirepod_vector_sdk (pip install 'edgekit-vision[vector]')")
    shots = tmp_path / "shots"
    shots.mkdir()
    for i in range(3):
        f = np.full((360, 640, 3), 40 * (i + 1), np.uint8)
        cv2.imwrite(str(shots / f"{i}.png"), f)
    out = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, "-m", "robot.collect", "--fake", str(shots), "--out", str(out),
         "--labels", "yes,no,background", "--rotate-augment", "--fps", "20"],
        input="yynb", capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "saved 4 images" in done.stderr
    assert len(list((out / "yes").glob("yes_*.png"))) == 2 * 5  # originals + 4 rotations each
    assert len(list((out / "no").glob("no_?.png"))) == 1
    img = cv2.imread(str(out / "background" / "background_0.png"), cv2.IMREAD_UNCHANGED)
    assert img.shape == (200, 200)


def test_cli_reports_errors_with_a_fix(tmp_path, capsys):
    rc = main(["--fake", str(tmp_path / "missing"), "--out", str(tmp_path / "o")], keys=ScriptedKeys([]))
    assert rc == 2 and "does not exist" in capsys.readouterr().err
