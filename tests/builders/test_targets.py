"""builders/targets.py: a build resolves each --target once (target, builder, options) and hands it down."""

from __future__ import annotations

import json
from collections import Counter

import pytest

import edgekit
import edgekit.builders.targets as targets_module
from edgekit.builders.contract import BuilderOutput, BuiltModel
from edgekit.builders.request import BuildRequest
from edgekit.builders.targets import TRUSTED_BUILDERS_ENV
from edgekit.errors import TargetError, UsageError
from edgekit.target import Target
from tests.conftest import CALIB, DEMO_MODEL

BUILDER = "tests.builders.test_targets:copy_builder"


def copy_builder(ctx, target, out_dir):
    """A third-party style builder: 'converts' by copying and reads its options as builders do."""
    dest = out_dir / f"{ctx.name}.keras"
    dest.write_bytes(ctx.source.path.read_bytes())
    checked = ctx.verify("raw", ctx.source.predict, ctx.float_spec)
    seen = ctx.options_for(target)
    seen_again = ctx.options_for(target)  # builders and recovery ask more than once
    assert seen == seen_again and seen is not seen_again  # a copy each: a builder may change its own
    model = BuiltModel(name="raw", file=dest.name, format="keras", precision="float32", input=ctx.float_spec,
                       outputs=({"name": "scores", "shape": [1, 10], "dtype": "float32"},), convert_seconds=0.0,
                       bytes=dest.stat().st_size, verification=checked, runtime_options={"seen": seen})
    return BuilderOutput((model,), "raw")


def target_file(tmp_path, name="custom", variants='["raw"]'):
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nsummary = "a custom target"\nbuilder = "{BUILDER}"\n'
                    'adapter = "edgekit.runtime.onnxrt:OnnxRuntime"\n'
                    f'[build]\nvariants = {variants}\nopset = 9\n')
    return str(path)


@pytest.fixture(autouse=True)
def _trusted(monkeypatch):
    monkeypatch.setenv(TRUSTED_BUILDERS_ENV, BUILDER)


def test_a_build_reads_checks_and_merges_each_target_once(tmp_path, monkeypatch):
    calls: Counter[str] = Counter()

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(targets_module, "load_target", counted("load_target", targets_module.load_target))
    monkeypatch.setattr(targets_module, "resolve", counted("resolve builder", targets_module.resolve))
    monkeypatch.setattr(Target, "can_build", counted("can_build", Target.can_build))
    monkeypatch.setattr(Target, "build_options", counted("build_options", Target.build_options))
    files = f"{target_file(tmp_path, 'one')},{target_file(tmp_path, 'two')}"
    results = edgekit.build(DEMO_MODEL, files, [CALIB], out=tmp_path / "out", quiet=True,
                            preprocess={"crop": [200, 200]}, calib_count=8)
    assert [r.target for r in results] == ["one", "two"] and all(r.passed for r in results)
    assert calls == {"load_target": 2, "resolve builder": 2, "can_build": 2, "build_options": 2}
    m = json.loads((results[0].bundle / "edgekit.json").read_text())
    assert m["models"][0]["runtime_options"]["seen"] == {"variants": ["raw"], "opset": 9}


def test_resolved_targets_carry_their_builder_and_merged_options(tmp_path):
    request = BuildRequest(model="m", targets=target_file(tmp_path), calib="c", variants="raw")
    [planned] = targets_module.resolve_targets(request)
    # imported by its dotted path (pytest imported this file under another name: not the same object)
    assert planned.name == "custom" and f"{planned.builder.__module__}:{planned.builder.__name__}" == BUILDER
    assert dict(planned.options) == {"variants": ["raw"], "opset": 9}


def test_what_cannot_build_is_refused_before_any_work(tmp_path, monkeypatch):
    one = target_file(tmp_path)
    with pytest.raises(UsageError, match="given more than once"):
        targets_module.resolve_targets(BuildRequest(model="m", targets=f"{one},{one}", calib="c"))
    with pytest.raises(UsageError, match="not a list of names"):
        targets_module.resolve_targets(BuildRequest(model="m", targets=target_file(tmp_path, variants="3"), calib="c"))
    monkeypatch.setattr(Target, "can_build", lambda self: (False, "missing tensorflow (pip install it)"))
    with pytest.raises(TargetError, match="cannot build custom here: missing tensorflow"):
        targets_module.resolve_targets(BuildRequest(model="m", targets=one, calib="c"))
