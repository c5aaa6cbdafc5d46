"""A fake ``tensorrt`` module (10.x or 11.x API) that records calls and really computes.

TensorRT cannot be installed on this project's machines, so the engine builder and the
TensorRT adapter are tested against this fake at the module boundary. It mirrors the parts
of the Python API edgekit uses, with the version differences that matter:

* ``reset("10.3.0")``: weak typing; ``BuilderFlag.FP16``/``INT8``, ``platform_has_fast_fp16``,
  the INT8 calibrator classes and ``NetworkDefinitionCreationFlag.EXPLICIT_BATCH`` exist.
* ``reset("11.0.0")``: every network is strongly typed; the precision builder flags,
  calibrators and ``platform_has_fast_fp16`` are gone: touching them raises AttributeError
  and is recorded in ``CALLS`` as ``("removed_api", name)``. The inspector JSON uses the
  11.x schema (``I/O Tensors``; ``Format`` and ``DataType`` split).

The parser reads the ONNX file with the real ``onnx`` package; a "plan" holds a JSON header
(TensorRT version, GPU, typing, per-layer precisions, shapes) and the ONNX bytes; an
execution context reads its input from the fake CUDA device memory at the address bound by
name, runs the graph with ONNX Runtime on the CPU and writes each output to its bound
address. Layer precisions follow TensorRT's rules in spirit: weak typing + FP16 flag ->
FP16 layers (unless ``IGNORE_FP16``, a GPU without fast FP16); strong typing -> each layer
in its ONNX output type. Engines list outputs in reverse ONNX order (``REVERSE_OUTPUTS``), to
check that callers bind and return tensors by name, not by position.

``CALLS`` records ``(method, *details)``; ``BUILDS`` counts ``build_serialized_network``.
"""

from __future__ import annotations

import enum
import json

import numpy as np
from cuda.bindings import runtime as _cuda  # the fake CUDA runtime that owns "device" memory

PLAN_MAGIC = b"FAKETRTPLAN\n"
CACHE_MAGIC = b"FAKETIMINGCACHE\n"

CALLS: list[tuple] = []
BUILDS = 0
IGNORE_FP16 = False
REVERSE_OUTPUTS = True
__version__ = "10.3.0"

_REMOVED_IN_11 = {
    "IInt8Calibrator",
    "IInt8EntropyCalibrator2",
    "IInt8MinMaxCalibrator",
    "IInt8LegacyCalibrator",
    "CalibrationAlgoType",
}


class _Enum(enum.IntEnum):
    pass


class DataType(_Enum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    BF16 = 7
    INT64 = 8


_NP = {
    DataType.FLOAT: np.float32,
    DataType.HALF: np.float16,
    DataType.INT8: np.int8,
    DataType.INT32: np.int32,
    DataType.BOOL: np.bool_,
    DataType.UINT8: np.uint8,
    DataType.INT64: np.int64,
}
_ONNX_TO_TRT = {
    1: DataType.FLOAT,
    10: DataType.HALF,
    3: DataType.INT8,
    6: DataType.INT32,
    9: DataType.BOOL,
    2: DataType.UINT8,
    7: DataType.INT64,
    16: DataType.BF16,
}


def nptype(trt_type):
    """The numpy type of a TensorRT DataType."""
    return _NP[DataType(trt_type)]


class TensorIOMode(_Enum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class MemoryPoolType(_Enum):
    WORKSPACE = 0
    DLA_MANAGED_SRAM = 1
    DLA_LOCAL_DRAM = 2
    DLA_GLOBAL_DRAM = 3
    TACTIC_DRAM = 4


class ProfilingVerbosity(_Enum):
    LAYER_NAMES_ONLY = 0
    NONE = 1
    DETAILED = 2


class LayerInformationFormat(_Enum):
    ONELINE = 0
    JSON = 1


class _RecordingMeta(type):
    """A namespace of enum members whose missing names (APIs removed in this version) are
    recorded in CALLS, then raise AttributeError as the real module would."""

    def __getattr__(cls, name):
        if name.startswith("_"):
            raise AttributeError(name)
        CALLS.append(("removed_api", f"{cls.__name__}.{name}"))
        raise AttributeError(
            f"type object '{cls.__name__}' has no attribute '{name}' (removed in TensorRT {__version__})"
        )


def _recording_enum(name: str, members: dict[str, int]) -> type:
    values = enum.IntEnum(name, members)
    return _RecordingMeta(name, (), {k: values[k] for k in members})


BuilderFlag: type
NetworkDefinitionCreationFlag: type


def _make_enums(major: int) -> None:
    global BuilderFlag, NetworkDefinitionCreationFlag
    flags = {
        "DEBUG": 2,
        "GPU_FALLBACK": 3,
        "REFIT": 5,
        "DISABLE_TIMING_CACHE": 6,
        "TF32": 7,
        "SPARSE_WEIGHTS": 8,
        "SAFETY_SCOPE": 9,
        "VERSION_COMPATIBLE": 13,
        "EXCLUDE_LEAN_RUNTIME": 14,
    }
    if major < 11:
        flags.update(
            FP16=0,
            INT8=1,
            BF16=17,
            FP8=15,
            OBEY_PRECISION_CONSTRAINTS=10,
            PREFER_PRECISION_CONSTRAINTS=11,
            DIRECT_IO=12,
        )
        net = {"EXPLICIT_BATCH": 0, "STRONGLY_TYPED": 1}
    else:
        net = {"STRONGLY_TYPED": 1}  # deprecated and ignored in 11: always strongly typed
    BuilderFlag = _recording_enum("BuilderFlag", flags)
    NetworkDefinitionCreationFlag = _recording_enum("NetworkDefinitionCreationFlag", net)


def _major() -> int:
    return int(__version__.split(".")[0])


def __getattr__(name):  # module-level: APIs removed in 11.x
    if name in _REMOVED_IN_11:
        if _major() >= 11:
            CALLS.append(("removed_api", name))
            raise AttributeError(f"module 'tensorrt' has no attribute '{name}' (removed in TensorRT {__version__})")
        return type(name, (), {})
    raise AttributeError(f"module 'tensorrt' has no attribute '{name}'")


def reset(version: str = "10.3.0") -> None:
    """Select the emulated TensorRT version and clear the call log and knobs."""
    global __version__, BUILDS, IGNORE_FP16, REVERSE_OUTPUTS
    __version__ = version
    BUILDS = 0
    IGNORE_FP16 = False
    REVERSE_OUTPUTS = True
    CALLS.clear()
    _make_enums(_major())


# ------------------------------------------------------------------------------------- logging


class Logger:
    class Severity(_Enum):
        INTERNAL_ERROR = 0
        ERROR = 1
        WARNING = 2
        INFO = 3
        VERBOSE = 4

    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = Severity

    def __init__(self, min_severity=Severity.WARNING):
        self.min_severity = min_severity


# ------------------------------------------------------------------------------------- network


class _Tensor:
    def __init__(self, name: str, shape: tuple[int, ...], dtype: DataType):
        self.name, self.shape, self.dtype = name, tuple(shape), dtype


class INetworkDefinition:
    def __init__(self, flags: int):
        self.flags = flags
        self.inputs: list[_Tensor] = []
        self.outputs: list[_Tensor] = []
        self.onnx: bytes = b""
        self.model = None

    @property
    def num_inputs(self):
        return len(self.inputs)

    @property
    def num_outputs(self):
        return len(self.outputs)

    def get_input(self, i):
        return self.inputs[i]

    def get_output(self, i):
        return self.outputs[i]


def _dims(value_info) -> tuple[int, ...]:
    return tuple(d.dim_value if d.HasField("dim_value") else -1 for d in value_info.type.tensor_type.shape.dim)


class OnnxParser:
    def __init__(self, network: INetworkDefinition, logger: Logger):
        self.network = network
        self.errors: list[str] = []

    @property
    def num_errors(self):
        return len(self.errors)

    def get_error(self, i):
        return self.errors[i]

    def parse_from_file(self, path: str) -> bool:
        CALLS.append(("parse_from_file", path))
        with open(path, "rb") as f:
            return self._parse(f.read())

    def parse(self, data: bytes) -> bool:
        CALLS.append(("parse", len(data)))
        return self._parse(bytes(data))

    def _parse(self, data: bytes) -> bool:
        import onnx

        try:
            model = onnx.load_from_string(data)
            onnx.checker.check_model(model)
        except Exception as exc:  # the real parser reports, it does not raise
            self.errors.append(f"ModelImporter: failed to parse ONNX model: {str(exc).splitlines()[0]}")
            return False
        g = model.graph
        inits = {i.name for i in g.initializer}
        self.network.inputs = [
            _Tensor(v.name, _dims(v), _ONNX_TO_TRT[v.type.tensor_type.elem_type])
            for v in g.input
            if v.name not in inits
        ]
        self.network.outputs = [_Tensor(v.name, _dims(v), _ONNX_TO_TRT[v.type.tensor_type.elem_type]) for v in g.output]
        self.network.onnx, self.network.model = data, model
        return True


# ------------------------------------------------------------------------------------- builder


class IOptimizationProfile:
    def __init__(self):
        self.shapes: dict[str, tuple] = {}

    def set_shape(self, name, min, opt, max):  # noqa: A002 - TensorRT's parameter names
        CALLS.append(("profile.set_shape", name, tuple(min), tuple(opt), tuple(max)))
        self.shapes[name] = (tuple(min), tuple(opt), tuple(max))


class ITimingCache:
    def __init__(self, trt: str, gpu: str, entries: int):
        self.trt, self.gpu, self.entries = trt, gpu, entries

    def serialize(self) -> bytes:
        CALLS.append(("timing_cache.serialize", self.entries))
        return CACHE_MAGIC + json.dumps({"trt": self.trt, "gpu": self.gpu, "entries": self.entries}).encode()


class IBuilderConfig:
    def __init__(self):
        self.flags: set = set()
        self.pools: dict = {}
        self.profiles: list[IOptimizationProfile] = []
        self._verbosity = ProfilingVerbosity.LAYER_NAMES_ONLY
        self.timing_cache: ITimingCache | None = None

    @property
    def profiling_verbosity(self):
        return self._verbosity

    @profiling_verbosity.setter
    def profiling_verbosity(self, value):
        CALLS.append(("config.profiling_verbosity", ProfilingVerbosity(value).name))
        self._verbosity = value

    def set_flag(self, flag):
        CALLS.append(("config.set_flag", flag.name))
        self.flags.add(flag.name)

    def clear_flag(self, flag):
        CALLS.append(("config.clear_flag", flag.name))
        self.flags.discard(flag.name)

    def get_flag(self, flag):
        return flag.name in self.flags

    def set_memory_pool_limit(self, pool, size):
        CALLS.append(("config.set_memory_pool_limit", MemoryPoolType(pool).name, int(size)))
        self.pools[MemoryPoolType(pool).name] = int(size)

    def get_memory_pool_limit(self, pool):
        return self.pools.get(MemoryPoolType(pool).name, 1 << 40)

    def add_optimization_profile(self, profile):
        CALLS.append(("config.add_optimization_profile", dict(profile.shapes)))
        self.profiles.append(profile)
        return len(self.profiles) - 1

    def create_timing_cache(self, data):
        data = bytes(data)
        CALLS.append(("config.create_timing_cache", len(data)))
        if not data:
            return ITimingCache(__version__, _gpu_name(), 0)
        if not data.startswith(CACHE_MAGIC):
            return None  # the real call logs "invalid timing cache" and returns None
        d = json.loads(data[len(CACHE_MAGIC) :])
        return ITimingCache(d["trt"], d["gpu"], d["entries"])

    def set_timing_cache(self, cache, ignore_mismatch):
        CALLS.append(("config.set_timing_cache", cache.entries, bool(ignore_mismatch)))
        if not ignore_mismatch and (cache.trt != __version__ or cache.gpu != _gpu_name()):
            return False
        self.timing_cache = cache
        return True

    def get_timing_cache(self):
        return self.timing_cache


def _gpu_name() -> str:
    d = _cuda.current_device()
    name = d["name"].decode() if isinstance(d["name"], bytes) else d["name"]
    return f"{name} sm{d['major']}{d['minor']}"


_LAYER_TYPES = {
    "Conv": "CaskConvolution",
    "Gemm": "CaskGemmMatrixMultiply",
    "MatMul": "CaskGemmMatrixMultiply",
    "Relu": "PointWiseV2",
    "Add": "PointWiseV2",
    "Mul": "PointWiseV2",
    "Softmax": "CaskSoftMaxV2",
    "GlobalAveragePool": "CaskPooling",
    "MaxPool": "CaskPooling",
    "AveragePool": "CaskPooling",
    "Flatten": "Shuffle",
    "Reshape": "Shuffle",
    "Transpose": "Shuffle",
    "Cast": "Cast",
}


def _layers(model, fp16_kernels: bool, strong: bool) -> list[dict]:
    """One layer per ONNX node, with the precision TensorRT would give its output."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    types = {
        v.name: v.type.tensor_type.elem_type
        for v in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]
    }
    layers = []
    for i, node in enumerate(model.graph.node):
        if strong or node.op_type == "Cast":
            dtype = _ONNX_TO_TRT.get(types.get(node.output[0], 1), DataType.FLOAT)
        else:
            dtype = DataType.HALF if fp16_kernels else DataType.FLOAT
        layers.append(
            {
                "name": node.name or f"{node.op_type}_{i}",
                "type": _LAYER_TYPES.get(node.op_type, node.op_type),
                "output": node.output[0],
                "dtype": dtype.name,
            }
        )
    return layers


class Builder:
    def __init__(self, logger):
        CALLS.append(("Builder",))
        self.logger = logger

    def __getattr__(self, name):
        if name in ("platform_has_fast_fp16", "platform_has_fast_int8"):
            if _major() >= 11:
                CALLS.append(("removed_api", f"Builder.{name}"))
                raise AttributeError(f"'Builder' object has no attribute '{name}' (removed in TensorRT 11)")
            return not IGNORE_FP16
        raise AttributeError(name)

    def create_network(self, flags=0):
        CALLS.append(("create_network", int(flags)))
        return INetworkDefinition(int(flags))

    def create_builder_config(self):
        return IBuilderConfig()

    def create_optimization_profile(self):
        return IOptimizationProfile()

    def build_serialized_network(self, network, config):
        global BUILDS
        CALLS.append(("build_serialized_network", sorted(config.flags), dict(config.pools)))
        BUILDS += 1
        if not network.inputs:
            return None
        inp = network.inputs[0]
        shape = inp.shape
        if any(d < 0 for d in shape):
            prof = next((p.shapes[inp.name] for p in config.profiles if inp.name in p.shapes), None)
            if prof is None:  # "Network has dynamic or shape inputs, but no optimization profile"
                return None
            shape = prof[1]
        if config.timing_cache is not None:
            config.timing_cache.entries += 1  # the build measured (and cached) one more tactic
        strong = _major() >= 11 or bool(network.flags & (1 << 1))
        fp16_kernels = "FP16" in config.flags and not IGNORE_FP16
        detailed = config.profiling_verbosity == ProfilingVerbosity.DETAILED
        header = {
            "trt": __version__,
            "gpu": _gpu_name(),
            "strong": strong,
            "detailed": detailed,
            "input": {
                "name": inp.name,
                "shape": list(shape),
                "dynamic": any(d < 0 for d in inp.shape),
                "dtype": inp.dtype.name,
            },
            "outputs": [{"name": o.name, "dtype": o.dtype.name} for o in network.outputs],
            "layers": _layers(network.model, fp16_kernels, strong),
        }
        return PLAN_MAGIC + json.dumps(header).encode() + b"\n" + network.onnx


# ------------------------------------------------------------------------------------- runtime


class Runtime:
    def __init__(self, logger):
        CALLS.append(("Runtime",))

    def deserialize_cuda_engine(self, plan):
        plan = bytes(plan)
        CALLS.append(("deserialize_cuda_engine", len(plan)))
        if not plan.startswith(PLAN_MAGIC):
            return None  # the real call logs an error and returns None
        header, _, onnx_bytes = plan[len(PLAN_MAGIC) :].partition(b"\n")
        h = json.loads(header)
        if h["trt"] != __version__ or h["gpu"] != _gpu_name():
            return None  # "The engine plan file is not compatible with this version of TensorRT" / device
        return ICudaEngine(h, onnx_bytes)


class ICudaEngine:
    def __init__(self, header: dict, onnx_bytes: bytes):
        import onnxruntime as ort

        self.header = header
        self.session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
        outs = [o["name"] for o in header["outputs"]]
        self.names = [header["input"]["name"], *(reversed(outs) if REVERSE_OUTPUTS else outs)]
        self.dtypes = {
            header["input"]["name"]: DataType[header["input"]["dtype"]],
            **{o["name"]: DataType[o["dtype"]] for o in header["outputs"]},
        }

    @property
    def num_io_tensors(self):
        return len(self.names)

    @property
    def num_layers(self):
        return len(self.header["layers"])

    def get_tensor_name(self, i):
        return self.names[i]

    def get_tensor_mode(self, name):
        if name == self.names[0]:
            return TensorIOMode.INPUT
        return TensorIOMode.OUTPUT if name in self.names else TensorIOMode.NONE

    def get_tensor_dtype(self, name):
        return self.dtypes[name]

    def get_tensor_shape(self, name):
        inp = self.header["input"]
        if name == inp["name"]:
            return tuple(-1 if inp["dynamic"] and i == 0 else d for i, d in enumerate(inp["shape"]))
        return self._output_shapes(tuple(inp["shape"]))[name]

    def _output_shapes(self, in_shape):
        out = {}
        for o in self.session.get_outputs():
            out[o.name] = tuple(d if isinstance(d, int) else in_shape[0] for d in o.shape)
        return out

    def create_execution_context(self):
        CALLS.append(("create_execution_context",))
        return IExecutionContext(self)

    def create_engine_inspector(self):
        return EngineInspector(self)


class IExecutionContext:
    def __init__(self, engine: ICudaEngine):
        self.engine = engine
        self.addresses: dict[str, int] = {}
        inp = engine.header["input"]
        self.input_shape = None if inp["dynamic"] else tuple(inp["shape"])

    def set_input_shape(self, name, shape):
        CALLS.append(("set_input_shape", name, tuple(shape)))
        if name != self.engine.names[0] or tuple(shape) != tuple(self.engine.header["input"]["shape"]):
            return False  # outside the optimisation profile
        self.input_shape = tuple(shape)
        return True

    def get_tensor_shape(self, name):
        if name == self.engine.names[0]:
            return self.input_shape or self.engine.get_tensor_shape(name)
        return self.engine.get_tensor_shape(name)

    def set_tensor_address(self, name, ptr):
        CALLS.append(("set_tensor_address", name, int(ptr)))
        if name not in self.engine.names:
            return False
        self.addresses[name] = int(ptr)
        return True

    def execute_async_v3(self, stream_handle):
        CALLS.append(("execute_async_v3", int(stream_handle)))
        eng = self.engine
        if self.input_shape is None or set(self.addresses) != set(eng.names):
            return False  # "not all input shapes/addresses are specified"
        name = eng.names[0]
        dtype = np.dtype(nptype(eng.dtypes[name]))
        n = int(np.prod(self.input_shape)) * dtype.itemsize
        x = np.frombuffer(_cuda.read_device(self.addresses[name], n), dtype=dtype).reshape(self.input_shape)
        outs = eng.session.run(None, {name: x})
        for meta, value in zip(eng.session.get_outputs(), outs):
            data = np.ascontiguousarray(value, dtype=nptype(eng.dtypes[meta.name])).tobytes()
            if _cuda.device_size(self.addresses[meta.name]) < len(data):
                return False  # an output bound to a buffer too small: TensorRT would fault
            _cuda.write_device(self.addresses[meta.name], data)
        return True


class EngineInspector:
    def __init__(self, engine: ICudaEngine):
        self.engine = engine

    @staticmethod
    def _tensor(layer: dict) -> dict:
        if _major() >= 11:  # 11.x splits "Format/Datatype" into "Format" and "DataType"
            dtype = {"HALF": "Half", "FLOAT": "Float"}.get(layer["dtype"], layer["dtype"])
            return {"Name": layer["output"], "Format": "Row major linear (kLINEAR)", "DataType": dtype}
        fmt = "FP16" if layer["dtype"] == "HALF" else "FP32"
        return {"Name": layer["output"], "Location": "Device", "Format/Datatype": f"Row major linear {fmt} format"}

    def get_engine_information(self, fmt):
        h = self.engine.header
        if not h["detailed"]:
            layers = [layer["name"] for layer in h["layers"]]
        else:
            layers = [
                {"Name": layer["name"], "LayerType": layer["type"], "Outputs": [self._tensor(layer)]}
                for layer in h["layers"]
            ]
        info = {"Layers": layers}
        if _major() >= 11:
            info["I/O Tensors"] = [
                {"Name": n, "IOMode": self.engine.get_tensor_mode(n).name.title()} for n in self.engine.names
            ]
        else:
            info["Bindings"] = list(self.engine.names)
        return json.dumps(info)


reset()
