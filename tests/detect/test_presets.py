"""``-T preset=NAME``: MediaPipe's SSD detectors decoded with the options of its graph files
(edgekit/detect/presets.py), options given winning; the error of a bare SSD names the presets.
The real-model checks run where the files of the mediapipe 0.10.14 wheel are present
($EDGEKIT_REAL_MODELS, tests/conftest.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from edgekit.detect.anchors import generate
from edgekit.detect.head import detect_config, detector, with_preset
from edgekit.detect.presets import MEDIAPIPE_TAG, PRESETS
from edgekit.errors import EdgekitError, ModelError, UsageError
from edgekit.imaging.image import InputSpec
from tests.conftest import real_model_file
from tests.helpers.detect_outputs import Outputs


def _spec(side: int, preset: str | None = None) -> InputSpec:
    p = PRESETS[preset]["preprocessing"] if preset else {"mean": 0.0, "std": 255.0, "resize": "stretch"}
    return InputSpec.from_dict({"shape": [1, side, side, 3], "dtype": "float32", "mean": [p["mean"]] * 3,
                                "std": [p["std"]] * 3, "resize": p["resize"]})


def _outputs(name: str) -> Outputs:
    """The runtime contract of the model ``name`` is for: regressors and scores, its input side."""
    decode = PRESETS[name]["options"]["ssd_decode"]
    side = PRESETS[name]["options"]["ssd_anchors"]["input_size_width"]
    return Outputs([(1, decode["num_boxes"], decode["num_coords"]), (1, decode["num_boxes"], 1)], spec=_spec(side))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_fills_the_options_of_its_graph(name):
    head = detector([], _outputs(name), preset=name)
    config, decode = head.config, PRESETS[name]["options"]["ssd_decode"]
    assert head.layout == "ssd" and config.iou_threshold == 0.3 and config.score_activation == "sigmoid"
    assert config.score_threshold == decode["min_score_thresh"] and config.score_clipping_thresh == 100.0
    assert config.ssd_decode.num_keypoints == decode["num_keypoints"] and config.ssd_decode.num_boxes == len(
        generate(config.ssd_anchors))  # the anchors the options generate are the boxes the model regresses
    assert all(path.startswith("mediapipe/modules/") for path in PRESETS[name]["graphs"])
    assert MEDIAPIPE_TAG == "v0.10.14"


def test_the_anchor_counts_follow_mediapipe_s_grids():
    counts = {name: len(generate(detect_config(None, 1, {"preset": name}).ssd_anchors)) for name in PRESETS}
    # 16x16x2 + 8x8x6; one 48x48 grid of one anchor (interpolated_scale_aspect_ratio 0); 24x24x2 + 12x12x6;
    # 28x28x2 + 14x14x2 + 7x7x6
    assert counts == {"mediapipe_face_short": 896, "mediapipe_face_full": 2304, "mediapipe_palm": 2016,
                      "mediapipe_pose": 2254}


def test_options_given_win_over_the_preset_s():
    name = "mediapipe_face_short"
    head = detector([], _outputs(name), preset=name, iou_threshold=0.5, score_threshold=0.2)
    assert head.config.iou_threshold == 0.5 and head.config.score_threshold == 0.2
    # inside a table, a key given wins and the preset's others stay
    merged = with_preset({"preset": name, "ssd_decode": {"min_score_thresh": 0.75}})
    assert merged["ssd_decode"]["min_score_thresh"] == 0.75 and merged["ssd_decode"]["num_keypoints"] == 6
    assert detect_config(None, 1, merged).score_threshold == 0.75
    assert merged["preset"] == name and PRESETS[name]["options"]["ssd_decode"]["min_score_thresh"] == 0.5  # a copy
    assert with_preset({"iou_threshold": 0.4}) == {"iou_threshold": 0.4}  # no preset: as given
    assert with_preset({"preset": name, "layout": "auto"})["layout"] == "auto"


@pytest.mark.parametrize(("value", "fix"), [
    ("mediapipe_face_shrt", "did you mean 'mediapipe_face_short'?"),
    ("yolo", "presets: mediapipe_face_short, mediapipe_face_full, mediapipe_palm, mediapipe_pose"),
    (3, "presets: mediapipe_face_short"),
])
def test_an_unknown_preset_is_refused_in_one_line(value, fix):
    with pytest.raises(UsageError) as refused:
        detector([], _outputs("mediapipe_face_short"), preset=value)
    assert refused.value.message == f"detect preset {value!r} is unknown" and refused.value.hint.startswith(fix)
    assert "\n" not in refused.value.message + refused.value.hint


def test_a_preset_for_another_model_is_refused_by_its_box_count():
    with pytest.raises(EdgekitError, match="2254|896"):
        detector([], _outputs("mediapipe_face_short"), preset="mediapipe_pose")


def test_the_bare_ssd_error_names_the_decode_options_and_the_presets():
    with pytest.raises(ModelError) as bare:
        detector([], _outputs("mediapipe_face_short"))
    fix = bare.value.hint
    assert "match no detection layout" in bare.value.message
    assert all(word in fix for word in ("ssd_anchors", "ssd_decode", "docs/detection.md", "--task raw",
                                        "--resize letterbox", *PRESETS))
    assert fix.startswith("these outputs are those of face_detection_short_range.tflite: "
                          "-T preset=mediapipe_face_short --resize letterbox (--mean 127.5 --std 127.5")
    with pytest.raises(ModelError) as other:  # outputs no preset has: the general fix
        detector([], Outputs([(1, 100, 7), (1, 100, 1)]))
    assert other.value.hint.startswith("an SSD without NMS in the graph needs its anchors and decode")


def test_a_build_records_the_preset_s_options_in_the_bundle():
    from edgekit.builders.gate.detect import DetectGate

    name = "mediapipe_palm"
    source = SimpleNamespace(outputs=[SimpleNamespace(shape=(2016, 18)), SimpleNamespace(shape=(2016, 1))],
                             output_names=["regressors", "scores"])
    gate = DetectGate.for_model(source, ["palm"], _spec(192), {"preset": name, "iou_threshold": 0.4}, None)
    options = gate.task_options([{"name": "regressors"}, {"name": "scores"}])
    assert options["layout"] == "ssd" and options["preset"] == name and options["iou_threshold"] == 0.4
    assert options["ssd_anchors"] == PRESETS[name]["options"]["ssd_anchors"] and gate.threshold == 0.5
    # the bundle's options decode alike on a device whose edgekit knows no preset: they are all there
    assert detect_config(_spec(192), 1, {k: v for k, v in options.items() if k != "preset"}) == detect_config(
        _spec(192), 1, options)


# --- the real models: each preset decodes MediaPipe's file on a real photo --------------------------

REAL = {"mediapipe_face_short": "face_detection_short_range.tflite",
        "mediapipe_face_full": "face_detection_full_range_sparse.tflite",
        "mediapipe_palm": "palm_detection_full.tflite", "mediapipe_pose": "pose_detection.tflite"}


def _astronaut(name: str):
    """The preset's real model on scikit-image's astronaut (512 x 512), preprocessed as its graph does."""
    path = real_model_file(REAL[name])
    if path is None:
        pytest.skip(f"{REAL[name]} is not under $EDGEKIT_REAL_MODELS (unpack the mediapipe 0.10.14 wheel there)")
    pytest.importorskip("skimage")
    from skimage import data

    from edgekit.imaging.image import Preprocessor
    from edgekit.runtime import open_runtime

    frame = data.astronaut()[:, :, ::-1].copy()  # BGR, as cameras give frames
    with open_runtime(path) as rt:
        spec = _spec(rt.input_spec.height, name)
        outputs = rt.infer(Preprocessor(spec)(frame))
    head = detector([name], Outputs([o.shape for o in outputs], spec=spec), preset=name)
    return head(outputs, frame_shape=frame.shape), outputs


@pytest.mark.parametrize("name", ["mediapipe_face_short", "mediapipe_face_full"])
def test_real_blazeface_short_and_full_find_the_astronaut_s_face(name):
    found, _ = _astronaut(name)
    assert len(found) == 1 and found.top.score > 0.85
    x1, y1, x2, y2 = found.top.box  # the face, by eye: 180-275, 80-175
    assert 160 < x1 < 200 and 55 < y1 < 100 and 250 < x2 < 290 and 160 < y2 < 200
    (rex, rey), (lex, ley), (nx, ny), (mx, my), (rrx, _), (lrx, _) = found.top.keypoints
    assert rex < nx < lex and max(rey, ley) < ny < my < y2 and rrx < rex and lrx > lex


def test_real_pose_detector_finds_the_astronaut_with_her_hips_below_the_photo():
    found, _ = _astronaut("mediapipe_pose")
    assert len(found) == 1 and found.top.score > 0.7
    (hx, hy), _, (sx, sy), _ = found.top.keypoints
    assert hy > 512 and 150 < sy < 300 and abs(hx - sx) < 100  # hips out of view, under the shoulders


def test_real_palm_detector_decodes_without_error():
    """No photo with hands is installable here: the palm preset is checked to decode MediaPipe's
    file into boxes and 7 keypoints each (at a low threshold), not to find a hand."""
    found, outputs = _astronaut("mediapipe_palm")
    assert [o.shape for o in outputs] == [(1, 2016, 18), (1, 2016, 1)] and not found.detections  # no hand at 0.5
    name = "mediapipe_palm"
    spec = _spec(192, name)
    low = detector([], Outputs([o.shape for o in outputs], spec=spec), preset=name, score_threshold=0.01)
    some = low(outputs, frame_shape=(512, 512, 3))
    assert len(some) > 0 and all(len(d.keypoints) == 7 and np.isfinite(d.box).all() for d in some.detections)
