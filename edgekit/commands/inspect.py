"""``edgekit inspect MODEL --target T``: what will run where, op by op.

- ``--target edgetpu``: the offline Edge TPU prediction (:mod:`edgekit.tflite.edgetpu_rules`):
  every op with its dtypes, whether the Edge TPU runs it and why not, where the graph is
  cut, the share of ops and parameters on the TPU and the parameter cache estimate.
- ``--target rpi`` / ``cpu`` (any LiteRT target): *measured* XNNPACK delegation -- the
  model is loaded with the LiteRT runtime the device uses and the interpreter's plan
  says which nodes XNNPACK took and which stay on LiteRT's built-in kernels.
- an rk3588 bundle: what its build recorded (no toolkit is run): the ops on the NPU and on the
  CPU from RKNN-Toolkit2's layer table, the gate measured in the toolkit's simulator, and what
  the board still has to do.

MODEL is a ``.tflite`` file or a bundle directory: ``BUNDLE`` (its default model) or
``BUNDLE:VARIANT``, as every verb that opens a model. No TensorFlow is imported.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from edgekit.errors import BundleError, ModelError, UsageError
from edgekit.options import target_completer


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``inspect`` arguments."""
    parser.add_argument("model", metavar="MODEL", help="a .tflite file, or a bundle directory (BUNDLE[:VARIANT])")
    parser.add_argument(
        "--target",
        help="edgetpu, rpi, cpu or a target .toml (default: the bundle's target, else edgetpu)",
    ).completer = target_completer
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument("--variant", metavar="VARIANT",
                        help="which model of a bundle (default: its default model); same as BUNDLE:VARIANT")
    from edgekit.options import add_deprecated_alias

    add_deprecated_alias(parser, "--model-name", "--variant")
    parser.add_argument(
        "--min-runtime-version",
        type=int,
        help="edgetpu: oldest Edge TPU runtime to support (ops newer than it count as unsupported)",
    )
    parser.add_argument("--threads", type=_threads, help="rpi/cpu: interpreter threads (default: the target's)")


def _threads(text: str) -> int:
    """1 .. MAX_THREADS: LiteRT segfaults on a huge thread count instead of refusing it."""
    from edgekit.options import at_least
    from edgekit.runtime.backends import MAX_THREADS

    value = at_least(1)(text)
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"at most {MAX_THREADS} (4 per CPU core), got {text}")
    return value


def main(args: argparse.Namespace) -> int:
    """Run the verb; returns the exit code (0: report printed)."""
    from edgekit.model import split_model_spec
    from edgekit.target import available_targets, load_target

    spec, variant = split_model_spec(args.model)
    if variant and args.variant and variant != args.variant:
        raise UsageError(f"two variants asked for: {args.model} and --variant {args.variant}", "give one")
    path, bundle_target, built = _resolve_model(spec, variant or args.variant)
    if bundle_target is not None and not args.target and bundle_target not in available_targets():
        # a path in the manifest would make inspect read any TOML file the bundle names
        raise BundleError(f"{spec}: the bundle's target {bundle_target[:100]!r} is not a shipped target",
                          f"give --target with one of: {', '.join(available_targets())}, or a target .toml")
    target = load_target(args.target or bundle_target or "edgetpu")
    if target.runtime_options.get("delegate") == "edgetpu":
        result = inspect_edgetpu(path, args.min_runtime_version)
        text = format_edgetpu(result)
    elif target.adapter.startswith("edgekit.runtime.litert:"):
        options = dict(target.runtime_options)
        if args.threads is not None:
            options["num_threads"] = args.threads
        result = inspect_litert(path, delegate=options.get("delegate", "xnnpack"),
                                num_threads=options.get("num_threads"))  # fmt: skip
        text = format_litert(result)
    elif target.adapter.startswith("edgekit.runtime.rknn_lite:") and "rknn" in built:
        result, text = {"mode": "rknn-build-record", "model": str(path)}, format_rknn(path, built)
    elif target.adapter.startswith("edgekit.runtime.imx500:") and "imx500" in built:
        result, text = {"mode": "imx500-build-record", "model": str(path)}, format_imx500(path, built)
    else:
        raise UsageError(
            f"inspect reads TFLite targets and rk3588 or imx500 bundles; {target.name} runs through {target.adapter}",
            "use --target edgetpu, rpi or cpu, or give an rk3588 or imx500 bundle edgekit build wrote",
        )
    result = {"target": target.name, **result, **built}
    text += "".join(f"\n{line}" for line in _build_lines(built))
    from edgekit.outputs.outstream import guarded_stdout

    with guarded_stdout():  # `--json > report.json` on a full disk: one error line
        if args.json:
            json.dump(result, sys.stdout, indent=2, default=str)
            sys.stdout.write("\n")
        else:
            print(f"target {target.name}: {text}")
    return 0


def _resolve_model(path: Path, name: str | None) -> tuple[Path, str | None, dict[str, Any]]:
    """The model file, the bundle's target, and what the build recorded of it (``rewrites``, ``speed``,
    the Edge TPU op share before the rewrites)."""
    if path.is_dir():
        from edgekit.bundle import load_bundle

        bundle = load_bundle(path, allow_rejected=True)  # inspecting a rejected build is useful
        _check_bundle_names(bundle)
        model = bundle.model_path(name)
        entry = next((m for m in bundle.models if m.file == model.name), None)
        extra = entry.extra if entry is not None else {}
        built = {k: extra[k] for k in ("rewrites", "speed", "rknn", "imx500")
                 if isinstance(extra.get(k), (list, dict))}
        if ("rknn" in built or "imx500" in built) and entry is not None:  # gated on the host at build: say what
            built["gate"] = _gate_record(bundle.manifest.get("verification"), entry.name)
        before = ((bundle.manifest.get("edgetpu") or {}).get("offline") or {}).get("before_rewrites")
        if built.get("rewrites") and isinstance(before, dict):
            built["edgetpu_before_rewrites"] = before
        return model, bundle.target, built
    if not path.is_file():
        raise ModelError(f"model {path} does not exist", "give a .tflite file or a bundle directory")
    if path.suffix != ".tflite":
        raise ModelError(f"{path} is not a .tflite model", "inspect reads .tflite files and bundles")
    return path, None, {}


def _gate_record(verification: Any, name: str) -> dict[str, Any]:
    """One model's gate as the build recorded it: the metric, the figures on the set it was judged on."""
    verification = verification if isinstance(verification, dict) else {}
    per_model = (verification.get("models") or {}).get(name) or {}
    dataset = "eval" if isinstance(per_model.get("eval"), dict) else "holdout"
    res = per_model.get(dataset) or {}
    keep = ("n", "original", "converted", "ratio", "agreement", "cosine", "passed")
    return {"metric": verification.get("metric"), "dataset": dataset, **{k: res.get(k) for k in keep if k in res},
            "worst_layers": (per_model.get("accuracy_analysis") or {}).get("worst_layers") or []}


def format_rknn(path: Path, built: dict[str, Any]) -> str:
    """An rk3588 bundle's build record: where its ops run, the simulator's gate, what the board still does."""
    rk, gate = built["rknn"], built.get("gate") or {}
    npu = rk.get("npu") or {}
    lines = [f"{path.name}: int8 .rknn for {rk.get('platform')} (RKNN-Toolkit2 {rk.get('toolkit')}), "
             f"{rk.get('calibration_images')} calibration images"]
    if npu.get("ops") is not None:
        cpu = ", ".join(f"{c.get('name')}" for c in npu.get("cpu_ops") or []) or "none"
        lines.append(f"ops on the NPU (the toolkit's layer table): {npu.get('npu_ops')}/{npu.get('ops')}; "
                     f"on the CPU: {cpu}")
    lines.append(_gate_line(gate, "in the toolkit's simulator"))
    for w in gate.get("worst_layers", [])[:3]:
        lines.append(f"  accuracy_analysis: {w.get('op')} {w.get('layer')} cosine {w.get('cosine')}")
    lines += [f"still to do on the board: {step}" for step in rk.get("on_device") or []]
    if rk.get("not_proven"):
        lines.append(f"not proven here: {rk['not_proven']}")
    return "\n".join(lines)


def format_imx500(path: Path, built: dict[str, Any]) -> str:
    """An imx500 bundle's build record: the chip's memory, the host-simulated gate, what the Pi still does."""
    imx, gate = built["imx500"], built.get("gate") or {}
    mem = imx.get("memory") or {}
    tools = ", ".join(f"{k} {v}" for k, v in (imx.get("toolchain") or {}).items())
    lines = [f"{path.name}: int8 for the IMX500 ({imx.get('tpc')}; {tools}), "
             f"{imx.get('calibration_images')} calibration images",
             f"memory report: {mem.get('usage')} of {mem.get('available')} ({mem.get('utilisation')}), "
             f"{'fits the chip' if mem.get('fits') else 'does NOT fit the chip'}",
             _gate_line(gate, "the exported ONNX on the host" if imx.get("gate_model") == "export"
                        else "MCT's quantised model on the host")]
    lines += [f"still to do on the Pi: {step}" for step in imx.get("on_device") or []]
    if imx.get("not_proven"):
        lines.append(f"not proven here: {imx['not_proven']}")
    return "\n".join(lines)


def _gate_line(gate: dict[str, Any], where: str) -> str:
    """The build's gate in one line: its figures on the set it judged, and its verdict."""
    figures = ", ".join(f"{k} {gate[k]:.{6 if k == 'cosine' else 4}f}" if isinstance(gate[k], float)
                        else f"{k} {gate[k]}"
                        for k in ("original", "converted", "ratio", "agreement", "cosine") if gate.get(k) is not None)
    verdict = {True: "PASS", False: "FAIL"}.get(gate.get("passed"), "not gated")
    return (f"gate at build, {where} ({gate.get('metric')} on {gate.get('n', '?')} {gate.get('dataset')} "
            f"images): {figures or 'no figures'}: {verdict}")


def _check_bundle_names(bundle: Any) -> None:
    """What a bundle names to import or read must be on edgekit's lists, as ``run`` requires: an
    adapter such as ``os:system`` is a bundle error here too, never a clean report."""
    from edgekit.bundle import MANIFEST
    from edgekit.runtime.registry import known_adapters

    adapter = bundle.runtime.get("adapter")
    if adapter is not None and adapter not in known_adapters():
        raise BundleError(f"{bundle.path}/{MANIFEST}: unknown runtime adapter {str(adapter)[:100]!r}",
                          f"adapters are: {', '.join(known_adapters())}; rebuild the bundle")


def _build_lines(built: dict[str, Any]) -> list[str]:
    """What the build did to this model and measured of it, as the manifest records it."""
    lines = []
    for r in built.get("rewrites", []):
        if isinstance(r, dict):
            lines.append(f"rewritten before int8: {r.get('op')} x{r.get('count')} into {r.get('into')}")
    before = built.get("edgetpu_before_rewrites")
    if before is not None and isinstance(before.get("tpu_ops"), int) and isinstance(before.get("total_ops"), int):
        cut = before.get("cut")
        lines.append(f"Edge TPU before the rewrites (at build): {before['tpu_ops']}/{before['total_ops']} ops "
                     "predicted on the TPU" + (f", cut at {str(cut)[:80]}" if cut else ""))
    speed = built.get("speed")
    if isinstance(speed, dict) and speed.get("p50_ms") is not None:
        ratio = f" ({speed['vs_fp32']}x fp32)" if speed.get("vs_fp32") is not None else ""
        lines.append(f"measured at build on the build host: p50 {speed['p50_ms']} ms{ratio}")
    return lines


# ---------------------------------------------------------------------------------------
# Edge TPU: offline prediction


def inspect_edgetpu(path: Path, runtime_version: int | None = None) -> dict[str, Any]:
    """The offline Edge TPU report as a dict, plus whether a compiler is installed."""
    import shutil

    from edgekit.tflite.edgetpu_rules import ABSENT_REASON, COMPILER, check_model

    report = check_model(path, runtime_version)
    compiler = shutil.which(COMPILER)
    return {
        "mode": "edgetpu-offline",
        "model": str(path),
        "report": report.to_dict(),
        "compiler": compiler,
        "compiler_note": (
            f"edgetpu_compiler found ({compiler}): edgekit build --target edgetpu compiles and reports the real mapping"
            if compiler
            else ABSENT_REASON.split(";")[0]
        ),
    }


def format_edgetpu(result: dict[str, Any]) -> str:
    """Human-readable text for :func:`inspect_edgetpu`'s dict."""
    from edgekit.tflite.edgetpu_rules import format_bytes

    r = result["report"]
    lines = [
        f"{result['model']} (offline prediction for Edge TPU runtime {r['runtime_version']}+; "
        "edgetpu_compiler has the last word)",
        "",
    ]
    rows = [(row["opcode"], str(row["count"]), row["dtypes"], "yes" if row["on_tpu"] else "no",
             "" if row["reason"] == "mapped" else row["reason"]) for row in r["rows"]]  # fmt: skip
    lines += _table(("OP", "COUNT", "DTYPE", "EDGE TPU", "REASON"), rows)
    lines.append("")
    cut = r["cut"]
    if r["compiled"]:
        lines.append("already compiled: ops inside edgetpu-custom-op run on the Edge TPU")
    elif cut is None:
        lines.append("cut: none (the whole graph maps to one Edge TPU segment)")
    else:
        lines.append(f"cut: op {cut['index']} {cut['opcode']} ({cut['reason']}); it and every later op run on the CPU")
    lines.append(f"ops on the Edge TPU: {r['tpu_ops']} of {r['total_ops']} ({r['op_share']:.0%})")
    lines.append(
        f"parameters on the Edge TPU: {format_bytes(r['tpu_parameter_bytes'])} of {format_bytes(r['parameter_bytes'])} "
        f"({r['parameter_share']:.0%})"
    )
    lines.append(f"cache ({r['cache_status']}): {r['cache_message']}")
    notes = sorted({f"{op['opcode']}: {n}" for op in r["ops"] for n in op["notes"]})
    lines += [f"note: {n}" for n in notes]
    shown = (r["cache_message"], "graph cut at", "no op is predicted")  # already printed above
    lines += [f"warning: {w}" for w in r["warnings"] if not w.startswith(shown)]
    lines.append(result["compiler_note"])
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# LiteRT/XNNPACK: measured delegation


def delegated_nodes(ops: list[dict]) -> set[int]:
    """Indices of original nodes that delegate kernels replaced.

    Same walk as :func:`edgekit.runtime.litert.delegation_coverage`: the interpreter
    lists the original nodes, then one ``DELEGATE`` node per partition; a partition is
    every node between the kernel's input tensors and its output tensors.
    """
    from edgekit.runtime.litert import delegated_nodes as walk

    return walk(ops)


def inspect_litert(path: Path, delegate: str = "xnnpack", num_threads: int | None = None) -> dict[str, Any]:
    """Load the model with LiteRT and report which nodes the delegate took (measured).

    Needs only the LiteRT runtime (no ``tflite`` schema package), so it runs on a device.
    """
    from edgekit.runtime.litert import LiteRTRuntime

    with LiteRTRuntime(path, delegate=delegate, num_threads=num_threads) as rt:
        info = rt.describe()
        ops = rt.ops_details()
        dtypes = {int(t["index"]): t["dtype"].__name__ for t in rt.tensor_details()}
        graph_inputs = {int(d["index"]) for d in rt.input_details()}
    taken = delegated_nodes(ops)
    original = [o for o in ops if o.get("op_name") != "DELEGATE"]
    # Activations are graph inputs or produced by a node; every other input is a constant.
    activations = graph_inputs | {int(t) for o in original for t in o["outputs"]}
    per_op = [
        {
            "index": o["index"],
            "opcode": o["op_name"],
            "dtypes": _dtype_label([dtypes.get(int(t), "?") for t in o["inputs"] if int(t) in activations],
                                   [dtypes.get(int(t), "?") for t in o["outputs"]]),
            "delegated": o["index"] in taken,
        }
        for o in original
    ]  # fmt: skip
    counts: dict[tuple, int] = {}
    for p in per_op:
        key = (p["opcode"], p["dtypes"], p["delegated"])
        counts[key] = counts.get(key, 0) + 1
    rows = [{"opcode": k[0], "count": n, "dtypes": k[1], "delegated": k[2]} for k, n in counts.items()]
    return {
        "mode": "litert-measured",
        "model": str(path),
        "runtime": {k: info[k] for k in ("backend", "version", "delegate_requested", "num_threads")},
        "delegate_applied": info["delegate_applied"],
        "total_nodes": info["total_nodes"],
        "delegated_nodes": info["delegated_nodes"],
        "cpu_nodes": info["cpu_nodes"],
        "delegate_kernels": info["delegate_kernels"],
        "rows": rows,
        "ops": per_op,
    }


def _dtype_label(ins: list[str], outs: list[str]) -> str:
    """Same style as :meth:`edgekit.tflite.graph.Graph.dtype_label`: ``int8`` or ``uint8->int8``."""
    ins, outs = list(dict.fromkeys(ins)), list(dict.fromkeys(outs))
    if not ins or ins == outs:
        return ",".join(outs or ins) or "-"
    return f"{','.join(ins)}->{','.join(outs)}"


def format_litert(result: dict[str, Any]) -> str:
    """Human-readable text for :func:`inspect_litert`'s dict."""
    rt = result["runtime"]
    delegate = rt["delegate_requested"]
    header = "XNNPACK" if delegate == "xnnpack" else delegate.upper()
    lines = [
        f"{result['model']} (measured: {rt['backend']} {rt['version']}, delegate {delegate}, "
        f"threads {rt['num_threads'] or 'default'})",
        "",
    ]
    rows = [(r["opcode"], str(r["count"]), r["dtypes"], "yes" if r["delegated"] else "no",
             "" if r["delegated"] else "LiteRT built-in CPU kernel") for r in result["rows"]]  # fmt: skip
    lines += _table(("OP", "COUNT", "DTYPE", header, "RUNS ON"), rows)
    lines.append("")
    lines.append(
        f"delegated: {result['delegated_nodes']} of {result['total_nodes']} nodes in "
        f"{result['delegate_kernels']} {header} partition(s); {result['cpu_nodes']} on LiteRT's built-in kernels"
    )
    if delegate != "none" and not result["delegate_applied"]:
        lines.append(f"warning: the {delegate} delegate took no node; everything runs on built-in kernels")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    right = {1}  # counts right-aligned

    def fmt(cells: tuple[str, ...]) -> str:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(parts).rstrip()

    return [fmt(header), *(fmt(r) for r in rows)]
