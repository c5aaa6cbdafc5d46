"""open_runtime: a bundle's adapter and options, entry overrides, and --backend selection."""

from __future__ import annotations

import pytest

from edgekit.errors import BackendUnavailable, UsageError
from edgekit.runtime import open_runtime


def test_jetson_bundle_wants_tensorrt_and_says_how_to_get_it(demo_bundles):
    with pytest.raises(BackendUnavailable) as info:
        open_runtime(demo_bundles["jetson"].bundle)
    assert "JetPack" in info.value.hint


def test_backend_swaps_the_adapter_for_its_format_only(demo_bundles):
    with open_runtime(demo_bundles["jetson"].bundle, backend="onnxruntime") as rt:
        d = rt.describe()
        assert d["backend"] == "onnxruntime" and d["providers_used"] == ["CPUExecutionProvider"]
        assert d["model"] == "demo_fp16.onnx"
    # a TFLite bundle ignores an ONNX backend: one bench command can mix both kinds
    with open_runtime(demo_bundles["cpu"].bundle, backend="onnxruntime") as rt:
        assert rt.describe()["backend"] == "ai_edge_litert"


def test_entry_options_and_user_overrides(demo_bundles):
    # the edgetpu bundle's plain int8 model says xnnpack even though the bundle says edgetpu
    with open_runtime(demo_bundles["edgetpu"].bundle) as rt:
        assert rt.describe()["delegate_requested"] == "xnnpack"
    with open_runtime(demo_bundles["cpu"].bundle, model="int8", delegate="none", num_threads=1) as rt:
        d = rt.describe()
        assert d["delegate_requested"] == "none" and d["delegated_nodes"] == 0 and d["num_threads"] == 1


def test_unknown_backend(demo_bundles):
    with pytest.raises(UsageError, match="unknown backend"):
        open_runtime(demo_bundles["cpu"].bundle, backend="tpu-magic")


def test_bundle_cannot_name_an_arbitrary_adapter(demo_bundles, tmp_path):
    import json
    import shutil

    from edgekit.errors import BundleError

    copy = tmp_path / "b"
    shutil.copytree(demo_bundles["cpu"].bundle, copy)
    manifest = json.loads((copy / "edgekit.json").read_text())
    manifest["runtime"]["adapter"] = "os:system"
    (copy / "edgekit.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="unknown runtime adapter"):
        open_runtime(copy)


def test_run_verb_never_imports_the_build_side():
    import subprocess
    import sys

    code = ("import sys; from edgekit.cli import main\n"
            "try:\n    main(['run', '--help'])\nexcept SystemExit:\n    pass\n"
            "print([m for m in sys.modules if m.startswith('edgekit.builders') or m in ('tensorflow', 'keras')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("argv,message", [
    (["bench", "{cpu}", "--frames", "0"], "must be at least 1"),
    (["bench", "{cpu}", "--json", "/nonexistent-dir/x.json"], "/nonexistent-dir does not exist"),
    (["run", "{cpu}", "--camera", "synthetic", "--top-k", "0"], "must be at least 1"),
])
def test_bench_and_run_refuse_bad_numbers_and_paths(demo_bundles, capsys, argv, message):
    from edgekit.cli import main

    argv = [a.replace("{cpu}", str(demo_bundles["cpu"].bundle)) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse reports type errors itself, with exit code 2
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_backend_table_rows_name_importable_adapters_and_formats():
    from edgekit.runtime import BACKENDS
    from edgekit.util.plugins import resolve

    assert list(BACKENDS) == ["litert", "onnxruntime", "onnxruntime-cuda", "onnxruntime-trt", "tensorrt", "rknn-lite",
                             "rknn-sim", "imx500"]
    for name, row in BACKENDS.items():
        assert row.formats and row.install_hint, name
        assert isinstance(resolve(row.adapter), type), name  # adapter modules import without their library


def test_bundle_cannot_name_a_function_of_an_adapter_module(demo_bundles, tmp_path):
    import json
    import shutil

    from edgekit.errors import BundleError

    copy = tmp_path / "b"
    shutil.copytree(demo_bundles["cpu"].bundle, copy)
    manifest = json.loads((copy / "edgekit.json").read_text())
    # the module is an adapter's, the attribute is not an adapter: only rows of the table may be named
    manifest["runtime"]["adapter"] = "edgekit.runtime.litert:load_edgetpu_delegate"
    (copy / "edgekit.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="unknown runtime adapter"):
        open_runtime(copy)


def test_run_refuses_a_flag_the_adapter_does_not_take_and_accepts_flags_not_given(demo_bundles, capsys):
    from edgekit.cli import main

    cpu = str(demo_bundles["cpu"].bundle)
    assert main(["run", cpu, "--camera", "synthetic", "--max-frames", "2", "--providers", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "LiteRTRuntime takes no option 'providers'" in err and "Traceback" not in err
    assert main(["run", cpu, "--camera", "synthetic", "--max-frames", "2", "--threads", "1"]) == 0
