"""Bad input to edgekit build: one clear line, non-zero exit, no traceback, no bundle that looks good."""

from __future__ import annotations

import shutil

import pytest

from edgekit.cli import main
from tests.conftest import CALIB, DEMO_MODEL, EVAL, FRAMES


def run_cli(capsys, *argv):
    code = main(["build", *argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def base(tmp_path, model=DEMO_MODEL, calib=CALIB, target="cpu", extra=()):
    return ["--model", str(model), "--target", target, "--calib", str(calib), "--out", str(tmp_path / "dist"),
            "--quiet", "--variants", "fp32", *extra]


def error_line(err):
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    return lines[0]


def test_missing_model(tmp_path, capsys):
    code, err = run_cli(capsys, *base(tmp_path, model=tmp_path / "nope.keras"))
    assert code == 2 and "does not exist" in error_line(err)


@pytest.mark.parametrize("name,content,message", [
    ("bad.keras", b"garbage" * 100, "must be a zip archive"),
    ("bad.h5", b"garbage" * 100, "not an HDF5 file"),
    ("model.pt", b"\x80\x02", "unsupported model format"),
    ("bad.onnx", b"garbage", "not a valid ONNX model"),
])
def test_corrupt_or_unsupported_model(tmp_path, capsys, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    target = "jetson" if name.endswith(".onnx") else "cpu"
    code, err = run_cli(capsys, *base(tmp_path, model=path, target=target))
    assert code == 2 and message in error_line(err)
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir())


def test_truncated_keras_zip(tmp_path, capsys):
    path = tmp_path / "cut.keras"
    path.write_bytes(DEMO_MODEL.read_bytes()[:-2000])
    code, err = run_cli(capsys, *base(tmp_path, model=path))
    assert code == 2 and "cut.keras" in error_line(err)


def test_unknown_target(tmp_path, capsys):
    code, err = run_cli(capsys, *base(tmp_path, target="coral-dev-99"))
    assert code == 2 and "unknown target" in error_line(err) and "edgetpu" in err


def test_empty_and_unreadable_calibration(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, err = run_cli(capsys, *base(tmp_path, calib=empty))
    assert code == 2 and "no images" in error_line(err)
    junk = tmp_path / "junk"
    junk.mkdir()
    for i in range(3):
        (junk / f"{i}.png").write_text("not a png")
    code, err = run_cli(capsys, *base(tmp_path, calib=junk))
    assert code == 2 and "readable image" in error_line(err)
    code, err = run_cli(capsys, *base(tmp_path, calib=tmp_path / "missing"))
    assert code == 2 and "does not exist" in error_line(err)


def test_broken_files_are_skipped_and_counted(tmp_path, capsys):
    mixed = tmp_path / "mixed"
    shutil.copytree(CALIB, mixed)
    (mixed / "notes.txt").write_text("hello")
    (mixed / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    jpg = next(FRAMES.glob("*.jpg")).read_bytes()
    (mixed / "cut.jpg").write_bytes(jpg[: len(jpg) // 3])
    main(["build", *base(tmp_path, calib=mixed)[:-3], "--variants", "fp32"])
    err = capsys.readouterr().err
    assert "skipped 3 calibration file(s): 2 unreadable/truncated, 1 not images" in err
    assert (tmp_path / "dist" / "demo-cpu" / "edgekit.json").is_file()


def test_eval_folder_without_classes(tmp_path, capsys):
    flat = tmp_path / "flat"
    shutil.copytree(CALIB, flat)
    code, err = run_cli(capsys, *base(tmp_path, extra=("--eval", str(flat))))
    assert code == 2 and "no class subfolders" in error_line(err)


def test_output_not_writable(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    argv = base(tmp_path)
    argv[argv.index("--out") + 1] = str(blocker / "dist")
    code, err = run_cli(capsys, *argv)
    assert code == 2 and "cannot write" in error_line(err)  # --out under a file: a path to fix


def test_accuracy_gate_failure_leaves_no_good_looking_bundle(tmp_path, capsys):
    dist = tmp_path / "dist"
    stale = dist / "demo-cpu"
    stale.mkdir(parents=True)
    (stale / "edgekit.json").write_text("{}")  # an older bundle that no longer matches this model
    code, err = run_cli(capsys, *base(tmp_path, extra=("--eval", str(EVAL), "--min-accuracy-ratio", "1.5")))
    assert code == 3 and "ratio" in error_line(err)
    assert not stale.exists()
    import json

    rejected = json.loads((dist / "demo-cpu.rejected" / "edgekit.json").read_text())
    assert rejected["verification"]["passed"] is False


def test_ctrl_c_during_conversion_leaves_nothing(tmp_path, capsys, monkeypatch):
    import edgekit.builders.tflite as tflite

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(tflite, "convert", interrupted)
    code, err = run_cli(capsys, *base(tmp_path))
    assert code == 130 and "interrupted" in err
    assert not (tmp_path / "dist").exists()  # no temp dir, no bundle, not the --out it made


def test_debug_shows_traceback(tmp_path, capsys):
    main(["build", "--debug", *base(tmp_path, model=tmp_path / "nope.keras")])
    assert "Traceback" in capsys.readouterr().err


def test_targets_lists_all_with_capabilities(capsys):
    assert main(["targets"]) == 0
    out = capsys.readouterr().out
    for name in ("edgetpu", "rpi", "cpu", "jetson"):
        assert name in out
    assert "libedgetpu" in out  # the Edge TPU runtime is not on this machine: says why




@pytest.mark.parametrize("extra,message", [
    (("--crop", "0x0"), "bad crop"),
    (("--crop", "200"), "bad --crop"),
    (("--mean", "1,2,3"), "--mean has 3 values for a 1-channel input"),
    (("--std", "0"), "--std must be positive"),
    (("--colour", "rgb"), "does not fit a 1-channel"),
    (("--min-accuracy-ratio", "-1"), "makes no sense"),
    (("--calib-count", "0"), "--calib-count 0 makes no sense"),
    (("--recovery-budget", "0"), "--recovery-budget 0"),
    (("--labels", "/nonexistent/labels.txt"), "cannot read labels file"),
])
def test_bad_options_are_refused_before_any_work(tmp_path, capsys, extra, message):
    code, err = run_cli(capsys, *base(tmp_path, extra=extra))
    assert code == 2 and message in error_line(err)
    assert not (tmp_path / "dist").exists()


def test_labels_count_must_match_outputs(tmp_path, capsys):
    labels = tmp_path / "labels.txt"
    labels.write_text("a\nb\nc\n")
    code, err = run_cli(capsys, *base(tmp_path, extra=("--labels", str(labels))))
    n_classes = len(DEMO_MODEL.with_suffix(".labels.txt").read_text().split())  # the demo's own labels file
    assert code == 2 and f"3 labels for a model with {n_classes} outputs" in error_line(err)


def test_task_classify_needs_a_class_score_output(tmp_path, capsys):
    import keras

    inp = keras.Input((8, 8, 1))
    model = keras.Model(inp, keras.layers.Conv2D(2, 3, padding="same")(inp))  # a 8x8x2 map: not class scores
    path = tmp_path / "seg.keras"
    model.save(path)
    code, err = run_cli(capsys, *base(tmp_path, model=path, extra=("--task", "classify")))
    assert code == 2 and "--task classify needs an output of class scores" in error_line(err)
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir())


def test_onnx_with_dynamic_image_size_is_refused_naming_input_and_shape(tmp_path, capsys):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, "H", "W"])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    path = tmp_path / "dyn.onnx"
    onnx.save(model, path)
    for target in ("jetson", "cpu"):
        code, err = run_cli(capsys, *base(tmp_path, model=path, target=target))
        assert code == 2 and "input 'x' has shape [?,3,?,?]" in error_line(err) and "--input-size" in err
    code, err = run_cli(capsys, *base(tmp_path, model=path, target="jetson", extra=("--input-size", "axb")))
    assert code == 2 and "--input-size 'axb' is not HxW" in error_line(err)
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir())


def test_real_sigint_stops_at_the_next_step_and_writes_nothing(tmp_path, capsys, monkeypatch):
    import os
    import signal

    import edgekit.builders.tflite as tflite

    real_convert = tflite.convert

    def convert_then_ctrl_c(*a, **k):
        blob = real_convert(*a, **k)
        os.kill(os.getpid(), signal.SIGINT)  # as if Ctrl-C landed inside TensorFlow
        return blob

    monkeypatch.setattr(tflite, "convert", convert_then_ctrl_c)
    code, err = run_cli(capsys, *base(tmp_path))
    assert code == 130 and "stopping after the current step" in err
    assert not (tmp_path / "dist").exists()  # the --out it made goes too


def _erfinv_model(path):
    """A small Keras model with Erfinv, an op with no TFLite builtin kernel: the real TFLite
    converter (builtins only, no select TF ops) rejects it in about a second."""
    import keras
    from keras import layers, ops

    inp = keras.Input((32, 32, 1))
    x = ops.erfinv(ops.tanh(layers.Conv2D(2, 3)(inp)))
    keras.Model(inp, layers.Dense(2, activation="softmax")(layers.GlobalAveragePooling2D()(x))).save(path)
    return path


@pytest.fixture(scope="module")
def converter_failure(tmp_path_factory):
    """``edgekit build`` on the Erfinv model once, over a stale bundle: (exit code, stderr, dist)."""
    import io
    from contextlib import redirect_stderr

    tmp = tmp_path_factory.mktemp("erfinv")
    stale = tmp / "dist" / "erfinv-cpu"
    stale.mkdir(parents=True)
    (stale / "edgekit.json").write_text("{}")
    err = io.StringIO()
    with redirect_stderr(err):
        code = main(["build", *base(tmp, model=_erfinv_model(tmp / "erfinv.keras"))])
    return code, err.getvalue(), tmp / "dist"


def test_a_real_converter_failure_is_one_line_and_removes_the_stale_bundle(converter_failure):
    code, err, dist = converter_failure
    assert "Traceback" not in err
    line = error_line(err)
    assert code == 2 and "TFLite conversion (fp32) failed: " in line and "Erfinv" in line
    assert "ops TFLite cannot convert" in err  # the fix line
    assert not (dist / "erfinv-cpu").exists()  # the stale bundle is gone, no new one stands in its place
    assert [p.name for p in dist.iterdir()] == []


def test_a_real_converter_failure_names_the_op_in_plain_words(converter_failure):
    line = error_line(converter_failure[1])
    assert "loc(callsite" not in line
    assert "no TFLite builtin kernel for Erfinv (the converter would need them as custom ops)" in line


def test_converter_errors_in_plain_words():
    from edgekit.builders.tf import converter_error

    assert converter_error("x\nFlex ops: FlexErf, FlexFoo\nDetails:") == \
        "no TFLite builtin kernel for FlexErf, FlexFoo (the converter would need them as TensorFlow (flex) ops)"
    assert converter_error("<unknown>:0: error: loc(fused[...]): 'tf.Foo' op is not supported\nmore") == \
        "tf.Foo is not supported"
    assert converter_error("  first line\nsecond") == "first line"
    assert converter_error("") == ""


def _onnx(path, op, opset=17, **attrs):
    """A one-op ONNX image model ``y = op(x)`` (ONNX Runtime runs it), saved at ``path``."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 8, 8])
    inputs = ["x", "x"] if op == "CastLike" else ["x"]
    graph = helper.make_graph([helper.make_node(op, inputs, ["y"], name=f"my/{op.lower()}@1", **attrs)], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8), path)
    return path


def test_onnx_op_onnx2tf_cannot_convert_is_named_with_its_node(tmp_path, capsys):
    model = _onnx(tmp_path / "castlike.onnx", "CastLike")
    code, err = run_cli(capsys, *base(tmp_path, model=model))
    assert code == 2 and "op CastLike (node 'my/castlike_1') is not supported by onnx2tf" in error_line(err)
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir())


def test_onnx_opset_onnx2tf_cannot_take_is_refused(tmp_path, capsys):
    model = _onnx(tmp_path / "old.onnx", "Relu", opset=9)
    code, err = run_cli(capsys, *base(tmp_path, model=model))
    assert code == 2 and "uses ONNX opset 9; onnx2tf converts opsets 11 to" in error_line(err)
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir())


def test_a_crashed_converter_process_is_one_line(tmp_path):
    """A real child that dies without a result (as a native crash does) becomes one ModelError."""
    import subprocess
    import sys
    from pathlib import Path

    from edgekit.builders.convert.onnx_to_tf import _result
    from edgekit.builders.sources.model import SourceModel, make_outputs
    from edgekit.errors import ModelError

    proc = subprocess.run([sys.executable, "-c", "import os; print('ERROR: out of cheese'); os.abort()"],
                          capture_output=True, text=True, check=False)
    source = SourceModel(Path("m.onnx"), "onnx", (8, 8, 3), None, outputs=make_outputs(["y"], [[1, 3]]))
    with pytest.raises(ModelError) as info:
        _result(tmp_path, proc, source)
    assert str(info.value.message) == ("onnx2tf could not convert m.onnx: the converter crashed "
                                       f"(exit {proc.returncode}): out of cheese")


def test_a_target_that_fails_does_not_stop_the_others(tmp_path, capsys):
    """onnx2tf cannot convert CastLike, so the TFLite target fails; the Jetson target (ONNX
    FP16, no onnx2tf) is still built, the error says so and the exit code is still an error."""
    model = _onnx(tmp_path / "castlike.onnx", "CastLike")
    code, err = run_cli(capsys, "--model", str(model), "--target", "cpu,jetson", "--calib", str(CALIB),
                        "--out", str(tmp_path / "dist"))
    line = error_line(err)
    assert code == 2 and line.startswith("edgekit build: error: cpu: ") and "CastLike" in line
    assert line.endswith("(written: jetson; failed: cpu)")
    assert "WARNING: cpu: not built: " in err and "going on with the other targets" in err
    assert sorted(p.name for p in (tmp_path / "dist").iterdir()) == ["castlike-jetson"]
    assert (tmp_path / "dist" / "castlike-jetson" / "edgekit.json").is_file()


def test_a_repeated_target_flag_adds_a_target_instead_of_replacing_the_first(tmp_path, capsys):
    """``--target a --target b`` builds both, like ``--target a,b``: an unknown first target is
    refused before anything is built (argparse's last-one-wins would have dropped it silently)."""
    argv = base(tmp_path, target="nosuch")
    code, err = run_cli(capsys, *argv, "--target", "cpu")
    assert code == 2 and "nosuch" in error_line(err)
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir())
