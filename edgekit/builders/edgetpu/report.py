"""Read what ``edgetpu_compiler`` says (its stdout and ``<name>_edgetpu.log``) into a report dict.

The compiler prints memory use, subgraphs and op counts, and with ``--show_operations`` an
``Operator  Count  Status`` table; fixtures of real output are in ``tests/fixtures/edgetpu/``.
"""

from __future__ import annotations

import re
from typing import Any

MAPPED = "Mapped to Edge TPU"

_BYTES = re.compile(r"([\d.]+)\s*(B|KiB|MiB|GiB|KB|kB|MB|GB)\b")
# The compiler prints binary units (5.90MiB, 41.75KiB, 0.00B); decimal ones are read too.
_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "KB": 1000, "kB": 1000, "MB": 1000**2,
          "GB": 1000**3}
_FIELDS = {
    "input_model": r"^Input model: (.+)$",
    "output_model": r"^Output model: (.+)$",
    "operation_log": r"^Operation log: (.+)$",
}
_SIZES = {
    "input_size_bytes": r"^Input size: (.+)$",
    "output_size_bytes": r"^Output size: (.+)$",
    "on_chip_memory_used_bytes": r"^On-chip memory used for caching model parameters: (.+)$",
    "on_chip_memory_remaining_bytes": r"^On-chip memory remaining for caching model parameters: (.+)$",
    "off_chip_memory_used_bytes": r"^Off-chip memory used for streaming uncached model parameters: (.+)$",
}
_COUNTS = {
    "subgraphs": r"^Number of Edge TPU subgraphs: (\d+)",
    "total_ops": r"^Total number of operations: (\d+)",
    "reported_tpu_ops": r"^Number of operations that will run on Edge TPU: (\d+)",
    "reported_cpu_ops": r"^Number of operations that will run on CPU: (\d+)",
    "compile_ms": r"^Model compiled successfully in (\d+) ms",
}
_TABLE_HEADER = re.compile(r"^Operator\s+Count\s+Status\s*$", re.I)
_TABLE_ROW = re.compile(r"^([A-Za-z0-9_\-]+)\s+(\d+)\s+(\S.*?)\s*$")
_TABLE_RULE = re.compile(r"^[-=+|:\s]+$")  # a ruler under the header ("-----  -----  ------")
_MAPPED_STATUS = re.compile(r"^mapped to edge\s?tpu\b", re.I)
# Printed when some ops fall back; without readable counts it still rules out "all mapped".
_FALLBACK = re.compile(r"not all operations are supported by the Edge TPU", re.I)


def parse_bytes(text: str) -> int | None:
    """``"5.90MiB"`` -> bytes (the compiler's unit style); None if unparseable."""
    m = _BYTES.search(text)
    return int(round(float(m.group(1)) * _UNITS[m.group(2)])) if m else None


def _file_name(path: str) -> str:
    """The last component of a path the compiler printed (POSIX or Windows separators)."""
    return re.split(r"[\\/]", path.strip())[-1]


def _last(pattern: str, text: str) -> re.Match | None:
    """The last match of a multi-line ``pattern`` in ``text``, or None."""
    matches = list(re.finditer(pattern, text, re.M))
    return matches[-1] if matches else None


def is_mapped(status: str) -> bool:
    """True for the status "Mapped to Edge TPU" (any case or spacing a re-implementation may print)."""
    return bool(_MAPPED_STATUS.match(" ".join(status.split())))


def has_operation_table(text: str) -> bool:
    """True when ``text`` holds an ``Operator  Count  Status`` header (rows readable or not)."""
    return any(_TABLE_HEADER.match(_cells(line)) for line in text.splitlines())


def _cells(line: str) -> str:
    """A table line with ``|`` cell borders and outer blanks removed."""
    return line.replace("|", " ").strip()


def parse_operation_table(text: str) -> list[dict[str, Any]]:
    """Rows of the compiler's ``Operator  Count  Status`` table (stdout with -s, or the .log)."""
    rows: list[dict[str, Any]] = []
    in_table = False
    for raw in text.splitlines():
        line = _cells(raw)
        if _TABLE_HEADER.match(line):
            in_table, rows = True, []  # the last table wins (stdout may repeat the log's)
            continue
        if not in_table or not line or _TABLE_RULE.match(raw):
            continue
        m = _TABLE_ROW.match(line)
        if not m:
            in_table = False
            continue
        status = " ".join(m.group(3).split())
        rows.append({"op": m.group(1), "count": int(m.group(2)), "status": status, "on_tpu": is_mapped(status)})
    return rows


def parse_compiler_output(stdout: str, log_text: str | None = None) -> dict[str, Any]:
    """Structure the compiler's stdout (and its ``.log``) into a report dict.

    Keys: ``compiler_version``, ``input_model``, ``output_model``, ``*_size_bytes``,
    ``on_chip_memory_used_bytes``, ``on_chip_memory_remaining_bytes``,
    ``off_chip_memory_used_bytes``, ``subgraphs``, ``total_ops``, ``tpu_ops``,
    ``cpu_ops``, ``operations`` (rows of the Operator/Count/Status table), ``all_mapped``.

    The compiler prints the "will run on Edge TPU/CPU" counts only when some ops fall
    back; otherwise the counts come from the table, or (no table) all ops are mapped. A
    table whose rows cannot be read, or the fallback paragraph without counts, leaves
    ``tpu_ops``/``cpu_ops`` None (unknown) rather than claiming every op is mapped.
    Paths the compiler printed are reduced to file names (no host paths in a manifest).
    """
    report: dict[str, Any] = {}
    m = re.search(r"Edge TPU Compiler version (\S+)", stdout) or (
        re.search(r"Edge TPU Compiler version (\S+)", log_text) if log_text else None
    )
    report["compiler_version"] = m.group(1) if m else None
    # With --search_delegate the compiler prints one summary per attempt: the last is the model written.
    for key, pattern in _FIELDS.items():
        m = _last(pattern, stdout)
        report[key] = _file_name(m.group(1)) if m else None
    for key, pattern in _SIZES.items():
        m = _last(pattern, stdout)
        report[key] = parse_bytes(m.group(1)) if m else None
    for key, pattern in _COUNTS.items():
        m = _last(pattern, stdout)
        report[key] = int(m.group(1)) if m else None
    rows = parse_operation_table(log_text or "") or parse_operation_table(stdout)
    report["operations"] = rows
    table_tpu = sum(r["count"] for r in rows if r["on_tpu"])
    table_total = sum(r["count"] for r in rows)
    total = report["total_ops"] if report["total_ops"] is not None else (table_total or None)
    reported = report.pop("reported_tpu_ops")
    report.pop("reported_cpu_ops")
    if reported is not None:
        tpu = reported
    elif rows:
        tpu = table_tpu
    elif has_operation_table(log_text or "") or has_operation_table(stdout) or _FALLBACK.search(stdout):
        tpu = None  # a table or a fallback paragraph we could not read: unknown, not "all mapped"
    else:
        tpu = total  # the compiler is silent about fallback only when everything maps
    report["total_ops"] = total
    report["tpu_ops"] = tpu
    report["cpu_ops"] = (total - tpu) if total is not None and tpu is not None else None
    report["all_mapped"] = bool(total) and tpu == total
    return report


def report_warnings(report: dict[str, Any], checked: bool) -> list[str]:
    """What a compiled model's report says the user should know: streamed parameters, and a
    report edgekit could not read (a compiler other than Coral's, or a new output format)."""
    warnings = []
    if not report.get("compiler_version"):
        warnings.append("edgetpu_compiler printed no 'Edge TPU Compiler version' line: is it Coral's compiler?")
    if report.get("edgetpu_custom_op") is False:  # the real compiler wraps every mapped op in one
        warnings.append("the compiled model holds no edgetpu-custom-op: nothing in it runs on the Edge TPU "
                        "(a stand-in compiler that copied its input?); run the plain int8 model: BUNDLE:int8")
    if (report.get("tpu_ops") is None or not report.get("total_ops")) and not checked:
        warnings.append("edgetpu_compiler's output gave no readable op counts: the Edge TPU share is unknown")
    off_chip = report.get("off_chip_memory_used_bytes") or 0
    if off_chip:
        warnings.append(
            f"{off_chip / 1024**2:.2f} MiB of parameters stream from the host on every inference "
            "(they do not fit the on-chip cache)"
        )
    return warnings
