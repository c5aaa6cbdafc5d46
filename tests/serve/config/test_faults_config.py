"""Fault catalogue, `edgekit serve` configurations: what `--print-config` must refuse.

A configuration that would fail at start must fail the check too (one line naming the file
and key, a fix, exit 2), so `systemctl reload` after `--print-config` never meets a surprise.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.faults import assert_refused, edgekit

SERVE_OWNER = "edgekit/serve/ is another helper's (done): reported, not fixed here"


def _config(tmp_path: Path, bundle: Path, table: str, text: str) -> Path:
    """A valid configuration (real bundle, synthetic camera, no HTTP/MQTT) with ``text`` in ``[table]``."""
    tables = {"model": f'path = "{bundle}"\n', "camera": 'uri = "synthetic:64x64"\n', "output": 'jsonl = "-"\n',
              "http": 'listen = ""\n', "mqtt": "", "log": ""}
    if table == "http" and text.startswith("listen"):
        tables["http"] = text + "\n"
    elif table:
        tables[table] += text + "\n"
    body = "".join(f"[{name}]\n{values}\n" for name, values in tables.items())
    if not table:
        body += text + "\n"
    path = tmp_path / "serve.toml"
    path.write_text(body)
    return path


def test_the_base_configuration_is_accepted(tmp_path, capsys, cpu_bundle):
    result = edgekit(capsys, "serve", "--config", str(_config(tmp_path, cpu_bundle, "", "")), "--print-config")
    assert result.code == 0, result.text


CASES = [
    ("", "[bogus]\nx = 1", "bogus"),
    ("model", "bogus = 1", "bogus"),
    ("model", "threads = -1", "threads"),
    ("model", 'threads = "many"', "threads"),
    ("model", "threads = 100000", "threads"),
    ("model", "top_k = 0", "top_k"),
    ("model", 'delegate = "gpu"', "delegate"),
    ("model", 'backend = "nope"', "backend"),
    ("model", "reopen_after_errors = -1", "reopen_after_errors"),
    ("model", "watch_interval_s = 0", "watch_interval_s"),
    ("model", "min_agreement = 2", "min_agreement"),
    ("camera", "reconnect_min_s = -1", "reconnect_min_s"),
    ("camera", 'on_end = "explode"', "on_end"),
    ("camera", "stall_timeout_s = 0", "stall_timeout_s"),
    ("output", "max_bytes = -5", "max_bytes"),
    ("output", "backups = -1", "backups"),
    ("http", 'listen = "notahost:9100"', "notahost"),
    ("http", 'listen = "127.0.0.1:70000"', "70000"),
    ("http", 'listen = "127.0.0.1:abc"', "abc"),
    ("http", "latency_min_s = 0", "latency_min_s"),
    ("mqtt", 'host = "127.0.0.1"\nport = 0', "port"),
    ("mqtt", 'host = "127.0.0.1"\nqos = 3', "qos"),
    ("mqtt", 'host = "127.0.0.1"\npublish = "sometimes"', "publish"),
    ("mqtt", 'host = "127.0.0.1"\nqueue_policy = "random"', "queue_policy"),
    ("mqtt", 'host = "127.0.0.1"\nqueue_size = -1', "queue_size"),
    ("mqtt", 'host = "127.0.0.1"\ntls = true\nca_file = "/nonexistent/ca.pem"', "ca_file"),
    ("mqtt", 'host = "127.0.0.1"\npassword_file = "/nonexistent/pw"', "password_file"),
    ("mqtt", 'host = "127.0.0.1"\ncert_file = "/nonexistent/c.pem"', "cert_file"),
    ("log", 'level = "loud"', "level"),
]


@pytest.mark.parametrize("table,text,needle", CASES, ids=[f"{t or 'top'}:{x.splitlines()[-1]}" for t, x, _ in CASES])
def test_bad_value_is_refused_by_print_config(tmp_path, capsys, cpu_bundle, table, text, needle):
    path = _config(tmp_path, cpu_bundle, table, text)
    assert_refused(edgekit(capsys, "serve", "--config", str(path), "--print-config"), needle)


@pytest.mark.parametrize("uri,needle", [
    ("synthetic:320x240@-5", "synthetic"),
    ("nope:1", "camera"),
    ("v4l2:abc", "v4l2"),
])
def test_bad_camera_uri_is_refused_by_print_config(tmp_path, capsys, cpu_bundle, uri, needle):
    path = _config(tmp_path, cpu_bundle, "", "")
    path.write_text(path.read_text().replace('uri = "synthetic:64x64"', f'uri = "{uri}"'))
    assert_refused(edgekit(capsys, "serve", "--config", str(path), "--print-config"), needle)


def test_unknown_camera_option_is_refused(tmp_path, capsys, cpu_bundle):
    path = _config(tmp_path, cpu_bundle, "", "[camera.options]\nbogus = 1")
    assert_refused(edgekit(capsys, "serve", "--config", str(path), "--print-config"), "bogus")


@pytest.mark.parametrize("model,needle", [("", "no model"), ("/nonexistent/bundle", "does not exist")])
def test_missing_model_is_refused(tmp_path, capsys, cpu_bundle, model, needle):
    path = _config(tmp_path, cpu_bundle, "", "")
    path.write_text(path.read_text().replace(f'path = "{cpu_bundle}"', f'path = "{model}"'))
    assert_refused(edgekit(capsys, "serve", "--config", str(path), "--print-config"), needle)


@pytest.mark.parametrize("text", ["not toml ][", "\xff\xfe", "[model]\npath = 5\n", "model = 5\n"])
def test_unreadable_configuration(tmp_path, capsys, text):
    path = tmp_path / "serve.toml"
    path.write_bytes(text.encode("latin-1"))
    assert_refused(edgekit(capsys, "serve", "--config", str(path), "--print-config"), "serve.toml")


def test_missing_configuration_file(tmp_path, capsys):
    assert_refused(edgekit(capsys, "serve", "--config", str(tmp_path / "nope.toml"), "--print-config"), "nope.toml")


def test_output_under_a_file(tmp_path, capsys, cpu_bundle):
    (tmp_path / "afile").write_text("x")
    path = _config(tmp_path, cpu_bundle, "output", "")
    path.write_text(path.read_text().replace('jsonl = "-"', f'jsonl = "{tmp_path / "afile" / "x.jsonl"}"'))
    assert_refused(edgekit(capsys, "serve", "--config", str(path), "--print-config"), "afile")


def test_start_with_threads_over_the_cap_is_one_line(tmp_path, capsys, cpu_bundle):
    """Not only --print-config: starting the daemon with such a value is one line and exit 2."""
    path = _config(tmp_path, cpu_bundle, "model", "threads = 100000")
    assert_refused(edgekit(capsys, "serve", "--config", str(path), "--max-frames", "2"), "threads")
