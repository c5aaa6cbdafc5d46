"""A fake ``cuda.bindings.runtime`` that keeps real bytes and records every call.

It behaves like cuda-python's runtime bindings where edgekit depends on it: every function
returns a tuple whose first item is a ``cudaError_t``; ``cudaMallocHost`` returns the address
of real host memory (numpy can view it through ctypes); "device" memory is bytes held here,
reached only through ``cudaMemcpyAsync`` (and the fake TensorRT's kernels); streams and
events are objects with ``int()``; ``cudaEventElapsedTime`` measures host time between the
two records.

Knobs: ``DEVICES`` (the GPUs; empty means none), ``FAIL`` (function name -> error to return).
``CALLS`` records ``(function, *details)``; ``live()`` counts unfreed allocations, streams and
events so tests can check that ``close()`` released everything. ``reset()`` restores defaults.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
import time
from types import SimpleNamespace


class cudaError_t(enum.IntEnum):  # noqa: N801 - cuda-python's names
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorInsufficientDriver = 35
    cudaErrorNoDevice = 100
    cudaErrorInvalidDevice = 101
    cudaErrorInvalidResourceHandle = 400
    cudaErrorIllegalAddress = 700


class cudaMemcpyKind(enum.IntEnum):  # noqa: N801
    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3
    cudaMemcpyDefault = 4


class _Handle:
    _ids = itertools.count(0x1000)

    def __init__(self):
        self.handle = next(self._ids)
        self.alive = True

    def __int__(self):
        return self.handle


class cudaStream_t(_Handle):  # noqa: N801
    pass


class cudaEvent_t(_Handle):  # noqa: N801
    def __init__(self):
        super().__init__()
        self.t_ns = None


DEFAULT_DEVICES = [{"name": b"Orin (nvgpu)", "major": 8, "minor": 7, "totalGlobalMem": 8 << 30}]
DEVICES: list[dict] = []
FAIL: dict[str, cudaError_t] = {}
CALLS: list[tuple] = []
RUNTIME_VERSION = 12060
_current = 0
_device_mem: dict[int, bytearray] = {}
_host_mem: dict[int, ctypes.Array] = {}
_streams: list[cudaStream_t] = []
_events: list[cudaEvent_t] = []
_next_device_ptr = 0x7F0000000000


def reset(devices: list[dict] | None = None) -> None:
    """Restore the default device list and clear memory, handles, failures and the call log."""
    global _current, _next_device_ptr
    DEVICES[:] = [dict(d) for d in (DEFAULT_DEVICES if devices is None else devices)]
    FAIL.clear()
    CALLS.clear()
    _device_mem.clear()
    _host_mem.clear()
    _streams.clear()
    _events.clear()
    _current = 0
    _next_device_ptr = 0x7F0000000000


def live() -> dict[str, int]:
    """Unreleased resources: device and pinned host allocations, streams, events."""
    return {
        "device": len(_device_mem),
        "host": len(_host_mem),
        "streams": sum(s.alive for s in _streams),
        "events": sum(e.alive for e in _events),
    }


def current_device() -> dict:
    """The device selected by cudaSetDevice (for the fake TensorRT)."""
    return DEVICES[_current]


def _fail(name: str):
    CALLS.append((name,))
    return FAIL.get(name)


def _ok(*values):
    return (cudaError_t.cudaSuccess, *values)


def _find_device(ptr: int, n: int) -> tuple[bytearray, int]:
    for base, buf in _device_mem.items():
        if base <= ptr and ptr + n <= base + len(buf):
            return buf, ptr - base
    raise ValueError(f"illegal device address 0x{ptr:x} (+{n} bytes)")


def read_device(ptr: int, n: int) -> bytes:
    """Bytes of fake device memory (used by the fake TensorRT's execute)."""
    buf, off = _find_device(int(ptr), n)
    return bytes(buf[off : off + n])


def write_device(ptr: int, data: bytes) -> None:
    """Store bytes in fake device memory (used by the fake TensorRT's execute)."""
    buf, off = _find_device(int(ptr), len(data))
    buf[off : off + len(data)] = data


def device_size(ptr: int) -> int:
    """Bytes from ``ptr`` to the end of its allocation (0 if not an allocation)."""
    try:
        buf, off = _find_device(int(ptr), 0)
    except ValueError:
        return 0
    return len(buf) - off


# ---------------------------------------------------------------- device management


def cudaGetErrorName(err):  # noqa: N802
    return _ok(cudaError_t(err).name.encode())


def cudaGetErrorString(err):  # noqa: N802
    return _ok(cudaError_t(err).name.encode())


def cudaGetDeviceCount():  # noqa: N802
    if (err := _fail("cudaGetDeviceCount")) is not None:
        return (err, 0)
    if not DEVICES:
        return (cudaError_t.cudaErrorNoDevice, 0)
    return _ok(len(DEVICES))


def cudaSetDevice(device):  # noqa: N802
    global _current
    if (err := _fail("cudaSetDevice")) is not None:
        return (err,)
    if not 0 <= device < len(DEVICES):
        return (cudaError_t.cudaErrorInvalidDevice,)
    _current = device
    return _ok()


def cudaGetDevice():  # noqa: N802
    return _ok(_current)


def cudaGetDeviceProperties(device):  # noqa: N802
    if (err := _fail("cudaGetDeviceProperties")) is not None:
        return (err, None)
    if not 0 <= device < len(DEVICES):
        return (cudaError_t.cudaErrorInvalidDevice, None)
    return _ok(SimpleNamespace(**DEVICES[device]))


def cudaRuntimeGetVersion():  # noqa: N802
    return _ok(RUNTIME_VERSION)


def cudaDriverGetVersion():  # noqa: N802
    return _ok(RUNTIME_VERSION)


# ---------------------------------------------------------------- memory


def cudaMalloc(size):  # noqa: N802
    global _next_device_ptr
    if (err := _fail("cudaMalloc")) is not None:
        return (err, 0)
    ptr = _next_device_ptr
    _next_device_ptr += (int(size) + 255) // 256 * 256 + 256  # aligned, with a gap between allocations
    _device_mem[ptr] = bytearray(int(size))
    CALLS[-1] = ("cudaMalloc", int(size), ptr)
    return _ok(ptr)


def cudaFree(ptr):  # noqa: N802
    _fail("cudaFree")
    if _device_mem.pop(int(ptr), None) is None:
        return (cudaError_t.cudaErrorInvalidValue,)
    return _ok()


def cudaMallocHost(size):  # noqa: N802
    if (err := _fail("cudaMallocHost")) is not None:
        return (err, 0)
    buf = (ctypes.c_ubyte * int(size))()
    ptr = ctypes.addressof(buf)
    _host_mem[ptr] = buf
    CALLS[-1] = ("cudaMallocHost", int(size), ptr)
    return _ok(ptr)


def cudaFreeHost(ptr):  # noqa: N802
    _fail("cudaFreeHost")
    if _host_mem.pop(int(ptr), None) is None:
        return (cudaError_t.cudaErrorInvalidValue,)
    return _ok()


def _check_host(ptr: int, n: int) -> None:
    for base, buf in _host_mem.items():
        if base <= ptr and ptr + n <= base + len(buf):
            return
    raise ValueError(f"host address 0x{ptr:x} (+{n}) is not pinned memory from cudaMallocHost")


def cudaMemcpyAsync(dst, src, count, kind, stream):  # noqa: N802
    if (err := _fail("cudaMemcpyAsync")) is not None:
        return (err,)
    if not isinstance(stream, cudaStream_t) or not stream.alive:
        return (cudaError_t.cudaErrorInvalidResourceHandle,)
    dst, src, count = int(dst), int(src), int(count)
    CALLS[-1] = ("cudaMemcpyAsync", cudaMemcpyKind(kind).name, count, dst, src)
    try:
        if kind == cudaMemcpyKind.cudaMemcpyHostToDevice:
            _check_host(src, count)  # the adapter promises pinned buffers; hold it to that
            write_device(dst, ctypes.string_at(src, count))
        elif kind == cudaMemcpyKind.cudaMemcpyDeviceToHost:
            _check_host(dst, count)
            ctypes.memmove(dst, read_device(src, count), count)
        else:
            return (cudaError_t.cudaErrorInvalidValue,)
    except ValueError:
        return (cudaError_t.cudaErrorIllegalAddress,)
    return _ok()


# ---------------------------------------------------------------- streams and events


def cudaStreamCreate():  # noqa: N802
    if (err := _fail("cudaStreamCreate")) is not None:
        return (err, None)
    s = cudaStream_t()
    _streams.append(s)
    return _ok(s)


def cudaStreamSynchronize(stream):  # noqa: N802
    _fail("cudaStreamSynchronize")
    return _ok() if getattr(stream, "alive", False) else (cudaError_t.cudaErrorInvalidResourceHandle,)


def cudaStreamDestroy(stream):  # noqa: N802
    _fail("cudaStreamDestroy")
    if not getattr(stream, "alive", False):
        return (cudaError_t.cudaErrorInvalidResourceHandle,)
    stream.alive = False
    return _ok()


def cudaEventCreate():  # noqa: N802
    _fail("cudaEventCreate")
    e = cudaEvent_t()
    _events.append(e)
    return _ok(e)


def cudaEventRecord(event, stream):  # noqa: N802
    _fail("cudaEventRecord")
    if not event.alive or not getattr(stream, "alive", False):
        return (cudaError_t.cudaErrorInvalidResourceHandle,)
    event.t_ns = time.perf_counter_ns()
    return _ok()


def cudaEventElapsedTime(start, end):  # noqa: N802
    _fail("cudaEventElapsedTime")
    if start.t_ns is None or end.t_ns is None:
        return (cudaError_t.cudaErrorInvalidResourceHandle, 0.0)
    return _ok((end.t_ns - start.t_ns) / 1e6)


def cudaEventDestroy(event):  # noqa: N802
    _fail("cudaEventDestroy")
    event.alive = False
    return _ok()


reset()
