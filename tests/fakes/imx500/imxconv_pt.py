"""Fake ``imxconv-pt -i MODEL.onnx -o DIR``: packerOut.zip and MODEL_MemoryReport.json in DIR."""

import json
import os
import sys
from pathlib import Path

args = sys.argv[1:]
src, out = Path(args[args.index("-i") + 1]), Path(args[args.index("-o") + 1])
assert src.read_bytes() == b"fake quantised onnx", src
print("FAKE IMX CALL " + json.dumps(["imxconv-pt", src.name]), file=sys.stderr)
out.mkdir(parents=True, exist_ok=True)
(out / "packerOut.zip").write_bytes(b"PK fake packer")
fits = os.environ.get("FAKE_IMX_FIT", "1") == "1"
report = {"Memory Report": {"Name": src.stem, "Memory Usage": "234.16KB" if fits else "9.50MB",
                            "Total Memory Available On Chip": "8.00MB", "Memory Utilization": "3%" if fits else "119%",
                            "Fit In Chip": fits}}
(out / f"{src.stem}_MemoryReport.json").write_text(json.dumps(report, indent=2))
