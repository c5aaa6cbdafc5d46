"""The energy signal end to end: a classifier that emits logits gets ``max_energy`` fitted at
build time, its frames carry their energy (edgekit/results.py), and the sign demo's gate refuses
a frame above the threshold (robot/openset.py, robot/signs.py).
"""

from __future__ import annotations

import io
import shutil

import numpy as np
import pytest

from edgekit.heads.classify import Decoder, free_energy
from robot.openset import Debouncer, Gate, gate_thresholds
from tests.conftest import CALIB, DEMO_MODEL, EVAL


def test_a_logit_output_carries_its_energy_and_a_softmax_output_none():
    logits = np.array([[3.0, 1.0, -2.0]], np.float32)
    result = Decoder(["a", "b", "c"], k=2)([logits])
    assert result.softmax_applied and result.energy == pytest.approx(-np.log(np.exp(logits).sum()))
    assert result.to_dict()["energy"] == pytest.approx(result.energy, abs=1e-6)
    probs = Decoder(["a", "b", "c"], k=2)([np.array([[0.7, 0.2, 0.1]], np.float32)])
    assert probs.energy is None and "energy" not in probs.to_dict()


def test_energy_of_a_quantised_logit_output_is_taken_after_dequantisation():
    q = np.array([[140, 100, 60]], np.uint8)  # scale 0.1, zero point 100: logits 4, 0, -4
    result = Decoder(["a", "b", "c"], quantization=(0.1, 100))([q])
    assert result.energy == pytest.approx(free_energy(np.array([4.0, 0.0, -4.0])), abs=1e-5)


def test_the_gate_refuses_a_confident_frame_whose_energy_is_too_high():
    gate = Gate(min_confidence=0.8, min_margin=0.1, background=None, max_energy=-5.0)
    assert gate.accepts(1, 0.95, 0.9, energy=-7.0)
    assert not gate.accepts(1, 0.95, 0.9, energy=-4.0)  # the same softmax, smaller logits: unfamiliar
    assert gate.accepts(1, 0.95, 0.9, energy=None)  # a softmax output has no energy to check


def test_the_debouncer_announces_only_while_energy_agrees():
    d = Debouncer(agree=2, min_confidence=0.8, background=None, max_energy=-5.0)
    said = [d.update(1, 0.95, 0.9, energy=e) for e in (-4.0, -4.0, -4.0, -6.0, -6.0)]
    assert said == [None, None, None, None, 1]


def test_an_explicit_max_energy_must_be_finite():
    from edgekit.errors import UsageError

    with pytest.raises(UsageError, match="--max-energy must be a finite number"):
        gate_thresholds(None, None, 0.2, float("nan"))
    assert gate_thresholds(None, None, 0.2, -3.0) == (0.2, -3.0, "")


def logit_model(path):
    """demo.keras with its softmax taken off the last layer (raw logits out) and its background
    class silenced (bias -30), so plain scenes get garment labels, as a closed-set model's would,
    and the gate's second signals have something to reject."""
    import keras

    model = keras.saving.load_model(DEMO_MODEL)
    head = model.layers[-1]
    head.activation = keras.activations.linear
    kernel, bias = head.get_weights()
    bias[-1] -= 30.0
    head.set_weights([kernel, bias])
    model.save(path)
    return path


@pytest.mark.slow
def test_a_logit_bundle_gets_max_energy_and_the_demo_applies_it(tmp_path):
    from edgekit.builders.build import build
    from robot import signs

    labels = DEMO_MODEL.with_suffix(".labels.txt").read_text(encoding="utf-8").split()
    built = build(logit_model(tmp_path / "logits.keras"), ["cpu"], out=tmp_path / "dist", calib=[CALIB],
                  eval_dir=EVAL, labels=labels, variants=["fp32"], quiet=True, calib_count=40)[0]
    openset = built.manifest["openset"]
    assert openset["signal"] == "margin+energy" and np.isfinite(openset["max_energy"])
    assert openset["false_announcement_rate_without"] > 0.05  # scenes are said without a second signal
    assert openset["false_announcement_rate"] < openset["false_announcement_rate_without"]
    assert "and energy <= " in (built.bundle / "build.log").read_text(encoding="utf-8")

    frames = tmp_path / "frames"
    frames.mkdir()
    shutil.copy(sorted((EVAL / "bag").glob("*.png"))[0], frames)

    def demo(*extra):
        out = io.StringIO()
        code = signs.main(["--bundle", str(built.bundle), "--fake", str(frames), "--hold", "3", "--no-speech",
                           "--min-margin", "0", *extra], out=out)
        assert code == 0, out.getvalue()
        return out.getvalue()

    fitted = demo()
    assert f"energy <= {openset['max_energy']:g}" in fitted
    assert "said (1): bag" in fitted  # a held bag is familiar enough
    refused = demo("--max-energy", "-1000")  # no real frame is that familiar
    assert "energy <= -1000" in refused and "said (0): -" in refused
