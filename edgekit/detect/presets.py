"""Detect option presets: MediaPipe's SSD detectors as its graphs decode them (``-T preset=NAME``).

Data only; :func:`edgekit.detect.head.with_preset` lays a preset under the options given (an
option given wins; inside ``ssd_anchors`` and ``ssd_decode``, a key given wins). Each value is
copied from MediaPipe's graph files at :data:`MEDIAPIPE_TAG` (the files in ``graphs``): the
``SsdAnchorsCalculator`` options become ``ssd_anchors``, the ``TensorsToDetectionsCalculator``
options ``ssd_decode``, the ``NonMaxSuppressionCalculator``'s ``min_suppression_threshold``
``iou_threshold`` (MediaPipe's NMS is WEIGHTED, edgekit's greedy: docs/detection.md).

``preprocessing`` is what the graph's ``ImageToTensorCalculator`` does to the frame
(``keep_aspect_ratio``: letterbox; ``output_tensor_float_range``: the mean and std that map 0-255
onto it; ``BORDER_ZERO``: black borders). A task head cannot set it (it is the model's input, fixed
before the head sees an output): give it as flags (``preprocessing_flags``) or in a
``<model>.preprocess.json`` beside the model. MediaPipe's files declare their mean and std in their
TFLite metadata, which edgekit reads; the letterbox they do not.
"""

from __future__ import annotations

MEDIAPIPE_TAG = "v0.10.14"
"""The MediaPipe release whose graph files the presets were copied from (google/mediapipe@v0.10.14)."""

_ANCHORS = {"min_scale": 0.1484375, "max_scale": 0.75, "anchor_offset_x": 0.5, "anchor_offset_y": 0.5,
            "aspect_ratios": [1.0], "fixed_anchor_size": True}
"""The SsdAnchorsCalculator options every MediaPipe detector below shares."""
_DECODE = {"num_classes": 1, "box_coord_offset": 0, "keypoint_coord_offset": 4, "num_values_per_keypoint": 2,
           "sigmoid_score": True, "score_clipping_thresh": 100.0, "reverse_output_order": True}
"""The TensorsToDetectionsCalculator options every MediaPipe detector below shares."""


def _scales(side: int) -> dict[str, float]:
    return {"x_scale": float(side), "y_scale": float(side), "w_scale": float(side), "h_scale": float(side)}


PRESETS: dict[str, dict] = {
    "mediapipe_face_short": {
        "model": "face_detection_short_range.tflite (BlazeFace, 128x128; 6 keypoints: right eye, left eye, "
                 "nose tip, mouth, right ear, left ear)",
        "graphs": ("mediapipe/modules/face_detection/face_detection_short_range.pbtxt",
                   "mediapipe/modules/face_detection/face_detection.pbtxt"),
        "options": {
            "layout": "ssd", "iou_threshold": 0.3,
            "ssd_anchors": {**_ANCHORS, "num_layers": 4, "input_size_height": 128, "input_size_width": 128,
                            "strides": [8, 16, 16, 16], "interpolated_scale_aspect_ratio": 1.0},
            "ssd_decode": {**_DECODE, "num_boxes": 896, "num_coords": 16, "num_keypoints": 6, **_scales(128),
                           "min_score_thresh": 0.5},
        },
        "preprocessing": {"mean": 127.5, "std": 127.5, "resize": "letterbox", "pad_value": 0},
    },
    "mediapipe_face_full": {
        "model": "face_detection_full_range_sparse.tflite (BlazeFace full range, 192x192; the same 6 keypoints)",
        "graphs": ("mediapipe/modules/face_detection/face_detection_full_range.pbtxt",
                   "mediapipe/modules/face_detection/face_detection.pbtxt"),
        "options": {
            "layout": "ssd", "iou_threshold": 0.3,
            # one 48x48 grid of one anchor each: interpolated_scale_aspect_ratio 0 adds none
            "ssd_anchors": {**_ANCHORS, "num_layers": 1, "input_size_height": 192, "input_size_width": 192,
                            "strides": [4], "interpolated_scale_aspect_ratio": 0.0},
            "ssd_decode": {**_DECODE, "num_boxes": 2304, "num_coords": 16, "num_keypoints": 6, **_scales(192),
                           "min_score_thresh": 0.6},
        },
        "preprocessing": {"mean": 127.5, "std": 127.5, "resize": "letterbox", "pad_value": 0},
    },
    "mediapipe_palm": {
        "model": "palm_detection_lite.tflite / palm_detection_full.tflite (192x192; 7 keypoints, of which "
                 "MediaPipe's hand region uses 0, the wrist centre, and 2, the middle finger's MCP)",
        "graphs": ("mediapipe/modules/palm_detection/palm_detection_cpu.pbtxt",),
        "options": {
            "layout": "ssd", "iou_threshold": 0.3,
            "ssd_anchors": {**_ANCHORS, "num_layers": 4, "input_size_height": 192, "input_size_width": 192,
                            "strides": [8, 16, 16, 16]},
            "ssd_decode": {**_DECODE, "num_boxes": 2016, "num_coords": 18, "num_keypoints": 7, **_scales(192),
                           "min_score_thresh": 0.5},
        },
        "preprocessing": {"mean": 0.0, "std": 255.0, "resize": "letterbox", "pad_value": 0},
    },
    "mediapipe_pose": {
        "model": "pose_detection.tflite (224x224; the box is the face's; 4 keypoints: mid-hip centre, a point "
                 "encoding the full body's size and rotation, mid-shoulder centre, the same for the upper body)",
        "graphs": ("mediapipe/modules/pose_detection/pose_detection_cpu.pbtxt",),
        "options": {
            "layout": "ssd", "iou_threshold": 0.3,
            "ssd_anchors": {**_ANCHORS, "num_layers": 5, "input_size_height": 224, "input_size_width": 224,
                            "strides": [8, 16, 32, 32, 32]},
            "ssd_decode": {**_DECODE, "num_boxes": 2254, "num_coords": 12, "num_keypoints": 4, **_scales(224),
                           "min_score_thresh": 0.5},
        },
        "preprocessing": {"mean": 127.5, "std": 127.5, "resize": "letterbox", "pad_value": 0},
    },
}
"""Preset name -> the model it is for, the graph files (at :data:`MEDIAPIPE_TAG`) its values come
from, the detect ``options`` and the ``preprocessing`` the graph applies."""
