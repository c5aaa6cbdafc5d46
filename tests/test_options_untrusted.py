"""Options and specs that come from a user's flags or an untrusted bundle are checked before the
first frame: each wrong value is one UsageError/InputSpecError line with a fix, never a traceback."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.detect.head import choose_layout
from edgekit.errors import UsageError
from edgekit.heads.classify import Decoder, classifier
from edgekit.imaging.image import InputSpec, InputSpecError
from tests.helpers.real_models import onnx_runtime

SPEC = InputSpec(shape=(1, 8, 8, 1), colour="gray")


def test_output_index_beyond_the_models_outputs_is_refused_when_the_head_is_made():
    runtime = onnx_runtime(SPEC, weights=[1.0, -1.0], bias=[0.0, 0.0])
    with pytest.raises(UsageError) as err:
        classifier(["a", "b"], runtime, output_index=5)
    assert "from 0 to the model's outputs - 1 (0), not 5" in err.value.message
    assert "edgekit inspect" in err.value.hint
    classifier(["a", "b"], runtime, output_index=0)  # the one output it has


def test_a_decoder_without_a_runtime_checks_the_index_on_the_first_outputs():
    with pytest.raises(UsageError, match="output_index 2, but the model has 1 output"):
        Decoder(["a", "b"], output_index=2)([np.array([[0.3, 0.7]], np.float32)])


@pytest.mark.parametrize(("options", "fix"), [({"k": 0}, "-T k=5"), ({"softmax": "maybe"}, "-T softmax=auto")])
def test_classify_option_errors_say_what_to_give(options, fix):
    with pytest.raises(UsageError) as err:
        classifier(["a", "b"], None, **options)
    assert fix in err.value.hint


@pytest.mark.parametrize("layout", [[], 3, None, {"yolo": 1}])
def test_a_detect_layout_that_is_not_a_name_is_a_usage_error(layout):
    with pytest.raises(UsageError, match="is unknown"):
        choose_layout(layout, [(1, 8, 100)], None)


@pytest.mark.parametrize(("mean", "std"), [((0.0,), (1e-300,)), ((0.0,), (-1.0,)), ((0.0,), (1e9,)),
                                           ((1e30,), (1.0,))])
def test_preprocessing_numbers_out_of_range_are_refused(mean, std):
    with pytest.raises(InputSpecError, match="must be within"):
        InputSpec.from_dict({**SPEC.to_dict(), "mean": list(mean), "std": list(std)})


@pytest.mark.parametrize("std", [(1.0,), (58.395,), (127.5,), (255.0,)])
def test_the_usual_preprocessing_numbers_pass(std):
    assert InputSpec.from_dict({**SPEC.to_dict(), "std": list(std)}).std == std


def test_a_run_shorter_than_its_warm_up_says_why_it_has_no_timings():
    from edgekit.commands.run import format_summary

    nan = float("nan")
    stage = {"count": 0, "p50_ms": nan, "p90_ms": nan, "p99_ms": nan, "mean_ms": nan, "max_ms": nan}
    summary = {"frames": 3, "warmup": 3, "fps": 0.0, "skipped": 0, "corrupt": 0, "stages": {"inference": stage}}
    text = format_summary(summary)
    assert "fps n/a (all 3 frames were warm-up)" in text and "fps 0.0" not in text  # issue 39 item 9
    assert "no timings: give --warmup 0" in text and "nan" not in text and "p50" not in text  # no empty table
    full = format_summary({**summary, "frames": 8, "fps": 30.0})
    assert "no timings" not in full and "fps 30.0" in full and "p50" in full


def test_running_a_training_format_model_says_to_build_it_first(tmp_path):
    from edgekit.errors import ModelError
    from edgekit.runtime import open_runtime

    model = tmp_path / "net.keras"
    model.write_bytes(b"PK\x03\x04")
    with pytest.raises(ModelError) as err:
        open_runtime(str(model))
    assert "a model to build, not to run" in err.value.message
    assert err.value.hint.startswith("edgekit build --model net.keras --target cpu")
