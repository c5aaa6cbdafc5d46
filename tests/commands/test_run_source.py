"""Results name their source: ``edgekit run`` on a folder prints each image's name, ``--json`` its
path as the folder was given; a clip or a camera is named in the JSON only. The detector is a real
ONNX model run by ONNX Runtime."""

from __future__ import annotations

import json
import re
from pathlib import Path

import cv2
import pytest

from edgekit.cli import main as cli
from tests.helpers.detector_model import detector_bundle, scene


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return detector_bundle(tmp_path_factory.mktemp("det") / "twobox-cpu")


def test_a_folder_run_names_each_image_in_text_and_json(bundle, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("eval/x").mkdir(parents=True)
    for i in range(3):
        cv2.imwrite(f"eval/x/{i:03d}.jpg", scene(i % 2 == 0, False, seed=i))
    assert cli(["run", str(bundle), "--camera", "folder:eval/x"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("frame ")]
    assert [line.split()[2] for line in lines] == ["000.jpg", "001.jpg", "002.jpg"]
    assert lines[0].startswith("frame      0  000.jpg  cat ")
    assert cli(["run", str(bundle), "--camera", "folder:eval/x", "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()[1:-1]]
    assert [r["source"] for r in records] == ["eval/x/000.jpg", "eval/x/001.jpg", "eval/x/002.jpg"]


def test_a_camera_frame_is_named_by_its_camera_and_capture_time(bundle, tmp_path, capsys):
    assert cli(["run", str(bundle), "--camera", "synthetic:64x48", "--max-frames", "2", "--every", "0"]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("frame ")]
    assert len(lines) == 2 and all(words[2] == "synthetic:64x48" for words in lines)
    assert all(re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}", words[3]) for words in lines)  # UTC, to the millisecond
    assert cli(["run", str(bundle), "--camera", "synthetic:64x48", "--max-frames", "2", "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()[1:-1]]
    assert [r["source"] for r in records] == ["synthetic:64x48"] * 2
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r["captured"]) for r in records)
