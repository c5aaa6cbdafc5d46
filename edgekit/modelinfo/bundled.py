"""A model file of a bundle, run on its own: what the bundle's ``edgekit.json`` records for it.

``edgekit run dist/demo-cpu/demo_fp32.tflite`` is a bare file to the runtime, but the manifest
beside it says how the bundle feeds it (the preprocessing its gate was measured with), its labels
and its task head. Nothing in the file itself may say so: the TFLite converter folds a Keras
``Rescaling(1/255)`` into the first convolution, so the fp32 file of a model that takes 0-255
pixels looks like any other. The record is the "model" layer of
:mod:`edgekit.modelinfo.preprocessing` for such a file; flags and a sidecar still go over it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.modelinfo.embedded import Embedded

RECORDED_KEYS = ("colour", "crop", "resize", "interpolation", "mean", "std", "pad_value")


def bundle_record(path: Path) -> Embedded | None:
    """What the bundle holding ``path`` records for it, or None: no ``edgekit.json`` beside it, a
    manifest that does not list it, a file whose sha256 is not the one listed (a copy edited
    since), or a manifest that cannot be read (the bare run then goes on without it)."""
    from edgekit.bundle import MANIFEST, load_bundle, sha256_file
    from edgekit.errors import EdgekitError

    if not (path.parent / MANIFEST).is_file():
        return None
    try:
        bundle = load_bundle(path.parent, check_hashes=False, allow_rejected=True)
        entry = next((m for m in bundle.models if m.file == path.name), None)
        if entry is None or bundle.manifest["files"].get(entry.file) != sha256_file(path, follow=False):
            return None
        spec = entry.input.to_dict()
        pre = {k: spec[k] for k in RECORDED_KEYS if k in spec}
        return Embedded(f"bundle {bundle.path.name}'s {MANIFEST}", pre, bundle.labels or None, bundle.task,
                        task_options=task_options(bundle, entry))
    except (EdgekitError, OSError, KeyError, TypeError, ValueError):
        return None


def task_options(bundle: Any, entry: Any) -> dict[str, Any]:
    """The head's options a bundle model carries: classify's output index (a converter may
    have moved the class scores), raw's output names as the original model called them, a
    file option (``anchors``) as the absolute path of the bundle's file (load_bundle checked it
    is listed, hashed and inside the bundle)."""
    from edgekit.bundle import PATH_OPTIONS, option_path

    options = dict(entry.extra.get("task_options") or {})
    for key in PATH_OPTIONS:
        if isinstance(options.get(key), str):
            options[key] = option_path(bundle, options[key])
    if bundle.task == "raw":
        options.setdefault("names", [str(o.get("name", f"output_{i}")) if isinstance(o, dict) else f"output_{i}"
                                     for i, o in enumerate(entry.outputs)])
    return options
