"""A clip played again by the daemon (``[camera] on_end = "reconnect"``, the default) is not a
camera fault: each pass used to count as a camera error and a reconnect, so a looped demo clip
tripped EdgekitCameraFlapping. Real folder source, real ONNX Runtime model."""

from __future__ import annotations

import logging

import cv2
import numpy as np

from tests.serve.test_daemon_services import make_config, new_daemon


def test_a_clip_played_again_is_no_camera_error_and_no_reconnect(tmp_path, caplog):
    clip = tmp_path / "clip"
    clip.mkdir()
    for i in range(4):
        cv2.imwrite(str(clip / f"{i:02d}.png"), np.full((48, 64, 3), 40 * i, np.uint8))
    config = make_config(tmp_path, None, camera={"uri": f"folder:{clip}", "options": {"fps": 100}},
                         http={"listen": ""})
    with caplog.at_level(logging.INFO, logger="edgekit.serve"):
        stats = new_daemon(config).run(max_frames=20, duration_s=30)
    assert stats["frames"]["processed"] == 20
    assert stats["errors"]["camera"] == 0 and stats["reconnects"]["camera"] == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "camera" in r.getMessage()]
    assert sum("playing it again" in r.getMessage() for r in caplog.records) == 1  # once at INFO, then DEBUG
