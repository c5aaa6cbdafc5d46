"""Several cameras in the configuration: ``[[camera]]`` with names, ``--camera [NAME=]URI``, the
name rules (one line and a fix, exit 2), and each camera's motion gate keys."""

from __future__ import annotations

import json

import pytest

from edgekit.commands.serve import build_config
from edgekit.errors import UsageError
from edgekit.serve.config.cameras import split_camera_flag
from edgekit.serve.config.load import ServeConfig, load_config, override
from tests.serve.config.test_load import parse_flags, write

TWO = """
[model]
path = "m.tflite"
[[camera]]
name = "door"
uri = "v4l2:0"
stall_timeout_s = 2.0
[camera.options]
fps = 15
[[camera]]
name = "yard"
uri = "clips/yard.mp4"
motion = true
motion_threshold = 40
"""


def test_camera_array_names_each_camera_with_its_own_keys(tmp_path):
    config = load_config(write(tmp_path, TWO))
    door, yard = config.camera_list
    assert (door.name, door.uri, door.stall_timeout_s, door.options, door.motion) == ("door", "v4l2:0", 2.0,
                                                                                      {"fps": 15}, False)
    assert yard.name == "yard" and yard.uri == str(tmp_path.resolve() / "clips" / "yard.mp4")  # beside the file
    assert (yard.motion, yard.motion_threshold, yard.stall_timeout_s, yard.options) == (True, 40, 5.0, {})
    assert config.camera == door  # the first camera's backoff also paces model reopens
    shown = config.to_dict()["camera"]  # --print-config shows the array as it was written
    assert [c["name"] for c in shown] == ["door", "yard"]


def test_a_plain_camera_table_is_one_unnamed_camera_as_before(tmp_path):
    config = load_config(write(tmp_path, '[camera]\nuri = "synthetic:64x48@10"\n'))
    assert config.cameras == () and config.camera_list == (config.camera,) and config.camera.name == ""
    assert isinstance(config.to_dict()["camera"], dict)
    named = load_config(write(tmp_path, '[camera]\nname = "porch"\nuri = "v4l2:0"\n'))
    assert [c.name for c in named.cameras] == ["porch"]  # one named camera: its results say so


@pytest.mark.parametrize("text, expected", [
    ("rtsp://user:pa@ss@cam.local:554/live?x=1", ("", "rtsp://user:pa@ss@cam.local:554/live?x=1")),
    ("rtsp://admin:a=b@10.0.0.5/stream", ("", "rtsp://admin:a=b@10.0.0.5/stream")),
    ("file:a=b.mp4", ("", "file:a=b.mp4")),
    ("./a=b.mp4", ("", "./a=b.mp4")),
    ("v4l2:0", ("", "v4l2:0")),
    ("door=rtsp://user:pw@cam/s?a=1", ("door", "rtsp://user:pw@cam/s?a=1")),
    ("Yard_2-b=file:x=y.mp4", ("Yard_2-b", "file:x=y.mp4")),
])
def test_camera_flag_takes_a_name_only_before_any_colon_or_slash(text, expected):
    assert split_camera_flag(text) == expected


def test_repeated_camera_flags_replace_the_files_cameras_and_keep_its_other_keys(tmp_path):
    path = write(tmp_path, '[model]\npath = "m.tflite"\n[camera]\nuri = "v4l2:0"\nstall_timeout_s = 3.0\n')
    config = build_config(parse_flags("--config", str(path), "--camera", "a=synthetic:160x120@10",
                                      "--camera", "b=rtsp://user:p@ss@host:554/s", "-O", "fps=5", "--motion"))
    a, b = config.camera_list
    assert (a.name, a.uri, b.name, b.uri) == ("a", "synthetic:160x120@10", "b", "rtsp://user:p@ss@host:554/s")
    assert a.stall_timeout_s == b.stall_timeout_s == 3.0  # the file's [camera] keys hold for each
    assert a.options == b.options == {"fps": "5"} and a.motion and b.motion  # so do the flags
    one = build_config(parse_flags("--config", str(path), "--camera", "rtsp://user:pw@host:554/s"))
    assert one.cameras == () and one.camera.uri == "rtsp://user:pw@host:554/s"  # exactly as before
    replaced = build_config(parse_flags("--config", str(write(tmp_path, TWO)), "--camera", "synthetic"))
    assert replaced.cameras == () and replaced.camera.name == "" and replaced.camera.stall_timeout_s == 2.0


@pytest.mark.parametrize("argv, needle", [
    (["--camera", "my cam=v4l2:0"], "'my cam' is not a camera name"),
    (["--camera", "a.b=v4l2:0"], "'a.b' is not a camera name"),
    (["--camera", "door="], "gives no URI"),
    (["--camera", "v4l2:0", "--camera", "b=v4l2:1"], "not every one named"),
    (["--camera", "a=v4l2:0", "--camera", "A=v4l2:1"], "have the same name"),
    (["--camera", "front-door=v4l2:0", "--camera", "front_door=v4l2:1"], "have the same name"),
    (["--camera", "set=v4l2:0"], "one of the device's own MQTT topics"),
    (["--camera", "x" * 33 + "=v4l2:0"], "is not a camera name"),
])
def test_bad_camera_names_on_the_command_line(argv, needle):
    with pytest.raises(UsageError) as info:
        build_config(parse_flags(*argv))
    assert needle in info.value.message and info.value.hint and "\n" not in str(info.value)


def test_a_bad_camera_name_exits_2_with_one_line_and_a_fix(capsys):
    from edgekit.cli import main

    assert main(["serve", "m.tflite", "--camera", "front door=v4l2:0", "--print-config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "edgekit serve: error: --camera 'front door=v4l2:0': 'front door' is not a camera name"
    assert len(err) == 2 and "letters, digits" in err[1]


@pytest.mark.parametrize("text, needle", [
    ('[[camera]]\nname = "a"\n[[camera]]\nname = "a"\n', "cameras 'a' and 'a' have the same name"),
    ('[[camera]]\nname = "a"\n[[camera]]\nuri = "v4l2:1"\n', "camera 2 of 2 ('v4l2:1') has no name"),
    ('[[camera]]\nname = "a/b"\n', "'a/b' is not a valid camera name"),
    ('[camera]\nname = "events"\n', "one of the device's own MQTT topics"),
    ("camera = []\n", "[[camera]] holds no camera"),
    ('[[camera]]\nname = "a"\nprot = 1\n', "(camera 1): unknown key 'prot' in [camera]"),
    ("[camera]\nmotion_threshold = 0\n", "[camera] motion_threshold = 0 must be a whole number from 1 to 255"),
    ("[camera]\nmotion_alpha = 0.0\n", "motion_alpha = 0.0 must be a number from 0 (exclusive) to 1"),
    ('[camera]\nmotion = "yes"\n', "[camera] motion must be true/false"),
    ("[camera]\nmotion_min_area = 2\n", "motion_min_area = 2 must be a number from 0 to 1"),
])
def test_bad_camera_tables_name_the_file_and_say_why(tmp_path, text, needle):
    path = write(tmp_path, text)
    with pytest.raises(UsageError) as info:
        load_config(path)
    assert needle in str(info.value) and str(path) in str(info.value) and info.value.hint


def test_motion_keys_default_off_and_reach_the_gate(tmp_path):
    from edgekit.camera.motion import MOTION_OPTIONS
    from edgekit.serve.config.cameras import motion_settings

    camera = ServeConfig().camera
    assert camera.motion is False
    assert motion_settings(camera) == {o.name: o.default for o in MOTION_OPTIONS}  # one default, the gate's
    config = load_config(write(tmp_path, "[camera]\nmotion = true\nmotion_refresh_s = 0\nmotion_width = 32\n"))
    assert motion_settings(config.camera)["refresh_s"] == 0.0 and motion_settings(config.camera)["width"] == 32
    with pytest.raises(UsageError, match="command line: \\[camera\\] motion_width"):
        override(ServeConfig(), "camera", motion_width=8)


def test_print_config_shows_every_named_camera(tmp_path, capsys):
    from edgekit.commands.serve import main

    (tmp_path / "m.tflite").write_bytes(b"")
    args = parse_flags("--config", str(write(tmp_path, '[model]\npath = "m.tflite"\n')), "--camera",
                       "a=synthetic:64x48@10", "--camera", "b=synthetic:64x48@20", "--print-config")
    assert main(args) == 0
    shown = json.loads(capsys.readouterr().out)["camera"]
    assert [(c["name"], c["uri"]) for c in shown] == [("a", "synthetic:64x48@10"), ("b", "synthetic:64x48@20")]


def test_print_config_checks_every_camera_and_names_the_bad_one(capsys):
    from edgekit.cli import main

    assert main(["serve", "m.tflite", "--camera", "a=synthetic", "--camera", "b=synthetic:1x2x3",
                 "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "[camera b] bad camera URI 'synthetic:1x2x3'" in err and "[camera a]" not in err
