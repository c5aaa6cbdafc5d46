"""IMX500 builder (Raspberry Pi AI Camera): Sony's PyTorch route to ``packerOut.zip``, gated on the host.

Sony's stack cannot be imported into edgekit's process (it pins numpy 1.26, onnx 1.17 and its
own quantiser packages), and its TensorFlow flavour needs Keras 2, which does not load
edgekit's Keras 3 models. The build therefore takes the PyTorch flavour, every vendor step in
the imx500 toolchain's interpreter (``edgekit toolchain install imx500``) as one child session
(:class:`~edgekit.toolchain.session.ChildSession`, job script
``edgekit/toolchain/jobs/imx500_build.py``):

1. the fp32 ONNX of the source (:func:`edgekit.builders.onnx.to_onnx`, as the jetson target
   makes it) with its input made NCHW (:mod:`edgekit.builders.convert.onnx_nchw`);
2. edgekit's calibration tensors in that layout (the first ``calib_images`` the converter sees);
3. in the child: onnx2torch, Model Compression Toolkit's post-training quantisation with the
   IMX500's target platform capabilities, MCT's export of the quantised ONNX;
4. the gate: every eval and held-back image through MCT's quantised model on the CPU (the
   host simulation of the int8 network), a chunk of images a request where a batch answers as
   its images alone do (:class:`QuantisedRunner`), compared with the original by
   :meth:`BuildContext.verify`, as every target's variants are;
5. ``imxconv-pt``: ``packerOut.zip`` and the memory report; a network that does not fit the
   chip's memory is refused, naming its size.

What the Pi still does (``imx500-package``, then picamera2) is recorded in the manifest.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit.builders.contract import BuilderOutput, BuiltModel, task_extra
from edgekit.errors import ModelError
from edgekit.imaging.image import InputSpec, Preprocessor

if TYPE_CHECKING:
    from edgekit.builders.context import BuildContext
    from edgekit.target import Target
    from edgekit.toolchain.session import ChildSession

VARIANTS = ("int8",)
"""What this builder makes: the IMX500 runs int8 networks only."""
CALIB_FILE = "imx500_calib.npz"
PACKER = "packerOut.zip"
REPORT = "imx500_memory_report.json"
ON_DEVICE = (
    "sudo apt install imx500-all imx500-tools python3-picamera2",
    "imx500-package -i packerOut.zip -o . (in the bundle: writes network.rpk)",
    "edgekit run BUNDLE --camera imx500 (picamera2's IMX500 loads network.rpk; each frame comes with "
    "the outputs the sensor gave it), or serve with [camera] uri = \"imx500\"",
)
NOT_PROVEN = (
    "the sensor's outputs against the host simulation, imx500-package, the network's speed "
    "and the sensor's own input scaling (no Pi and AI Camera here)"
)


def build(ctx: BuildContext, target: Target, out_dir: Path) -> BuilderOutput:
    """Write ``packerOut.zip``, its memory report and quantised ONNX, gated on the host (the builder contract)."""
    from edgekit.toolchain.store import find_toolchain

    options = ctx.options_for(target)
    toolchain = find_toolchain(str(options.get("toolchain", "imx500")))
    opset = int(options.get("opset", 17))
    gate_model = gate_model_option(options.get("gate_model", "module"))  # refused before minutes of PTQ
    with ctx.log.step(f"[{target.name}] convert to ONNX (opset {opset}), NCHW input") as step:
        io, names = nchw_onnx(ctx, ctx.workdir / f"{ctx.name}_imx500.onnx", opset)
    spec = _input_spec(ctx, io)
    count = _write_calibration(ctx, spec, ctx.workdir / CALIB_FILE, int(options.get("calib_images", 64)))
    workdir = ctx.workdir / f"imx500-{target.name}"
    order = [io.outputs.index(n) for n in names]
    job = {
        "onnx": str(ctx.workdir / f"{ctx.name}_imx500.onnx"),
        "calib": str(ctx.workdir / CALIB_FILE),
        "export": str(out_dir / f"{ctx.name}_int8.onnx"),
        "quantization": mct_settings(options.get("mct_quantization", {})),
        "convert_dir": str(workdir / "converted"),
    }
    with ctx.log.step(
        f"[{target.name}] Model Compression Toolkit: PyTorch post-training quantisation for the "
        f"IMX500 on {count} calibration images, export"
    ) as built:
        session = _start(ctx, target, toolchain, workdir, job, float(options.get("start_timeout_s", 3600)))
    try:
        runner = QuantisedRunner(session, order, bool(options.get("gate_batch", True)), gate_model)
        verification = ctx.verify("int8", runner, spec)
        gated = "the exported ONNX in ONNX Runtime" if runner.request["model"] == "export" else "MCT's quantised model"
        ctx.log.info(f"[{target.name}] the gate ran {gated} {runner.note}")
        with ctx.log.step(f"[{target.name}] imxconv-pt: packerOut.zip and the memory report") as conv:
            converted, _ = session.request({"op": "convert"})
    finally:
        session.close()
    shutil.copy2(workdir / "job.log", out_dir / "imx500.log")
    memory = memory_gate(converted.get("report") or {}, target.name)
    _collect(Path(job["convert_dir"]), out_dir, converted)
    ctx.log.info(f"[{target.name}] memory: {memory['usage']} of {memory['available']} on the chip "
                 f"({memory['utilisation']}), fits")
    facts = {"toolchain": session.ready.get("versions", {}), "tpc": session.ready.get("tpc"),
             "calibration_images": count, "quantized_onnx": Path(job["export"]).name, "memory": memory,
             "memory_report": REPORT, "log": "imx500.log", "ptq_seconds": session.ready.get("ptq_s"),
             "convert_seconds": converted.get("convert_s"), "gate_model": runner.request["model"],
             "gate_run": runner.note, "on_device": list(ON_DEVICE), "not_proven": NOT_PROVEN}
    seconds = round(step["seconds"] + built["seconds"] + conv["seconds"], 2)
    model = _model(ctx, out_dir, spec, (io, names, order, runner.shapes), verification, facts, seconds)
    return BuilderOutput((model,), "int8")


def _model(ctx: BuildContext, out_dir: Path, spec: InputSpec, graph: tuple, verification: dict, facts: dict,
           seconds: float) -> BuiltModel:
    """The bundle's model entry: ``packerOut.zip`` with the outputs the gate saw (``graph``: the ONNX's
    inputs and outputs, the source's output names in it, their order, the outputs' shapes)."""
    io, names, order, shapes = graph
    outs = tuple({"name": ctx.source.output_names[names.index(n)] if n in names else n, "tensor": n,
                  "shape": shapes[i] if i < len(shapes) else [], "dtype": "float32"}
                 for i, n in enumerate(io.outputs))
    return BuiltModel(name="int8", file=PACKER, format="imx500", precision="int8", input=spec, outputs=outs,
                      convert_seconds=seconds, bytes=(out_dir / PACKER).stat().st_size, verification=verification,
                      extra={"imx500": facts, **task_extra(ctx.class_output, order)})


def nchw_onnx(ctx: BuildContext, dest: Path, opset: int) -> tuple[Any, list[str]]:
    """The source's fp32 ONNX with an NCHW input at ``dest``; (its inputs and outputs, the ONNX
    output names of the source's outputs in the source's order)."""
    from edgekit.builders.convert.onnx_nchw import to_nchw
    from edgekit.builders.onnx import to_onnx

    plain = ctx.workdir / f"{ctx.name}_imx500_source.onnx"
    names = to_onnx(ctx, plain, opset)
    io = to_nchw(plain, dest, ctx.source.input_hwc, ctx.source.layout)
    missing = [n for n in names if n not in io.outputs]
    if missing:
        raise ModelError(
            f"the ONNX of {ctx.source.path.name} lacks the outputs {missing}", "report it with build.log (--debug)"
        )
    return io, names


def _input_spec(ctx: BuildContext, io: Any) -> InputSpec:
    """The bundle's input: the build's preprocessing, as the NCHW float tensor the network takes."""
    d = ctx.float_spec.to_dict()
    d.update(shape=list(io.shape), layout="NCHW", dtype="float32", name=io.input, scale=None, zero_point=None)
    return InputSpec.from_dict(d)


def _write_calibration(ctx: BuildContext, spec: InputSpec, dest: Path, limit: int) -> int:
    """The quantiser's calibration tensors (NCHW float32) in ``dest``; how many."""
    images = ctx.converter_calib
    count = max(1, min(limit, len(images)))
    chunks = list(images.subset(np.arange(count)).batches(Preprocessor(spec), ctx.chunk))
    np.savez_compressed(dest, calib=np.concatenate(chunks).astype(np.float32))
    return count


def _start(ctx: BuildContext, target: Target, toolchain: Any, workdir: Path, job: dict,
           timeout: float) -> ChildSession:
    """The child session; a failure keeps the toolchain's log beside ``--out``."""
    from edgekit.toolchain.session import open_session

    keep = ctx.request.out / f"{ctx.name}-{target.name}.imx500.failed.log"
    return open_session(toolchain, "imx500_build", job, workdir, timeout, keep)


class QuantisedRunner:
    """A batch of NCHW tensors through MCT's quantised model in the child: the outputs in the source's
    order (``order[j]``: the child's output holding the source's output ``j``).

    The exported ONNX fixes batch 1, but MCT's torch module takes a batch (its reshapes keep the
    batch axis): a whole chunk a request is several times faster (per-call overhead dominates a
    small model). The first batch is also run ``CHECK`` images one at a time and the answers
    compared; a module that refuses a batch, or answers a batch differently, is run one image at
    a time for the rest of the gate (:attr:`note` says which, for the log), so the gate's figures
    are those of one image a request, but for a value on a quantiser's rounding edge
    (:func:`batch_agrees`). A chunk of one image is one image a request either way.
    """

    CHECK = 4
    """Images of the first batch run alone as well: batch-mixing shows from the second on."""

    def __init__(self, session: ChildSession, order: list[int], batched: bool = True, model: str = "module"):
        self.session, self.order, self.request = session, order, {"op": "infer", "model": model}
        self.shapes: list[list[int]] = []
        self.batched: bool | None = None if batched else False
        self.note = "one image a request (gate_batch = false)" if not batched else "one image a request (chunks of one)"

    def __call__(self, batch: np.ndarray) -> list[np.ndarray]:
        x = np.ascontiguousarray(batch, dtype=np.float32)
        outs = None
        if self.batched is not False:
            outs = self._batch(x)
            if self.batched is None and len(x) > 1:  # a batch of one shows nothing
                self.batched = self._same(x, outs)
        if self.batched is False or outs is None:
            outs = self._one_by_one(x)
        if not self.shapes:
            self.shapes = [[1, *o.shape[1:]] for o in outs]
        if not all(np.all(np.isfinite(o)) for o in outs):
            raise ModelError("MCT's quantised model gives NaN/Inf outputs", "see imx500.log in the build's work dir")
        return [outs[i] for i in self.order]

    def _batch(self, x: np.ndarray) -> list[np.ndarray] | None:
        """The batch in one request; None when the child refuses it (its error is in the log)."""
        try:
            _, outs = self.session.request(self.request, [x])
        except ModelError as exc:
            self.batched, self.note = False, f"one image a request (the module refused a batch: {exc})"[:300]
            return None
        outs = [np.asarray(o, dtype=np.float32) for o in outs]
        return outs if all(o.ndim and o.shape[0] == len(x) for o in outs) else None

    def _one_by_one(self, x: np.ndarray) -> list[np.ndarray]:
        rows = []
        for t in x:
            _, outs = self.session.request(self.request, [t[None]])
            rows.append([o[0] if o.ndim and o.shape[0] == 1 else o for o in map(np.asarray, outs)])
        return [np.stack([r[i] for r in rows]).astype(np.float32) for i in range(len(rows[0]))]

    def _same(self, x: np.ndarray, outs: list[np.ndarray] | None) -> bool:
        """Whether the batched answer is the first ``CHECK`` images' answers alone (:func:`batch_agrees`)."""
        if outs is None:
            if self.batched is None:  # not refused: answered without the batch axis
                self.note = f"one image a request (a batch of {len(x)} gave outputs without the batch axis)"
            return False
        n = min(self.CHECK, len(x))
        alone = self._one_by_one(x[:n])
        agrees, how = batch_agrees(alone, [o[:n] for o in outs])
        self.note = (f"{len(x)} images a request (their outputs {how} on {n} images)" if agrees
                     else f"one image a request (a batch's outputs {how})")
        return agrees


def mct_settings(table: Any) -> dict[str, Any]:
    """The target file's ``mct_quantization`` table (MCT ``QuantizationConfig`` fields: names to numbers,
    booleans or error-method names); ModelError when it is not one."""
    if not isinstance(table, dict) or not all(
            isinstance(k, str) and isinstance(v, (bool, int, float, str)) for k, v in table.items()):
        raise ModelError(f"mct_quantization {table!r} is not a table of settings",
                         "give e.g. mct_quantization = { relu_bound_to_power_of_2 = true } in the target file")
    return dict(table)


def gate_model_option(name: Any) -> str:
    """The target option ``gate_model``: ``module`` (MCT's quantised torch module) or ``export`` (its
    exported ONNX in ONNX Runtime, what imxconv-pt converts); ModelError for anything else."""
    if name not in ("module", "export"):
        raise ModelError(f"gate_model {name!r} is not module or export", 'set gate_model = "module" in the target file')
    return str(name)


def batch_agrees(alone: list[np.ndarray], batched: list[np.ndarray], share: float = 1e-3) -> tuple[bool, str]:
    """Whether a batch's outputs are those of its images run alone, and how they compare (for the log).

    Equal (to float rounding), or on a quantised output off by one step of its grid (the
    smallest gap between its values) on at most ``share`` of the values: a convolution run on a
    batch adds in another order, and a value on a quantiser's rounding edge lands one step away
    (the demo detector: 2 of 64,000 values, 1/128 apart). A model that mixes images across the
    batch differs by far more, in far more values.
    """
    scale = max(1.0, *(float(np.max(np.abs(a), initial=0.0)) for a in alone))
    off = flipped = total = 0
    worst = 0.0
    for a, b in zip(alone, batched):
        d = np.abs(a.astype(np.float64) - b)
        worst, total = max(worst, float(np.max(d, initial=0.0))), total + d.size
        if not np.any(d > 1e-6 * scale):
            continue
        values = np.unique(a)
        grid = float(np.min(np.diff(values))) if values.size > 1 else 0.0
        if grid < 1e-4 * scale or float(d.max()) > grid * (1 + 1e-6):
            return False, f"differ from one-at-a-time ones by up to {worst:.3g}"
        off, flipped = off + 1, flipped + int(np.count_nonzero(d > 1e-6 * scale))
    if not off:
        return True, "equal one-at-a-time ones"
    if flipped > share * total:
        return False, f"differ from one-at-a-time ones by a quantisation step in {flipped} of {total} values"
    return True, f"equal one-at-a-time ones but {flipped} of {total} values one quantisation step away"


_SIZE = re.compile(r"^\s*([\d.]+)\s*([KMG]?B)\s*$")
_UNITS = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}


def size_bytes(text: Any) -> int | None:
    """``"3.89MB"`` (the converter's memory report) in bytes; None when it is not a size."""
    match = _SIZE.match(str(text))
    return round(float(match.group(1)) * _UNITS[match.group(2)]) if match else None


def memory_gate(report: dict, target: str) -> dict[str, Any]:
    """The memory report's figures; ModelError naming the size when the network does not fit the chip."""
    usage, available = report.get("Memory Usage", "?"), report.get("Total Memory Available On Chip", "?")
    figures = {
        "fits": report.get("Fit In Chip"),
        "usage": usage,
        "available": available,
        "usage_bytes": size_bytes(usage),
        "available_bytes": size_bytes(available),
        "utilisation": report.get("Memory Utilization", "?"),
    }
    if figures["fits"] is not True:
        raise ModelError(
            f"[{target}] the network does not fit the IMX500: it needs {usage} of the chip's "
            f"{available} (memory report: Fit In Chip {report.get('Fit In Chip')!r})",
            "use a smaller model or input size (the converter's memory report is in the log)",
        )
    return figures


def _collect(converted: Path, out_dir: Path, answer: dict) -> None:
    """``packerOut.zip`` and the memory report from the converter's folder into the bundle."""
    shutil.copy2(converted / PACKER, out_dir / PACKER)
    if answer.get("report_file"):
        shutil.copy2(converted / answer["report_file"], out_dir / REPORT)
    else:
        (out_dir / REPORT).write_text(
            json.dumps({"Memory Report": answer.get("report", {})}, indent=1) + "\n", encoding="utf-8"
        )
