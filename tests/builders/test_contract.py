"""The build contract: BuildRequest in, a typed BuilderOutput from each builder, TargetBuild out.

The builders here are stand-ins that a custom target file names by dotted path, as a third
party's builder would be; they run on the real demo model (the original model is both the
"converted" one and the reference, so verification agrees exactly).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest

import edgekit
from edgekit.builders.contract import BuilderOutput, BuiltModel, TargetBuild
from edgekit.builders.request import BuildRequest
from edgekit.cli import build_parser
from edgekit.errors import EdgekitError, UsageError
from edgekit.imaging.image import InputSpec
from tests.conftest import CALIB, DEMO_MODEL, EVAL


def test_request_normalises_cli_spellings():
    r = BuildRequest(model="m.keras", targets="cpu, rpi,", calib="calib/x", labels="labels.txt",
                     variants="fp32,int8", out="dist")
    assert r.model == Path("m.keras") and r.targets == ("cpu", "rpi") and r.calib == ("calib/x",)
    assert r.labels == Path("labels.txt") and r.variants == ("fp32", "int8") and r.out == Path("dist")
    assert BuildRequest(model="m", targets=["cpu"], calib=[CALIB], labels=["a", "b"]).labels == ("a", "b")


def test_request_builder_overrides_hold_only_what_was_given():
    r = BuildRequest(model="m", targets="cpu", calib="c")
    assert r.builder_overrides() == {}
    r = BuildRequest(model="m", targets="cpu", calib="c", variants=["int8"], io_dtype="int8", strict_tpu_ops=True)
    assert r.builder_overrides() == {"variants": ["int8"], "io_dtype": "int8", "strict_tpu_ops": True}


@pytest.mark.parametrize("kwargs,message,hint", [
    ({"min_accuracy_ratio": 0}, "--min-accuracy-ratio 0.0 makes no sense", "a ratio like 0.99"),
    ({"calib_count": 0}, "--calib-count 0 makes no sense", "at least one calibration image"),
    ({"holdout_fraction": 1.0}, "holdout_fraction 1.0 makes no sense", "in [0, 1)"),
    ({"min_cosine": float("nan")}, "--min-cosine nan makes no sense", "similarity like 0.98"),
    ({"task": "boxes"}, "unknown task 'boxes'", "use --task classify or detect"),
    ({"strict_tpu_ops": "yes"}, "--strict-tpu-ops yes makes no sense", "true or false"),
])
def test_request_refuses_bad_values_when_made_naming_the_flag_and_a_fix(kwargs, message, hint):
    with pytest.raises(UsageError) as err:
        BuildRequest(model="m", targets="cpu", calib="c", **kwargs)
    assert err.value.message == message and hint in err.value.hint


def _model(name="fp32", **kw):
    spec = InputSpec(shape=(1, 32, 32, 1), colour="gray")
    return BuiltModel(name=name, file=f"{name}.bin", format="raw", precision="float32", input=spec, outputs=(),
                      convert_seconds=0.0, bytes=1, verification={}, **kw)


def test_builder_output_must_name_a_default_among_unique_models():
    out = BuilderOutput([_model("a"), _model("b")], "b")
    assert out.default.name == "b" and set(out.verification) == {"a", "b"}
    with pytest.raises(EdgekitError, match="default 'c'"):
        BuilderOutput((_model("a"),), "c")
    with pytest.raises(EdgekitError, match="unique"):
        BuilderOutput((_model("a"), _model("a")), "a")


def test_manifest_entry_keeps_per_model_runtime_options_and_extras():
    entry = _model("fp16", runtime_options={"precision": "fp16"}, extra={"tensorrt": {"engine": "x"}}).manifest_entry()
    assert entry["runtime_options"] == {"precision": "fp16"} and entry["tensorrt"] == {"engine": "x"}
    assert entry["input"]["shape"] == [1, 32, 32, 1]
    assert "runtime_options" not in _model().manifest_entry()  # None: the target's options apply


def test_merge_options_given_wins_key_by_key():
    from edgekit.target import load_target, merge_options

    assert merge_options({"crop": [200, 200], "colour": "gray"}, {"crop": None}) == {"crop": None, "colour": "gray"}
    assert merge_options({"a": 1, "b": 2}, {"c": 3}, keys=("a", "c")) == {"a": 1, "c": 3}
    edgetpu = load_target("edgetpu")
    assert edgetpu.build_options({})["io_dtype"] == "uint8"
    merged = edgetpu.build_options(BuildRequest(model="m", targets="edgetpu", calib="c", io_dtype="int8",
                                                variants="int8").builder_overrides())
    assert merged["io_dtype"] == "int8" and merged["variants"] == ["int8"] and merged["compile"] is True


def test_cli_flags_reach_the_builder_over_the_target_file(tmp_path, capsys):
    from edgekit.cli import main

    code = main(["build", "--model", str(DEMO_MODEL), "--target", _target(tmp_path, "copy_builder"), "--calib",
                 str(CALIB), "--out", str(tmp_path / "out"), "--quiet", "--crop", "200x200", "--variants", "a,b",
                 "--min-tpu-ops", "0.5", "--json"])
    assert code == 0, capsys.readouterr().err
    m = json.loads((tmp_path / "out" / "demo-custom" / "edgekit.json").read_text())
    assert m["models"][0]["runtime_options"]["seen"] == {"variants": ["a", "b"], "opset": 9, "min_tpu_ops": 0.5}
    assert m["input"]["crop"] == [200, 200]


def test_unknown_build_keyword_is_refused_with_the_setting_it_resembles():
    with pytest.raises(UsageError, match="unknown setting 'varaints'") as err:
        edgekit.build(DEMO_MODEL, "cpu", CALIB, varaints=["fp32"])  # a typo no longer vanishes
    assert err.value.hint == "did you mean 'variants'?"


def test_every_setting_is_a_field_a_keyword_and_a_flag_or_says_why_not():
    from edgekit.builders.request import SETTINGS, add_flags

    fields = {f.name for f in dataclasses.fields(BuildRequest)}
    assert fields == {s.name for s in SETTINGS}
    parser = argparse.ArgumentParser()
    add_flags(parser)
    flags = {a.dest: a.option_strings for a in parser._actions if a.dest != "help"}
    for s in SETTINGS:
        if s.flag and not s.custom:
            assert flags[s.name] == [s.flag]
        else:
            assert s.name not in flags
    # the verb adds the custom ones itself, with the spec's help
    verb = build_parser().parse_args(["build", "--model", "m", "--target", "cpu", "--calib", "c", "-T", "k=1",
                                      "--max-memory", "1G"])
    assert verb.task_option == [("k", "1")] and verb.max_memory == 1 << 30


def copy_builder(ctx, target, out_dir):
    """A third-party style builder: 'converts' by copying, verifies with the original model itself."""
    dest = out_dir / f"{ctx.name}.keras"
    dest.write_bytes(ctx.source.path.read_bytes())
    checked = ctx.verify("raw", ctx.source.predict, ctx.float_spec)
    seen = ctx.options_for(target)
    model = BuiltModel(name="raw", file=dest.name, format="keras", precision="float32", input=ctx.float_spec,
                       outputs=({"name": "scores", "shape": [1, 10], "dtype": "float32"},), convert_seconds=0.0,
                       bytes=dest.stat().st_size, verification=checked, runtime_options={"seen": seen})
    return BuilderOutput((model,), "raw", runtime_options={"threads": 1})


def dict_builder(ctx, target, out_dir):
    """The old untyped contract: refused."""
    return {"models": [], "default_model": "x", "verification": {}}


@pytest.fixture(autouse=True)
def _trusted_builders(monkeypatch):
    """A builder outside edgekit is called only when the user trusts it (edgekit.builders.targets.check_builder)."""
    from edgekit.builders.targets import TRUSTED_BUILDERS_ENV

    monkeypatch.setenv(TRUSTED_BUILDERS_ENV,
                       "tests.builders.test_contract:copy_builder,tests.builders.test_contract:dict_builder")


def _target(tmp_path, builder):
    path = tmp_path / f"{builder}.toml"
    # an adapter of the backends table (a target file may name no other) only as its name in the manifest:
    # no test here opens the bundle (the test is about the manifest the builder's output makes)
    path.write_text(f'name = "custom"\nsummary = "a custom target"\n'
                    f'builder = "tests.builders.test_contract:{builder}"\n'
                    'adapter = "edgekit.runtime.onnxrt:OnnxRuntime"\n[build]\nvariants = ["raw"]\nopset = 9\n'
                    '[runtime.options]\nthreads = 4\nmode = "x"\n')
    return str(path)


def test_custom_builder_output_becomes_the_manifest(tmp_path):
    [r] = edgekit.build(DEMO_MODEL, _target(tmp_path, "copy_builder"), [CALIB], out=tmp_path / "out", eval_dir=EVAL,
                        quiet=True, io_dtype="int8", preprocess={"crop": [200, 200]})
    assert isinstance(r, TargetBuild) and r.passed and r.target == "custom"
    m = json.loads((r.bundle / "edgekit.json").read_text())
    assert m["default_model"] == "raw" and m["models"][0]["file"] == "demo.keras"
    # the target's [build] table with the request's overrides laid over it
    assert m["models"][0]["runtime_options"] == {"seen": {"variants": ["raw"], "opset": 9, "io_dtype": "int8"}}
    assert m["runtime"]["options"] == {"threads": 1, "mode": "x"}  # the builder's over the target's
    assert m["verification"]["ratio"] == 1.0 and m["verification"]["models"]["raw"]["eval"]["agreement"] == 1.0
    assert "delegation" not in m and "edgetpu" not in m


def test_builder_returning_a_dict_is_refused_and_leaves_no_bundle(tmp_path):
    stale = tmp_path / "out" / "demo-custom"
    stale.mkdir(parents=True)
    with pytest.raises(EdgekitError, match="returned dict, not a BuilderOutput"):
        edgekit.build(DEMO_MODEL, _target(tmp_path, "dict_builder"), [CALIB], out=tmp_path / "out", quiet=True,
                      preprocess={"crop": [200, 200]})
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []


def test_no_builders_module_imports_up_the_layers():
    """builders/ may use the device-side modules but never edgekit/__init__, the CLI or its verbs."""
    import ast

    import edgekit.builders

    bad = []
    for path in sorted(Path(edgekit.builders.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                if name == "edgekit" or name.startswith(("edgekit.commands", "edgekit.cli")):
                    bad.append(f"{path.name}:{node.lineno} {name}")
    assert bad == []


@pytest.mark.parametrize(("given", "size"), [("224", (224, 224)), ("224x160", (224, 160)), (" 96 X 128 ", (96, 128)),
                                            ((224, 160), (224, 160)), ([96], (96, 96)), (None, None)])
def test_input_size_is_height_by_width(given, size):
    from edgekit.builders.request import parse_input_size

    assert parse_input_size(given) == size


@pytest.mark.parametrize("given", ["axb", "0x3", "224x", "-1", "x", "20000x20000", (1, 2, 3)])
def test_an_input_size_that_is_not_hxw_is_one_usage_error(given):
    from edgekit.builders.request import parse_input_size

    with pytest.raises(UsageError, match="is not HxW") as caught:
        parse_input_size(given)
    assert caught.value.hint == "give the height and width, e.g. --input-size 224x224"
