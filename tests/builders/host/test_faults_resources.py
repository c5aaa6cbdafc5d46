"""Fault catalogue, second pass on the build/eval side (issue 29).

Inputs sized to exhaust memory (a 16384x16384 ONNX or .tflite input, a PNG declaring 400 M
pixels), files nested to exhaust the parser's recursion (annotations.json, data.yaml, a target
file), a target file naming ``os:system`` as its builder, eval sets whose mAP would measure
nothing (20,000 degenerate boxes, every object iscrowd). Each is a clean refusal (exit 2, one
``error:`` line, a ``fix:`` line, no traceback) before the work starts, with nothing left behind.
The ONNX cases use graphs made here with onnx.helper: no TensorFlow conversion is needed to
reach a pre-check.
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import CALIB, DEMO_MODEL, ROOT
from tests.helpers.faults import assert_nothing_left, assert_refused, edgekit, snapshot

DETECTOR_ONNX = ROOT / "models" / "detector.onnx"
DETECT_EVAL = ROOT / "eval" / "detect"
DETECT_CALIB = ROOT / "calib" / "detect"


def wide_onnx(path: Path, hw=("h", "w"), channels: int = 64) -> Path:
    """``x [n,3,h,w] -> Conv(channels, 3x3) -> Relu -> Conv(2, 1x1) -> GlobalAveragePool -> y [n,2]``:
    a few kB of weights, ``channels`` float32 planes at full resolution."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.zeros((channels, 3, 3, 3), np.float32), "w")
    w2 = numpy_helper.from_array(np.zeros((2, channels, 1, 1), np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["c2"]), helper.make_node("GlobalAveragePool", ["c2"], ["p"]),
             helper.make_node("Flatten", ["p"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, *hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])], [w, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def bomb_png(path: Path, side: int = 20000) -> Path:
    """A 1-bit grey PNG declaring ``side`` x ``side`` pixels: about 50 kB on disk for 20000."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = zlib.compress(b"\x00" * ((side // 8 + 1) * side), 9)
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b""))
    return path


def _refused(capsys, tmp_path, argv, *needles, allowed=()) -> tuple[str, str]:
    """A clean refusal holding ``needles`` that left nothing under ``tmp_path`` (but ``allowed``):
    (the error line, the fix line)."""
    before = snapshot(tmp_path)
    result = edgekit(capsys, *argv)
    line = assert_refused(result, *needles)
    assert_nothing_left(before, tmp_path, allowed=allowed)
    lines = result.err.splitlines()
    return line, lines[lines.index(line) + 1]


def _build(tmp_path, model, *extra, calib=CALIB, target="cpu") -> list[str]:
    return ["build", "--model", str(model), "--target", target, "--calib", str(calib), "--out",
            str(tmp_path / "dist"), "--quiet", "--calib-count", "12", *extra]


# ---- memory: checked before ONNX Runtime / LiteRT / TensorFlow run the model -----------------------------------

def test_onnx_input_size_that_cannot_fit_is_refused_before_onnx_runtime_runs(capsys, tmp_path):
    """Was OOM-killed without a word: load_onnx ran the model on a 16384x16384 zero image first."""
    model = wide_onnx(tmp_path / "wide.onnx")
    line, fix = _refused(capsys, tmp_path, _build(tmp_path, model, "--input-size", "16384x16384"),
                         "16384x16384", "GB of memory", "widest layer")
    assert "available" in line and "--no-memory-check" in fix


def test_onnx_fixed_huge_input_is_refused_before_onnx_runtime_runs(capsys, tmp_path):
    model = wide_onnx(tmp_path / "fixed.onnx", hw=(16384, 16384), channels=8)
    _refused(capsys, tmp_path, _build(tmp_path, model), "16384x16384", "GB of memory")


def test_the_graph_widest_step_reaches_the_check_before_the_model_runs(tmp_path):
    """The architecture-blind estimate (MobileNetV2 widths) would let a 1024-channel full-resolution
    graph through at 4096x4096 (15 GB); its widest step (137 GB per image) does not."""
    from edgekit.builders.host.resources import GB, estimate_memory
    from edgekit.builders.sources.onnx import load_onnx

    seen = []

    class Stop(Exception):
        pass

    def precheck(hwc, activation_bytes):
        seen.append((hwc, activation_bytes))
        raise Stop  # the model must not run after this

    with pytest.raises(Stop):
        load_onnx(wide_onnx(tmp_path / "w.onnx", channels=1024), (4096, 4096), precheck)
    [(hwc, widest)] = seen
    assert hwc == (4096, 4096, 3)
    assert widest == 4096 * 4096 * (1024 + 1024) * 4  # the Relu reads and writes 1024 planes
    blind = estimate_memory(4096, 4096, 1, 12, 40_000)
    assert blind < 16 * GB < 100 * GB < estimate_memory(4096, 4096, 1, 12, 40_000, widest)
    # a narrow graph never lowers the blind estimate
    assert estimate_memory(224, 224, 8, 12, 40_000, 1000) == estimate_memory(224, 224, 8, 12, 40_000)


def test_memory_check_override_still_builds_past_the_precheck(tmp_path):
    """--no-memory-check (memory_check=False) lets the precheck through: the model then runs."""
    from edgekit.builders.host.preflight import check_resources
    from edgekit.builders.log import BuildLog
    from edgekit.builders.request import BuildRequest
    from edgekit.errors import UsageError

    request = BuildRequest(model=wide_onnx(tmp_path / "w.onnx"), targets=["cpu"], calib=[CALIB])
    with pytest.raises(UsageError, match="16384x16384"):
        check_resources(request, BuildLog(quiet=True), (16384, 16384, 3), 1 << 40)
    lax = BuildRequest(model=wide_onnx(tmp_path / "w.onnx"), targets=["cpu"], calib=[CALIB], memory_check=False)
    check_resources(lax, BuildLog(quiet=True), (16384, 16384, 3), 1 << 40)


@pytest.fixture(scope="module")
def open_tflite(tmp_path_factory) -> Path:
    """A float .tflite whose height and width are left open (one TF conversion for the module)."""
    import keras
    import tensorflow as tf

    inp = keras.Input((None, None, 3), batch_size=1)
    model = keras.Model(inp, keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(8, 3)(inp)))
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    path = tmp_path_factory.mktemp("open") / "open.tflite"
    path.write_bytes(converter.convert())
    return path


@pytest.mark.slow
def test_tflite_input_size_that_cannot_fit_is_refused_before_litert_allocates(capsys, tmp_path, open_tflite):
    _refused(capsys, tmp_path, _build(tmp_path, open_tflite, "--input-size", "16384x16384"),
             "16384x16384", "GB of memory")


@pytest.mark.slow
def test_savedmodel_input_size_that_cannot_fit_is_refused(capsys, tmp_path):
    import tensorflow as tf

    class Net(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.zeros((3, 3, 3, 4)))

        @tf.function(input_signature=[tf.TensorSpec([1, None, None, 3], tf.float32)])
        def serve(self, x):
            return {"y": tf.reduce_mean(tf.nn.conv2d(x, self.w, 1, "SAME"), axis=[1, 2])}

    net = Net()
    tf.saved_model.save(net, str(tmp_path / "sm"), signatures={"serving_default": net.serve})
    _refused(capsys, tmp_path, _build(tmp_path, tmp_path / "sm", "--input-size", "16384x16384"),
             "16384x16384", "GB of memory", allowed=(tmp_path / "sm",))


# ---- custom target files: the builder is checked before anything is imported or written -------------------------

TARGET = 'name = "custom"\nsummary = "s"\nbuilder = "{builder}"\nadapter = "{adapter}"\n'
LITERT = "edgekit.runtime.litert:LiteRTRuntime"


@pytest.mark.parametrize("builder,adapter,needle", [
    ("os:system", LITERT, "builder 'os:system'"),
    ("subprocess:call", LITERT, "subprocess:call"),
    ("edgekit.builders.tflite:build", "os:system", "adapter 'os:system'"),
    ("edgekit.builders.tflite:build", "edgekit.runtime.fake:FakeRuntime", "FakeRuntime"),
])
def test_custom_target_naming_a_builder_or_adapter_outside_the_tables_is_refused(capsys, tmp_path, builder,
                                                                                 adapter, needle):
    """``builder = "os:system"`` was imported and called (TypeError, an empty --out left behind)."""
    toml = tmp_path / "t" / "custom.toml"
    toml.parent.mkdir()
    toml.write_text(TARGET.format(builder=builder, adapter=adapter))
    _refused(capsys, tmp_path, _build(tmp_path, DETECTOR_ONNX, target=str(toml)), needle)
    assert not (tmp_path / "dist").exists()


def test_an_untrusted_builder_module_is_never_imported(capsys, tmp_path, monkeypatch):
    (tmp_path / "mods").mkdir()
    marker = tmp_path / "imported"
    (tmp_path / "mods" / "trapmod.py").write_text(f"open({str(marker)!r}, 'w').close()\ndef build(*a): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    toml = tmp_path / "custom.toml"
    toml.write_text(TARGET.format(builder="trapmod:build", adapter=LITERT))
    _line, fix = _refused(capsys, tmp_path, _build(tmp_path, DETECTOR_ONNX, target=str(toml)), "trapmod:build")
    assert not marker.exists() and "trapmod" not in sys.modules
    assert "EDGEKIT_TRUSTED_BUILDERS" in fix and "entry-point" in fix


def test_a_target_file_nested_past_the_parser_is_one_line(capsys, tmp_path):
    toml = tmp_path / "deep.toml"
    toml.write_text(TARGET.format(builder="edgekit.builders.tflite:build", adapter=LITERT)
                    + "x = " + "[" * 5000 + "]" * 5000 + "\n")
    _refused(capsys, tmp_path, _build(tmp_path, DETECTOR_ONNX, target=str(toml)), "too deeply")


# ---- inputs that cannot explode: pixels, nesting, degenerate eval sets -----------------------------------------

def _coco_copy(tmp_path: Path, edit) -> Path:
    """eval/detect copied, its annotations.json passed through ``edit(dict) -> dict | str``."""
    dest = tmp_path / "evalset"
    shutil.copytree(DETECT_EVAL, dest)
    data = edit(json.loads((dest / "annotations.json").read_text()), dest)
    (dest / "annotations.json").write_text(data if isinstance(data, str) else json.dumps(data))
    return dest


def _with_bomb(data: dict, dest: Path) -> dict:
    bomb_png(dest / "bomb.png")
    data["images"].append({"id": 999, "file_name": "bomb.png", "width": 20000, "height": 20000})
    data["annotations"].append({"id": 9999, "image_id": 999, "category_id": 1, "bbox": [10, 10, 50, 50],
                                "area": 2500, "iscrowd": 0})
    return data


def _nested(data: dict, dest: Path) -> str:
    return json.dumps(data)[:-1] + ', "extra": ' + "[" * 100_000 + "]" * 100_000 + "}"


def _degenerate(data: dict, dest: Path) -> dict:
    """20,000 boxes of 0.001 x 0.001 pixels on the first image (no zero area: that was refused already)."""
    first = data["images"][0]["id"]
    data["annotations"] += [{"id": 100_000 + i, "image_id": first, "category_id": 1, "iscrowd": 0,
                             "bbox": [5 + (i % 100), 5 + (i // 200), 0.001, 0.001], "area": 1e-6}
                            for i in range(20_000)]
    return data


def _all_crowd(data: dict, dest: Path) -> dict:
    for a in data["annotations"]:
        a["iscrowd"] = 1
    return data


BENCH = ["bench", str(DETECTOR_ONNX), "--task", "detect", "--eval"]


@pytest.mark.parametrize("edit,needles", [
    (_with_bomb, ("bomb.png", "20000x20000")),
    (_nested, ("nested deeper than 100 levels",)),
    (_degenerate, ("20000 of its", "under 1 pixel")),
    (_all_crowd, ("iscrowd", "undefined")),  # COCOeval scores nothing: its -1 read as mAP 0, a ratio of nan
])
@pytest.mark.parametrize("verb", ["build", "bench"])
def test_a_coco_eval_set_that_would_explode_is_refused(capsys, tmp_path, verb, edit, needles):
    """Were a DecompressionBombError and a RecursionError (tracebacks), and a 20,000-box set that
    passed the mAP gate and printed nan in bench."""
    evalset = _coco_copy(tmp_path, edit)
    argv = (_build(tmp_path, DETECTOR_ONNX, "--eval", str(evalset), "--variants", "fp32", calib=DETECT_CALIB)
            if verb == "build" else [*BENCH, str(evalset)])
    _refused(capsys, tmp_path, argv, *needles, allowed=(evalset,))
    assert not (tmp_path / "dist").exists()


def test_a_task_option_nested_past_the_parser_is_one_line(capsys, tmp_path):
    deep = "[" * 5000 + "]" * 5000
    _refused(capsys, tmp_path, _build(tmp_path, DETECTOR_ONNX, "-T", f"outputs={deep}"), "-T outputs", "nested")


def test_an_undefined_map_found_only_when_scoring_is_refused_too(tmp_path):
    """The images holding the only non-crowd objects were not scored: coco_map says the mAP is
    undefined (CalibrationError) instead of reading COCOeval's -1 as 0."""
    from edgekit.detect.boxes import Detections
    from edgekit.errors import CalibrationError
    from edgekit.evaluation.dataset import load_detection_set
    from edgekit.evaluation.evaluate import coco_map

    def crowd_but_one(data, dest):
        for a in data["annotations"]:
            a["iscrowd"] = 0 if a["image_id"] == data["images"][0]["id"] else 1
        return data

    dataset = load_detection_set(_coco_copy(tmp_path, crowd_but_one))
    scored = {im.id: Detections((), (im.width, im.height)) for im in dataset.images[1:]}
    with pytest.raises(CalibrationError, match="undefined"):
        coco_map(dataset, scored)


def test_a_bomb_among_the_calibration_images_is_named(capsys, tmp_path):
    calib = tmp_path / "calib"
    shutil.copytree(DETECT_CALIB, calib)
    bomb_png(calib / "000a.png")
    _refused(capsys, tmp_path, _build(tmp_path, DETECTOR_ONNX, "--calib-count", "500", calib=calib),
             "000a.png", "million pixels", allowed=(calib,))


def _yolo_set(tmp_path: Path, yaml_text: str) -> Path:
    root = tmp_path / "yolo"
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    shutil.copy(DETECT_EVAL / "000.jpg", root / "images" / "000.jpg")
    (root / "labels" / "000.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    (root / "data.yaml").write_text(yaml_text)
    return root


@pytest.mark.parametrize("text,needle", [
    ("names: " + "[" * 3000 + "]" * 3000 + "\n", "too deeply"),
    ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nnames: [*b, *b]\n",
     "list of names"),
])
def test_a_yolo_data_yaml_that_would_explode_is_refused(capsys, tmp_path, text, needle):
    pytest.importorskip("yaml")
    root = _yolo_set(tmp_path, text)
    _refused(capsys, tmp_path, [*BENCH, str(root)], needle, allowed=(root,))


def _jpeg_declaring(path: Path, width: int, height: int) -> Path:
    import cv2

    ok, data = cv2.imencode(".jpg", np.full((8, 8, 3), 128, np.uint8))
    blob = bytearray(data.tobytes())
    sof = blob.index(b"\xff\xc0")
    blob[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    path.write_bytes(bytes(blob))
    return path


def _bmp_declaring(path: Path, width: int, height: int) -> Path:
    path.write_bytes(b"BM" + b"\0" * 16 + struct.pack("<ii", width, height) + b"\0" * 40)
    return path


@pytest.mark.parametrize("make", [
    lambda p: bomb_png(p / "b.png"),
    lambda p: _jpeg_declaring(p / "b.jpg", 60000, 60000),
    lambda p: _bmp_declaring(p / "b.bmp", 30000, -30000),  # a negative height: a top-down BMP
])
def test_read_image_refuses_by_header_before_decoding(tmp_path, make):
    from edgekit.errors import EdgekitError
    from edgekit.imaging.image import ImageReadError, read_image
    from edgekit.util.imagesize import ImageTooLarge

    path = make(tmp_path)
    with pytest.raises(ImageTooLarge) as err:
        read_image(path)
    assert isinstance(err.value, EdgekitError) and not isinstance(err.value, ImageReadError)  # never skipped
    assert path.name in err.value.message and err.value.hint


def test_bench_accuracy_table_never_prints_nan():
    from edgekit.bench.accuracy import EvalResult, format_eval

    rows = [EvalResult("a", 10, 0, 0.0, {}, [], {}, metric="mAP", map50=None),
            EvalResult("b", 10, 0, 0.0, {}, [], {}, metric="mAP", map50=0.0)]
    table = format_eval(rows)
    assert "nan" not in table.lower() and "n/a" in table


# ---- Ctrl-C / SIGTERM: the --out folder a build made goes; one that was there stays -----------------------------

def _interrupt_build(tmp_path: Path, out: Path, signum: int) -> tuple[int, str]:
    """``edgekit build`` of the demo model in a subprocess, sent ``signum`` once its target's
    bundle directory is being written (the log's "== target cpu" line: --out exists by then)."""
    import os
    import subprocess
    import time

    env = {**os.environ, "TMPDIR": str(tmp_path / "systmp"), "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "edgekit.cli", "build", "--model", str(DEMO_MODEL),
            "--target", "cpu", "--variants", "fp32", "--calib", str(CALIB), "--calib-count", "12", "--out", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    seen, deadline = [], time.monotonic() + 300
    assert proc.stderr is not None
    for line in proc.stderr:  # polls the build's log, line by line
        seen.append(line)
        if line.startswith("== target cpu"):
            proc.send_signal(signum)
            break
        assert time.monotonic() < deadline, "".join(seen)
    else:
        pytest.fail("the build ended before its target started:\n" + "".join(seen))
    _out, rest = proc.communicate(timeout=300)
    return proc.returncode, "".join(seen) + rest


@pytest.mark.slow
@pytest.mark.parametrize("signum", [2, 15])  # SIGINT (Ctrl-C), SIGTERM
def test_interrupted_build_removes_the_out_folders_it_created(tmp_path, signum):
    """Ctrl-C left an empty --out while saying nothing was left behind; its missing parents go too."""
    out = tmp_path / "new" / "deeper" / "dist"
    code, err = _interrupt_build(tmp_path, out, signum)
    assert code == 128 + signum and "Traceback" not in err, err
    assert "nothing half-written was left behind" in err
    assert not (tmp_path / "new").exists(), sorted(p.name for p in (tmp_path / "new").rglob("*"))
    assert [p.name for p in (tmp_path / "systmp").iterdir() if p.name != ".ses"] == []


@pytest.mark.slow
def test_interrupted_build_keeps_an_out_folder_that_was_there(tmp_path):
    out = tmp_path / "dist"
    out.mkdir()
    (out / "mine.txt").write_text("the user's")
    empty = tmp_path / "empty"
    empty.mkdir()
    code, err = _interrupt_build(tmp_path, out, 2)
    assert code == 130 and "Traceback" not in err, err
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    code, err = _interrupt_build(tmp_path, empty, 2)
    assert code == 130 and empty.is_dir() and list(empty.iterdir()) == []


@pytest.mark.slow
def test_every_format_measures_the_widest_step_of_the_same_model(tmp_path):
    """One Keras model (a 64-channel 3x3 conv, then ReLU, at 100x200) as Keras, SavedModel and
    float .tflite: each loader hands the check the bytes its runtime holds at the widest op."""
    import keras
    import tensorflow as tf

    from edgekit.builders.sources.load import load_source_model

    inp = keras.Input((100, 200, 3), batch_size=1)
    x = keras.layers.ReLU()(keras.layers.Conv2D(64, 3, padding="same")(inp))
    model = keras.Model(inp, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(x)))
    model.save(tmp_path / "m.keras")
    model.export(str(tmp_path / "sm"))
    (tmp_path / "m.tflite").write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    plane = 100 * 200 * 64 * 4
    seen = {}
    for name in ("m.keras", "sm", "m.tflite"):
        load_source_model(tmp_path / name, precheck=lambda hwc, widest, n=name: seen.setdefault(n, (hwc, widest)))
    assert seen["m.keras"] == seen["sm"] == ((100, 200, 3), 2 * plane)  # the ReLU reads and writes a plane
    assert seen["m.tflite"] == ((100, 200, 3), 100 * 200 * 3 * 4 + plane)  # LiteRT fuses the ReLU into the conv
