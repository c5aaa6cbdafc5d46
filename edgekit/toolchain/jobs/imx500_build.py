"""Sony's IMX500 stack in the imx500 toolchain's interpreter, as a session.

Run as ``python -s imx500_build.py job.json --session`` in a job folder (see :mod:`jobwire`).

The job says:

* ``onnx``: edgekit's fp32 ONNX with an NCHW input of batch 1 (what the jetson target writes,
  its input made channels-first); onnx2torch makes it a torch module, whose Resize and equal
  Split modules are made ones MCT's torch.fx reader can trace (:func:`traceable`);
* ``calib``: a ``.npz`` whose ``calib`` holds edgekit's preprocessed calibration tensors (NCHW);
  the representative data set of Model Compression Toolkit's PyTorch post-training quantisation
  for the IMX500's target platform capabilities (``imx500``, ``v1``), one tensor a batch (the
  ONNX has batch 1 built into its reshapes);
* ``quantization``: settings of MCT's ``QuantizationConfig`` over its defaults (the target
  file's ``mct_quantization`` table; empty: MCT's defaults);
* ``export``: where MCT's exporter writes the quantised ONNX (fake-quant ops imxconv-pt reads);
* ``convert_dir``: where ``imxconv-pt`` writes ``packerOut.zip`` and the memory report.

After the quantisation and the export the child answers ``{"op": "ready"}`` (with ``ptq_s`` and
the stack's versions), then one answer per request until ``{"op": "close"}``:

* ``{"op": "infer"}`` with one NCHW float32 tensor of one image or a batch (MCT's module keeps
  the batch axis its reshapes were given, though the exported ONNX fixes batch 1): MCT's
  quantised model on the CPU (the host simulation of the int8 network: fake-quantised weights
  and activations), its outputs back;
* ``{"op": "infer", "model": "export"}``: the same through the exported ONNX in ONNX Runtime
  (MCT's quantiser ops registered): what ``imxconv-pt`` converts, for a gate on it
  (``gate_model = "export"``);
* ``{"op": "convert"}``: ``imxconv-pt -i EXPORT -o CONVERT_DIR`` (Java; its output to the log),
  the memory report (``*_MemoryReport.json``) in the answer's ``report``.

Imports only the vendor stack, numpy and :mod:`jobwire` (never edgekit).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import traceback
import types
from pathlib import Path

import jobwire
import numpy as np

TPC = ("pytorch", "imx500", "v1")
"""MCT's target platform capabilities for the IMX500 (framework, platform, version)."""


def stand_in_torchvision() -> None:
    """Stand in for torchvision where it is not installed.

    onnx2torch and MCT import a few torchvision names at import time (NMS and RoIAlign
    converters, data-generation transforms), none of which post-training quantisation of an
    image model uses; PyPI's Linux torchvision wheels are CUDA builds that do not load against
    the toolchain's CPU torch. Each stand-in refuses when called, naming the op.
    """
    import importlib.util

    try:
        if importlib.util.find_spec("torchvision") is not None:
            import torchvision  # noqa: F401 - a working one wins

            return
    except Exception as exc:  # noqa: BLE001 - a build that cannot load (CUDA against a CPU torch) is replaced
        print(f"torchvision does not load ({type(exc).__name__}): standing in for it", file=sys.stderr)

    def module(name: str) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        mod.__path__ = []
        sys.modules[name] = mod
        return mod

    def refuse(what: str):
        def call(*_args, **_kwargs):
            raise NotImplementedError(f"{what} needs torchvision, which the imx500 toolchain does not have")

        return call

    tv = module("torchvision")
    tv.__version__ = "0.28.0"  # what edge-mdt-cl's version check reads (it needs >= 0.18)
    tv.ops = module("torchvision.ops")
    for name in ("nms", "roi_align", "box_convert", "batched_nms"):
        setattr(tv.ops, name, refuse(f"torchvision.ops.{name}"))
    tv.transforms = module("torchvision.transforms")
    tv.transforms.transforms = module("torchvision.transforms.transforms")
    for name in ("RandomCrop", "RandomHorizontalFlip", "CenterCrop", "Normalize"):
        setattr(tv.transforms, name, type(name, (), {"__init__": refuse(f"torchvision.transforms.{name}")}))
    tv.transforms.transforms._setup_size = refuse("torchvision.transforms")


def traceable(model) -> int:
    """Make onnx2torch's modules that MCT cannot trace ones it can; how many were replaced.

    MCT reads a model by tracing it with torch.fx, where a tensor's rank and shape are not
    numbers. onnx2torch's ``OnnxResize`` branches on its input's rank (``Proxy(sub)D input is
    not implemented``) and its equal ``Split`` divides the traced axis length (which leaves MCT
    an ``int`` activation it cannot collect statistics on). A Resize whose scales are a constant
    becomes ``nn.Upsample`` (:func:`_upsample`); an equal Split becomes ``torch.chunk`` into as
    many parts (ONNX requires an equal split to divide the axis, where the two agree). Anything
    else is left as it is (MCT then names it).
    """
    from onnx2torch.node_converters.resize import OnnxResize
    from onnx2torch.node_converters.split import OnnxSplit, OnnxSplit13

    replaced = 0
    for node in list(model.graph.nodes):
        module = model.get_submodule(node.target) if node.op == "call_module" else None
        if isinstance(module, OnnxResize) and len(node.args) == 3 and not node.kwargs:
            layer = _upsample(module, _constant(model, node.args[2]))
            if layer is not None:
                model.add_submodule(node.target, layer)
                node.args = node.args[:1]
                replaced += 1
        elif isinstance(module, (OnnxSplit, OnnxSplit13)) and getattr(module, "split", None) is None \
                and len(node.args) == 1 and not node.kwargs:
            _chunk(model, node, module)
            replaced += 1
    if replaced:
        model.graph.eliminate_dead_code()
        model.recompile()
    return replaced


def _upsample(module, scales: np.ndarray | None):
    """``nn.Upsample`` for an onnx2torch Resize of constant ``scales``, or None where it would differ.

    Nearest at integer factors, where every ONNX coordinate mode picks ``floor(dst / factor)``
    as torch does (tf2onnx writes Keras' UpSampling2D as ``tf_half_pixel_for_nn``); linear in
    2-D with onnx2torch's own ``align_corners``.
    """
    import torch

    if scales is None or scales.size < 3 or list(scales[:2]) != [1, 1]:
        return None
    factors = tuple(float(f) for f in scales[2:])
    if module.onnx_mode == "nearest" and all(f.is_integer() and f >= 1 for f in factors):
        return torch.nn.Upsample(scale_factor=factors, mode="nearest")
    if module.onnx_mode == "linear" and len(factors) == 2:
        return torch.nn.Upsample(scale_factor=factors, mode="bilinear", align_corners=module.align_corners)
    return None


def _chunk(model, node, module) -> None:
    """Replace the call of an equal-split module by ``torch.chunk`` (the same parts, no traced shapes)."""
    import torch

    with model.graph.inserting_before(node):
        chunk = model.graph.call_function(torch.chunk, (node.args[0], module.num_splits), {"dim": module.axis})
    node.replace_all_uses_with(chunk)
    model.graph.erase_node(node)


def _constant(model, arg) -> np.ndarray | None:
    """The value of a graph argument that is a constant of the module (a ``get_attr``); else None."""
    if getattr(arg, "op", None) != "get_attr":
        return None
    value = model
    for part in arg.target.split("."):
        value = getattr(value, part)
    return value.detach().cpu().numpy()


def quantise(job: dict, calib: np.ndarray, progress: dict):
    """MCT's PyTorch PTQ of the job's ONNX for the IMX500; the quantised module (CPU, eval mode)."""
    import model_compression_toolkit as mct
    import onnx
    import torch
    from onnx2torch import convert

    progress["stage"] = "onnx2torch"
    model = convert(onnx.load(job["onnx"])).eval()
    progress["replaced"] = traceable(model)

    def representative():
        for x in calib:
            yield [torch.from_numpy(np.ascontiguousarray(x[None], dtype=np.float32))]

    progress["stage"] = "post-training quantisation"
    tpc = mct.get_target_platform_capabilities(TPC[0], TPC[1], target_platform_version=TPC[2])
    core = mct.core.CoreConfig(quantization_config=quantization_config(mct, job.get("quantization") or {}))
    quantised, _ = mct.ptq.pytorch_post_training_quantization(model, representative, core_config=core,
                                                              target_platform_capabilities=tpc)
    progress["stage"] = "export"
    export = torch.onnx.export
    # torch >= 2.9 exports through dynamo by default, which does not know MCT's quantiser ops
    torch.onnx.export = functools.partial(export, dynamo=False)
    try:
        mct.exporter.pytorch_export_model(quantised, save_model_path=job["export"], repr_dataset=representative)
    finally:
        torch.onnx.export = export
    return quantised.eval()


def quantization_config(mct, settings: dict):
    """MCT's ``QuantizationConfig`` with the target file's ``mct_quantization`` settings over its defaults
    (an ``*_error_method`` by its name, e.g. ``"NOCLIPPING"``); an unknown name fails PTQ in one line."""
    settings = dict(settings)
    for key in [k for k in settings if k.endswith("_error_method")]:
        settings[key] = mct.core.QuantizationErrorMethod[str(settings[key]).upper()]
    return mct.core.QuantizationConfig(**settings)


def infer(model, tensor: np.ndarray) -> list[np.ndarray]:
    """One NCHW tensor through the quantised module; its outputs as float32 arrays."""
    import torch

    with torch.no_grad():
        out = model(torch.from_numpy(np.ascontiguousarray(tensor, dtype=np.float32)))
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    return [o.detach().cpu().numpy().astype(np.float32) for o in outs]


def export_session(job: dict):
    """ONNX Runtime on the exported quantised ONNX (what imxconv-pt converts), with MCT's quantiser ops."""
    import mct_quantizers
    import onnxruntime as ort

    options = mct_quantizers.get_ort_session_options()
    return ort.InferenceSession(job["export"], options, providers=["CPUExecutionProvider"])


def infer_export(session, tensor: np.ndarray) -> list[np.ndarray]:
    """One NCHW tensor (an image or a batch: the export keeps a batch axis) through the exported ONNX."""
    feed = {session.get_inputs()[0].name: np.ascontiguousarray(tensor, dtype=np.float32)}
    return [np.asarray(o, dtype=np.float32) for o in session.run(None, feed)]


def convert_model(job: dict) -> dict:
    """``imxconv-pt`` on the exported model; the memory report and the files it wrote."""
    bindir = Path(sys.executable).parent
    out = Path(job["convert_dir"])
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    t0 = time.monotonic()
    code = subprocess.run(
        [str(bindir / "imxconv-pt"), "-i", job["export"], "-o", str(out)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=sys.stderr,
        stderr=sys.stderr,
        check=False,
    ).returncode
    seconds = round(time.monotonic() - t0, 2)
    reports = sorted(out.glob("*_MemoryReport.json"))
    if code != 0 or not (out / "packerOut.zip").is_file():
        raise RuntimeError(f"imxconv-pt exited {code} without packerOut.zip (see the log)")
    report = json.loads(reports[0].read_text(encoding="utf-8")) if reports else {}
    return {
        "report": report.get("Memory Report", report),
        "report_file": reports[0].name if reports else None,
        "files": sorted(p.name for p in out.iterdir()),
        "convert_s": seconds,
    }


def versions() -> dict:
    """The stack's versions (distributions as pip names them)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("model-compression-toolkit", "imx500-converter", "mct-quantizers", "torch", "onnx2torch"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "?"
    return found


def serve(workdir: Path) -> int:
    """Quantise and export, answer ``ready``, then requests; the exit code."""
    requests, answers = jobwire.claim_stdout()  # vendor prints go to the log, never the pipe
    job, _ = jobwire.read_job(workdir)
    progress, exported = {"stage": "start"}, None
    try:
        stand_in_torchvision()
        calib = np.load(job["calib"], allow_pickle=False)["calib"]
        t0 = time.monotonic()
        model = quantise(job, calib, progress)
        jobwire.send(
            answers,
            {
                "ok": True,
                "op": "ready",
                "ptq_s": round(time.monotonic() - t0, 2),
                "versions": versions(),
                "tpc": "/".join(TPC[1:]),
            },
        )
    except Exception as exc:  # one line for the parent; the traceback stays in the log
        traceback.print_exc()
        jobwire.send(answers, {"ok": False, "error": f"{progress['stage']}: {jobwire.one_line(exc)}"})
        return 1
    while True:
        try:
            header, arrays = jobwire.receive(requests)
        except jobwire.WireError:
            return 0  # the parent closed the pipe
        if header.get("op") == "close":
            return 0
        try:
            if header.get("op") == "convert":
                jobwire.send(answers, {"ok": True, **convert_model(job)})
            elif header.get("model") == "export":
                exported = exported or export_session(job)
                jobwire.send(answers, {"ok": True}, infer_export(exported, arrays[0]))
            else:
                jobwire.send(answers, {"ok": True}, infer(model, arrays[0]))
        except Exception as exc:  # one bad request is one error answer, not a dead session
            traceback.print_exc()
            jobwire.send(answers, {"ok": False, "error": jobwire.one_line(exc)})


if __name__ == "__main__":
    sys.exit(serve(Path(sys.argv[1]).resolve().parent))
