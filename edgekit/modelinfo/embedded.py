"""What a model file declares about itself: preprocessing, labels, task, input size.

Exporters write this into the model: Ultralytics puts ``task``, ``names``, ``imgsz``, ``stride``
... in an ONNX model's ``metadata_props`` (strings; ``names`` is a Python dict literal); MediaPipe
and Model Maker put normalisation and labels in a .tflite's TFLite metadata
(:mod:`edgekit.modelinfo.tflite_metadata`). :func:`read_embedded` turns either into one
:class:`Embedded`; where it stands among flags and sidecar files is
:mod:`edgekit.modelinfo.preprocessing`'s business.

Device side: numpy-free even. The ONNX file is not loaded: its protobuf is walked field by field
(seeking past the graph's weights), so a 100 MB model costs a few reads. Every value is
untrusted: sizes are capped, ``names`` is parsed with ``ast.literal_eval`` (never ``eval``) and
checked like a labels file, and a malformed value is one ModelError naming the file.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from edgekit.errors import ModelError, first_line

MAX_PROP_BYTES = 1 << 20  # one metadata value: COCO's 80 names are ~1.3 KB, ImageNet's 1000 ~30 KB
MAX_PROPS = 256
MAX_SIDE = 16384  # as edgekit.imaging.image.MAX_SIDE (not imported: this module stays free of numpy)
ULTRALYTICS_PAD = 114  # the grey of Ultralytics' LetterBox (ultralytics/data/augment.py)
# Ultralytics task -> edgekit task head (segment, pose and obb outputs are not boxes + classes only)
_ULTRALYTICS_TASKS = {"detect": "detect", "classify": "classify"}


@dataclass(frozen=True)
class Embedded:
    """What one model file declares about itself (everything optional).

    ``preprocess`` holds :data:`edgekit.modelinfo.preprocessing.PREPROCESS_KEYS` values; ``input_size`` is
    ``(height, width)``; ``source`` says where it was read (``Ultralytics ONNX metadata``,
    ``TFLite metadata``), for the line that tells the user what was assumed.
    """

    source: str = ""
    preprocess: dict[str, Any] = field(default_factory=dict)
    labels: list[str] | None = None
    task: str | None = None
    input_size: tuple[int, int] | None = None
    input_dims: tuple[Any, ...] | None = None  # the ONNX graph's first input (ints, or names if symbolic)
    notes: tuple[str, ...] = ()
    task_options: dict[str, Any] = field(default_factory=dict)  # the task head's, as a bundle records them


def read_embedded(path: str | Path) -> Embedded:
    """What ``path`` (a .onnx or .tflite) declares about itself; an empty Embedded for other files."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        props, dims = read_onnx_metadata(path)
        found = ultralytics(props, path.name) if _is_ultralytics(props) else Embedded()
        return Embedded(found.source, found.preprocess, found.labels, found.task, found.input_size, dims, found.notes)
    if suffix == ".tflite":
        from edgekit.modelinfo.tflite_metadata import read_tflite_metadata

        meta = read_tflite_metadata(path)
        pre = {k: meta[k] for k in ("colour", "mean", "std") if k in meta}
        if not pre and not meta.get("labels"):
            return Embedded()
        return Embedded("TFLite metadata", pre, meta.get("labels"))
    return Embedded()


# --- ONNX: a protobuf walk over ModelProto (onnx.proto field numbers) -------------------------------

_GRAPH, _METADATA_PROPS = 7, 14  # ModelProto
_GRAPH_INPUT = 11  # GraphProto.input (ValueInfoProto: name 1, type 2)


def read_onnx_metadata(path: Path) -> tuple[dict[str, str], tuple[Any, ...] | None]:
    """``(metadata_props, first input's dims)`` of an ONNX file, without loading its graph.

    Dims are ints, or the names of symbolic dimensions (``"height"``), or None when not recorded.
    """
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            props: dict[str, str] = {}
            dims = None
            for number, length in protobuf_fields(f, size):
                if number == _METADATA_PROPS and length is not None:
                    _metadata_entry(_read_capped(f, length), props)
                elif number == _GRAPH and length is not None and dims is None:
                    end = f.tell() + length
                    dims = _first_input_dims(f, end)
                    f.seek(end)
                elif length is not None:
                    f.seek(length, 1)
    except OSError as exc:
        raise ModelError(f"cannot read {path.name}: {first_line(exc, 300)}") from exc
    except MalformedProtobuf as exc:
        raise ModelError(f"{path.name} is not a readable ONNX model ({exc})"[:300],
                         "copy or export the model again") from exc
    return props, dims


class MalformedProtobuf(Exception):
    """Bytes that are not the protobuf they should be."""


def read_varint(f: BinaryIO) -> int | None:
    """A protobuf varint, or None at the end of the file."""
    value = shift = 0
    while True:
        byte = f.read(1)
        if not byte:
            if shift:
                raise MalformedProtobuf("cut in a varint")
            return None
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7
        if shift > 63:
            raise MalformedProtobuf("varint longer than 10 bytes")


def protobuf_fields(f: BinaryIO, end: int):
    """``(field number, length)`` of each field up to ``end``: length for length-delimited fields
    (the file is left at their start), None for scalars (already read past)."""
    while f.tell() < end:
        tag = read_varint(f)
        if tag is None:
            return
        number, wire = tag >> 3, tag & 7
        if wire == 2:
            length = read_varint(f)
            if length is None or f.tell() + length > end:
                raise MalformedProtobuf(f"field {number} runs past its end")
            yield number, length
        elif wire == 0:
            if read_varint(f) is None:
                raise MalformedProtobuf("cut in a varint")
            yield number, None
        elif wire in (1, 5):
            f.seek(8 if wire == 1 else 4, 1)
            yield number, None
        else:
            raise MalformedProtobuf(f"wire type {wire}")


def _read_capped(f: BinaryIO, length: int) -> bytes:
    if length > MAX_PROP_BYTES:
        raise MalformedProtobuf(f"a metadata entry of {length} bytes")
    return f.read(length)


def _metadata_entry(data: bytes, props: dict[str, str]) -> None:
    """One StringStringEntryProto (key 1, value 2) into ``props``."""
    import io

    if len(props) >= MAX_PROPS:
        raise MalformedProtobuf(f"more than {MAX_PROPS} metadata entries")
    f, key, value = io.BytesIO(data), "", ""
    for number, length in protobuf_fields(f, len(data)):
        if length is None:
            continue
        text = f.read(length).decode("utf-8", "replace")
        key, value = (text, value) if number == 1 else (key, text) if number == 2 else (key, value)
    props[key] = value


def _first_input_dims(f: BinaryIO, end: int) -> tuple[Any, ...] | None:
    """Dims of GraphProto's first ``input`` (ValueInfo -> TypeProto.tensor_type -> shape -> dim)."""
    import io

    for number, length in protobuf_fields(f, end):
        if length is None or number != _GRAPH_INPUT:
            if length is not None:
                f.seek(length, 1)
            continue
        if length > MAX_PROP_BYTES:
            return None
        value_info = f.read(length)
        shape = _nested(io.BytesIO(value_info), (2, 1, 2))  # type -> tensor_type -> shape
        if shape is None:
            return None
        dims = []
        g = io.BytesIO(shape)
        for dim_no, dim_len in protobuf_fields(g, len(shape)):
            if dim_no == 1 and dim_len is not None:
                dims.append(_dim(g.read(dim_len)))
        return tuple(dims)
    return None


def _nested(f: BinaryIO, path: tuple[int, ...]) -> bytes | None:
    """The bytes of the sub-message reached by field numbers ``path``."""
    import io

    data = f.read()
    for number in path:
        g, found = io.BytesIO(data), None
        for n, length in protobuf_fields(g, len(data)):
            if length is None:
                continue
            chunk = g.read(length)
            if n == number and found is None:
                found = chunk
        if found is None:
            return None
        data = found
    return data


def _dim(data: bytes) -> Any:
    """TensorShapeProto.Dimension: dim_value (1, varint) or dim_param (2, string)."""
    import io

    g = io.BytesIO(data)
    while g.tell() < len(data):
        tag = read_varint(g)
        if tag is None:
            break
        if tag == (1 << 3) | 0:
            return read_varint(g)
        if tag == (2 << 3) | 2:
            length = read_varint(g) or 0
            return g.read(length).decode("utf-8", "replace") or "?"
        raise MalformedProtobuf("unexpected field in a dimension")
    return "?"


# --- Ultralytics ----------------------------------------------------------------------------------


def _is_ultralytics(props: dict[str, str]) -> bool:
    """Ultralytics' exporter writes ``author: Ultralytics`` plus task, names, imgsz, stride."""
    return props.get("author", "").startswith("Ultralytics") or {"task", "names", "imgsz"} <= set(props)


def ultralytics(props: dict[str, str], name: str) -> Embedded:
    """An Ultralytics export's metadata: task, labels from ``names``, input size from ``imgsz``,
    and its predictor's preprocessing (RGB, pixels / 255; detectors letterboxed with grey 114 by
    bilinear resizing, classifiers centre-cropped to square)."""
    task = props.get("task", "detect")
    labels = _names(props["names"], name) if "names" in props else None
    size = _imgsz(props["imgsz"], name) if "imgsz" in props else None
    gray = props.get("channels", "3").strip() == "1"  # newer exports say how many channels they were trained on
    pre: dict[str, Any] = {"colour": "gray" if gray else "rgb", "mean": [0.0], "std": [255.0],
                           "interpolation": "linear"}
    if task == "classify":  # classify_transforms: shorter side to imgsz, centre crop (crop_fraction 1.0)
        pre.update(crop="square", resize="stretch")
    else:  # LetterBox(new_shape, auto=False) for a fixed-size export: centred, grey borders
        pre.update(crop=None, resize="letterbox", pad_value=ULTRALYTICS_PAD)
    notes = () if task in _ULTRALYTICS_TASKS else (f"Ultralytics task {task!r} has no edgekit head: outputs are raw",)
    return Embedded("Ultralytics ONNX metadata", pre, labels, _ULTRALYTICS_TASKS.get(task), size, notes=notes)


def _names(text: str, name: str) -> list[str]:
    """``names``: ``"{0: 'person', 1: 'bicycle'}"`` (or a list literal) -> labels in class order."""
    from edgekit.bundle import check_labels

    fix = "give the labels with --labels FILE"
    try:
        value = ast.literal_eval(text)  # literals only: a crafted "names" cannot run code
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise ModelError(f"{name}: its metadata 'names' is not a dict or list literal", fix) from exc
    if isinstance(value, dict):
        if sorted(value) != list(range(len(value))) or not all(isinstance(k, int) for k in value):
            raise ModelError(f"{name}: its metadata 'names' is not numbered 0..{len(value) - 1}", fix)
        value = [value[i] for i in range(len(value))]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ModelError(f"{name}: its metadata 'names' is not a list of class names", fix)
    labels = check_labels([v.replace("\n", " ") for v in value], f"{name}'s metadata 'names'", fix)
    if len(labels) != len(value):  # a blank name would shift every class after it
        raise ModelError(f"{name}: its metadata 'names' has blank names", fix)
    return labels


def _imgsz(text: str, name: str) -> tuple[int, int]:
    """``imgsz``: ``"[640, 640]"`` or ``"640"`` -> ``(height, width)``."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        value = None
    if isinstance(value, int):
        value = [value, value]
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SIDE for v in value)):
        raise ModelError(f"{name}: its metadata 'imgsz' {text[:40]!r} is not [height, width] (1 to {MAX_SIDE})",
                         "give the size with --input-size HxW")
    return int(value[0]), int(value[1])


def graph_disagreements(found: Embedded, input_hw: tuple[Any, Any], outputs: list[list[Any]]) -> tuple[bool, list[str]]:
    """Where a model's metadata contradicts its graph: (keep the metadata's task?, one note each).

    Metadata is written by an exporter and copied by hand; the graph is what runs. A ``classify``
    task on an output that is no vector of class scores (a detector's ``[1, 4+classes, boxes]``)
    would top-k box coordinates as "class scores", so that task is dropped with a note; an
    ``imgsz`` other than the graph's fixed input size says the metadata is another export's.
    """
    keep, notes = True, []
    if found.task == "classify" and len(outputs) == 1:
        wide = [d for d in outputs[0][1:] if d != 1]  # a classifier: one axis of scores past the batch
        if len(wide) > 1:
            keep = False
            notes.append(f"{found.source} task 'classify' ignored: the output {list(outputs[0])} is not one vector "
                         "of class scores (give --task detect if it is a detector)")
    height, width = input_hw
    if found.input_size and all(isinstance(d, int) and d > 0 for d in (height, width)) \
            and tuple(found.input_size) != (height, width):
        notes.append(f"{found.source} imgsz {found.input_size[0]}x{found.input_size[1]} disagrees with the "
                     f"graph's input {height}x{width}: the graph's is used (the metadata may be another export's)")
    return keep, notes
