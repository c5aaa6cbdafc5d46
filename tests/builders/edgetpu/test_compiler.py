"""edgetpu_compiler integration, exercised against a TEST DOUBLE of the compiler process.

The real compiler exists only for x86-64 Linux from Coral's apt repository, so these
tests put ``tests/fixtures/edgetpu/edgetpu_compiler`` (a Python script printing output in
the real compiler's format and writing ``*_edgetpu.tflite``/``.log`` files) on PATH.
What is real: the subprocess call (argument list, no shell), the timeout that kills the
process group, exit-code handling, output/log parsing and the converted int8 models.
Tests marked ``edgetpu`` run the real compiler when it is installed.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import time
from pathlib import Path

import pytest

from edgekit.builders.edgetpu.compiler import (
    ABSENT_REASON,
    compile_for_edgetpu,
    compile_model,
    find_compiler,
    parse_bytes,
    parse_compiler_output,
    parse_operation_table,
    tpu_op_threshold,
)
from edgekit.errors import CompilerError, UsageError
from edgekit.tflite.edgetpu_rules import check_model

FAKE = Path(__file__).parents[2] / "fixtures" / "edgetpu" / "edgetpu_compiler"


@pytest.fixture
def no_compiler(tmp_path, monkeypatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


@pytest.fixture
def fake_compiler(tmp_path, monkeypatch):
    """Put the test double on PATH; returns a function that sets its mode."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "edgetpu_compiler"
    source = FAKE.read_text().split("\n", 1)[1]  # swap the shebang for this interpreter
    exe.write_text(f"#!{sys.executable}\n{source}")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    argv_file = tmp_path / "argv.json"
    monkeypatch.setenv("EDGEKIT_FAKE_EDGETPU_ARGV", str(argv_file))

    def use(mode: str = "mapped") -> Path:
        monkeypatch.setenv("EDGEKIT_FAKE_EDGETPU_MODE", mode)
        return argv_file

    use()
    return use


def test_find_compiler(fake_compiler, tmp_path):
    found = find_compiler(None)
    assert found is not None and Path(found).name == "edgetpu_compiler"
    assert find_compiler(found) == str(Path(found).resolve())
    with pytest.raises(CompilerError, match="not an executable edgetpu_compiler"):
        find_compiler(str(tmp_path / "nowhere" / "edgetpu_compiler"))


def test_absent_compiler_is_not_compiled_with_one_line_reason(no_compiler, model, tmp_path):
    assert find_compiler(None) is None
    result = compile_model(model("small_int8"), tmp_path / "out")
    assert (result.status, result.compiled_path, result.report) == ("not compiled", None, {})
    assert result.reason == ABSENT_REASON and "\n" not in result.reason
    assert "x86-64 Linux" in result.reason and "apt repository" in result.reason


def test_all_mapped(fake_compiler, model, tmp_path):
    argv_file = fake_compiler("mapped")
    src = model("small_int8")
    out = tmp_path / "out"
    result = compile_model(src, out, min_runtime_version=13)
    # an argument list reached the process unchanged: no shell in between; the compiler writes into a
    # fresh folder inside out/, removed once the checked model and log are moved into place
    argv = json.loads(argv_file.read_text())
    assert argv[2:] == ["--show_operations", "--min_runtime_version", "13", str(src.resolve())]
    assert argv[0] == "--out_dir" and Path(argv[1]).parent == out.resolve() and not Path(argv[1]).exists()
    assert sorted(p.name for p in out.iterdir()) == ["small_int8_edgetpu.log", "small_int8_edgetpu.tflite"]
    assert result.status == "compiled" and result.reason == ""
    assert result.compiled_path == out / "small_int8_edgetpu.tflite" and result.compiled_path.is_file()
    r = result.report
    assert r["compiler_version"] == "16.0.384591198"
    assert (r["total_ops"], r["tpu_ops"], r["cpu_ops"], r["all_mapped"]) == (8, 8, 0, True)
    assert r["subgraphs"] == 1 and r["compile_ms"] == 412
    assert r["input_size_bytes"] == pytest.approx(src.stat().st_size, rel=0.01)
    assert r["off_chip_memory_used_bytes"] == 0 and r["on_chip_memory_used_bytes"] > 0
    assert r["log_file"] == "small_int8_edgetpu.log" and (out / r["log_file"]).is_file()
    assert r["command"] == [
        "edgetpu_compiler", "--out_dir", "out", "--show_operations", "--min_runtime_version", "13",
        "small_int8.tflite",
    ]  # fmt: skip
    assert {row["status"] for row in r["operations"]} == {"Mapped to Edge TPU"}
    assert result.to_dict()["compiled_file"] == "small_int8_edgetpu.tflite"


def test_partly_mapped_reports_statuses_and_threshold(fake_compiler, model, tmp_path):
    fake_compiler("partial")
    result = compile_model(model("gather_int8"), tmp_path / "out")
    r = result.report
    assert result.status == "compiled"
    assert (r["total_ops"], r["tpu_ops"], r["cpu_ops"], r["all_mapped"]) == (8, 2, 6, False)
    statuses = {(row["op"], row["status"]) for row in r["operations"]}
    assert ("GATHER", "Operation not supported") in statuses
    assert ("CONV_2D", "More than one subgraph is not supported") in statuses
    assert sum(row["count"] for row in r["operations"] if row["on_tpu"]) == 2
    message = tpu_op_threshold(r, 0.95)
    assert message == "only 2 of 8 ops (25%) run on the Edge TPU, below --min-tpu-ops 0.95"
    assert tpu_op_threshold(r, 0.25) is None
    with pytest.raises(CompilerError, match="only 2 of 8 ops"):
        tpu_op_threshold(r, 0.95, fail=True)


def test_zero_ops_mapped_fails_and_removes_the_model(fake_compiler, model, tmp_path):
    fake_compiler("zero")
    out = tmp_path / "out"
    with pytest.raises(CompilerError) as err:
        compile_model(model("small_int8"), out)
    assert "mapped 0 of 3 operations" in err.value.message
    assert "Operation is working on an unsupported data type" in err.value.message
    assert not (out / "small_int8_edgetpu.tflite").exists()


@pytest.mark.parametrize(
    ("mode", "words"),
    [("fail", "Invalid model: .*small_float.tflite; Model not quantized"), ("crash", "Internal compiler error")],
)
def test_compiler_failure_carries_its_own_message(fake_compiler, model, tmp_path, mode, words):
    fake_compiler(mode)
    with pytest.raises(CompilerError, match=r"edgetpu_compiler failed \(exit 1\): " + words):
        compile_model(model("small_float"), tmp_path / "out")


def test_exit_0_without_a_model_file_is_a_failure(fake_compiler, model, tmp_path):
    fake_compiler("nofile")
    with pytest.raises(CompilerError, match="wrote no small_int8_edgetpu.tflite"):
        compile_model(model("small_int8"), tmp_path / "out")


@pytest.mark.slow  # asserts on wall-clock time
def test_timeout_kills_the_compiler_and_its_child(fake_compiler, model, tmp_path):
    fake_compiler("timeout")
    t0 = time.monotonic()
    with pytest.raises(
        CompilerError, match=r"timed out after 1.5 s \(killed\); its output: .*Started a compilation timeout timer"
    ):
        compile_model(model("small_int8"), tmp_path / "out", timeout_s=1.5)
    # the forked child sleeps an hour and holds the pipes: only a process-group kill returns this fast
    assert time.monotonic() - t0 < 10


def test_bad_min_runtime_version(fake_compiler, model, tmp_path):
    with pytest.raises(UsageError, match="min-runtime-version"):
        compile_model(model("small_int8"), tmp_path, min_runtime_version="13; rm -rf /")


def test_threshold_validates_and_accepts_offline_reports(model):
    offline = check_model(model("gather_int8"))
    assert tpu_op_threshold(offline, 0.95) == (
        "only 2 of 8 ops (25%) are predicted to run on the Edge TPU, below --min-tpu-ops 0.95"
    )
    with pytest.raises(UsageError):
        tpu_op_threshold(offline, 1.5)


def test_build_step_without_compiler_keeps_offline_report(no_compiler, model, tmp_path):
    step = compile_for_edgetpu(model("gather_int8"), tmp_path, min_tpu_ops=0.95)
    assert step["status"] == "not compiled" and step["compiled_file"] is None and step["compiler"] is None
    assert step["offline"]["cut"]["opcode"] == "GATHER"
    assert ABSENT_REASON in step["warnings"]
    assert any("are predicted to run on the Edge TPU, below --min-tpu-ops 0.95" in w for w in step["warnings"])
    json.dumps(step)
    with pytest.raises(CompilerError, match="below --min-tpu-ops"):
        compile_for_edgetpu(model("gather_int8"), tmp_path, min_tpu_ops=0.95, strict_tpu_ops=True)


def test_build_step_with_compiler_judges_the_compiler_report(fake_compiler, model, tmp_path):
    fake_compiler("mapped")
    step = compile_for_edgetpu(model("small_int8"), tmp_path, min_runtime_version=14, min_tpu_ops=0.95)
    assert step["status"] == "compiled" and step["compiled_file"] == "small_int8_edgetpu.tflite"
    assert step["compiler"]["tpu_ops"] == 8 and step["min_runtime_version"] == 14
    # the fixture compiler copies its input, which the build points out; nothing else is wrong
    assert [w for w in step["warnings"] if "holds no edgetpu-custom-op" not in w] == []


def test_build_step_warns_about_off_chip_streaming(fake_compiler, model, tmp_path):
    fake_compiler("mapped")
    step = compile_for_edgetpu(model("anki_int8"), tmp_path)
    assert step["compiler"]["off_chip_memory_used_bytes"] > 8 * 1024**2
    warnings = [w for w in step["warnings"] if "holds no edgetpu-custom-op" not in w]  # the fixture copies
    assert len(warnings) == 1 and "stream from the host on every inference" in warnings[0]
    assert step["offline"]["cache_status"] == "streams"  # the prediction agreed


# --- parsing: the real compiler's output formats ------------------------------------------


V15_STDOUT = """Edge TPU Compiler version 15.0.340273435

Model compiled successfully in 1873 ms.

Input model: signs_int8.tflite
Input size: 16.60MiB
Output model: out/signs_int8_edgetpu.tflite
Output size: 16.71MiB
On-chip memory used for caching model parameters: 6.91MiB
On-chip memory remaining for caching model parameters: 2.25KiB
Off-chip memory used for streaming uncached model parameters: 9.70MiB
Number of Edge TPU subgraphs: 1
Total number of operations: 13
Operation log: out/signs_int8_edgetpu.log

Model successfully compiled but not all operations are supported by the Edge TPU. A percentage of the model \
will instead run on the CPU, which is slower. If possible, consider updating your model to use only operations \
supported by the Edge TPU. For details, visit g.co/coral/model-reqs.
Number of operations that will run on Edge TPU: 11
Number of operations that will run on CPU: 2
See the operation log file for individual operation details.
"""

V15_LOG = """Edge TPU Compiler version 15.0.340273435
Input: signs_int8.tflite
Output: out/signs_int8_edgetpu.tflite

Operator                       Count      Status

QUANTIZE                       1          Mapped to Edge TPU
CONV_2D                        3          Mapped to Edge TPU
MAX_POOL_2D                    2          Mapped to Edge TPU
RESHAPE                        1          Mapped to Edge TPU
FULLY_CONNECTED                2          Mapped to Edge TPU
SOFTMAX                        1          Mapped to Edge TPU
QUANTIZE                       1          Mapped to Edge TPU
TRANSPOSE                      1          Operation not supported
DEQUANTIZE                     1          Operation is working on an unsupported data type
"""


def test_parse_summary_without_table_on_stdout_uses_the_log():
    r = parse_compiler_output(V15_STDOUT, V15_LOG)
    assert r["compiler_version"] == "15.0.340273435"
    assert (r["total_ops"], r["tpu_ops"], r["cpu_ops"]) == (13, 11, 2)
    assert r["on_chip_memory_used_bytes"] == parse_bytes("6.91MiB")
    assert r["on_chip_memory_remaining_bytes"] == 2304
    assert r["off_chip_memory_used_bytes"] == int(round(9.70 * 1024**2))
    # the compiler's paths are reduced to file names: a manifest names no host path
    assert r["operation_log"] == "signs_int8_edgetpu.log" and r["output_model"] == "signs_int8_edgetpu.tflite"
    assert len(r["operations"]) == 9 and r["operations"][-1]["status"].startswith("Operation is working")
    # without the log, the counts still come from the summary lines
    assert parse_compiler_output(V15_STDOUT)["tpu_ops"] == 11


def test_parse_all_mapped_without_counts_or_table():
    stdout = V15_STDOUT.split("\nModel successfully compiled but")[0]
    r = parse_compiler_output(stdout)
    assert (r["total_ops"], r["tpu_ops"], r["cpu_ops"], r["all_mapped"]) == (13, 13, 0, True)


def test_parse_size_and_table_edges():
    assert parse_bytes("0.00B") == 0 and parse_bytes("41.75KiB") == 42752 and parse_bytes("n/a") is None
    rows = parse_operation_table(V15_LOG + "Compilation child process completed within timeout period.\n")
    assert rows[-1]["op"] == "DEQUANTIZE"


@pytest.mark.edgetpu
@pytest.mark.skipif(
    shutil.which("edgetpu_compiler") is None,
    reason="the real edgetpu_compiler is not installed (x86-64 Linux, Coral's apt package edgetpu-compiler)",
)
def test_real_compiler_maps_the_int8_cnn(model, tmp_path):
    result = compile_model(model("small_int8"), tmp_path)
    assert result.status == "compiled" and result.report["tpu_ops"] == result.report["total_ops"]


# --- the real compiler's output shapes, replayed through the process boundary (tests/fixtures/edgetpu/outputs) --

OUTPUTS = FAKE.parent / "outputs"


@pytest.fixture
def replay(fake_compiler, monkeypatch):
    """``replay(name, exit_code)``: the compiler double prints ``outputs/<name>.stdout`` and exits with the code."""

    def use(name: str, exit_code: int = 0) -> None:
        fake_compiler("replay")
        monkeypatch.setenv("EDGEKIT_FAKE_EDGETPU_REPLAY", str(OUTPUTS / f"{name}.stdout"))
        monkeypatch.setenv("EDGEKIT_FAKE_EDGETPU_EXIT", str(exit_code))

    return use


@pytest.fixture
def int8_file(tmp_path):
    """Bytes standing in for an int8 model: a replay only copies them, so no conversion is needed here."""
    path = tmp_path / "small_int8.tflite"
    path.write_bytes(b"TFL3 stand-in")
    return path


def test_every_fixture_is_documented_with_its_source():
    readme = (OUTPUTS / "README.md").read_text()
    names = {p.stem for p in OUTPUTS.glob("*.stdout")}
    assert len(names) == 7 and all(f"`{n}`" in readme or f"`{n}` (" in readme for n in names)


def test_real_short_table_when_every_op_maps(replay, int8_file, tmp_path):
    """v16 with -s and every op mapped prints no Edge TPU/CPU counts: the table alone says so."""
    replay("all_mapped_short_v16")
    result = compile_model(int8_file, tmp_path / "out")
    r = result.report
    assert result.status == "compiled" and result.compiled_path.is_file()
    assert (r["total_ops"], r["tpu_ops"], r["cpu_ops"], r["all_mapped"]) == (11, 11, 0, True)
    assert [(row["op"], row["count"]) for row in r["operations"]] == [
        ("CONV_2D", 4), ("MAX_POOL_2D", 2), ("QUANTIZE", 2), ("MEAN", 1), ("FULLY_CONNECTED", 1), ("SOFTMAX", 1)]
    assert all(row["on_tpu"] for row in r["operations"]) and r["compile_ms"] == 655
    assert r["off_chip_memory_used_bytes"] == 0 and r["on_chip_memory_remaining_bytes"] == parse_bytes("5.88MiB")


def test_real_partial_mapping_reads_counts_and_the_log(replay, int8_file, tmp_path):
    replay("partial_v16")
    result = compile_model(int8_file, tmp_path / "out")
    r = result.report
    assert (r["total_ops"], r["tpu_ops"], r["cpu_ops"], r["all_mapped"]) == (40, 13, 27, False)
    assert r["log_file"] == "small_int8_edgetpu.log" and len(r["operations"]) == 11
    assert sum(row["count"] for row in r["operations"]) == 40
    assert sum(row["count"] for row in r["operations"] if row["on_tpu"]) == 13
    assert ("CONV_2D", 8, False) in {(row["op"], row["count"], row["on_tpu"]) for row in r["operations"]}
    assert tpu_op_threshold(r, 0.5) == "only 13 of 40 ops (32%) run on the Edge TPU, below --min-tpu-ops 0.5"


def test_search_delegate_output_reports_the_last_attempt_only():
    """Two compile attempts, two tables: no row of the first table may leak into the report of the last."""
    text = (OUTPUTS / "search_delegate_v16.stdout").read_text()
    rows = parse_operation_table(text)
    assert len(rows) == 8 and sum(row["count"] for row in rows) == 52
    assert ("RESHAPE", 6) not in {(row["op"], row["count"]) for row in rows}  # the first attempt's row
    r = parse_compiler_output(text)
    assert (r["total_ops"], r["tpu_ops"], r["cpu_ops"]) == (52, 48, 4)  # the last summary, like the table
    assert r["compile_ms"] == 1512 and r["output_size_bytes"] == parse_bytes("4.58MiB")


@pytest.mark.parametrize(("name", "exit_code", "words"), [
    ("not_quantized_v15", 1, r"\(exit 1\): Invalid model: float_model.tflite; Model not quantized"),
    ("internal_error_v14", 1, r"\(exit 1\): Internal compiler error. Aborting!"),
    ("failed_exit0_v16", 0, r"\(exit 0\): ERROR: Attempting to use a delegate .*; Compilation failed: Model failed "
                            r"in Tflite interpreter.*; Compilation failed!"),
    ("failed_exit0_v16", 1, r"\(exit 1\): ERROR: Attempting"),
    ("timeout_v16", 0, r"\(exit 0\): Compilation timeout. This is usually caused by large activations.; "
                       r"Compilation failed!"),
    ("timeout_v16", 1, r"\(exit 1\): Compilation timeout"),
])
def test_real_failures_fail_whatever_the_exit_code(replay, int8_file, tmp_path, name, exit_code, words):
    out = tmp_path / "out"
    out.mkdir()
    stale = out / "small_int8_edgetpu.tflite"
    stale.write_bytes(b"compiled by an earlier run")  # must not be taken for this run's result
    replay(name, exit_code)
    with pytest.raises(CompilerError, match=r"^edgetpu_compiler failed " + words) as err:
        compile_model(int8_file, out)
    assert "\n" not in err.value.message and "edgekit inspect MODEL --target edgetpu" in err.value.hint


def test_without_count_lines_the_table_decides_not_the_all_mapped_default():
    stdout = V15_STDOUT.split("\nModel successfully compiled but")[0]  # a summary that never says what fell back
    r = parse_compiler_output(stdout, V15_LOG)
    assert (r["total_ops"], r["tpu_ops"], r["cpu_ops"], r["all_mapped"]) == (13, 11, 2, False)


def test_a_log_alone_gives_version_and_table_counts():
    """Only the .log at hand (stdout lost): the version and every count come from the log's table."""
    r = parse_compiler_output("", V15_LOG)
    assert r["compiler_version"] == "15.0.340273435"
    assert (r["total_ops"], r["tpu_ops"], r["cpu_ops"], r["all_mapped"]) == (13, 11, 2, False)
    assert r["input_model"] is None and r["input_size_bytes"] is None and r["subgraphs"] is None
    empty = parse_compiler_output("")
    assert (empty["compiler_version"], empty["total_ops"], empty["tpu_ops"], empty["cpu_ops"]) == (None,) * 4
    assert empty["operations"] == [] and empty["all_mapped"] is False


def test_the_stdout_version_wins_and_an_empty_log_falls_back_to_the_stdout_table():
    stdout = (OUTPUTS / "all_mapped_short_v16.stdout").read_text()
    r = parse_compiler_output(stdout, "Edge TPU Compiler version 15.0.1\n")
    assert r["compiler_version"] == "16.0.384591198" and len(r["operations"]) == 6


def test_table_rows_need_the_header_and_end_at_the_first_other_line():
    rows = "CONV_2D                        2          Mapped to Edge TPU\n"
    assert parse_operation_table(rows) == []  # no header: a line that looks like a row is not one
    header = "Operator                       Count      Status\n\n"
    text = header + rows + "Compilation child process completed within timeout period.\n" + rows
    assert [r["op"] for r in parse_operation_table(text)] == ["CONV_2D"]
    assert [r["count"] for r in parse_operation_table(header + rows + "\n" + rows)] == [2, 2]  # blank lines inside


def test_counts_without_a_total_leave_the_cpu_share_unknown():
    r = parse_compiler_output("Number of operations that will run on Edge TPU: 11\n")
    assert (r["total_ops"], r["tpu_ops"], r["cpu_ops"], r["all_mapped"]) == (None, 11, None, False)
