"""One runtime-options surface: run, bench, serve and the robot demo spell each knob the same way
and map it to the same open_model keywords; old spellings still work with a deprecation note."""

from __future__ import annotations

import pytest

from edgekit.cli import build_parser
from edgekit.errors import UsageError
from edgekit.options import runtime_options
from edgekit.runtime import BACKENDS
from edgekit.serve.daemon import model_options

KNOBS = ["--device", "usb:1", "--backend", "onnxruntime", "--threads", "2", "--delegate", "none",
         "--providers", "cpu", "--allow-fallback"]
EXPECTED = {"device": "usb:1", "backend": "onnxruntime", "num_threads": 2, "delegate": "none",
            "providers": "cpu", "allow_fallback": True}


def parse(verb: str, *argv: str):
    return build_parser(verb).parse_args([verb, *argv])


def robot_parser():
    from robot.signs import build_parser as robot_build_parser

    return robot_build_parser()


def test_every_front_end_maps_the_same_flags_to_the_same_keywords():
    run = parse("run", "m.tflite", "--camera", "synthetic", *KNOBS)
    bench = parse("bench", "m.tflite", *KNOBS)
    robot = robot_parser().parse_args(["--fake", "frames", *KNOBS])
    assert runtime_options(run) == EXPECTED
    assert runtime_options(robot) == EXPECTED
    assert runtime_options(bench) == {**EXPECTED, "backend": ["onnxruntime"]}  # bench compares backends

    from edgekit.commands.serve import build_config

    config = build_config(parse("serve", *KNOBS))
    assert model_options(config) == EXPECTED  # through [model] and back: nothing renamed or lost


def test_flags_not_given_are_never_passed():
    assert runtime_options(parse("run", "m.tflite", "--camera", "synthetic")) == {}
    assert runtime_options(robot_parser().parse_args(["--fake", "frames"])) == {}
    assert runtime_options(parse("run", "m.tflite", "--camera", "synthetic", "--allow-rejected")) == {
        "allow_rejected": True
    }


def test_backend_choices_are_the_runtime_table():
    for verb, argv in (("run", ["m", "--camera", "synthetic"]), ("bench", ["m"]), ("serve", [])):
        for name in BACKENDS:
            parse(verb, *argv, "--backend", name)
    with pytest.raises(SystemExit):
        parse("serve", "--backend", "teapot")


def test_serve_old_spelling_still_works_with_a_note(capsys):
    from edgekit.commands.serve import build_config

    config = build_config(parse("serve", "--edgetpu-device", "pci:0", "--device-name", "pi-7"))
    assert config.model.device == "pci:0"
    assert config.mqtt.device == "pi-7"  # --device-name (now --node-name) is the MQTT name
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["edgekit serve: note: --edgetpu-device is deprecated; use --device",
                   "edgekit serve: note: --device-name is deprecated; use --node-name"]
    # The new spelling prints nothing.
    assert build_config(parse("serve", "--device", "usb")).model.device == "usb"
    assert capsys.readouterr().err == ""


def test_serve_backend_is_a_config_key(tmp_path):
    from edgekit.commands.serve import build_config
    from edgekit.errors import UsageError
    from edgekit.serve.config.load import load_config

    path = tmp_path / "serve.toml"
    path.write_text('[model]\npath = "m.onnx"\nbackend = "tensorrt"\n', encoding="utf-8")
    assert model_options(load_config(path))["backend"] == "tensorrt"
    flagged = build_config(parse("serve", "--config", str(path), "--backend", "onnxruntime"))
    assert model_options(flagged)["backend"] == "onnxruntime"  # the flag overrides the file
    path.write_text('[model]\nbackend = "onnxrt"\n', encoding="utf-8")
    with pytest.raises(UsageError, match="backend"):
        load_config(path)


def test_serve_threads_zero_still_means_the_runtime_default():
    from edgekit.commands.serve import build_config

    assert "num_threads" not in model_options(build_config(parse("serve", "--threads", "0")))
    with pytest.raises(SystemExit):
        parse("run", "m", "--camera", "synthetic", "--threads", "0")


def test_serve_camera_options_override_the_files_keys(tmp_path):
    from edgekit.commands.serve import build_config

    path = tmp_path / "serve.toml"
    path.write_text('[camera]\nuri = "v4l2:0"\noptions = { fps = 30, fourcc = "MJPG" }\n', encoding="utf-8")
    config = build_config(parse("serve", "--config", str(path), "-O", "fps=15", "--camera-option", "size=640x480"))
    assert config.camera.options == {"fps": "15", "fourcc": "MJPG", "size": "640x480"}
    assert build_config(parse("serve", "--config", str(path))).camera.options == {"fps": 30, "fourcc": "MJPG"}
    with pytest.raises(SystemExit):
        parse("serve", "-O", "fps")


def test_camera_help_lists_the_camera_packages_uri_forms(monkeypatch):
    import edgekit.camera
    from edgekit.options import camera_help

    monkeypatch.setattr(edgekit.camera, "camera_uri_forms", lambda: ["v4l2:N", "synthetic[:WxH[@fps]]"],
                        raising=False)
    assert camera_help("file:clip.mp4") == "camera URI: v4l2:N, synthetic[:WxH[@fps]]"
    assert "synthetic[:WxH[@fps]]" in build_parser("run")._subparsers._group_actions[0].choices["run"].format_help()
    monkeypatch.delattr(edgekit.camera, "camera_uri_forms")
    assert camera_help("file:clip.mp4") == "camera URI: file:clip.mp4"  # an older camera package


@pytest.mark.parametrize("verb", ["run", "bench"])
def test_task_and_task_options_reach_open_model(verb):
    camera = ["--camera", "synthetic"] if verb == "run" else []
    args = parse(verb, "m.onnx", *camera, "--task", "detect", "-T", "score_threshold=0.4", "-T", "layout=yolo",
                 "--task-option", "outputs=[0]", "-T", "class_agnostic=true")
    assert runtime_options(args) == {"task": "detect", "task_options": {
        "score_threshold": 0.4, "layout": "yolo", "outputs": [0], "class_agnostic": True}}


def test_a_bare_model_becomes_a_detector_when_told(tmp_path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from edgekit.errors import ModelError
    from edgekit.model import open_model

    # a YOLOv8-layout output [1, 4 + 2, 3] that a bare model's default (raw) would not decode
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["m"], keepdims=1, axes=[1, 2, 3]),
         helper.make_node("Reshape", ["m", "shape"], ["m3"]),
         helper.make_node("Add", ["m3", "boxes"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 3])],
        [helper.make_tensor("shape", TensorProto.INT64, [3], [1, 1, 1]),
         helper.make_tensor("boxes", TensorProto.FLOAT, [1, 6, 3], np.zeros(18, np.float32).tolist())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = tmp_path / "det.onnx"
    onnx.save(model, path)
    with open_model(path) as plain:
        assert plain.task == "raw"
    with open_model(path, task="detect", task_options={"score_threshold": 0.3}) as m:
        assert (m.task, m.task_options) == ("detect", {"score_threshold": 0.3})
    with pytest.raises(ModelError, match="unknown task 'boxes'"):
        open_model(path, task="boxes")


def test_serve_takes_the_bundle_as_its_first_argument_like_run_and_bench(capsys):
    from edgekit.commands.serve import build_config

    config = build_config(parse("serve", "dist/demo-cpu:int8", "--node-name", "pi-7"))
    assert (config.model.path, config.model.name, config.mqtt.device) == ("dist/demo-cpu", "int8", "pi-7")
    config = build_config(parse("serve", "dist/demo-cpu", "--variant", "fp16"))
    assert (config.model.path, config.model.name) == ("dist/demo-cpu", "fp16")
    assert capsys.readouterr().err == ""  # the new spellings print nothing
    config = build_config(parse("serve", "--bundle", "dist/demo-cpu", "--model-name", "fp32"))
    assert (config.model.path, config.model.name) == ("dist/demo-cpu", "fp32")
    assert capsys.readouterr().err.splitlines() == [
        "edgekit serve: note: --bundle is deprecated; use BUNDLE[:VARIANT] as the first argument",
        "edgekit serve: note: --model-name is deprecated; use --variant"]
    with pytest.raises(UsageError, match="two variants asked for"):
        build_config(parse("serve", "dist/demo-cpu:int8", "--variant", "fp16"))
    with pytest.raises(UsageError, match="two models given"):
        build_config(parse("serve", "dist/a", "--bundle", "dist/b"))


def test_serve_json_means_results_on_stdout_and_log_level_is_a_deprecated_alias(capsys):
    from edgekit.commands.serve import build_config

    assert build_config(parse("serve", "dist/demo-cpu", "--json")).output.jsonl == "-"
    with pytest.raises(UsageError, match="--json prints results on stdout"):
        build_config(parse("serve", "dist/demo-cpu", "--json", "--output", "r.jsonl"))
    assert build_config(parse("serve", "dist/demo-cpu", "--log-level", "debug")).log.level == "debug"
    assert "--log-level is deprecated; use -v/-vv/-q" in capsys.readouterr().err
    with pytest.raises(UsageError, match="not debug, info, warning or error"):
        build_config(parse("serve", "dist/demo-cpu", "--log-level", "loud"))
