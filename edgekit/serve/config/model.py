"""``[model]`` of the serve configuration: what to run, how to hot-swap it, and where to pull it
from when a fleet rolls it out (``source``, ``channel``, ``trusted_keys``: :mod:`edgekit.fleet`).

:mod:`edgekit.serve.config.load` validates it with the other tables; the checks that involve several
of its keys are :func:`check_model` here.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgekit.errors import UsageError


@dataclass(frozen=True)
class ModelConfig:
    """``[model]``: what to run."""

    path: str = ""  # bundle directory, .tflite or .onnx
    name: str = ""  # model inside a bundle ("" = the bundle's default)
    labels: str = ""  # labels file for a bare model (a bundle brings its own)
    threads: int = 0  # CPU threads for the runtime (0 = the runtime's default)
    delegate: str = ""  # LiteRT: xnnpack, none, edgetpu ("" = what the bundle says)
    device: str = ""  # Edge TPU device: usb, usb:0, pci:0 ("" = first found)
    providers: str = ""  # ONNX Runtime providers in order, e.g. "tensorrt,cuda,cpu" ("" = the bundle's)
    allow_fallback: bool = False  # ONNX Runtime: accept a session without some requested providers
    backend: str = ""  # a key of edgekit.runtime.BACKENDS, e.g. "onnxruntime" ("" = the bundle's adapter)
    top_k: int = 3
    reopen_after_errors: int = 5  # consecutive inference errors before the runtime is reopened
    watch: bool = False  # hot-swap: look at the bundle path every watch_interval_s (SIGHUP always works)
    watch_interval_s: float = 2.0
    warmup_frames: int = 5  # a new bundle runs this many recent frames before it is swapped in
    probation_frames: int = 30  # a swapped-in bundle that fails within this many frames is rolled back
    min_agreement: float = 0.0  # top-1 agreement with the running model on the warm-up frames (0 = no check)
    allow_task_change: bool = False  # hot-swap: accept a bundle with another task or other labels
    check_deadline_s: float = 300.0  # hot-swap: one check's limit before it is refused (watch.CHECK_DEADLINE_S)
    source: str = ""  # fleet: s3://BUCKET/PREFIX or an https:// base URL to pull versions from ("" = path)
    channel: str = "stable"  # fleet: the channel to follow
    trusted_keys: tuple = ()  # fleet: public key files; a version must be signed by one of them
    poll_interval_s: float = 30.0  # fleet: seconds between looks at the channel (backoff when the store fails)
    keep_versions: int = 2  # fleet: versions kept on the device (the serving one and the one before it)
    versions_dir: str = ""  # fleet: where pulled versions live ("" = $STATE_DIRECTORY or ~/.local/state/edgekit)
    max_bundle_mb: float = 1024.0  # fleet: a version larger than this is refused before it is downloaded


MODEL_MINIMUM = {"threads": 0, "top_k": 1, "reopen_after_errors": 1, "watch_interval_s": 0.05, "warmup_frames": 1,
                 "probation_frames": 0, "min_agreement": 0.0, "check_deadline_s": 1.0, "poll_interval_s": 0.05,
                 "keep_versions": 1, "max_bundle_mb": 0.001}
"""The smallest value of each numeric ``[model]`` key."""

MODEL_PATH_KEYS = ("path", "labels", "versions_dir", "trusted_keys")
"""Keys naming files, relative to the configuration file when given there."""


def check_model(where: str, m: ModelConfig) -> None:
    """The checks across ``[model]`` keys: a share is a share; a fleet source needs trusted keys and
    a channel name, and replaces ``path``."""
    if m.min_agreement > 1:
        raise UsageError(f"{where}: [model] min_agreement is a share, 0..1", "e.g. 0.9 (0 turns the check off)")
    if not m.source:
        return
    from edgekit.fleet.channel import check_channel
    from edgekit.fleet.store import parse_location

    parse_location(m.source, f"{where}: [model] source")
    check_channel(m.channel, f"{where}: [model] channel")
    if m.path:
        raise UsageError(f"{where}: [model] source and path are both set",
                         "give one: a fleet source keeps its versions in [model] versions_dir and serves from there")
    if not m.trusted_keys:
        raise UsageError(f"{where}: [model] source needs trusted_keys (a device runs only signed bundles)",
                         "give --trusted-key PUB (the .pub file of the signing key), or [model] trusted_keys")
