"""RKNN builder for the rk3588 target (and the other chips RKNN-Toolkit2 names): a quantised
``.rknn``, gated in the toolkit's own simulator.

The toolkit cannot be imported into edgekit's process (it pins numpy 1.26 and torch 2.4), so
every toolkit step runs in the rk3588 toolchain's interpreter (``edgekit toolchain install
rk3588``) as one child session (:class:`~edgekit.toolchain.session.ChildSession`, job script
``edgekit/toolchain/jobs/rknn_sim.py``):

1. the fp32 ONNX of the source (:func:`edgekit.builders.onnx.to_onnx`, as the jetson target
   makes it) with its input made NCHW (:mod:`edgekit.builders.convert.onnx_nchw`: the toolkit
   refuses NHWC), kept in the bundle;
2. edgekit's calibration tensors in that layout (the first ``calib_images`` the converter
   sees), kept in the bundle (``rknn_calib.npz``, compressed: float tensors of 8-bit pixels
   shrink about 5x) so that ``--backend rknn-sim`` can rebuild the model;
3. in the child: ``config`` (mean 0, std 1: the tensors are edgekit's preprocessed inputs),
   ``load_onnx``, quantised ``build``, ``export_rknn`` into the bundle, the simulator;
4. the gate: every eval and held-back image through the simulator, compared with the original
   by :meth:`BuildContext.verify`, as every target's variants are; when it fails (or with
   ``quant_report``), ``accuracy_analysis`` names the layers that lost the most;
5. the toolkit's layer table (its verbose build log) says which ops run on the NPU and which
   on the board's CPU: the manifest and the build log name the latter.

The ``.rknn.sim.json`` sidecar lets ``--backend rknn-sim`` rebuild the same model later
(:mod:`edgekit.runtime.rknn_sim`).
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
"""What this builder makes: the toolkit's quantised model (its float one gains nothing on the NPU)."""
CALIB_FILE = "rknn_calib.npz"
LAYOUT_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "InputOperator", "OutputOperator")
"""Ops that move data without computing: on the CPU they cost a copy, not a fallback of the model's work."""
ON_DEVICE = ("pip install rknn-toolkit-lite2 on the board (librknnrt.so comes with its image)",
             "edgekit run BUNDLE --camera v4l2:0 (backend rknn-lite; core_mask picks NPU cores)")
NOT_PROVEN = "the board's outputs against the simulator's, the NPU's speed (no board here)"


def build(ctx: BuildContext, target: Target, out_dir: Path) -> BuilderOutput:
    """Write the ``.rknn``, its ONNX, calibration and sidecar, and gate it in the simulator (the builder contract)."""
    from edgekit.toolchain.store import find_toolchain

    options = ctx.options_for(target)
    toolchain = find_toolchain(str(options.get("toolchain", "rk3588")))
    with ctx.log.step(f"[{target.name}] convert to ONNX (opset {int(options.get('opset', 17))}), NCHW input") as step:
        io, names = _nchw_onnx(ctx, out_dir / f"{ctx.name}.onnx", int(options.get("opset", 17)))
    spec = _input_spec(ctx, io)
    count = _write_calibration(ctx, target, spec, out_dir / CALIB_FILE, int(options.get("calib_images", 64)))
    rknn = out_dir / f"{ctx.name}.rknn"
    job = sim_job(io, options, f"{ctx.name}.onnx", spec.shape[1])
    (out_dir / (rknn.name + ".sim.json")).write_text(json.dumps(job, indent=1) + "\n", encoding="utf-8")
    workdir = ctx.workdir / f"rknn-{target.name}"
    order = [io.outputs.index(n) for n in names]
    with ctx.log.step(f"[{target.name}] RKNN-Toolkit2: quantised build for {job['platform']} on {count} "
                      "calibration images, export_rknn, simulator") as built:
        session = _start(ctx, target, toolchain, workdir, {
            **job, "onnx": str(out_dir / job["onnx"]), "calib": str(out_dir / CALIB_FILE), "export": str(rknn),
            "verbose": True}, float(options.get("start_timeout_s", 3600)))
    try:
        verification, shapes = _gate(ctx, session, spec, order)
        missed = any(isinstance(r, dict) and r.get("passed") is False for r in verification.values())
        if missed or options.get("quant_report"):
            verification["accuracy_analysis"] = _analysis(ctx, target, session, spec, missed)
    finally:
        session.close()
    layers = layer_table((workdir / "job.log").read_text(encoding="utf-8", errors="replace"))
    shutil.copy2(workdir / "job.log", out_dir / f"{rknn.name}.log")
    npu = _npu_report(ctx, target, layers)
    outs = tuple({"name": ctx.source.output_names[names.index(n)] if n in names else n, "tensor": n,
                  "shape": shapes[i], "dtype": "float32"} for i, n in enumerate(io.outputs))
    facts = {"platform": job["platform"], "toolkit": session.ready.get("toolkit") or "?",
             "calibration_images": count, "simulator": rknn.name + ".sim.json", "log": f"{rknn.name}.log",
             "quantized_build_seconds": session.ready.get("build_s"), "npu": npu,
             "on_device": list(ON_DEVICE), "not_proven": NOT_PROVEN}
    model = BuiltModel(name="int8", file=rknn.name, format="rknn", precision="int8", input=spec, outputs=outs,
                       convert_seconds=round(step["seconds"] + built["seconds"], 2), bytes=rknn.stat().st_size,
                       verification=verification, extra={"rknn": facts, **task_extra(ctx.class_output, order)})
    return BuilderOutput((model,), "int8")


def _nchw_onnx(ctx: BuildContext, dest: Path, opset: int) -> tuple[Any, list[str]]:
    """The source's fp32 ONNX with an NCHW input at ``dest``; (its inputs and outputs, the ONNX
    output names of the source's outputs in the source's order)."""
    from edgekit.builders.convert.onnx_nchw import to_nchw
    from edgekit.builders.onnx import to_onnx

    plain = ctx.workdir / f"{ctx.name}_rknn_source.onnx"
    names = to_onnx(ctx, plain, opset)
    io = to_nchw(plain, dest, ctx.source.input_hwc, ctx.source.layout)
    missing = [n for n in names if n not in io.outputs]
    if missing:
        raise ModelError(f"the ONNX of {ctx.source.path.name} lacks the outputs {missing}",
                         "report it with build.log (--debug)")
    if io.transposed:
        ctx.log.info(f"  ONNX input {io.input} made NCHW {list(io.shape)} (a Transpose in front of the "
                     "channels-last graph: RKNN-Toolkit2 takes NCHW only)")
    return io, names


def _input_spec(ctx: BuildContext, io: Any) -> InputSpec:
    """The bundle's input: the build's preprocessing, as the NCHW float tensor the ``.rknn`` takes."""
    d = ctx.float_spec.to_dict()
    d.update(shape=list(io.shape), layout="NCHW", dtype="float32", name=io.input, scale=None, zero_point=None)
    return InputSpec.from_dict(d)


def sim_job(io: Any, options: dict, onnx_file: str, channels: int) -> dict[str, Any]:
    """The toolkit's ``config`` and ``load_onnx`` facts (the ``.rknn.sim.json`` sidecar, files relative)."""
    rules = options.get("disable_rules") or []
    if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
        raise ModelError(f"disable_rules {rules!r} is not a list of rule names",
                         'give a list such as disable_rules = ["fuse_pad_into_conv"] in the target file')
    return {"onnx": onnx_file, "calib": CALIB_FILE, "platform": str(options.get("platform", "rk3588")),
            "channels": int(channels), "disable_rules": list(rules),
            "quantized_algorithm": str(options.get("quantized_algorithm", "normal")),
            "input": io.input, "input_shape": list(io.shape)}


def _write_calibration(ctx: BuildContext, target: Target, spec: InputSpec, dest: Path, limit: int) -> int:
    """The quantiser's calibration tensors (NCHW float32) in ``dest``; how many."""
    images = ctx.converter_calib
    count = max(1, min(limit, len(images)))
    chunks = list(images.subset(np.arange(count)).batches(Preprocessor(spec), ctx.chunk))
    calib = np.concatenate(chunks).astype(np.float32)
    np.savez_compressed(dest, calib=calib)
    if count < len(images):
        ctx.log.info(f"[{target.name}] int8 calibration: the toolkit sees {count} of the {len(images)} calibration "
                     f"images (calib_images in the target file); the bundle keeps them for --backend rknn-sim "
                     f"({dest.stat().st_size / 1e6:.1f} MB)")
    return count


def _start(ctx: BuildContext, target: Target, toolchain: Any, workdir: Path, job: dict,
           timeout: float) -> ChildSession:
    """The child session; a failure keeps the toolchain's log beside ``--out``."""
    from edgekit.toolchain.session import open_session

    keep = ctx.request.out / f"{ctx.name}-{target.name}.rknn.failed.log"
    return open_session(toolchain, "rknn_sim", job, workdir, timeout, keep, whose="the toolkit's")


class SimRunner:
    """A batch of input tensors through the simulator session, one image at a time: the outputs
    in the source's order (``order[j]``: the simulator's output holding the source's output ``j``)."""

    def __init__(self, session: ChildSession, layout: str, order: list[int]):
        self.session, self.layout, self.order = session, layout, order
        self.shapes: list[list[int]] = []

    def __call__(self, batch: np.ndarray) -> list[np.ndarray]:
        from edgekit.runtime.rknn_lite import to_nhwc

        rows = []
        for x in batch:
            _, outs = self.session.request({"op": "infer"}, [to_nhwc(x[None], self.layout)])
            rows.append([o[0] if o.ndim and o.shape[0] == 1 else o for o in map(np.asarray, outs)])
        if not self.shapes and rows:
            self.shapes = [[1, *o.shape] for o in rows[0]]
        stacked = [np.stack([r[i] for r in rows]).astype(np.float32) for i in range(len(rows[0]))]
        if not all(np.all(np.isfinite(o)) for o in stacked):
            raise ModelError("the RKNN simulator gives NaN/Inf outputs: the quantised model is broken",
                             "see the toolkit's log in the bundle (.rknn.log); try quantized_algorithm = \"mmse\"")
        return [stacked[i] for i in self.order]


def _gate(ctx: BuildContext, session: ChildSession, spec: InputSpec, order: list[int]) -> tuple[dict, list]:
    """The int8 model's verification through the simulator, and the shapes of its outputs."""
    runner = SimRunner(session, spec.layout, order)
    verification = ctx.verify("int8", runner, spec)
    return verification, runner.shapes or [[] for _ in order]


def _analysis(ctx: BuildContext, target: Target, session: ChildSession, spec: InputSpec, missed: bool) -> dict:
    """``accuracy_analysis`` on one image (the first eval image, else held-back): the worst layers, logged."""
    images = ctx.evalset if ctx.evalset is not None and len(ctx.evalset) else ctx.holdout
    if images is None or not len(images):
        images = ctx.calib
    sample = next(images.subset(np.arange(1)).batches(Preprocessor(spec), 1))
    why = "int8 missed the gate" if missed else "int8"
    with ctx.log.step(f"[{target.name}] {why}: accuracy_analysis (simulator vs float, layer by layer, one image)"):
        header, _ = session.request({"op": "analyse"}, [sample])
    worst = header.get("worst_layers") or []
    if worst:
        text = ", ".join(f"{w['op']} {w['layer']} cosine {w['cosine']:.4f}"
                         + (f" (alone {w['single_cosine']:.4f})" if w.get("single_cosine") is not None else "")
                         for w in worst[:3])
        (ctx.log.warn if missed else ctx.log.info)(f"[{target.name}] worst layers by cosine against the float "
                                                   f"model (accuracy_analysis): {text}")
    return {"images": 1, "worst_layers": worst}


_ROW = re.compile(r"^D RKNN: \[[^\]]*\]\s+(?P<id>\d+)\s+(?P<op>\S+)\s+(?P<dtype>\S+)\s+(?P<target>[A-Z]+)\s+"
                  r".*\s(?P<name>\S+)\s*$")


def layer_table(log: str) -> list[dict[str, Any]]:
    """The rows of the toolkit's ``Network Layer Information Table`` (a verbose build prints it):
    each op's type, data type, where it runs (``NPU`` or ``CPU``) and its full name."""
    rows, inside = [], False
    for line in log.splitlines():
        if "Network Layer Information Table" in line:
            rows, inside = [], True  # a later table (a rebuild) replaces an earlier one
            continue
        if not inside:
            continue
        match = _ROW.match(line.strip())
        if match:
            rows.append({"id": int(match["id"]), "op": match["op"], "dtype": match["dtype"],
                         "target": match["target"], "name": match["name"]})
        elif rows and set(line.split("]", 1)[-1].strip()) <= {"-"}:
            inside = False  # the closing rule
    return rows


def _npu_report(ctx: BuildContext, target: Target, layers: list[dict[str, Any]]) -> dict[str, Any]:
    """What runs where on the chip, from the layer table: logged, and the manifest's ``rknn.npu``."""
    if not layers:
        ctx.log.warn(f"[{target.name}] the toolkit's log has no layer table: which ops the NPU runs is unknown")
        return {"ops": None, "npu_ops": None, "cpu_ops": []}
    ops = [r for r in layers if r["op"] not in ("InputOperator", "OutputOperator")]
    cpu = [{"op": r["op"], "name": r["name"], "target": r["target"]} for r in ops if r["target"] != "NPU"]
    report = {"ops": len(ops), "npu_ops": len(ops) - len(cpu), "cpu_ops": cpu}
    text = f"[{target.name}] the NPU runs {report['npu_ops']} of {len(ops)} ops"
    compute = [c for c in cpu if c["op"] not in LAYOUT_OPS]
    if not cpu:
        ctx.log.info(text)
    elif not compute:
        ctx.log.info(f"{text}; on the CPU only data moves: {', '.join(c['name'] for c in cpu)}")
    else:
        ctx.log.warn(f"{text}; the NPU cannot run {', '.join(c['name'] for c in compute)}: they run on the board's "
                     "CPU between NPU parts, which can make the NPU slower than the CPU (replace those layers)")
    return report
