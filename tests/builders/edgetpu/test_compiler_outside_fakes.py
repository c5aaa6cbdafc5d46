"""edgetpu_compiler stand-ins written differently from ours (tests/fixtures/edgetpu/edgetpu_compiler).

Outside reviewers bring their own fake compiler. Each script here is a small Python program put on
PATH that mimics Coral's compiler with its own format details (argparse flags, a ruler under the
table header, tabs, other status spellings, no log, an empty model, a crash, a hang ...). The
integration must read the right op counts from each, fail with one clear line when it should, and
leave no file behind when it fails.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from edgekit.builders.edgetpu.compiler import compile_for_edgetpu, compile_model, find_compiler, tpu_op_threshold
from edgekit.builders.edgetpu.report import parse_compiler_output, parse_operation_table
from edgekit.errors import CompilerError

# argparse, as someone re-implementing the documented command line would write it.
HEAD = r'''
import argparse, os, shutil, sys, time
p = argparse.ArgumentParser(prog="edgetpu_compiler")
p.add_argument("-o", "--out_dir", default=".")
p.add_argument("-s", "--show_operations", action="store_true")
p.add_argument("-m", "--min_runtime_version")
p.add_argument("-t", "--timeout_sec", type=int, default=180)
p.add_argument("-v", "--version", action="store_true")
p.add_argument("models", nargs="*")
a = p.parse_args()
print("Edge TPU Compiler version 16.0.384591198")
if a.version:
    sys.exit(0)
m = a.models[0]
stem = os.path.splitext(os.path.basename(m))[0]
out = os.path.join(a.out_dir, stem + "_edgetpu.tflite")
log = os.path.join(a.out_dir, stem + "_edgetpu.log")
'''

SUMMARY = r'''
print("Model compiled successfully in 25 ms.")
print("Input model: " + m)
print("Output model: " + out)
print("On-chip memory used for caching model parameters: 1.00 MiB")
print("Off-chip memory used for streaming uncached model parameters: 0B")
print("Number of Edge TPU subgraphs: 1")
print("Total number of operations: %d" % TOTAL)
print("Operation log: " + log)
'''


def install(tmp_path: Path, monkeypatch, body: str, name: str = "edgetpu_compiler") -> Path:
    """Write a fake compiler script into a fresh bin/ on PATH; returns its path."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    exe = bindir / name
    exe.write_text(f"#!{sys.executable}\n{HEAD}\n{body}\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    return exe


@pytest.fixture
def int8(tmp_path):
    """Bytes standing in for an int8 model: these fakes only copy them."""
    path = tmp_path / "net_int8.tflite"
    path.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(64))
    return path


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_a_ruled_tab_separated_log_table_gives_the_true_counts(tmp_path, monkeypatch, int8):
    """A ruler under the header used to end the table: no rows, and "every op mapped" was assumed."""
    install(tmp_path, monkeypatch, "TOTAL = 4\n" + SUMMARY + r'''
shutil.copy(m, out)
with open(log, "w") as f:
    f.write("Operator\tCount\tStatus\n--------\t-----\t------\nCONV_2D\t3\tMapped to Edge TPU\n"
            "SOFTMAX\t1\tOperation not supported\n")
''')
    result = compile_model(int8, tmp_path / "out")
    r = result.report
    assert (r["total_ops"], r["tpu_ops"], r["cpu_ops"], r["all_mapped"]) == (4, 3, 1, False)
    assert [(row["op"], row["on_tpu"]) for row in r["operations"]] == [("CONV_2D", True), ("SOFTMAX", False)]
    assert r["on_chip_memory_used_bytes"] == 1024**2 and r["off_chip_memory_used_bytes"] == 0
    assert listing(tmp_path / "out") == ["net_int8_edgetpu.log", "net_int8_edgetpu.tflite"]


def test_other_spellings_of_the_mapped_status_and_a_pipe_table():
    text = ("| Operator | Count | Status |\n|---|---|---|\n| CONV_2D | 2 | mapped to EdgeTPU |\n"
            "| MEAN | 1 | Mapped  to  Edge TPU |\n| GATHER | 1 | Operation not supported |\n")
    rows = parse_operation_table(text)
    assert [(r["op"], r["count"], r["on_tpu"]) for r in rows] == [
        ("CONV_2D", 2, True), ("MEAN", 1, True), ("GATHER", 1, False)]
    r = parse_compiler_output("Total number of operations: 4\n", text)
    assert (r["tpu_ops"], r["cpu_ops"]) == (3, 1)


def test_an_unreadable_table_or_a_fallback_paragraph_is_unknown_not_all_mapped():
    """A table whose rows cannot be read must not turn into "every op on the Edge TPU"."""
    header_only = "Operator  Count  Status\n\nCONV 2D  three  Mapped to Edge TPU\n"
    r = parse_compiler_output("Total number of operations: 5\n", header_only)
    assert (r["total_ops"], r["tpu_ops"], r["cpu_ops"], r["all_mapped"]) == (5, None, None, False)
    paragraph = ("Total number of operations: 5\nModel successfully compiled but not all operations are "
                 "supported by the Edge TPU.\n")
    assert parse_compiler_output(paragraph)["tpu_ops"] is None
    assert parse_compiler_output("Total number of operations: 5\n")["tpu_ops"] == 5  # silent: all mapped
    message = tpu_op_threshold(r, 0.9)
    assert message == "edgetpu_compiler's output gave no readable op counts: --min-tpu-ops 0.9 unchecked"
    with pytest.raises(CompilerError, match="no readable op counts"):
        tpu_op_threshold(r, 0.9, fail=True)


def test_a_stale_log_of_an_earlier_run_is_not_read(tmp_path, monkeypatch, int8):
    """The fake writes the model and prints its table but writes no log: an old log must not count."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "net_int8_edgetpu.log").write_text(
        "Operator  Count  Status\n\nCONV_2D  9  Operation not supported\n")
    install(tmp_path, monkeypatch, "TOTAL = 2\n" + SUMMARY + r'''
shutil.copy(m, out)
print("Operator                       Count      Status")
print("CONV_2D                        2          Mapped to Edge TPU")
''')
    r = compile_model(int8, out).report
    assert (r["total_ops"], r["tpu_ops"], r["log_file"]) == (2, 2, None)
    assert [row["count"] for row in r["operations"]] == [2]


def test_a_stale_model_is_not_taken_for_a_silent_compile(tmp_path, monkeypatch, int8):
    out = tmp_path / "out"
    out.mkdir()
    (out / "net_int8_edgetpu.tflite").write_bytes(b"compiled by an earlier run")
    install(tmp_path, monkeypatch, "pass  # exits 0, writes nothing, says nothing more")
    with pytest.raises(CompilerError) as err:
        compile_model(int8, out)
    assert err.value.message == "edgetpu_compiler exited 0 but wrote no net_int8_edgetpu.tflite: no output"
    assert listing(out) == ["net_int8_edgetpu.tflite"]  # the user's old file, untouched; nothing of ours


def test_a_model_under_another_name_is_found_and_renamed(tmp_path, monkeypatch, int8):
    """A fake that names its output itself (and says so on "Output model:") still yields <name>_edgetpu."""
    install(tmp_path, monkeypatch, r'''
out = os.path.join(a.out_dir, "compiled.tflite")
log = os.path.join(a.out_dir, "compiled.log")
TOTAL = 1
''' + SUMMARY + r'''
shutil.copy(m, out)
open(log, "w").write("Operator Count Status\nCONV_2D 1 Mapped to Edge TPU\n")
''')
    result = compile_model(int8, tmp_path / "out")
    assert result.compiled_path == tmp_path / "out" / "net_int8_edgetpu.tflite"
    assert result.report["output_model"] == "compiled.tflite" and result.report["tpu_ops"] == 1
    assert listing(tmp_path / "out") == ["net_int8_edgetpu.log", "net_int8_edgetpu.tflite"]


@pytest.mark.parametrize(("body", "words"), [
    ("open(out, 'wb').close()\nprint('Model compiled successfully in 1 ms.')",
     r"^edgetpu_compiler wrote an empty net_int8_edgetpu.tflite: Model compiled successfully in 1 ms.$"),
    ("print('Internal compiler error. Aborting!')\nshutil.copy(m, out)",
     r"^edgetpu_compiler failed \(exit 0\): Internal compiler error. Aborting!$"),
    ("print('Invalid model: ' + m)\nprint('Model not quantized')",
     r"^edgetpu_compiler failed \(exit 0\): Invalid model: .*net_int8.tflite; Model not quantized$"),
    ("import signal\nshutil.copy(m, out)\nos.kill(os.getpid(), signal.SIGSEGV)",
     r"^edgetpu_compiler failed \(killed by SIGSEGV\): no output$"),
    ("print('ERROR: cannot open model', file=sys.stderr)\nsys.exit(3)",
     r"^edgetpu_compiler failed \(exit 3\): ERROR: cannot open model$"),
])
def test_failures_are_one_line_and_leave_nothing(tmp_path, monkeypatch, int8, body, words):
    install(tmp_path, monkeypatch, body)
    with pytest.raises(CompilerError) as err:
        compile_model(int8, tmp_path / "out")
    assert re.match(words, err.value.message), err.value.message
    assert "\n" not in err.value.message and err.value.hint
    assert listing(tmp_path / "out") == []


def test_a_hang_without_a_fork_is_killed_and_leaves_nothing(tmp_path, monkeypatch, int8):
    install(tmp_path, monkeypatch, r'''
import signal
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only a SIGKILL ends it
shutil.copy(m, out)  # half-way: a model file exists when it is killed
print("Started a compilation timeout timer of 180 seconds.", flush=True)
time.sleep(3600)
''')
    with pytest.raises(CompilerError, match=r"timed out after 1 s \(killed\).*Started a compilation") as err:
        compile_model(int8, tmp_path / "out", timeout_s=1)
    assert "edgetpu_compiler -s MODEL" in err.value.hint
    assert listing(tmp_path / "out") == []


def test_a_compiler_that_is_not_executable(tmp_path, monkeypatch, int8):
    exe = install(tmp_path, monkeypatch, "pass")
    exe.chmod(0o644)
    with pytest.raises(CompilerError, match=r"is not an executable edgetpu_compiler: is not executable \(chmod"):
        find_compiler(str(exe))
    with pytest.raises(CompilerError, match="does not exist"):
        find_compiler(str(tmp_path / "missing" / "edgetpu_compiler"))
    monkeypatch.setenv("PATH", str(exe.parent))  # the only one on PATH cannot run
    result = compile_model(int8, tmp_path / "out")
    assert result.status == "not compiled" and "not executable (chmod +x it)" in result.reason
    assert str(tmp_path) not in result.reason  # it goes into the manifest


def test_a_compiler_of_another_kind_is_compiled_with_warnings(tmp_path, monkeypatch, model):
    """No version line and no counts: the model is kept, the user is told what is unknown."""
    exe = install(tmp_path, monkeypatch, "")
    exe.write_text(f"#!{sys.executable}\nimport os, shutil, sys\nd = sys.argv[sys.argv.index('--out_dir') + 1]\n"
                   "m = sys.argv[-1]\nshutil.copy(m, os.path.join(d, os.path.basename(m)[:-7] + '_edgetpu.tflite'))\n"
                   "print('ok')\n")
    int8 = model("small_int8")
    step = compile_for_edgetpu(int8, tmp_path / "out")
    assert step["status"] == "compiled" and step["compiler"]["tpu_ops"] is None
    assert any("no 'Edge TPU Compiler version' line" in w for w in step["warnings"])
    assert any("the Edge TPU share is unknown" in w for w in step["warnings"])
    step = compile_for_edgetpu(int8, tmp_path / "out2", min_tpu_ops=0.9)
    assert any("--min-tpu-ops 0.9 unchecked" in w for w in step["warnings"])
    # it copied its input: no edgetpu-custom-op, which the build says (run refuses it on a TPU)
    assert step["compiler"]["edgetpu_custom_op"] is False
    assert any("holds no edgetpu-custom-op" in w and "BUNDLE:int8" in w for w in step["warnings"])


def test_a_compiled_model_with_the_custom_op_raises_no_such_warning(tmp_path, monkeypatch, model):
    install(tmp_path, monkeypatch, "TOTAL = 1\n" + SUMMARY + r'''
with open(out, "wb") as f:
    f.write(open(m, "rb").read() + b"edgetpu-custom-op")
with open(log, "w") as f:
    f.write("Operator  Count  Status\nCONV_2D  1  Mapped to Edge TPU\n")
''')
    step = compile_for_edgetpu(model("small_int8"), tmp_path / "out")
    assert step["compiler"]["edgetpu_custom_op"] is True
    assert not any("edgetpu-custom-op" in w for w in step["warnings"])


def test_a_different_version_is_recorded(tmp_path, monkeypatch, int8):
    exe = install(tmp_path, monkeypatch, "TOTAL = 1\n" + SUMMARY + "shutil.copy(m, out)")
    exe.write_text(exe.read_text().replace("version 16.0.384591198", "version 2.1.302470888"))
    r = compile_model(int8, tmp_path / "out").report
    assert r["compiler_version"] == "2.1.302470888" and (r["total_ops"], r["tpu_ops"]) == (1, 1)


@pytest.mark.slow  # asserts on wall-clock time
def test_ctrl_c_kills_the_compiler_group(tmp_path, monkeypatch, int8):
    """A KeyboardInterrupt while compiling must not leave the compiler running."""
    pid_file = tmp_path / "pid"
    install(tmp_path, monkeypatch, f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(3600)")
    old = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            compile_model(int8, tmp_path / "out", timeout_s=30)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the compiler survived the interrupt")
    assert listing(tmp_path / "out") == []


@pytest.mark.parametrize(("script", "status", "words"), [
    ("print('Edge TPU Compiler version 16.0.384591198')", "ok", "Edge TPU Compiler version 16.0.384591198"),
    ("print('Edge TPU Compiler version 2.1.302470888')", "ok", "Edge TPU Compiler version 2.1.302470888"),
    ("print('usage: compile MODEL')", "warn", "does not print 'Edge TPU Compiler version': usage: compile MODEL"),
    ("import sys\nprint('line one')\nprint('line two', file=sys.stderr)\nsys.exit(2)", "warn",
     "--version fails: line one; line two"),
])
def test_doctor_reads_the_version_line_of_any_compiler(tmp_path, script, status, words):
    from edgekit.doctor.base import Env
    from edgekit.doctor.edgetpu import _compiler

    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "edgetpu_compiler"
    exe.write_text(f"#!{sys.executable}\n{script}\n")
    exe.chmod(0o755)
    check = _compiler(Env(path=str(bindir)))
    assert check.status.lower() == status and words in check.detail and "\n" not in check.detail


@pytest.mark.slow  # a real int8 build of the demo model (~5 s)
def test_a_build_reports_the_compilers_counts_not_the_prediction(tmp_path, monkeypatch, capsys):
    """The summary row and build.log said "TPU 11/11 predicted" although the compiler mapped 3 of 5."""
    from edgekit.bundle import load_bundle
    from edgekit.cli import main
    from tests.conftest import CALIB, DEMO_MODEL

    install(tmp_path, monkeypatch, "TOTAL = 5\n" + SUMMARY + r'''
shutil.copy(m, out)
with open(log, "w") as f:
    f.write("Operator  Count  Status\n--------  -----  ------\nCONV_2D  3  Mapped to Edge TPU\n"
            "FULLY_CONNECTED  1  More than one subgraph is not supported\nSOFTMAX  1  Operation not supported\n")
''')
    code = main(["build", "--model", str(DEMO_MODEL), "--target", "edgetpu", "--calib", str(CALIB),
                 "--out", str(tmp_path / "out"), "--quiet", "--calib-steps", "20"])
    out = capsys.readouterr().out
    assert code == 0 and "TPU 3/5 compiled" in out and "predicted" not in out
    bundle = load_bundle(tmp_path / "out" / "demo-edgetpu")
    compiler = bundle.manifest["edgetpu"]["compiler"]
    assert (compiler["tpu_ops"], compiler["total_ops"], compiler["input_model"]) == (3, 5, "demo_int8.tflite")
    log = (tmp_path / "out" / "demo-edgetpu" / "build.log").read_text()
    assert "(edgetpu_compiler: 3/5 on the TPU)" in log
    assert not list((tmp_path / "out" / "demo-edgetpu").glob(".edgetpu-*"))


def test_compiler_given_by_a_bare_name_is_looked_up_on_path(tmp_path, monkeypatch):
    exe = install(tmp_path, monkeypatch, "pass", name="my_edgetpu_compiler")
    monkeypatch.chdir(tmp_path)
    assert find_compiler("my_edgetpu_compiler") == str(exe.resolve())
    with pytest.raises(CompilerError, match="does not exist"):
        find_compiler("no_such_compiler")


def test_a_compiler_that_reports_on_stderr(tmp_path, monkeypatch, int8):
    exe = install(tmp_path, monkeypatch, "TOTAL = 3\n" + SUMMARY + r'''
shutil.copy(m, out)
print("Number of operations that will run on Edge TPU: 2")
print("Number of operations that will run on CPU: 1")
''')
    # every print of this stand-in goes to stderr, its banner included
    exe.write_text(exe.read_text().replace("import argparse, os, shutil, sys, time",
                                           "import argparse, os, shutil, sys, time\nsys.stdout = sys.stderr"))
    r = compile_model(int8, tmp_path / "out").report
    assert (r["compiler_version"], r["total_ops"], r["tpu_ops"], r["cpu_ops"]) == ("16.0.384591198", 3, 2, 1)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_out_dir_is_one_line(tmp_path, monkeypatch, int8):
    install(tmp_path, monkeypatch, "pass")
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        with pytest.raises(CompilerError, match="cannot write the compiled model into"):
            compile_model(int8, out)
    finally:
        out.chmod(0o755)


def test_an_out_dir_that_is_a_file_is_one_line(tmp_path, monkeypatch, int8):
    install(tmp_path, monkeypatch, "pass")
    (tmp_path / "file").write_text("x")
    with pytest.raises(CompilerError, match="cannot write the compiled model into .*file"):
        compile_model(int8, tmp_path / "file")
