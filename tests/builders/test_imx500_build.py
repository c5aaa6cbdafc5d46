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


def forwards(bundle: Path) -> list[int]:
    """The batch size of every forward call of the fake quantised module, in order."""
    text = (bundle / "imx500.log").read_text()
    return [int(line.split("FAKE IMX FORWARD ", 1)[1]) for line in text.splitlines() if "FAKE IMX FORWARD " in line]


def gate_figures(manifest: dict) -> list:
    ver = manifest["verification"]["models"]["int8"]
    return [ver[d][k] for d in ("eval", "holdout") if d in ver for k in ("n", "agreement", "cosine")] + [
        ver["eval"]["ratio"]]


@pytest.mark.parametrize("batch", ["", "1", "skew"], ids=["refused", "batched", "skewed"])
def test_the_gate_batches_only_where_a_batch_answers_as_single_images_do(toolchains, data, monkeypatch, batch):  # noqa: F811
    (single,) = imx_build(mean_model(data / "tiny.onnx"), data)
    expected = gate_figures(single.manifest)
    monkeypatch.setenv("FAKE_MCT_BATCH", batch)
    (result,) = imx_build(mean_model(data / "tiny.onnx"), data)
    assert result.passed and gate_figures(result.manifest) == expected  # the same figures, batched or not
    sizes, note = forwards(result.bundle), result.manifest["models"][0]["imx500"]["gate_run"]
    assert note in (result.bundle / "build.log").read_text()
    if batch == "1":  # the first batch twice (4 of its images alone), then every chunk whole
        assert max(sizes) > 4 and sizes.count(1) == 4 and note.endswith("equal one-at-a-time ones on 4 images)")
    else:
        assert sizes[0] > 1 and set(sizes[1:]) == {1} and note.startswith("one image a request")
        why = "the module refused a batch" if batch == "" else "a batch's outputs differ from one-at-a-time ones"
        assert why in note


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


def test_a_batch_agrees_when_equal_or_one_quantisation_step_off_on_a_few_values():
    from edgekit.builders.imx500 import batch_agrees

    rng = np.random.default_rng(1)
    alone = [np.round(rng.random((4, 8, 500)) * 128) / 128]  # a sigmoid output on MCT's 1/128 grid
    assert batch_agrees(alone, [alone[0].copy()]) == (True, "equal one-at-a-time ones")
    edge = alone[0].copy()
    edge[0, 0, :2] += 1 / 128  # two values on a rounding edge: the demo detector's 2 of 64,000
    assert batch_agrees(alone, [edge]) == (True, "equal one-at-a-time ones but 2 of 16000 values one quantisation "
                                                 "step away")
    many = alone[0].copy()
    many[1:] += 1 / 128  # every value of three images a step off: not rounding, another model
    assert batch_agrees(alone, [many]) == (False, "differ from one-at-a-time ones by a quantisation step in "
                                                  "12000 of 16000 values")
    mixed = alone[0][::-1].copy()  # images swapped across the batch
    ok, how = batch_agrees(alone, [mixed])
    assert not ok and how == "differ from one-at-a-time ones by up to 1"
    floats = [rng.random((4, 11)).astype(np.float32)]  # a float output: no grid, float rounding only
    assert batch_agrees(floats, [floats[0] + 1e-7])[0] and not batch_agrees(floats, [floats[0] + 1e-3])[0]


def test_gate_model_names_the_module_or_the_export_else_one_line_error():
    from edgekit.builders.imx500 import gate_model_option

    assert gate_model_option("module") == "module" and gate_model_option("export") == "export"
    with pytest.raises(ModelError, match="gate_model 'onnx' is not module or export"):
        gate_model_option("onnx")


def test_mct_quantization_settings_reach_mct_and_a_bad_one_is_one_line(toolchains, data, monkeypatch):  # noqa: F811
    from edgekit.builders.imx500 import mct_settings
    from edgekit.target import load_target

    custom = load_target("imx500").build_options({})  # the shipped file leaves MCT's defaults
    assert "mct_quantization" not in custom and mct_settings({}) == {}
    with pytest.raises(ModelError, match="mct_quantization 'x' is not a table of settings"):
        mct_settings("x")
    toml = (Path(__file__).resolve().parents[2] / "edgekit" / "targets" / "imx500.toml").read_text()
    target = data / "imx500_custom.toml"
    setting = 'mct_quantization = { activation_error_method = "noclipping" }'
    target.write_text(toml.replace("[build]\n", f"[build]\n{setting}\n"))
    (result,) = build(mean_model(data / "tiny.onnx"), str(target), [data / "calib"], out=data / "dist",
                      eval_dir=data / "eval", quiet=True, preprocess={"colour": "gray", "mean": [0.0], "std": [255.0]})
    ptq = [json.loads(line.split("FAKE IMX CALL ", 1)[1]) for line in (result.bundle / "imx500.log").read_text()
           .splitlines() if "pytorch_post_training_quantization" in line]
    assert ptq[0][-1] == {"activation_error_method": "NOCLIPPING"}
    target.write_text(toml.replace("[build]\n", "[build]\nmct_quantization = { no_such_setting = 1 }\n"))
    with pytest.raises(ModelError, match="post-training quantisation: .*unexpected keyword argument 'no_such_setting'"):
        build(mean_model(data / "tiny.onnx"), str(target), [data / "calib"], out=data / "dist2",
              eval_dir=data / "eval", quiet=True, preprocess={"colour": "gray", "mean": [0.0], "std": [255.0]})


def test_inspect_names_the_exported_onnx_when_the_gate_ran_on_it():
    from edgekit.commands.inspect import format_imx500

    gate = {"metric": "map", "n": 100, "original": 0.3838, "converted": 0.3725, "ratio": 0.9706, "passed": True}
    text = format_imx500(Path("detector-imx500"), {"imx500": {"gate_model": "export"}, "gate": gate})
    assert "gate at build, the exported ONNX on the host" in text
    assert "MCT's quantised model" in format_imx500(Path("b"), {"imx500": {}, "gate": gate})


class StubSession:
    """Answers ``infer`` as a module would: each image's mean, plus ``skew`` on the rows after the first."""

    def __init__(self, skew: float = 0.0):
        self.skew, self.sizes = skew, []

    def request(self, header, arrays):
        (x,) = arrays
        self.sizes.append(len(x))
        out = x.reshape(len(x), -1).mean(axis=1, keepdims=True).astype(np.float32)
        if len(x) > 1:
            out[1:] += self.skew
        return {"ok": True}, [out]


def test_the_runner_decides_on_the_first_chunk_of_more_than_one_image():
    from edgekit.builders.imx500 import QuantisedRunner

    x = np.random.default_rng(2).random((6, 1, 4, 4)).astype(np.float32)
    session = StubSession()
    runner = QuantisedRunner(session, [0])
    runner(x[:1])  # a chunk of one decides nothing
    assert runner.batched is None and session.sizes == [1]
    (out,) = runner(x)
    np.testing.assert_allclose(out[:, 0], x.reshape(6, -1).mean(axis=1), rtol=1e-6)
    assert runner.batched is True and session.sizes == [1, 6, 1, 1, 1, 1] and runner.shapes == [[1, 1]]
    runner(x)
    assert session.sizes[-1] == 6 and runner.note.startswith("6 images a request")
    skewed = StubSession(skew=0.5)
    runner = QuantisedRunner(skewed, [0])
    (out,) = runner(x)  # the batch's answer is dropped: the figures are the images' alone
    np.testing.assert_allclose(out[:, 0], x.reshape(6, -1).mean(axis=1), rtol=1e-6)
    assert runner.batched is False and skewed.sizes == [6, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
