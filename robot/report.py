"""The sign demo's end-of-run summary (``python -m robot.signs`` and ``--task detect``)."""

from __future__ import annotations

from typing import Any, TextIO


def print_report(report: Any, out: TextIO) -> None:
    """The end-of-run summary: labels said, frame rates delivered vs processed, stage latencies."""
    m, s = report.metrics, report.source
    print(f"said ({len(report.said)}): {' '.join(report.said) or '-'}", file=out)
    print(_frames_line(s), file=out)
    print(f"processed: {m.get('frames')} frames ({m.get('warmup')} warm-up), {m.get('fps', 0):.1f} fps; "
          f"model load {_ms(m.get('init_ms'))}, first inference {_ms(m.get('first_inference_ms'))}", file=out)
    print(f"{'stage':<13}{'count':>6}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}", file=out)
    stages = dict(m.get("stages", {}))
    stages["announce"] = report.announce
    for name, st in stages.items():
        if st and st.get("count"):
            print(f"{name:<13}{st['count']:>6}{st['p50_ms']:>9.3f}{st['p90_ms']:>9.3f}{st['p99_ms']:>9.3f}"
                  f"{st['max_ms']:>9.3f}", file=out)
    for err in report.errors:
        print(f"warning: {err}", file=out)


def _frames_line(source: dict[str, Any]) -> str:
    """Camera frame accounting; a source that delivered none (or is not a camera) says so plainly."""
    bad = source.get("undecodable")
    bad_text = f", undecodable {bad}" if bad else ""
    cam = source.get("camera_fps")
    if not cam:
        return (f"frames: no camera frame rate (received {source.get('received', 0)}, delivered "
                f"{source.get('delivered', 0)}{bad_text})" if source else "frames: n/a (the source keeps no counts)")
    return (f"frames: camera {cam:.1f} fps, received {source.get('received')}, delivered {source.get('delivered')}, "
            f"skipped {source.get('skipped')}{bad_text}")


def _ms(value: float | None) -> str:
    return f"{value:.1f} ms" if isinstance(value, (int, float)) else "n/a"
