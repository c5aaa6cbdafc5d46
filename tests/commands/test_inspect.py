"""``edgekit inspect``: the CLI verb end to end on real converted models and real LiteRT."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from edgekit.bundle import BundleWriter
from edgekit.cli import main as cli
from edgekit.imaging.image import InputSpec
from edgekit.runtime.litert import LiteRTRuntime

FAKE = Path(__file__).parents[1] / "fixtures" / "edgetpu" / "edgetpu_compiler"


@pytest.fixture
def no_compiler(tmp_path, monkeypatch):
    # keep the interpreter's own directory only, so no edgetpu_compiler is found
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    if shutil.which("edgetpu_compiler"):
        pytest.skip("an edgetpu_compiler sits beside the interpreter")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli(["inspect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_edgetpu_table_for_full_int8_cnn(model, capsys, no_compiler):
    code, out, _ = run(capsys, str(model("small_int8")), "--target", "edgetpu")
    assert code == 0
    lines = out.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("OP "))
    assert lines[header].split() == ["OP", "COUNT", "DTYPE", "EDGE", "TPU", "REASON"]
    assert lines[header + 1].split() == ["QUANTIZE", "1", "uint8->int8", "yes"]
    assert lines[header + 2].split() == ["CONV_2D", "2", "int8", "yes"]
    assert "cut: none" in out
    assert "ops on the Edge TPU: 8 of 8 (100%)" in out
    assert "cache (fits)" in out
    assert "edgetpu_compiler not found (it runs only on x86-64 Linux" in out


def test_edgetpu_table_shows_the_cut(model, capsys, no_compiler):
    code, out, _ = run(capsys, str(model("gather_int8")), "--target", "edgetpu")
    assert code == 0
    gather = next(ln for ln in out.splitlines() if ln.startswith("GATHER"))
    assert gather.split()[:4] == ["GATHER", "1", "int8", "no"]
    assert gather.endswith("GATHER is not in the Edge TPU's supported-operations table")
    assert "cut: op 2 GATHER" in out
    assert "after the cut at op 2 (GATHER): runs on the CPU" in out
    assert "ops on the Edge TPU: 2 of 8 (25%)" in out


def test_edgetpu_seed_cnn_warns_about_the_cache(model, capsys, no_compiler):
    code, out, _ = run(capsys, str(model("anki_int8")), "--target", "edgetpu")
    assert code == 0
    assert "ops on the Edge TPU: 11 of 11 (100%)" in out
    assert "cache (streams): 16.59 MiB of parameters exceed the ~8 MiB on-chip cache" in out


def test_edgetpu_json(model, capsys, no_compiler):
    code, out, _ = run(capsys, str(model("small_float")), "--target", "edgetpu", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["target"] == "edgetpu" and d["mode"] == "edgetpu-offline" and d["compiler"] is None
    r = d["report"]
    assert r["tpu_ops"] == 0 and r["op_share"] == 0.0
    assert {row["reason"] for row in r["rows"]} == {"not int8/uint8 quantised (float32)"}


def test_edgetpu_mentions_an_installed_compiler(model, capsys, tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "edgetpu_compiler"  # the test double; inspect only looks it up
    exe.write_text(f"#!{sys.executable}\n" + FAKE.read_text().split("\n", 1)[1])
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    _, out, _ = run(capsys, str(model("small_int8")), "--target", "edgetpu")
    assert f"edgetpu_compiler found ({exe.resolve()})" in out


def test_cpu_xnnpack_delegation_is_measured(model, capsys):
    path = model("gather_int8")
    code, out, _ = run(capsys, str(path), "--target", "cpu", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["mode"] == "litert-measured" and d["runtime"]["delegate_requested"] == "xnnpack"
    with LiteRTRuntime(path, delegate="xnnpack") as rt:
        measured = rt.describe()
    assert (d["delegated_nodes"], d["total_nodes"], d["delegate_kernels"]) == (
        measured["delegated_nodes"],
        measured["total_nodes"],
        measured["delegate_kernels"],
    )
    assert sum(op["delegated"] for op in d["ops"]) == d["delegated_nodes"]
    by_op = {op["opcode"]: op["delegated"] for op in d["ops"]}
    assert by_op["GATHER"] is False and by_op["CONV_2D"] is True  # XNNPACK has no GATHER kernel


def test_rpi_text_for_float_model(model, capsys):
    code, out, _ = run(capsys, str(model("small_float")), "--target", "rpi")
    assert code == 0
    assert "delegate xnnpack, threads 4" in out
    assert "delegated: 6 of 6 nodes in 1 XNNPACK partition(s); 0 on LiteRT's built-in kernels" in out
    conv = next(ln for ln in out.splitlines() if ln.startswith("CONV_2D"))
    assert conv.split() == ["CONV_2D", "2", "float32", "yes"]


def test_bundle_directory_uses_its_default_model_and_target(model, capsys, tmp_path, no_compiler):
    src = model("gather_int8")
    with BundleWriter(tmp_path / "bundle") as w:
        shutil.copy(src, w.dir / "model_int8.tflite")
        spec = InputSpec(shape=(1, 32, 32, 3), dtype="uint8", scale=1 / 255, zero_point=0)
        w.commit({
            "target": "edgetpu",
            "default_model": "int8",
            "models": [{"name": "int8", "file": "model_int8.tflite", "format": "tflite", "precision": "int8",
                        "input": spec.to_dict(), "outputs": []}],
        })  # fmt: skip
    code, out, _ = run(capsys, str(tmp_path / "bundle"))
    assert code == 0
    assert out.startswith("target edgetpu: ") and "model_int8.tflite" in out
    assert "cut: op 2 GATHER" in out


def test_errors_are_one_line(model, capsys, tmp_path):
    code, _, err = run(capsys, str(tmp_path / "missing.tflite"))
    assert code == 2 and "does not exist" in err
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\x00" * 32)
    code, _, err = run(capsys, str(bad), "--target", "edgetpu")
    assert code == 2 and "not a TFLite model" in err
    code, _, err = run(capsys, str(model("small_int8")), "--target", "jetson")
    assert code == 2 and "inspect reads TFLite targets" in err


def test_cpu_inspect_needs_only_the_runtime(model):
    # a device has ai_edge_litert but neither TensorFlow nor the tflite schema package
    code = (
        "import sys\n"
        "from edgekit.cli import main\n"
        f"assert main(['inspect', {str(model('gather_int8'))!r}, '--target', 'cpu', '--json']) == 0\n"
        "bad = [m for m in ('tensorflow', 'keras', 'tflite') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, capture_output=True)
