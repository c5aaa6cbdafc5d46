"""``edgekit build --target imx500`` with a fake of Sony's PyTorch stack (tests/fakes/imx500) in a real venv.

The build, the child session, its pipe protocol and the job script are real; MCT, onnx2torch,
torch and imxconv-pt are fakes whose 'quantised' model is the float ONNX (run in ONNX Runtime)
on a 1/256 grid, so the gate passes; ``FAKE_MCT_SWAP`` breaks it and ``FAKE_IMX_FIT=0`` makes the
memory report refuse the network. The real stack's build is tests/toolchain/test_imx500_real.py (marked).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgekit.builders.build import build
from edgekit.builders.imx500 import memory_gate, size_bytes
from edgekit.bundle import load_bundle
from edgekit.errors import ModelError, TargetError, VerificationFailed
from edgekit.toolchain.store import Installed, write_record
from tests.builders.test_rknn import SIZE, data, mean_model  # noqa: F401 - data is a fixture

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "imx500"


@pytest.fixture(scope="module")
def imx_toolchain(tmp_path_factory) -> Installed:
    """An installed-looking imx500 toolchain whose stack is the fake (and imxconv-pt its script)."""
    root = tmp_path_factory.mktemp("toolchains")
    folder = root / "imx500"
    folder.mkdir()
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip",
                    str(folder / "venv")], check=True)
    site = next((folder / "venv" / "lib").glob("python3*/site-packages"))
    # the fakes first, then edgekit's site-packages for numpy, onnx and onnxruntime
    (site / "edgekit-test.pth").write_text(f"{FAKE}\n{Path(np.__file__).resolve().parents[1]}\n")
    conv = folder / "venv" / "bin" / "imxconv-pt"
    conv.write_text(f"#!{folder / 'venv' / 'bin' / 'python'}\n" + (FAKE / "imxconv_pt.py").read_text())
    conv.chmod(0o755)
    installed = Installed(name="imx500", path=folder, python="3.11", versions={"model-compression-toolkit": "fake"})
    write_record(installed)
    return installed


@pytest.fixture
def toolchains(imx_toolchain, monkeypatch):
    monkeypatch.setenv("EDGEKIT_TOOLCHAINS", str(imx_toolchain.path.parent))
    return imx_toolchain


def imx_build(model, data_dir):
    return build(model, "imx500", [data_dir / "calib"], out=data_dir / "dist", eval_dir=data_dir / "eval", quiet=True,
                 preprocess={"colour": "gray", "mean": [0.0], "std": [255.0]})


def calls_in(log_text: str) -> list[str]:
    return [json.loads(line.split("FAKE IMX CALL ", 1)[1])[0] for line in log_text.splitlines()
            if "FAKE IMX CALL " in line]


@pytest.mark.parametrize("nhwc", [False, True], ids=["nchw", "nhwc"])
def test_the_recipe_quantises_gates_on_the_host_and_converts(toolchains, data, nhwc):  # noqa: F811
    (result,) = imx_build(mean_model(data / "tiny.onnx", nhwc), data)
    assert result.passed and result.bundle == data / "dist" / "tiny-imx500"
    bundle = load_bundle(result.bundle)
    entry = bundle.manifest["models"][0]
    assert (entry["file"], entry["format"], entry["precision"]) == ("packerOut.zip", "imx500", "int8")
    assert (result.bundle / "packerOut.zip").read_bytes() == b"PK fake packer"
    assert (result.bundle / "tiny_int8.onnx").read_bytes() == b"fake quantised onnx"
    calls = calls_in((result.bundle / "imx500.log").read_text())
    assert calls == ["onnx2torch.convert", "get_target_platform_capabilities", "pytorch_post_training_quantization",
                     "pytorch_export_model", "imxconv-pt"]
    ev = bundle.manifest["verification"]["models"]["int8"]["eval"]
    assert ev["n"] == 12 and ev["ratio"] == 1.0 and ev["passed"] and ev["cosine"] > 0.999
    assert entry["input"]["layout"] == "NCHW" and entry["input"]["shape"] == [1, 1, SIZE, SIZE]
    facts = entry["imx500"]
    assert facts["memory"]["fits"] is True and facts["memory"]["usage"] == "234.16KB"
    assert json.loads((result.bundle / "imx500_memory_report.json").read_text())["Memory Report"]["Fit In Chip"]
    assert any("imx500-package -i packerOut.zip" in step for step in facts["on_device"])


def test_inspect_shows_the_chip_memory_the_gate_and_the_pi_steps(toolchains, data, capsys):  # noqa: F811
    from edgekit.cli import main

    (result,) = imx_build(mean_model(data / "tiny.onnx", False), data)
    capsys.readouterr()
    assert main(["inspect", str(result.bundle)]) == 0
    out = capsys.readouterr().out
    assert "memory report: 234.16KB of 8.00MB" in out and "fits the chip" in out
    assert "gate at build, MCT's quantised model on the host" in out and "ratio 1.0" in out and ": PASS" in out
    assert "still to do on the Pi: imx500-package -i packerOut.zip" in out and "not proven here" in out


def test_a_gate_miss_is_rejected(toolchains, data, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FAKE_MCT_SWAP", "1")
    with pytest.raises(VerificationFailed):
        imx_build(mean_model(data / "tiny.onnx"), data)
    manifest = json.loads((data / "dist" / "tiny-imx500.rejected" / "edgekit.json").read_text())
    assert manifest["verification"]["models"]["int8"]["eval"]["passed"] is False


def test_a_network_that_does_not_fit_is_refused_naming_its_size(toolchains, data, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FAKE_IMX_FIT", "0")
    with pytest.raises(ModelError, match=r"does not fit the IMX500: it needs 9.50MB of the chip's 8.00MB"):
        imx_build(mean_model(data / "tiny.onnx"), data)


def test_without_the_toolchain_the_build_is_refused_before_the_model_loads(data, monkeypatch):  # noqa: F811
    monkeypatch.setenv("EDGEKIT_TOOLCHAINS", str(data / "none"))
    with pytest.raises(TargetError, match=r"imx500 toolchain is not installed \(edgekit toolchain install imx500\)"):
        imx_build(data / "missing.onnx", data)


def test_memory_report_sizes_and_the_gate():
    assert size_bytes("234.16KB") == round(234.16 * 1024) and size_bytes("8.00MB") == 8 * 1024**2
    assert size_bytes("n/a") is None
    fits = memory_gate({"Memory Usage": "3.89MB", "Total Memory Available On Chip": "8.00MB", "Fit In Chip": True}, "x")
    assert fits["usage_bytes"] == round(3.89 * 1024**2)
    with pytest.raises(ModelError, match="needs \\? of the chip's \\?"):
        memory_gate({}, "x")
