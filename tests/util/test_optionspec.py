"""The one option spec (edgekit/util/optionspec.py): types, text, ranges, choices, did-you-mean, and that
every plug-in table reads its options from it (one Option class in the package)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from edgekit.util.optionspec import (
    MAX_FLOAT,
    Option,
    OptionValueError,
    close_match,
    coerce_all,
    defaults,
    did_you_mean,
)

ROOT = Path(__file__).resolve().parents[2]


def test_there_is_one_option_class():
    found = [f"{p.relative_to(ROOT)}" for p in (ROOT / "edgekit").rglob("*.py")
             if re.search(r"^class Option\b", p.read_text(encoding="utf-8"), re.M)]
    assert found == ["edgekit/util/optionspec.py"]


@pytest.mark.parametrize("option, value, out", [
    (Option("n", "int"), "7", 7),
    (Option("n", "int"), 3.0, 3),
    (Option("x", "float"), 2, 2.0),
    (Option("x", "float"), " 0.5", 0.5),
    (Option("b", "bool"), "off", False),
    (Option("b", "bool"), 1, True),
    (Option("l", "ints"), "1, 2 3", [1, 2, 3]),
    (Option("l", "floats"), (1, 2.5), [1.0, 2.5]),
    (Option("p", "pair"), "0.5,8", (0.5, 8.0)),
    (Option("s", "strs"), ["cpu", "cuda"], ["cpu", "cuda"]),
    (Option("s", "str_or_list"), "640x480", "640x480"),
    (Option("t", "table"), {"a": 1}, {"a": 1}),
    (Option("z", "size", parse=lambda v: tuple(int(i) for i in v.split("x"))), "4x3", (4, 3)),
    (Option("n", "int", ge=1), None, None),  # None: the plug-in's default
])
def test_values_and_text_become_the_declared_type(option, value, out):
    assert option.coerce(value) == out


@pytest.mark.parametrize("option, value, what, wrong_type", [
    (Option("n", "int", ge=1, le=64), 0, "a whole number from 1 to 64", False),
    (Option("n", "int"), True, "a whole number", True),  # True is an int to Python, never a count
    (Option("n", "int"), 2.5, "a whole number", True),
    (Option("x", "float", gt=0), 0, "a number from 0 (exclusive) to 3.1536e+07", False),
    (Option("n", "int", gt=0), 0, "a whole number above 0", False),
    (Option("x", "float"), float("nan"), "a number of at most 3.1536e+07", True),
    (Option("x", "float"), 1e300, f"a number of at most {MAX_FLOAT:g}", False),  # a year: waits overflow beyond
    (Option("c", "str", choices=("auto", "never")), "sometimes", "one of: auto, never", False),
    (Option("l", "ints", ge=0, le=63), [0, -1], "a list of whole numbers from 0 to 63", False),
    (Option("b", "bool"), "maybe", "true or false", True),
])
def test_a_value_that_does_not_fit_says_what_the_option_takes(option, value, what, wrong_type):
    with pytest.raises(OptionValueError) as err:
        option.coerce(value)
    assert err.value.what == what and err.value.wrong_type is wrong_type and err.value.option is option


def test_a_typed_source_gets_no_text_conversion():
    # TOML and JSON say 4 when they mean 4: "4" there is a mistake worth a message
    with pytest.raises(OptionValueError):
        Option("n", "int").coerce("4", text=False)
    with pytest.raises(OptionValueError):
        Option("b", "bool").coerce(1, text=False)
    assert Option("s", "str").coerce("4", text=False) == "4"


def test_describe_bound_and_defaults():
    fps = Option("fps", "float", 5.0, "frames per second", gt=0, le=100)
    assert fps.describe() == "fps=float>0,<=100 (default 5)"
    assert Option("size", "size", (640, 360)).describe() == "size=WxH (default 640x360)"
    assert defaults((fps, Option("loop", "bool", False))) == {"fps": 5.0, "loop": False}


def test_did_you_mean_is_written_once():
    names = ["num_threads", "delegate", "device"]
    assert close_match("num_thread", names) == "num_threads"
    assert close_match("colour", names) is None
    assert did_you_mean("delegat", names) == "did you mean 'delegate'?"
    assert did_you_mean("colour", names) == "known: num_threads, delegate, device"


def test_coerce_all_names_the_first_unknown_key():
    spec = (Option("k", "int", ge=1), Option("softmax", "str", choices=("auto",)))
    assert coerce_all(spec, {"k": "3"}) == {"k": 3}
    with pytest.raises(KeyError, match="'b'"):
        coerce_all(spec, {"b": 1, "c": 2})


def test_plug_in_keyword_defaults_come_from_their_spec():
    # every table's plug-in: a second copy of a default in a signature would drift
    from edgekit.detect.config import OPTIONS as DETECT
    from edgekit.detect.config import DetectConfig
    from edgekit.heads import classify, raw
    from edgekit.runtime.registry import BACKENDS
    from edgekit.util.plugins import resolve

    factories = [(resolve(row.adapter), resolve(row.adapter).OPTIONS) for row in BACKENDS.values()]
    factories += [(classify.classifier, classify.OPTIONS), (raw.raw, raw.OPTIONS)]
    for factory, spec in factories:
        params = inspect.signature(factory).parameters
        for option in spec:
            assert params[option.name].default is option.default, (factory, option.name)
    fields = DetectConfig.__dataclass_fields__
    for option in DETECT:
        if option.name in fields and option.default is not None:
            assert fields[option.name].default is option.default, option.name
