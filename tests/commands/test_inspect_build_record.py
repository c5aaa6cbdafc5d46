"""inspect shows what the build did to a bundle's model and measured of it (edgekit.json)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_inspect_names_the_rewrites_and_the_measured_speed(demo_bundles):
    bundle = demo_bundles["cpu"].bundle
    manifest = json.loads((bundle / "edgekit.json").read_text())
    entry = next(m for m in manifest["models"] if m["name"] == "int8")
    entry["rewrites"] = [{"op": "HARD_SWISH", "count": 3, "into": "x * RELU6(x + 3) / 6"}]
    edited = bundle.parent / "demo-cpu-edited"
    import shutil

    shutil.copytree(bundle, edited)
    (edited / "edgekit.json").write_text(json.dumps(manifest))
    out = subprocess.run([sys.executable, "-m", "edgekit.cli", "inspect", f"{edited}:int8"], capture_output=True,
                         text=True)
    speed = entry["speed"]
    assert "rewritten before int8: HARD_SWISH x3 into x * RELU6(x + 3) / 6" in out.stdout, out.stderr
    assert f"p50 {speed['p50_ms']} ms ({speed['vs_fp32']}x fp32)" in out.stdout
