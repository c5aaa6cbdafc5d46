"""The wire between edgekit and a vendor child: JSON and ``.npy`` arrays, nothing else.

Imported by both sides: by edgekit as ``edgekit.toolchain.jobs.jobwire`` and by the job
scripts, which run in a toolchain's interpreter where edgekit is not installed, as the
sibling module ``jobwire`` (a script run by path has its folder first on ``sys.path``). It
may therefore import only the standard library and numpy.

Two forms:

* a one-shot job: ``job.json`` and the arrays it names (``in/NAME.npy``) in a work folder;
  the child writes ``result.json`` and ``out/NAME.npy`` there (:func:`read_job`,
  :func:`write_result`);
* a session over pipes (the simulator as a runtime): each message is a 4-byte big-endian
  length and a JSON header, then as many arrays as the header's ``"arrays"`` says, each an
  8-byte length and the bytes of an ``.npy`` file (:func:`send`, :func:`receive`). Arrays are
  read with ``allow_pickle=False``: a message can carry numbers only, never code.
"""

from __future__ import annotations

import io
import json
import os
import struct
import sys
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

JOB = "job.json"
RESULT = "result.json"
MAX_HEADER = 1 << 20
MAX_ARRAY = 1 << 31


class WireError(RuntimeError):
    """The other side sent something that is not a message (it died, or printed onto the pipe)."""


def write_arrays(folder: Path, arrays: dict[str, np.ndarray]) -> dict[str, str]:
    """Save each array as ``folder/NAME.npy``; returns name -> file name (relative to the job folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    names = {}
    for name, array in arrays.items():
        np.save(folder / f"{name}.npy", np.ascontiguousarray(array), allow_pickle=False)
        names[name] = f"{folder.name}/{name}.npy"
    return names


def load_arrays(root: Path, names: dict[str, str]) -> dict[str, np.ndarray]:
    """The arrays ``names`` points at (files relative to ``root``), never unpickled."""
    return {name: np.load(root / rel, allow_pickle=False) for name, rel in names.items()}


def read_job(folder: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The job and its input arrays, in the child."""
    job = json.loads((folder / JOB).read_text(encoding="utf-8"))
    return job, load_arrays(folder, job.get("arrays", {}))


def write_result(folder: Path, result: dict[str, Any], arrays: dict[str, np.ndarray] | None = None) -> None:
    """``result.json`` (with ``"arrays"``: the output files), written whole, in the child."""
    result = {**result, "arrays": write_arrays(folder / "out", arrays) if arrays else {}}
    tmp = folder / (RESULT + ".tmp")
    tmp.write_text(json.dumps(result, default=_plain), encoding="utf-8")
    os.replace(tmp, folder / RESULT)


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as one line. RKNN-Toolkit2 raises ValueErrors whose message is a whole traceback
    ending in the reason (``ValueError: The value of disable_rules only support <class 'list'> !``):
    the last line that names an error is the one a user needs."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    told = [ln for ln in lines if ln.split(":", 1)[0].endswith(("Error", "Exception"))]
    text = told[-1] if told else (lines[0] if lines else "")
    return f"{type(exc).__name__}: {text}"[:limit] if not told else text[:limit]


def _plain(value: Any) -> Any:
    """numpy scalars and arrays as JSON numbers and lists."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def _read_exactly(stream: BinaryIO, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            raise WireError(f"the other side closed the pipe ({len(data)} of {n} bytes read)")
        data += chunk
    return bytes(data)


def send(stream: BinaryIO, header: dict[str, Any], arrays: list[np.ndarray] = ()) -> None:
    """Write one message: the header (``"arrays"`` set to their count), then each array as ``.npy``."""
    body = json.dumps({**header, "arrays": len(arrays)}, default=_plain).encode("utf-8")
    parts = [struct.pack(">I", len(body)), body]
    for array in arrays:
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
        parts += [struct.pack(">Q", buf.getbuffer().nbytes), buf.getvalue()]
    stream.write(b"".join(parts))
    stream.flush()


def receive(stream: BinaryIO) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Read one message written by :func:`send`; WireError when the bytes are not one."""
    (size,) = struct.unpack(">I", _read_exactly(stream, 4))
    if size > MAX_HEADER:
        raise WireError(f"a header of {size} bytes: the pipe carries something else (vendor output?)")
    try:
        header = json.loads(_read_exactly(stream, size))
    except ValueError as exc:
        raise WireError(f"a header that is not JSON: {exc}") from None
    arrays = []
    for _ in range(int(header.get("arrays", 0))):
        (n,) = struct.unpack(">Q", _read_exactly(stream, 8))
        if n > MAX_ARRAY:
            raise WireError(f"an array of {n} bytes is over the limit")
        arrays.append(np.load(io.BytesIO(_read_exactly(stream, n)), allow_pickle=False))
    return header, arrays


def claim_stdout() -> tuple[BinaryIO, BinaryIO]:
    """In a session child: (the pipe to read requests from, the pipe to answer on).

    Vendor libraries print to stdout (RKNN-Toolkit2 does, from Python and C++): the answer pipe
    is a private duplicate of fd 1, and fd 1 is pointed at stderr (the parent's log), so no
    stray line can land between two messages.
    """
    answer = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return sys.stdin.buffer, answer
