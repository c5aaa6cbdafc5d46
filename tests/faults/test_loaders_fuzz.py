"""Property tests of the loaders (Hypothesis): whatever the input, only edgekit's own errors.

Four readers take untrusted input: a bundle's edgekit.json (load_bundle, then opening the
model), a serve configuration (load_config / from_dict), a target file (load_target) and a
.tflite flatbuffer (read_graph). Each gets generated documents and mutations of a real one;
anything but a clean result or an :class:`~edgekit.errors.EdgekitError` fails the test.

Examples per run (bounded, derandomised so CI is repeatable): EXAMPLES below, 1,100 in all;
``EDGEKIT_FUZZ_EXAMPLES=N`` runs N per test for a longer local session.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import string
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from edgekit.errors import EdgekitError  # noqa: E402

SCALE = int(os.environ.get("EDGEKIT_FUZZ_EXAMPLES", "0"))
EXAMPLES = {"manifest": 200, "manifest_text": 100, "config": 200, "config_text": 100, "target": 150,
            "target_text": 100, "tflite": 250}


def fuzz(name: str):
    """Hypothesis settings for one property: bounded, repeatable, no per-example deadline."""
    return settings(max_examples=SCALE or EXAMPLES[name], deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


# JSON/TOML-like values: what a hand-edited or hostile file can hold.
SCALARS = (st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.sampled_from([0, 1, -1, 100000, 2**63])
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
           | st.sampled_from(["", "..", "../x", "/etc/passwd", "fp32", "int8", "labels.txt", "square", "gray",
                              "NHWC", "uint8", "edgekit.runtime.litert:ctypes", "os:system", "a" * 300]))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                          max_size=4), max_leaves=12)


def _paths(doc, prefix=()):
    """Every key path into a nested dict/list document."""
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


def _mutate(doc, path, value, delete):
    """``doc`` with the node at ``path`` replaced by ``value`` (or deleted)."""
    doc = copy.deepcopy(doc)
    if not path:
        return value
    node = doc
    for k in path[:-1]:
        node = node[k]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


@st.composite
def mutations(draw, base, keep_root=False):
    """A real document with one to three nodes replaced or deleted (``keep_root``: never the
    whole document, for readers whose parser always hands over a table)."""
    doc = base
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p or not keep_root]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        delete = bool(path) and draw(st.booleans())
        doc = _mutate(doc, path, draw(JSON), delete)
    return doc


# ---- the manifest --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fuzz_bundle(tmp_path_factory, cpu_bundle):
    """A copy of the real bundle whose edgekit.json each example rewrites; its manifest."""
    b = tmp_path_factory.mktemp("fuzz") / "demo-cpu"
    shutil.copytree(cpu_bundle, b)
    return b, json.loads((b / "edgekit.json").read_text())


def _load_and_open(b: Path) -> None:
    from edgekit.bundle import load_bundle
    from edgekit.model import open_model

    try:
        bundle = load_bundle(b)
        _ = bundle.model(), bundle.labels, bundle.input_spec, bundle.runtime, bundle.task
        with open_model(b) as model:
            model.runtime.describe()
    except EdgekitError:
        pass


def test_manifest_mutations_raise_only_edgekit_errors(fuzz_bundle):
    b, base = fuzz_bundle

    @fuzz("manifest")
    @given(mutations(base))
    def check(doc):
        (b / "edgekit.json").write_text(json.dumps(doc, allow_nan=True))
        _load_and_open(b)

    check()


def test_manifest_text_raises_only_edgekit_errors(fuzz_bundle):
    b, base = fuzz_bundle
    real = json.dumps(base).encode()

    @fuzz("manifest_text")
    @given(st.binary(max_size=200) | st.builds(lambda cut, junk: real[:cut] + junk, st.integers(0, len(real)),
                                               st.binary(max_size=20)))
    def check(data):
        (b / "edgekit.json").write_bytes(data)
        _load_and_open(b)

    check()


# ---- the serve configuration -----------------------------------------------------------------------------------

def _example_config() -> dict:
    from edgekit.target import tomllib
    from tests.conftest import ROOT

    return tomllib.loads((ROOT / "deploy" / "serve.example.toml").read_text())


def test_serve_config_dicts_raise_only_edgekit_errors(tmp_path):
    from edgekit.serve.config.load import from_dict

    base = _example_config()

    @fuzz("config")
    @given(mutations(base, keep_root=True) | st.dictionaries(st.sampled_from([*base, "x"]), JSON, max_size=4))
    def check(doc):
        with contextlib.suppress(EdgekitError):
            from_dict(doc, "fuzz.toml", tmp_path)

    check()


def _toml(doc: dict) -> str:
    """A small TOML writer (strings, numbers, booleans, arrays, tables) for generated documents."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v) if v == v and abs(v) != float("inf") else ("nan" if v != v else ("inf" if v > 0 else "-inf"))
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v if not isinstance(x, dict) and x is not None) + "]"
        return json.dumps(str(v))

    lines, tables = [], []
    for k, v in doc.items():
        if isinstance(v, dict):
            tables.append((k, v))
        elif v is not None:
            lines.append(f"{json.dumps(str(k))} = {value(v)}")
    for name, table in tables:
        lines.append(f"[{json.dumps(str(name))}]")
        lines.extend(f"{json.dumps(str(k))} = {value(v)}" for k, v in table.items()
                     if v is not None and not isinstance(v, dict))
    return "\n".join(lines) + "\n"


def test_serve_config_files_raise_only_edgekit_errors(tmp_path):
    from edgekit.serve.config.load import load_config

    path = tmp_path / "serve.toml"
    base = _example_config()

    @fuzz("config_text")
    @given(st.binary(max_size=300) | mutations(base, keep_root=True).map(lambda d: _toml(d).encode())
           | st.text(alphabet=string.printable, max_size=300).map(str.encode))
    def check(data):
        path.write_bytes(data)
        with contextlib.suppress(EdgekitError):
            load_config(path)

    check()


# ---- the target file -------------------------------------------------------------------------------------------

def test_target_files_raise_only_edgekit_errors(tmp_path):
    from edgekit.target import TARGETS_DIR, load_target, tomllib

    path = tmp_path / "custom.toml"
    bases = [tomllib.loads(p.read_text()) for p in sorted(TARGETS_DIR.glob("*.toml"))]

    @fuzz("target")
    @given(st.sampled_from(bases).flatmap(lambda base: mutations(base, keep_root=True)))
    def check(doc):
        path.write_text(_toml(doc) if isinstance(doc, dict) else str(doc))
        try:
            target = load_target(str(path))
            target.can_build(), target.can_run(), target.build_options({})
        except EdgekitError:
            pass

    check()


def test_target_text_raises_only_edgekit_errors(tmp_path):
    from edgekit.target import load_target

    path = tmp_path / "custom.toml"

    @fuzz("target_text")
    @given(st.binary(max_size=300) | st.text(alphabet=string.printable, max_size=300).map(str.encode))
    def check(data):
        path.write_bytes(data)
        with contextlib.suppress(EdgekitError):
            load_target(str(path))

    check()


# ---- the .tflite graph reader -----------------------------------------------------------------------------------

def test_tflite_graph_reader_on_mutated_models(tmp_path, cpu_bundle):
    from edgekit.tflite.graph import parse_graph, read_graph

    real = next(cpu_bundle.glob("*.tflite")).read_bytes()
    path = tmp_path / "m.tflite"

    @st.composite
    def mutated(draw):
        data = bytearray(real)
        for _ in range(draw(st.integers(1, 8))):
            kind = draw(st.sampled_from(["flip", "cut", "splice", "zero"]))
            pos = draw(st.integers(0, max(len(data) - 1, 0)))
            if kind == "flip" and data:
                data[pos] = draw(st.integers(0, 255))
            elif kind == "cut":
                data = data[:pos]
            elif kind == "splice":
                data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
            elif data:
                data[pos:pos + 4] = b"\xff\xff\xff\x7f"
        return bytes(data)

    @fuzz("tflite")
    @given(mutated() | st.binary(max_size=64))
    def check(data):
        path.write_bytes(data)
        for read in (lambda: read_graph(path), lambda: parse_graph(data)):
            try:
                graph = read()
                _ = graph.summary() if hasattr(graph, "summary") else None
            except EdgekitError:
                pass

    check()
