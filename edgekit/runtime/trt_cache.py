"""The TensorRT engine cache: keys, locations, sidecars, atomic writes, build locks and lookup.

An engine (a "plan") is specific to one GPU and one TensorRT version, so engines are cached
on the device that built them:

* beside the bundle in ``<bundle>/.engines/`` or, when the bundle is read-only, in
  ``$XDG_CACHE_HOME/edgekit/engines/<hash of the bundle path>/``;
* one ``<onnx stem>.<precision>.plan`` per model and precision, with a JSON sidecar
  ``<...>.plan.json`` holding the cache key and what the build really produced. The plan
  file itself is never modified, so ``trtexec --loadEngine`` and other tools can read it;
* keyed by TensorRT version, GPU name and compute capability, ONNX sha256, precision and
  input shape: a mismatch (a JetPack upgrade, another module, a rebuilt bundle) rebuilds
  and says why. A plan whose sha256 differs from its sidecar's (torn write) is rebuilt too.

Nothing here imports TensorRT or CUDA; :mod:`edgekit.runtime.trt_engine` ties cache and build.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from edgekit.bundle import sha256_file

ENGINE_DIR = ".engines"
SIDECAR_FORMAT = "edgekit-tensorrt-engine"
SIDECAR_VERSION = 1


@dataclass(frozen=True)
class GpuInfo:
    """The GPU an engine is built for: name, compute capability (e.g. "8.7") and index."""

    name: str
    compute_capability: str
    index: int = 0


@dataclass(frozen=True)
class EngineKey:
    """Everything that makes a cached engine unusable when it changes."""

    tensorrt: str
    gpu: str
    compute_capability: str
    onnx_sha256: str
    precision: str
    input_shape: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["input_shape"] = list(self.input_shape)
        return d

    def differences(self, other: dict[str, Any] | None) -> list[str]:
        """Human-readable reasons why an engine built under ``other`` (a sidecar key) cannot be reused."""
        if not other:
            return ["no cached engine"]
        mine = self.to_dict()
        labels = {
            "tensorrt": "TensorRT version",
            "gpu": "GPU",
            "compute_capability": "compute capability",
            "onnx_sha256": "ONNX model (sha256)",
            "precision": "precision",
            "input_shape": "input shape",
        }
        out = []
        for k, label in labels.items():
            if other.get(k) != mine[k]:
                old, new = other.get(k), mine[k]
                if k == "onnx_sha256":
                    old, new = str(old)[:12], str(new)[:12]
                out.append(f"{label} changed: {old} -> {new}")
        return out


def engine_cache_dir(model_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Where engines for ``model_path`` live: ``cache_dir`` if given, else ``.engines/`` beside
    the model, else (read-only bundle) a per-bundle folder in the user's cache directory."""
    if cache_dir is not None:
        path = Path(cache_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path
    beside = Path(model_path).resolve().parent / ENGINE_DIR
    try:
        beside.mkdir(exist_ok=True)
        if os.access(beside, os.W_OK | os.X_OK):
            return beside
    except OSError:
        pass  # read-only bundle (a mounted image, another user's directory): use the user cache
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgekit" / "engines"
    digest = hashlib.sha256(str(Path(model_path).resolve().parent).encode()).hexdigest()[:16]
    path = base / digest
    path.mkdir(parents=True, exist_ok=True)
    return path


def plan_path_for(model_path: str | Path, precision: str, cache_dir: Path) -> Path:
    """The plan file for one model and precision inside ``cache_dir``."""
    return cache_dir / f"{Path(model_path).stem}.{precision}.plan"


def sidecar_path(plan_path: str | Path) -> Path:
    """The JSON sidecar beside a plan file (metadata never goes inside the plan)."""
    return Path(str(plan_path) + ".json")


def read_sidecar(plan_path: str | Path) -> dict[str, Any] | None:
    """The sidecar of a plan, or None when missing, unreadable or not ours."""
    try:
        data = json.loads(sidecar_path(plan_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != SIDECAR_FORMAT:
        return None
    return data


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of bytes (a plan's, as its sidecar records it)."""
    return hashlib.sha256(data).hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    """Write a file so that readers see the old or the new content, never half of it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def build_lock(cache_dir: Path, stem: str) -> Iterator[None]:
    """Serialise builds of one engine between processes (two services starting together)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not Linux; Jetsons are
        yield
        return
    with open(cache_dir / f".{stem}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def timing_cache_path(cache_dir: Path, trt_version: str, gpu: GpuInfo) -> Path:
    """Timing caches are specific to a TensorRT version and GPU too: one file per pair."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu.name).strip("-").lower() or "gpu"
    return cache_dir / f"timing-trt{trt_version}-{slug}-sm{gpu.compute_capability.replace('.', '')}.cache"



@dataclass(frozen=True)
class Engine:
    """A usable plan on disk and its sidecar record.

    ``built`` is True when this call built it (``reason`` says why), False when the cached
    plan was reused. ``record`` is the sidecar dict (key, precision report, I/O names,
    build time).
    """

    plan_path: Path
    record: dict[str, Any]
    built: bool
    reason: str

    @property
    def precision_used(self) -> str:
        return self.record.get("precision", {}).get("used", "unknown")

    @property
    def outputs(self) -> list[str]:
        return list(self.record.get("outputs", []))


def engine_key(trt: Any, gpu: GpuInfo, onnx_path: Path, precision: str, shape: tuple[int, ...] | None) -> EngineKey:
    """The cache key of one model on this device."""
    return EngineKey(
        tensorrt=str(trt.__version__),
        gpu=gpu.name,
        compute_capability=gpu.compute_capability,
        onnx_sha256=sha256_file(onnx_path),
        precision=precision,
        input_shape=tuple(int(d) for d in shape) if shape else (),
    )


def cached_engine(plan_path: Path, key: EngineKey) -> tuple[dict[str, Any] | None, list[str]]:
    """The sidecar of a reusable cached plan (or None) and the reasons it is not reusable."""
    record = read_sidecar(plan_path)
    if record is None:
        return None, ["no cached engine" if not plan_path.exists() else "cached engine has no valid sidecar"]
    old_key = record.get("key") or {}
    if not key.input_shape and not record.get("dynamic_input"):
        # No shape given (a bare .onnx): a static-shape engine of this model fits whatever its shape.
        key = replace(key, input_shape=tuple(old_key.get("input_shape", ())))
    reasons = key.differences(old_key)
    if reasons:
        return None, reasons
    if not plan_path.is_file():
        return None, ["plan file missing"]
    if sha256_file(plan_path) != record.get("plan_sha256"):
        return None, ["plan file does not match its sidecar (interrupted write or modified)"]
    return record, []




def store_engine(plan_path: Path, plan: bytes, record: dict[str, Any]) -> None:
    """Write a plan and its sidecar. Plan first, sidecar last: a crash in between leaves a sha
    mismatch, which the next lookup treats as a rebuild."""
    write_atomic(plan_path, plan)
    write_atomic(sidecar_path(plan_path), (json.dumps(record, indent=2) + "\n").encode())
