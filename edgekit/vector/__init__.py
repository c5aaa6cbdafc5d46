"""Anki Vector support on ``wirepod_vector_sdk`` (import name ``anki_vector``, imported lazily).

- :mod:`edgekit.vector.camera`: ``VectorSource``, the robot's camera as a FrameSource.
- :mod:`edgekit.vector.speech`: say text and show images or labels on the face screen.
- :mod:`edgekit.vector.face`: numpy <-> the face screen's RGB565 bytes (no SDK needed).
- :mod:`edgekit.vector.fake`: ``FakeVector``, a loopback robot the real SDK connects to
  (frames in ``fake_frames``, the gRPC servicer in ``fake_servicer``).
- :mod:`edgekit.vector.connection`: connecting and clean disconnects.
- :mod:`edgekit.vector.diagnosis`: ``VectorError``; SDK errors -> a reason and a fix hint.

Importing this package imports neither the SDK nor grpc; ``from edgekit.vector import
VectorSource`` imports only what that name needs.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "VectorSource": "edgekit.vector.camera",
    "FakeVector": "edgekit.vector.fake",
    "VectorError": "edgekit.vector.connection",
    "say_text": "edgekit.vector.speech",
    "show_face": "edgekit.vector.speech",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
