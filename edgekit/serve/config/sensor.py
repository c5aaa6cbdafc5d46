"""The Raspberry Pi AI Camera in ``edgekit serve``: an ``imx500`` camera and an imx500 model are one pair.

The IMX500 runs one network, on its own image, and hands its outputs in each frame's metadata: the
model's backend (:mod:`edgekit.runtime.imx500`) opens the camera and the ``imx500`` source reads
that camera (:mod:`edgekit.camera.imx500`). So the camera can only serve its own network, and the
network has no other camera: another camera's frames would be published with outputs the sensor
computed on a frame nobody sees. Every other pairing is refused before anything opens
(:func:`check_pairing`, part of the preflight), and once more after the model opened
(:func:`check_opened`: a fleet's bundle or a caller's runtime is known only then). Hot-swapping is
refused too: a new network would need a second ``Picamera2`` beside the running one.
"""

from __future__ import annotations

from typing import Any

from edgekit.errors import EdgekitError, UsageError

SENSOR_SCHEME = "imx500"
SENSOR_ADAPTER = "edgekit.runtime.imx500:"
ONE_PAIR_FIX = ("keep one camera, uri = \"imx500\", with a bundle built for --target imx500 (one sensor runs one "
                "network); serve other cameras from a second daemon with their own bundle")


def is_sensor_camera(uri: str) -> bool:
    """Whether ``uri`` is the AI Camera read through its model's backend (``imx500``); a malformed
    URI is not (the camera check names it)."""
    from edgekit.camera import locate_scheme

    try:
        return locate_scheme(str(uri).strip())[0].name == SENSOR_SCHEME
    except EdgekitError:
        return False


def runs_in_sensor(path: str, backend: str = "") -> bool | None:
    """Whether the model at ``path`` (``BUNDLE[:VARIANT]`` or a model file) runs in the IMX500:
    an entry of format ``imx500``/``rpk`` or the imx500 adapter, a ``.rpk``, or ``backend = "imx500"``.
    None when that cannot be told here (no path, a broken bundle: the model check says why)."""
    from edgekit.model import split_model_spec
    from edgekit.runtime.registry import BACKENDS

    formats = BACKENDS[SENSOR_SCHEME].formats
    if backend == SENSOR_SCHEME:
        return True
    if not path:
        return None
    target, variant = split_model_spec(path)
    if target.is_file():
        return target.suffix.lower().lstrip(".") in formats
    if not target.is_dir():
        return None
    from edgekit.bundle import load_bundle

    try:
        bundle = load_bundle(target, check_hashes=False, allow_rejected=True)
        entry = bundle.model(variant)
    except EdgekitError:
        return None
    return entry.format in formats or str(bundle.runtime.get("adapter", "")).startswith(SENSOR_ADAPTER)


def _label(camera: Any) -> str:
    return f"[camera {camera.name}]" if camera.name else "[camera]"


def check_pairing(config: Any, where: str = "", model: bool = True) -> None:
    """An ``imx500`` camera pairs only with its own imx500 model, alone: UsageError (one line, with the
    fix) otherwise. ``model`` False: the model is opened by the caller, so only the cameras are checked."""
    cameras = config.camera_list
    sensors = [c for c in cameras if is_sensor_camera(c.uri)]
    m = config.model
    in_sensor = runs_in_sensor(m.path, m.backend) if model and not m.source else None
    if not sensors and not in_sensor:
        return
    if len(cameras) > 1:
        names = ", ".join(c.name for c in sensors)
        if len(sensors) > 1:
            who = f"{len(sensors)} imx500 cameras ({names}) cannot share one model"
        elif sensors:
            who = f"[camera {names}] imx500 cannot share the model with {len(cameras) - 1} other camera(s)"
        else:
            who = f"[model] {m.path} runs in the AI Camera's sensor and cannot serve {len(cameras)} cameras"
        raise UsageError(f"{where}{who}: the sensor's network sees its own frames only", ONE_PAIR_FIX)
    camera = cameras[0]
    if in_sensor and not sensors:
        raise UsageError(f"{where}[model] {m.path} runs in the AI Camera's sensor, so its camera is the sensor's: "
                         f"{_label(camera)} uri = {camera.uri!r} would be published with outputs of frames the "
                         "sensor saw, not its own",
                         "set [camera] uri = \"imx500\" (or serve a bundle built for this device's CPU)")
    if in_sensor is False:
        raise UsageError(f"{where}{_label(camera)} imx500 reads the network in the AI Camera's sensor, and [model] "
                         f"{m.path} does not run there",
                         "serve a bundle built with --target imx500, or read this camera with uri = \"picamera2\"")
    _check_swaps(config, where)


def _check_swaps(config: Any, where: str) -> None:
    """Hot-swap (``watch``) and a fleet ``source`` would open a second network beside the running one."""
    m = config.model
    fix = "to change the network, replace the bundle and restart the service (systemctl restart edgekit)"
    if m.watch:
        raise UsageError(f"{where}[model] watch with an imx500 camera: a new network cannot be opened beside the "
                         "running one (one sensor, one Picamera2)", f"remove watch; {fix}")
    if m.source:
        raise UsageError(f"{where}[model] source with an imx500 camera: a fleet's new versions are hot-swapped, "
                         "which opens the new network beside the running one (one sensor, one Picamera2)",
                         f"give [model] path instead; {fix}")
    stage = next((s for s in config.stages if runs_in_sensor(s.model)), None)
    if stage is not None:
        raise UsageError(f"{where}[[stage]] model {stage.model} runs in the AI Camera's sensor, which sees its own "
                         "image, not a detection's region", "build the second model for this device's CPU")


def check_opened(config: Any, runtime: Any) -> None:
    """The opened model and the cameras still pair (a fleet's bundle or a caller's runtime is known
    only now): the imx500 backend has ``has_outputs``, no other runtime has."""
    in_sensor = callable(getattr(runtime, "has_outputs", None))
    sensors = [c for c in config.camera_list if is_sensor_camera(c.uri)]
    if in_sensor and (len(config.camera_list) > 1 or not sensors):
        raise UsageError("the model runs in the AI Camera's sensor: its one camera must be uri = \"imx500\"",
                         ONE_PAIR_FIX)
    if sensors and not in_sensor:
        raise UsageError(f"[camera] imx500 with a {type(runtime).__name__} model: the AI Camera's outputs come "
                         "from a network running in the sensor", "serve a bundle built with --target imx500")
