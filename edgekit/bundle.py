"""Bundles: the directory ``edgekit build`` hands to a device.

A bundle holds model file(s), ``labels.txt``, ``build.log`` and ``edgekit.json``, a public
versioned manifest (stdlib json only, so any tool can read it). Model files are never
modified to carry metadata. Bundles are written to a temporary sibling directory and
renamed into place, so a reader never sees a half-written one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.errors import BundleError, ModelError, first_line
from edgekit.imaging.image import InputSpec
from edgekit.util.safe_open import open_regular, read_regular

FORMAT_VERSION = 1
MANIFEST = "edgekit.json"
MAX_MANIFEST_BYTES = 16 << 20
MAX_OPTION_FILE_BYTES = 64 << 20  # 1,000,000 anchors (detect.anchors.MAX_ANCHORS) as float32 are 16 MB


PATH_OPTIONS = ("anchors",)
"""``task_options`` keys whose string value names a file (an ``[N, 4]`` ``.npy``): in a bundle it must be
a file listed (and hashed) in ``files``; :class:`BundleWriter` copies an outside file in."""


def sha256_file(path: str | Path, follow: bool = True) -> str:
    """Hex sha256 of a regular file, read in 1 MiB blocks (``follow=False``: not through a symlink).

    Raises OSError (:class:`~edgekit.util.safe_open.NotARegularFile` for a FIFO, device or directory:
    hashing one would block or never end)."""
    h = hashlib.sha256()
    with open_regular(path, follow) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# A labels file is untrusted (a copied bundle, a --labels flag) and its lines are printed and
# published with every result: bound its size, each label's length and what a label may hold.
MAX_LABELS_BYTES = 16 << 20  # ImageNet-21k's 21,841 names are about 1 MiB
MAX_LABEL_CHARS = 1000
_LABELS_FIX = "give a UTF-8 text file, one label per line"
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # C0 and C1 controls, tab allowed


def read_labels(path: str | Path) -> list[str]:
    """Read a labels file: UTF-8, one label per line (surrounding spaces stripped), blank lines ignored.

    The one reader of labels, for a bundle's ``labels.txt`` and a ``--labels`` file alike. A
    UTF-8 byte-order mark (Windows editors write one) is dropped rather than glued to the first label.
    Raises ModelError when the file cannot be read, is not UTF-8, is larger than
    :data:`MAX_LABELS_BYTES`, or has a label longer than :data:`MAX_LABEL_CHARS` or holding
    control characters (an ANSI escape sequence in a label would rewrite the user's terminal).
    """
    try:
        data = read_regular(path, MAX_LABELS_BYTES)  # a FIFO or /dev/zero is refused, not waited on
        if len(data) > MAX_LABELS_BYTES:
            raise ModelError(f"labels file {path} is larger than {MAX_LABELS_BYTES >> 20} MiB", _LABELS_FIX)
    except OSError as exc:
        raise ModelError(f"cannot read labels file {path}: {first_line(exc)}", _LABELS_FIX) from exc
    return check_labels(data, f"labels file {path}", _LABELS_FIX)


def check_labels(data: bytes | list[str], origin: str, fix: str = _LABELS_FIX) -> list[str]:
    """Labels from untrusted ``data`` (UTF-8 text, one per line, or a list of names), checked as
    :func:`read_labels` says; ``origin`` names where they came from in the error."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig").splitlines()
        except UnicodeDecodeError as exc:
            raise ModelError(f"cannot read {origin}: {first_line(exc, 300)}", fix) from exc
    labels = [line.strip() for line in data if line.strip()]
    for n, label in enumerate(labels, 1):
        if len(label) > MAX_LABEL_CHARS:
            raise ModelError(f"{origin}: label {n} is {len(label)} characters long (at most {MAX_LABEL_CHARS})", fix)
        if _CONTROL.search(label):
            raise ModelError(f"{origin}: label {n} holds control characters ({label[:40]!r})", fix)
    return labels


@dataclass(frozen=True)
class ModelEntry:
    """One model file in a bundle (a bundle may carry several precisions)."""

    name: str
    file: str
    format: str
    precision: str
    input: InputSpec
    outputs: list[dict]
    extra: dict

    @classmethod
    def from_dict(cls, d: dict) -> ModelEntry:
        known = {"name", "file", "format", "precision", "input", "outputs"}
        return cls(
            name=d["name"],
            file=d["file"],
            format=d["format"],
            precision=d["precision"],
            input=InputSpec.from_dict(d["input"]),
            outputs=list(d.get("outputs", [])),
            extra={k: v for k, v in d.items() if k not in known},
        )


@dataclass(frozen=True)
class Bundle:
    """A loaded, checked bundle. ``manifest`` is the raw edgekit.json dict."""

    path: Path
    manifest: dict

    @property
    def name(self) -> str:
        """The manifest's name, the model's (``demo`` for ``dist/demo-cpu``), else the folder's."""
        return str(self.manifest.get("name") or self.path.name)

    @property
    def target(self) -> str:
        return self.manifest["target"]

    @property
    def models(self) -> list[ModelEntry]:
        return [ModelEntry.from_dict(m) for m in self.manifest["models"]]

    def model(self, name: str | None = None) -> ModelEntry:
        """The model called ``name``, or the bundle's default model."""
        name = name or self.manifest.get("default_model")
        for m in self.models:
            if m.name == name:
                return m
        names = ", ".join(m.name for m in self.models)
        raise BundleError(f"bundle {self.path} has no model {name!r}", f"choose one of: {names}")

    def model_path(self, name: str | None = None) -> Path:
        return self.path / self.model(name).file

    @property
    def input_spec(self) -> InputSpec:
        return self.model().input

    @property
    def labels(self) -> list[str]:
        """The class names in output order (:func:`read_labels` of the bundle's labels file)."""
        name = self.manifest.get("labels")
        return read_labels(self.path / name) if name else []

    @property
    def runtime(self) -> dict:
        return self.manifest.get("runtime", {})

    @property
    def task(self) -> str:
        """The task head that decodes this bundle's outputs (bundles before ``task``: classify)."""
        return self.manifest.get("task") or "classify"


def load_bundle(path: str | Path, check_hashes: bool = True, allow_rejected: bool = False) -> Bundle:
    """Read and check a bundle directory.

    Raises BundleError when the directory or manifest is missing or corrupt, the manifest
    comes from a newer edgekit, a model or labels file is not covered by the sha256 list, a
    listed file lies outside the bundle or is missing, (with ``check_hashes``) a file's sha256
    differs, or the bundle failed its accuracy gate at build time (unless ``allow_rejected``).
    """
    path = Path(path)
    mpath = path / MANIFEST
    if not path.is_dir():
        raise BundleError(f"bundle {path} does not exist", "build one with: edgekit build ...")
    if not mpath.is_file():
        raise BundleError(f"{path} is not an edgekit bundle (no {MANIFEST})", "build one with: edgekit build ...")
    manifest = _read_manifest(mpath)
    if not isinstance(manifest, dict) or "format_version" not in manifest:
        raise BundleError(f"{mpath} is not an edgekit manifest (no format_version)", "rebuild the bundle")
    version = manifest["format_version"]
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise BundleError(
            f"{path} uses bundle format {version}; this edgekit reads up to {FORMAT_VERSION}",
            "upgrade edgekit on this device",
        )
    for key, kind in (("target", str), ("models", list), ("files", dict)):
        if not isinstance(manifest.get(key), kind):
            raise BundleError(f"{mpath}: {key!r} is missing or not a {kind.__name__}", "rebuild the bundle")
    if not isinstance(manifest.get("runtime", {}), dict):
        raise BundleError(f"{mpath}: 'runtime' is not an object", "rebuild the bundle")
    for key, kind in (("task", str), ("verification", dict), ("default_model", str)):
        if manifest.get(key) is not None and not isinstance(manifest[key], kind):  # optional, but typed
            raise BundleError(f"{mpath}: {key!r} is not a {kind.__name__}", "rebuild the bundle")
    _check_files(path, manifest, check_hashes)
    try:
        bundle = Bundle(path=path, manifest=manifest)
        bundle.model()
    except (KeyError, TypeError) as exc:
        raise BundleError(f"{mpath} has a malformed model entry: {exc}", "rebuild the bundle") from exc
    _check_task(mpath, bundle)
    from edgekit.heads.openset import check_manifest  # numpy: imported when a bundle is loaded, not with this module

    if problem := check_manifest(manifest.get("openset")):
        raise BundleError(f"{mpath}: {problem}", "rebuild the bundle")
    verification = manifest.get("verification") or {}
    if not isinstance(verification.get("passed"), (bool, type(None))):  # "false" or 0 ran as passed
        raise BundleError(f"{mpath}: verification.passed is {verification['passed']!r}, not true or false",
                          "rebuild the bundle")
    if verification.get("passed") is False and not allow_rejected:
        raise BundleError(
            f"{path} failed its accuracy check at build time ({verification.get('reason') or 'see edgekit.json'})",
            "rebuild it, or pass --allow-rejected to run it anyway for inspection",
        )
    return bundle


def _read_manifest(mpath: Path) -> Any:
    """The parsed ``edgekit.json``: a regular file (not a link, FIFO or device) of a bounded size."""
    try:
        data = read_regular(mpath, MAX_MANIFEST_BYTES, follow=False)
    except OSError as exc:
        raise BundleError(f"{mpath} cannot be read: {exc.strerror or exc}", "rebuild the bundle") from exc
    if len(data) > MAX_MANIFEST_BYTES:  # a real one is a few KiB
        raise BundleError(f"{mpath} is over {MAX_MANIFEST_BYTES >> 20} MiB, not an edgekit manifest",
                          "rebuild the bundle")
    try:
        return json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:  # "[" * 100000: RecursionError
        raise BundleError(f"{mpath} is corrupt: {exc}"[:300], "rebuild the bundle") from exc


def _check_task(mpath: Path, bundle: Bundle) -> None:
    """``task`` names a known head; a model's ``task_options.output_index`` points at one of its outputs."""
    from edgekit.heads.table import TASK_HEADS

    if bundle.task not in TASK_HEADS:
        raise BundleError(f"{mpath}: unknown task {bundle.task!r} (this edgekit knows {', '.join(TASK_HEADS)})",
                          "upgrade edgekit on this device, or rebuild the bundle")
    for m in bundle.models:
        options = m.extra.get("task_options", {})
        index = options.get("output_index", 0) if isinstance(options, dict) else None
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < max(len(m.outputs), 1):
            raise BundleError(f"{mpath}: model {m.name!r} has malformed task_options {options!r}",
                              "rebuild the bundle")


def _check_files(path: Path, manifest: dict, check_hashes: bool) -> None:
    """Every path the manifest names (model files, ``labels``, :data:`PATH_OPTIONS` of each model's
    ``task_options``) is listed in ``files``; every listed file lies inside the bundle (``..``, an
    absolute name or a symlink leading out is refused) and is a regular file; with ``check_hashes``
    each matches its sha256 (read once, never through a symlink, never blocking on a FIFO).

    A listed file that is missing is an error even without ``check_hashes``: a half-copied bundle
    must not load. ``labels`` is held to the model files' rule because its lines are published with
    every result: ``"labels": "/etc/passwd"`` would otherwise put a device file on the network, as
    ``"anchors": "/etc/x.npy"`` would let a copied bundle make the device read any file.
    """
    mpath, root = path / MANIFEST, path.resolve()
    for what, name in _named_files(manifest):
        if not isinstance(name, str) or name not in manifest["files"]:
            # an unlisted file would escape the sha256 check
            raise BundleError(f"{mpath}: {what} {name!r} is not listed in 'files'"[:300], "rebuild the bundle")
    for name, digest in manifest["files"].items():
        fpath = path / name
        short = name if len(name) <= 80 else name[:80] + "..."
        try:
            real = fpath.resolve(strict=False)
            inside, present = root in real.parents, fpath.is_file()
            matches = not (check_hashes and inside and present) or sha256_file(real, follow=False) == digest
        except (OSError, ValueError, RuntimeError) as exc:  # a NUL byte, a name too long, a symlink loop
            raise BundleError(f"{mpath}: file {short!r} cannot be read: {getattr(exc, 'strerror', None) or exc}",
                              "rebuild the bundle") from exc
        if not inside:
            raise BundleError(f"{mpath}: file {short!r} points outside the bundle", "rebuild the bundle")
        if not present and os.path.lexists(fpath):  # a FIFO, device or directory where a file is listed
            raise BundleError(f"{mpath}: file {short!r} is not a regular file", "rebuild the bundle")
        if not present:
            raise BundleError(f"bundle {path} is missing {short}", "copy the whole bundle directory again")
        if not matches:
            raise BundleError(
                f"{fpath} does not match its sha256 in {MANIFEST} (corrupt or modified)",
                "copy the bundle again or rebuild it",
            )


def _named_files(manifest: dict) -> list[tuple[str, Any]]:
    """(what, name) of every file the manifest names outside ``files``."""
    named = [("model file", e.get("file") if isinstance(e, dict) else None) for e in manifest["models"]]
    if manifest.get("labels") is not None:
        named.append(("labels file", manifest["labels"]))
    for entry in manifest["models"]:
        options = entry.get("task_options") if isinstance(entry, dict) else None
        for key in PATH_OPTIONS if isinstance(options, dict) else ():
            if isinstance(options.get(key), str):  # a list of anchors is inline, not a file
                named.append((f"task_options.{key} file", options[key]))
    return named


def option_path(bundle: Bundle, name: str) -> str:
    """The absolute path of a :data:`PATH_OPTIONS` file ``name`` that :func:`load_bundle` checked
    (listed, hashed, inside): what the head's reader opens (it refuses relative paths)."""
    return str(bundle.path.resolve() / name)


class BundleWriter:
    """Write a bundle into a temporary directory, then rename it into place.

    Use as a context manager: on an exception (Ctrl-C included) the temporary directory is
    removed and any existing bundle at ``dest`` is left untouched.

    >>> with BundleWriter("dist/demo-cpu") as w:          # doctest: +SKIP
    ...     shutil.copy(model, w.dir / "model.tflite")
    ...     w.commit(manifest)
    """

    def __init__(self, dest: str | Path):
        self.dest = Path(dest)
        self.dir: Path | None = None
        self._committed = False

    def __enter__(self) -> BundleWriter:
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=f".{self.dest.name}.tmp-{os.getpid()}-", dir=self.dest.parent))
        return self

    def commit(self, manifest: dict[str, Any]) -> Path:
        """Hash every file, write edgekit.json last, and rename the bundle into place."""
        assert self.dir is not None, "use BundleWriter as a context manager"
        manifest = self._take_in_option_files(manifest)
        files = {}
        for f in sorted(self.dir.rglob("*")):
            if f.is_file() and f.name != MANIFEST:
                files[f.relative_to(self.dir).as_posix()] = sha256_file(f)
        manifest = {"format_version": FORMAT_VERSION, **manifest, "files": files}
        tmp = self.dir / (MANIFEST + ".part")
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=False, default=_json_default) + "\n")
        os.replace(tmp, self.dir / MANIFEST)
        os.chmod(self.dir, 0o755)  # noqa: S103 - mkdtemp makes 0700; bundles are meant to be shared
        old = None
        if self.dest.exists():
            old = self.dest.with_name(f".{self.dest.name}.old-{os.getpid()}")
            os.replace(self.dest, old)
        os.replace(self.dir, self.dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self._committed = True
        return self.dest

    def _take_in_option_files(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``manifest`` whose :data:`PATH_OPTIONS` name files inside the bundle: a file
        given by absolute path (``-T anchors=/data/anchors.npy``) is copied in, named by its content,
        so the device reads what was hashed and nothing outside the bundle."""
        models = manifest.get("models")
        if not isinstance(models, list):
            return manifest
        out = []
        for entry in models:
            options = entry.get("task_options") if isinstance(entry, dict) else None
            for key in PATH_OPTIONS if isinstance(options, dict) else ():
                source = options[key] if isinstance(options.get(key), str) else ""
                if os.path.isabs(source):
                    try:
                        data = read_regular(source, MAX_OPTION_FILE_BYTES)
                    except OSError as exc:
                        raise BundleError(f"task_options.{key}: cannot read {source}: {exc.strerror or exc}",
                                          "give a readable .npy file") from exc
                    if len(data) > MAX_OPTION_FILE_BYTES:
                        raise BundleError(f"task_options.{key}: {source} is over {MAX_OPTION_FILE_BYTES >> 20} MiB",
                                          "give the [N, 4] anchors as a float32 .npy")
                    name = f"{key}-{hashlib.sha256(data).hexdigest()[:12]}{Path(source).suffix}"
                    (self.dir / name).write_bytes(data)
                    options = {**options, key: name}
                    entry = {**entry, "task_options": options}
            out.append(entry)
        return {**manifest, "models": out}

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._committed and self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)


def _json_default(obj: Any) -> Any:
    try:
        import numpy as np

        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, np.ndarray):
            return obj.tolist()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")
