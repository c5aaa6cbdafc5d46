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
