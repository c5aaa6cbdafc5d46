"""``edgekit doctor`` on this machine (no accelerator, no camera: reported missing, with fixes) and
on a fake filesystem root whose sysfs/dev/etc/proc files and PATH programs describe a Jetson
with a Coral on USB, a camera and a configured Vector."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from edgekit import doctor
from edgekit.cli import main as cli_main
from edgekit.commands import doctor as doctor_verb
from edgekit.doctor import MISSING, OK, WARN, Env, run_checks

HARDWARE = [
    "libedgetpu",
    "Edge TPU (USB)",
    "Edge TPU (PCIe)",
    "edgetpu_compiler",
    "JetPack / L4T",
    "NVIDIA GPU",
    "CUDA toolkit",
    "cuda-python",
    "TensorRT",
    "cameras (V4L2)",
    "picamera2",
    "Vector configuration",
    "onnxruntime GPU providers",
]


def by_name(checks):
    return {c.name: c for c in checks}


@pytest.fixture
def bare(tmp_path):
    """This machine's libraries, but an empty root, home and PATH (so the report is deterministic)."""
    (tmp_path / "root").mkdir()
    (tmp_path / "home").mkdir()
    (tmp_path / "bin").mkdir()
    return Env(root=tmp_path / "root", home=tmp_path / "home", path=str(tmp_path / "bin"))


def test_this_machine_reports_every_missing_piece_with_a_fix(bare):
    checks = by_name(run_checks(bare))
    for name in HARDWARE:
        assert checks[name].status == MISSING, name
        assert checks[name].fix, f"{name} has no fix"
    assert checks["Python"].status == OK and checks["ai_edge_litert"].status == OK
    assert checks["onnxruntime"].status == OK and "CPUExecutionProvider" in checks["onnxruntime"].detail
    assert "libedgetpu1-std" in checks["libedgetpu"].fix
    assert "1a6e:089a" in checks["Edge TPU (USB)"].fix
    assert "nvidia-jetpack" in checks["TensorRT"].fix
    assert "python3-picamera2" in checks["picamera2"].fix
    assert "anki_vector.configure" in checks["Vector configuration"].fix


def test_targets_summary_on_this_machine(bare):
    summary = doctor.targets_summary(run_checks(bare))
    assert summary["cpu"] == {"can_run": True, "missing": []}
    assert summary["edgetpu"]["can_run"] is False and "libedgetpu" in summary["edgetpu"]["missing"]
    assert summary["jetson"] == {"can_run": False, "missing": ["NVIDIA GPU", "TensorRT or onnxruntime GPU providers"]}


def test_table_lists_the_fix_for_each_missing_piece(bare):
    checks = run_checks(bare)
    table = doctor_verb.format_table(checks)
    assert table.splitlines()[0].split() == ["group", "check", "status", "detail"]
    fixes = table.split("to fix:")[1]
    for c in checks:
        if c.status == MISSING:
            assert f"  {c.name}: {c.fix}" in fixes
    assert "target jetson   cannot run here: needs NVIDIA GPU" in table


def test_cli_json_parses_and_exits_zero(capsys):
    assert cli_main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"edgekit", "python", "checks", "targets", "missing"} <= set(report)
    names = {c["name"] for c in report["checks"]}
    assert {"Python", "ai_edge_litert", "libedgetpu", "TensorRT", "NVIDIA GPU", "cameras (V4L2)"} <= names
    assert all(set(c) == {"group", "name", "status", "detail", "fix"} for c in report["checks"])
    assert report["missing"] == sum(c["status"] == "missing" for c in report["checks"])


def test_cli_table_exits_zero(capsys):
    assert cli_main(["doctor"]) == 0
    assert "to fix:" in capsys.readouterr().out


def test_a_crashing_check_is_reported_not_raised(bare, monkeypatch):
    def broken(env):
        raise RuntimeError("sysfs exploded")

    monkeypatch.setattr(doctor, "CHECKS", [doctor.check_python, broken])
    checks = run_checks(bare)
    assert checks[-1].status == WARN and "sysfs exploded" in checks[-1].detail


def _script(path: Path, text: str) -> None:
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def jetson_like(tmp_path):
    """A fake root: Jetson Orin (L4T R36.4.3), a Coral on USB 2, /dev/apex_0, a webcam, Vector config."""
    root, home, bin_ = tmp_path / "root", tmp_path / "home", tmp_path / "bin"
    usb = root / "sys/bus/usb/devices/2-1"
    usb.mkdir(parents=True)
    (usb / "idVendor").write_text("1a6e\n")
    (usb / "idProduct").write_text("089a\n")
    (usb / "speed").write_text("480\n")
    other = root / "sys/bus/usb/devices/1-1"
    other.mkdir(parents=True)
    (other / "idVendor").write_text("046d\n")
    (other / "idProduct").write_text("0825\n")
    (root / "dev").mkdir()
    (root / "dev/apex_0").write_text("")
    (root / "dev/video0").write_text("")
    (root / "dev/video10").write_text("")
    (root / "sys/class/video4linux/video0").mkdir(parents=True)
    (root / "sys/class/video4linux/video0/name").write_text("HD Pro Webcam C920\n")
    (root / "etc").mkdir()
    (root / "etc/nv_tegra_release").write_text(
        "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, "
        "EABI: aarch64, DATE: Wed Jan  8 01:49:37 UTC 2025\n"
    )
    (root / "usr/local/cuda").mkdir(parents=True)
    (root / "usr/local/cuda/version.json").write_text(json.dumps({"cuda": {"name": "CUDA SDK", "version": "12.6.68"}}))
    vec = home / ".anki_vector"
    vec.mkdir(parents=True)
    cert = vec / "Vector-T3S7-00e20100.cert"
    cert.write_text("cert")
    (vec / "sdk_config.ini").write_text(
        f"[00e20100]\ncert = {cert}\nip = 192.168.1.50\nname = Vector-T3S7\nguid = s3cr3t-guid==\n"
    )
    bin_.mkdir()
    _script(bin_ / "nvidia-smi", 'echo "Orin (nvgpu), N/A, [N/A], 8.7"\n')
    _script(bin_ / "edgetpu_compiler", 'echo "Edge TPU Compiler version 16.0.384591198"\n')
    return Env(root=root, home=home, path=str(bin_))


def test_fake_jetson_with_coral_camera_and_vector(jetson_like):
    checks = by_name(run_checks(jetson_like))
    assert checks["JetPack / L4T"].status == OK and checks["JetPack / L4T"].detail == "L4T R36.4.3 (JetPack 6.x)"
    assert checks["NVIDIA GPU"].status == OK and checks["NVIDIA GPU"].detail == "Orin (nvgpu), N/A, [N/A], 8.7"
    assert checks["CUDA toolkit"].detail == "CUDA 12.6.68"
    usb = checks["Edge TPU (USB)"]
    assert usb.status == WARN and "1a6e:089a at 2-1, 480 Mb/s" in usb.detail and "USB 3" in usb.fix
    assert checks["Edge TPU (PCIe)"].status == OK  # root may read and write anything
    assert checks["edgetpu_compiler"].detail == "Edge TPU Compiler version 16.0.384591198"
    assert checks["cameras (V4L2)"].status == OK
    assert checks["cameras (V4L2)"].detail == "video0 (HD Pro Webcam C920), video10"
    vector = checks["Vector configuration"]
    assert vector.status == OK and vector.detail == "Vector-T3S7 (serial 00e20100, 192.168.1.50)"


def test_usb3_coral_and_a_broken_vector_config(jetson_like):
    root, home = jetson_like.root, jetson_like.home
    usb = root / "sys/bus/usb/devices/2-1"
    (usb / "idVendor").write_text("18d1\n")
    (usb / "idProduct").write_text("9302\n")
    (usb / "speed").write_text("5000\n")
    (home / ".anki_vector/sdk_config.ini").write_text("[00e20100]\nip = 192.168.1.50\nname = Vector-T3S7\n")
    checks = by_name(run_checks(jetson_like))
    assert checks["Edge TPU (USB)"].status == OK and "initialised" in checks["Edge TPU (USB)"].detail
    vector = checks["Vector configuration"]
    assert vector.status == WARN and "lacks cert, guid" in vector.detail and vector.fix


def test_vector_guid_is_never_printed(jetson_like, capsys, monkeypatch):
    monkeypatch.setattr(doctor_verb, "Env", lambda: jetson_like)
    doctor_verb.main(type("Args", (), {"json": True})())
    doctor_verb.main(type("Args", (), {"json": False})())
    assert "s3cr3t" not in capsys.readouterr().out


def test_gpu_from_proc_when_nvidia_smi_is_absent(jetson_like, tmp_path):
    root = jetson_like.root
    gpu = root / "proc/driver/nvidia/gpus/0000:01:00.0"
    gpu.mkdir(parents=True)
    (gpu / "information").write_text("Model: \t\t NVIDIA GeForce RTX 3060\nIRQ: 42\n")
    (root / "proc/driver/nvidia/version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14\n")
    (root / "etc/nv_tegra_release").unlink()
    env = Env(root=root, home=jetson_like.home, path=str(tmp_path / "nothing"))
    gpu_check = by_name(run_checks(env))["NVIDIA GPU"]
    assert gpu_check.status == OK and gpu_check.detail.startswith("NVIDIA GeForce RTX 3060 (NVRM version")


def test_doctor_imports_no_tensorflow_and_runs_no_shell():
    code = (
        "import sys; from edgekit import doctor; doctor.run_checks(); "
        "print(sorted(m for m in ('tensorflow', 'keras', 'torch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    files = [*Path(doctor.__file__).parent.glob("*.py"), Path(doctor_verb.__file__)]
    source = "".join(f.read_text() for f in files)
    assert "shell=True" not in source and "os.system" not in source
