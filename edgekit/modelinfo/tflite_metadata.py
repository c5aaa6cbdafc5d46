"""What a ``.tflite`` says about its own input: the TFLite Support metadata (``TFLITE_METADATA``).

MediaPipe, Model Maker and TF Hub models carry a second flatbuffer (tflite-support's
``metadata_schema.fbs``, file identifier ``M001``) in one of the model's buffers, named by an
entry of the model's ``metadata`` list. It holds, per input tensor, ``NormalizationOptions``
(``(pixel - mean) / std``, pixel units) and ``ImageProperties`` (RGB or grayscale), and names
label files (``TENSOR_AXIS_LABELS``) packed in a zip appended to the .tflite.

Both flatbuffers are read here with a few ``struct`` reads (no ``tflite``/``flatbuffers``
package, so a device needs nothing new). The file is untrusted: every offset is checked against
the file's size, lists are capped, and anything malformed is one :class:`ModelError` naming
the file, never a traceback or a read past the end.
"""

from __future__ import annotations

import math
import mmap
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

from edgekit.errors import ModelError, first_line

TFLITE_IDENTIFIER = b"TFL3"
METADATA_NAME = b"TFLITE_METADATA"
MAX_ITEMS = 4096  # tensors, buffers or metadata entries read from one list (real models: a few)
MAX_CHANNEL_VALUES = 4  # a mean/std list of an image input: 1 or 3 values (4: RGBA)

# tflite-support metadata_schema.fbs: the field slots read (a union field takes two: type, value)
_NORMALIZATION = 1  # ProcessUnitOptions.NormalizationOptions
_IMAGE_PROPERTIES = 2  # ContentProperties.ImageProperties
_AXIS_LABELS, _VALUE_LABELS = 2, 3  # AssociatedFileType
_COLOUR = {1: "rgb", 2: "gray"}  # ColorSpaceType


class _Malformed(Exception):
    """A flatbuffer offset or size that does not fit the file."""


class _Table:
    """A flatbuffer table at ``pos`` of ``buf``, read with bounds checks (see the module notes)."""

    def __init__(self, buf: Any, pos: int):
        self.buf, self.pos = buf, pos
        vtable = pos - _read(buf, "<i", pos)
        self.vt_size = _read(buf, "<H", vtable) if 0 <= vtable <= len(buf) - 4 else -1
        if self.vt_size < 4 or self.vt_size % 2:
            raise _Malformed(f"table at {pos}")
        self.vtable = vtable

    def _field(self, slot: int) -> int | None:
        entry = 4 + 2 * slot
        if entry + 2 > self.vt_size:
            return None
        offset = _read(self.buf, "<H", self.vtable + entry)
        return self.pos + offset if offset else None

    def scalar(self, slot: int, fmt: str, default: Any = 0) -> Any:
        at = self._field(slot)
        return default if at is None else _read(self.buf, "<" + fmt, at)

    def _indirect(self, slot: int) -> int | None:
        at = self._field(slot)
        return None if at is None else at + _read(self.buf, "<I", at)

    def table(self, slot: int) -> _Table | None:
        at = self._indirect(slot)
        return None if at is None else _Table(self.buf, at)

    def vector(self, slot: int, item_size: int) -> tuple[int, int]:
        """``(start, count)`` of a vector field (``(0, 0)`` when absent); its bytes lie in the file."""
        at = self._indirect(slot)
        if at is None:
            return 0, 0
        count = _read(self.buf, "<I", at)
        if at + 4 + count * item_size > len(self.buf):
            raise _Malformed(f"vector of {count} at {at}")
        return at + 4, count

    def tables(self, slot: int) -> list[_Table]:
        start, count = self.vector(slot, 4)
        return [_Table(self.buf, start + 4 * i + _read(self.buf, "<I", start + 4 * i))
                for i in range(min(count, MAX_ITEMS))]

    def string(self, slot: int, limit: int = 1024) -> str:
        start, count = self.vector(slot, 1)
        return bytes(self.buf[start : start + min(count, limit)]).decode("utf-8", "replace")

    def floats(self, slot: int) -> list[float] | None:
        start, count = self.vector(slot, 4)
        if not count:
            return None
        if count > MAX_CHANNEL_VALUES:
            raise _Malformed(f"{count} normalisation values")
        return list(struct.unpack_from(f"<{count}f", self.buf, start))


def _read(buf: Any, fmt: str, pos: int) -> Any:
    if not 0 <= pos <= len(buf) - struct.calcsize(fmt):
        raise _Malformed(f"offset {pos}")
    return struct.unpack_from(fmt, buf, pos)[0]


def _root(buf: Any, identifier: bytes) -> _Table:
    if len(buf) < 8 or bytes(buf[4:8]) != identifier:
        raise _Malformed(f"no {identifier.decode()} identifier")
    return _Table(buf, _read(buf, "<I", 0))


def read_tflite_metadata(path: str | Path) -> dict[str, Any]:
    """What a .tflite's TFLite Support metadata declares: ``{}`` when it has none.

    Returns:
        a dict with any of ``mean``, ``std`` (lists, pixel units), ``colour`` (``rgb``/``gray``)
        of the first input, ``labels`` (the first output's label file, checked like a labels
        file) and ``name`` (the model's name in its metadata).

    Raises ModelError naming the file when the model or its metadata is malformed.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            meta = _metadata_buffer(buf)
            found = _describe(_root(meta, b"M001")) if meta is not None else {}
    except (OSError, ValueError) as exc:  # ValueError: an empty file cannot be mapped
        raise ModelError(f"cannot read {path.name}: {first_line(exc, 300)}",
                         "give a complete .tflite file") from exc
    except (_Malformed, struct.error) as exc:
        raise ModelError(f"{path.name}: its TFLite metadata is malformed ({exc})"[:300],
                         "export the model again, or give the preprocessing with flags") from exc
    if "label_file" in found:
        found["labels"] = _zip_labels(path, found.pop("label_file"))
    return found


def _metadata_buffer(buf: Any) -> bytes | None:
    """The bytes of the model's ``TFLITE_METADATA`` buffer, or None."""
    model = _root(buf, TFLITE_IDENTIFIER)
    entries = [m for m in model.tables(6) if m.string(0, 64).encode() == METADATA_NAME]
    if not entries:
        return None
    index = entries[0].scalar(1, "I")
    buffers = model.tables(4)
    if index >= len(buffers):
        raise _Malformed(f"metadata buffer {index} of {len(buffers)}")
    start, count = buffers[index].vector(0, 1)
    if not count:  # a model over 2 GB keeps buffers after the flatbuffer: offset and size
        start, count = buffers[index].scalar(1, "Q"), buffers[index].scalar(2, "Q")
        if start + count > len(buf):
            raise _Malformed(f"metadata buffer at {start}")
    return bytes(buf[start : start + count])


def _describe(meta: _Table) -> dict[str, Any]:
    """mean/std/colour of the first input, the first output's label file name."""
    found: dict[str, Any] = {}
    name = meta.string(0)
    if name:
        found["name"] = name
    subgraphs = meta.tables(3)
    if not subgraphs:
        return found
    inputs, outputs = subgraphs[0].tables(2), subgraphs[0].tables(3)
    if inputs:
        found.update(_input_facts(inputs[0]))
    for kind in (_AXIS_LABELS, _VALUE_LABELS):  # a classifier's axis labels; an SSD's class-id labels
        files = [f.string(0, 255) for t in outputs for f in t.tables(6) if f.scalar(2, "b") == kind]
        if files:
            found["label_file"] = files[0]
            break
    return found


def _input_facts(tensor: _Table) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    for unit in tensor.tables(4):
        options = unit.table(1)
        if unit.scalar(0, "B") == _NORMALIZATION and options is not None:
            mean, std = options.floats(0), options.floats(1)
            if mean is None or std is None or not all(math.isfinite(v) for v in mean + std):
                raise _Malformed(f"normalisation mean {mean} std {std}")
            facts["mean"], facts["std"] = mean, std
            break
    content = tensor.table(3)
    if content is not None and content.scalar(0, "B") == _IMAGE_PROPERTIES:
        props = content.table(1)
        colour = _COLOUR.get(props.scalar(0, "b")) if props is not None else None
        if colour:
            facts["colour"] = colour
    return facts


def _zip_labels(path: Path, name: str) -> list[str]:
    """The label file ``name`` from the zip appended to the model (checked like a labels file)."""
    from edgekit.bundle import MAX_LABELS_BYTES, check_labels

    fix = "give the labels with --labels FILE"
    try:
        with zipfile.ZipFile(path) as zf:
            info = zf.getinfo(name)
            if info.file_size > MAX_LABELS_BYTES:
                raise ModelError(f"{path.name}: its label file {name} is {info.file_size >> 20} MiB", fix)
            with zf.open(info) as f:
                data = f.read(MAX_LABELS_BYTES + 1)  # the declared size may lie
    # zlib.error: a corrupt deflate stream inside an intact zip directory (zipfile passes it on)
    except (zipfile.BadZipFile, zlib.error, KeyError, OSError, EOFError, NotImplementedError, ValueError) as exc:
        raise ModelError(f"{path.name}: its metadata names the label file {name!r}, which cannot be read: "
                         f"{first_line(exc, 300)}", fix) from exc
    if len(data) > MAX_LABELS_BYTES:
        raise ModelError(f"{path.name}: its label file {name} is larger than {MAX_LABELS_BYTES >> 20} MiB", fix)
    return check_labels(data, f"{path.name}'s label file {name}", fix)
