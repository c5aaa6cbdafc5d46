"""Run onnx2tf on one prepared ONNX model, in a child process:
``python -m edgekit.builders.convert.onnx2tf_job JOB.json``.

Why a child process (of the same interpreter and environment): onnx2tf ends the process
with ``sys.exit(1)`` on many errors, prints hundreds of coloured lines to stdout, imports
its own ``tf_keras`` graph state and may crash natively; the build process must survive
all of that, keep the chatter for ``build.log`` and turn a failure into one line.

What runs here:

* the network is blocked for the whole process (an audit hook refuses every socket
  connection and name lookup): onnx2tf downloads
  ``calibration_image_sample_data_20x128x128x3_float32.npy`` from the internet for any
  4-D 3-channel input unless a file of that name is in the working directory
  (``onnx2tf/utils/common_functions.py:download_test_image_data``). The parent puts edgekit's
  own calibration tensors there under that name, and this guard makes a forgotten file
  fail loudly instead of downloading;
* onnx2tf builds the TensorFlow model (``disable_model_save=True``: it writes nothing of its
  own, no float TFLite we would throw away);
* the SavedModel is exported here with one signature output per ONNX output, keyed by the
  names the parent chose, so the TFLite converter's output order never matters.

The job's ``flags`` (onnx2tf keywords) are the parent's fallbacks
(:mod:`edgekit.builders.convert.onnx2tf_fallbacks`). Writes ``result.json`` (``{"ok": true, "outputs":
[...], "input_shape": [...]}`` or ``{"ok": false, "error": "...", "stage": "convert" | "export"}``)
into the working directory.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import traceback
from pathlib import Path

from edgekit.builders.convert.onnx2tf_fallbacks import FOLD_SHAPES

SAMPLE_FILE = "calibration_image_sample_data_20x128x128x3_float32.npy"


class NetworkBlocked(RuntimeError):
    """Raised inside the conversion process when anything tries to reach the network."""


def block_network() -> None:
    """Refuse every non-local socket connection and name lookup in this process (audit hook)."""

    def hook(event: str, args: tuple) -> None:
        if event == "socket.getaddrinfo":
            raise NetworkBlocked(f"name lookup of {args[0]!r} refused: edgekit builds offline")
        if event == "socket.connect":
            sock = args[0]
            if getattr(sock, "family", None) != socket.AF_UNIX:
                raise NetworkBlocked(f"connection to {args[1]!r} refused: edgekit builds offline")

    sys.addaudithook(hook)


FOLDED = "model-folded.onnx"


def _convert(job: dict):
    flags = dict(job.get("flags", {}))  # the parent's fallbacks (onnx2tf_fallbacks.FALLBACKS)
    # before onnx2tf brings TensorFlow in: onnxsim's native simplifier crashed the process (SIGSEGV)
    # when TensorFlow was already loaded, and ran cleanly with TensorFlow imported after it
    onnx_file = fold_shapes(job["onnx"], FOLDED) if flags.pop(FOLD_SHAPES, False) else job["onnx"]
    import onnx2tf

    kwargs = {
        "input_onnx_file_path": onnx_file,
        "output_folder_path": "saved_model",
        "disable_model_save": True,
        "not_use_onnxsim": True,  # folded here when needed (onnx2tf_fallbacks.FOLD_SHAPES says why)
        "verbosity": "info",
    }
    if job["layout"] == "NHWC":
        # onnx2tf assumes a 4-D input is NCHW; an NHWC export must keep its layout
        kwargs["keep_nwc_or_nhwc_or_ndhwc_input_names"] = [job["input"]]
    kwargs.update(flags)
    return onnx2tf.convert(**kwargs)


def fold_shapes(source: str, out: str) -> str:
    """Write ``source`` simplified by onnxsim (run-time shape computations folded into constants:
    the input already has a static shape) to ``out``; onnxsim checks the result against ONNX
    Runtime on random inputs and says whether it matches."""
    try:
        import onnx
        import onnxsim
    except ImportError as exc:
        raise RuntimeError("onnxsim is not installed: pip install onnxsim==0.4.36 (make install does this)") from exc
    model, matches = onnxsim.simplify(onnx.load(source))
    if not matches:
        raise RuntimeError("onnxsim's simplified graph does not give the original's outputs")
    onnx.save(model, out)
    print(f"edgekit: onnxsim folded the graph's run-time shapes ({len(model.graph.node)} nodes)", flush=True)
    return out


def _export(model, keys: list[str], out: str, nchw: bool = False) -> list[dict]:
    """Write the SavedModel; ``nchw``: the model kept its NCHW input (onnx2tf's -kat fallback),
    so the signature takes NHWC, as every edgekit TFLite model does, and transposes."""
    import tensorflow as tf
    import tf_keras

    shape = list(model.inputs[0].shape)
    spec = tf.TensorSpec([shape[0], *shape[2:], shape[1]] if nchw else shape, tf.float32, name="image")

    def serve(image):
        outputs = model(tf.transpose(image, [0, 3, 1, 2]) if nchw else image)
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        return dict(zip(keys, outputs))

    archive = tf_keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(name="serving_default", fn=serve, input_signature=[spec])
    archive.write_out(out)
    return [{"key": k, "shape": [int(d) if d is not None else None for d in o.shape]}
            for k, o in zip(keys, model.outputs)]


_ERROR_LINE = re.compile(r"^\s*(\w+(?:Error|Exception)):\s*(.+)$")
_SHAPES = re.compile(r" with input shapes: (.+?)\.?$")
_NODE_NAME = re.compile(r"\bname='([^']+)'")


def _cause(line: str) -> str:
    """TensorFlow's shape error without its graph-node dump: "Dimensions must be equal, but are 4800 and
    120 (input shapes [1,1,4800], [120])"."""
    shapes = line[line.find(" with input shapes"):] if " with input shapes" in line else ""
    return _SHAPES.sub(r" (input shapes \1)", line.split(" for '{{node", 1)[0] + shapes)


def describe_failure(exc: BaseException) -> dict:
    """``error`` (the exception's type and its telling line), and ``node``/``op`` (the ONNX node onnx2tf
    was converting, read from its op function's ``graph_node`` argument in the traceback).

    TensorFlow wraps what fails while tracing in ``ValueError: in user code:`` followed by the
    traceback of the traced code and, last, the real error: the first line says nothing (PP-OCRv4's
    recogniser read "ValueError: in user code:" and no more), so the last error-like line is kept.
    """
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    at = next((i for i in range(len(lines) - 1, -1, -1) if _ERROR_LINE.match(lines[i])), None)
    telling = lines[at] if at is not None else f"{type(exc).__name__}: {lines[-1] if lines else ''}"
    if at is not None and at + 1 < len(lines) and not lines[at + 1].startswith("Call arguments"):
        # Keras's "Exception encountered when calling layer ..." says the cause on the next line
        telling = telling.rstrip(".") + ": " + _cause(lines[at + 1])
    found: dict = {"error": telling[:400]}
    named = _NODE_NAME.findall(str(exc))  # onnx2tf names each TF op after its ONNX node
    if named:
        found["node"] = named[-1][:120]
    tb = exc.__traceback__
    while tb is not None:  # the innermost onnx2tf op function's node is where it failed
        node = tb.tb_frame.f_locals.get("graph_node") if "onnx2tf" in tb.tb_frame.f_code.co_filename else None
        if node is not None and getattr(node, "name", None):
            found["node"], found["op"] = str(node.name)[:120], str(getattr(node, "op", "") or "")[:40]
        tb = tb.tb_next
    return found


def main(argv: list[str]) -> int:
    """Convert the job's ONNX model; 0 on success, 3 on a conversion error (see result.json)."""
    block_network()
    job = json.loads(Path(argv[0]).read_text())
    result: dict = {"ok": False, "stage": "convert"}
    try:
        if not Path(SAMPLE_FILE).is_file():
            raise NetworkBlocked(f"{SAMPLE_FILE} is missing: onnx2tf would download it")
        model = _convert(job)
        if model is None:
            raise RuntimeError("onnx2tf returned no model")
        if len(model.outputs) != len(job["keys"]):
            raise RuntimeError(f"onnx2tf made {len(model.outputs)} outputs of the model's {len(job['keys'])}")
        result["stage"] = "export"
        nchw = job["layout"] == "NCHW" and bool(job.get("flags", {}).get("keep_shape_absolutely_input_names"))
        outputs = _export(model, job["keys"], "saved_model", nchw)
        shape = [int(d) if d is not None else None for d in model.inputs[0].shape]
        result = {"ok": True, "outputs": outputs, "input_shape": [shape[0], *shape[2:], shape[1]] if nchw else shape}
    except SystemExit as exc:  # onnx2tf exits on its own errors after printing them
        result["error"] = f"onnx2tf stopped (exit {exc.code})"
    except Exception as exc:  # whatever the converter raises becomes the one line the parent shows
        result.update(describe_failure(exc))
        traceback.print_exc()  # the whole of it into the kept log (the parent keeps stdout and stderr)
    Path("result.json").write_text(json.dumps(result))
    return 0 if result["ok"] else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
