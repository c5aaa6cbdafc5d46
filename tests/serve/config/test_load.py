"""edgekit serve configuration: the example file loads, bad files fail with clear messages,
flags override the file."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from edgekit.commands.serve import build_config, configure
from edgekit.errors import UsageError
from edgekit.serve.config.load import ServeConfig, load_config, override, parse_address

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "serve.example.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "serve.toml"
    path.write_text(text, encoding="utf-8")
    return path


def parse_flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(list(argv))


def test_example_file_is_valid_and_documents_every_key():
    config = load_config(EXAMPLE)
    text = EXAMPLE.read_text()
    # Every key of every table appears in the example, so the example is the documentation.
    for table, values in config.to_dict().items():
        assert f"[{table}]" in text
        for key in values:
            documented = (f"\n{key} =", f"\n# {key} =", f"\n[{table}.{key}]")
            assert any(d in text for d in documented), f"[{table}] {key} undocumented"


def test_defaults_bind_loopback_and_disable_mqtt():
    config = load_config(None)
    assert config.http.listen.startswith("127.0.0.1:")
    assert config.mqtt.host == ""
    assert config.topic.startswith("edgekit/") and "{device}" not in config.topic


def test_relative_paths_are_relative_to_the_file(tmp_path):
    path = write(tmp_path, '[model]\npath = "bundles/demo"\n[output]\njsonl = "log/results.jsonl"\n')
    config = load_config(path)
    assert config.model.path == str(tmp_path.resolve() / "bundles" / "demo")
    assert config.output.jsonl == str(tmp_path.resolve() / "log" / "results.jsonl")


def test_int_is_accepted_where_a_number_is_expected(tmp_path):
    config = load_config(write(tmp_path, "[camera]\nreconnect_max_s = 10\n"))
    assert config.camera.reconnect_max_s == 10.0 and isinstance(config.camera.reconnect_max_s, float)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[model\npath = 1", "not valid TOML"),
        ("[modle]\npath = 'x'\n", "did you mean [model]"),
        ("[mqtt]\nprot = 1883\n", "did you mean 'port'"),
        ("[mqtt]\nport = 'abc'\n", "[mqtt] port must be an integer"),
        ("[mqtt]\nport = 70000\n", "not a TCP port"),
        ("[mqtt]\nqos = 3\n", "is not one of 0, 1, 2"),
        ("[mqtt]\ntopic = 'a/+/b'\n", "not a valid topic prefix"),
        ("[model]\ntop_k = 0\n", "below the minimum 1"),
        ("[model]\nthreads = true\n", "must be an integer"),
        ("[camera]\non_end = 'loop'\n", "'reconnect', 'stop'"),
        ("[camera]\nreconnect_min_s = 5\nreconnect_max_s = 1\n", "reconnect_max_s is below"),
        ("[camera]\noptions = 3\n", "must be a table"),
        ("model = 3\n", "[model] must be a table"),
        ("[http]\nlisten = '127.0.0.1:port'\n", "bad port"),
        ("[log]\nlevel = 'loud'\n", "'debug', 'info'"),
        ("[model]\ncheck_deadline_s = 0.5\n", "check_deadline_s = 0.5 is below the minimum 1"),
        ("[model]\ncheck_deadline_s = 1e9\n", "check_deadline_s = 1000000000.0 is more than a year"),
        ("[model]\ncheck_deadline_s = 'soon'\n", "check_deadline_s must be a number"),
    ],
)
def test_bad_files_name_file_table_and_key(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(UsageError) as info:
        load_config(path)
    assert expected in str(info.value)
    assert str(path) in str(info.value)
    assert info.value.hint


def test_missing_and_undecodable_files(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b"[model]\npath = '\xe9'\n")
    with pytest.raises(UsageError, match="cannot read config file"):
        load_config(bad)


def test_a_fifo_given_as_the_config_is_refused_at_once(tmp_path):
    """Through the library API too (the CLI checks its path itself): open() on a FIFO with no
    writer blocks for ever; the file is opened without blocking and refused as not a file."""
    fifo = tmp_path / "serve.toml"
    os.mkfifo(fifo)
    with pytest.raises(UsageError) as info:
        load_config(fifo)
    assert str(info.value) == (f"cannot read config file {fifo}: {fifo} is a FIFO (named pipe), not a regular "
                               "file (give the TOML file itself)")


def test_the_hot_swap_check_deadline_is_read_from_the_model_table(tmp_path):
    from edgekit.serve.watch import CHECK_DEADLINE_S

    assert load_config(None).model.check_deadline_s == CHECK_DEADLINE_S  # one default, in two places
    config = load_config(write(tmp_path, "[model]\ncheck_deadline_s = 900\n"))
    assert config.model.check_deadline_s == 900.0


def test_flags_override_the_file(tmp_path):
    path = write(
        tmp_path,
        '[model]\npath = "a.tflite"\ntop_k = 2\n[camera]\nuri = "v4l2:0"\n[mqtt]\nhost = "broker"\n'
        '[http]\nlisten = "127.0.0.1:9100"\n',
    )
    args = parse_flags(
        "--config",
        str(path),
        "--camera",
        "synthetic:320x240@30",
        "--mqtt",
        "10.0.0.5:1884",
        "--http",
        "off",
        "--top-k",
        "5",
        "--node-name",
        "pi-7",
        "--output",
        "off",
    )
    config = build_config(args)
    assert config.model.path == str(tmp_path.resolve() / "a.tflite")  # from the file
    assert config.model.top_k == 5
    assert config.camera.uri == "synthetic:320x240@30"
    assert (config.mqtt.host, config.mqtt.port) == ("10.0.0.5", 1884)
    assert config.http.listen == "" and config.output.jsonl == ""
    assert config.topic == "edgekit/pi-7"
    assert build_config(parse_flags("--config", str(path), "--mqtt", "off")).mqtt.host == ""


def test_bad_flag_values_get_the_same_checks():
    with pytest.raises(UsageError, match="below the minimum"):
        build_config(parse_flags("--top-k", "0"))
    with pytest.raises(UsageError, match="bad port"):
        build_config(parse_flags("--mqtt", "host:99999"))
    with pytest.raises(UsageError, match="command line"):
        override(ServeConfig(), "camera", reconnect_min_s="soon")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("broker", ("broker", 1883)),
        ("broker:1884", ("broker", 1884)),
        (":1885", ("127.0.0.1", 1885)),
        ("[::1]:1886", ("::1", 1886)),
        ("[::1]", ("::1", 1883)),
    ],
)
def test_parse_address(text, expected):
    assert parse_address(text, 1883) == expected


def test_print_config_shows_the_effective_values(tmp_path, capsys):
    import json

    from edgekit.commands.serve import main

    path = write(tmp_path, '[model]\npath = "m.tflite"\n')
    (tmp_path / "m.tflite").write_bytes(b"")  # --print-config checks that the model exists
    assert main(parse_flags("--config", str(path), "--top-k", "4", "--print-config")) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["model"]["top_k"] == 4 and shown["model"]["path"].endswith("m.tflite")


def test_shipped_prometheus_config_and_alert_rules_are_valid():
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    deploy = EXAMPLE.parent
    rules = subprocess.run([promtool, "check", "rules", str(deploy / "alerts.yml")], capture_output=True, text=True)
    assert rules.returncode == 0 and "SUCCESS: 9 rules found" in rules.stdout, rules.stdout + rules.stderr
    config = subprocess.run([promtool, "check", "config", str(deploy / "prometheus.yml")], capture_output=True,
                            text=True)
    assert config.returncode == 0 and "1 rule files found" in config.stdout, config.stdout + config.stderr


def test_print_config_of_the_shipped_example_shows_it_and_every_problem(capsys):
    """'Validate and show': the shipped example names a bundle under /opt that this machine lacks;
    the configuration is still shown, with each problem that would stop the start."""
    import json

    from edgekit.cli import main

    example = Path(__file__).resolve().parents[3] / "edgekit" / "deploy" / "serve.example.toml"
    rc = main(["serve", "--config", str(example), "--print-config", "--camera", "v4l2:abc"])
    out, err = capsys.readouterr()
    assert rc == 2 and json.loads(out)["model"]["path"] == "/opt/edgekit/bundles/demo-cpu"
    lines = err.splitlines()
    assert [line for line in lines if "also:" in line] == [
        f"edgekit serve: also: {example}: [camera] bad camera URI 'v4l2:abc' "
        "(fix: write v4l2:N or v4l2:/dev/videoN or N)"]
    assert lines[-2] == f"edgekit serve: error: {example}: [model] path /opt/edgekit/bundles/demo-cpu does not exist"
