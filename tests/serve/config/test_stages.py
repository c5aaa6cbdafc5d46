"""A cascade in the daemon: ``[[stage]]`` and ``serve DET --then SECOND --roi JSON`` (serve/config/stages.py):
the tables checked before anything opens, and the real two-model ONNX cascade (the tiny detector of
tests/helpers feeding a colour classifier) writing sub-labels into serve's JSON lines."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

from edgekit.errors import UsageError
from edgekit.serve.config.load import from_dict
from tests.helpers.detector_model import FRAME_H, FRAME_W, detector_bundle
from tests.helpers.faults import assert_refused, edgekit
from tests.helpers.real_models import channel_share_onnx

ROI = {"scale_x": 1.2, "scale_y": 1.2, "square_long": True}


def test_a_stage_table_is_read_with_its_roi_and_paths_beside_the_file(tmp_path):
    config = from_dict({"stage": [{"model": "fl-cpu:fp32", "roi": ROI, "task": "landmarks"}]}, "serve.toml",
                       tmp_path)
    (stage,) = config.stages
    assert stage.model == str(tmp_path / "fl-cpu:fp32") and stage.roi == ROI and stage.task == "landmarks"
    assert config.to_dict()["stage"][0]["model"] == stage.model
    assert from_dict({}, "serve.toml").stages == ()


@pytest.mark.parametrize("raw, needle", [
    ({"stage": {"model": "x"}}, "must be an array of tables"),
    ({"stage": []}, "holds no stage"),
    ({"stage": [{"model": "a"}, {"model": "b"}]}, "one second stage is supported"),
    ({"stage": [{"roi": ROI}]}, "no model"),
    ({"stage": [{"model": "x", "rio": ROI}]}, "did you mean 'roi'"),
    ({"stage": [{"model": "x", "roi": {"scale": 2}}]}, "roi has no option 'scale'"),
    ({"stage": [{"model": "x", "roi": "wide"}]}, "roi must be a table"),
])
def test_bad_stage_tables_are_one_line(raw, needle):
    with pytest.raises(UsageError) as err:
        from_dict(raw, "serve.toml")
    assert needle in str(err.value) and "serve.toml" in str(err.value)


@pytest.fixture(scope="module")
def cascade(tmp_path_factory):
    pytest.importorskip("onnxruntime")
    root = tmp_path_factory.mktemp("stage")
    bundle = detector_bundle(root / "twobox-cpu")
    colour = channel_share_onnx(root / "colour.onnx", (1, 16, 16, 3))
    (root / "colour.txt").write_text("red\ngreen\nblue\n")
    frames = root / "frames"
    frames.mkdir()
    frame = np.zeros((FRAME_H, FRAME_W, 3), np.uint8)
    frame[:, : FRAME_W // 2], frame[:, FRAME_W // 2:] = (60, 60, 250), (250, 60, 60)  # red | blue (BGR)
    cv2.imwrite(str(frames / "a.png"), frame)
    return bundle, colour, root / "colour.txt", frames


def test_serve_then_writes_each_detections_sub_label(cascade, tmp_path, capsys):
    bundle, colour, labels, frames = cascade
    out = tmp_path / "results.jsonl"
    result = edgekit(capsys, "serve", bundle, "--then", colour, "--then-task", "classify", "--then-labels", labels,
                     "--roi", json.dumps(ROI), "--camera", f"folder:{frames}", "--output", out, "--mqtt", "off",
                     "--http", "off", "--max-frames", "3")
    assert result.code == 0, result.err
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 3
    assert all({d["label"]: d["sub_label"] for d in x["detections"]} == {"cat": "red", "dog": "blue"} for x in lines)
    assert all("second_stage" in x["ms"] for x in lines)


def test_serve_then_refusals_are_one_line(cascade, tmp_path, capsys):
    bundle, colour, labels, frames = cascade
    common = ("--camera", f"folder:{frames}", "--output", tmp_path / "r.jsonl", "--mqtt", "off", "--http", "off",
              "--max-frames", "1")
    assert_refused(edgekit(capsys, "serve", bundle, "--roi", "{}", *common), "--roi without --then")
    assert_refused(edgekit(capsys, "serve", bundle, "--then", colour, "--roi", "{nope", *common), "--roi is not JSON")
    assert_refused(edgekit(capsys, "serve", colour, "--then", colour, "--then-task", "classify", *common),
                   "[[stage]] needs a detector first")
