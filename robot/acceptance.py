"""Score a sign-demo run against the truth: per-item latency, misses, false announcements.

``truth.csv`` names what each image of a ``--fake DIR`` folder shows, one row per image:

    file,label
    0000.png,background
    0001.png,bag

(an empty label means background; images not listed count as background). Each image is
streamed ``--hold`` times, so frame ``k`` of the run shows image ``k // hold``. An *item* is a
run of frames with the same non-background label. An announcement of that label while it is
up, or within ``rearm_s`` + 1 s after it (speech lags the camera), is a hit (the first) or a
repeat (any later one); any other announcement is false. False announcements are also counted
per minute of plain scene, the rate a user of the robot notices.
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from edgekit.errors import UsageError
from edgekit.imaging.image import IMAGE_SUFFIXES


def frame_truth(truth_csv: str | Path, folder: str | Path, hold: int) -> list[str]:
    """The label of every streamed frame, in order ('' for background)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"--truth needs --fake to be an image folder; {folder} is not one")
    files = sorted(p.name for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    try:
        with open(truth_csv, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise UsageError(f"cannot read {truth_csv}: {exc.strerror}") from exc
    if rows and not {"file", "label"} <= set(rows[0]):
        raise UsageError(f"{truth_csv} needs the columns file,label", "first line: file,label")
    labels = {row["file"]: (row["label"] or "").strip() for row in rows}
    unknown = sorted(set(labels) - set(files))
    if unknown:
        raise UsageError(f"{truth_csv} names {len(unknown)} file(s) not in {folder}, e.g. {unknown[0]}")
    return [labels.get(name, "") for name in files for _ in range(max(1, hold))]


def items_of(truth: Sequence[str], background: str) -> list[tuple[str, int, int]]:
    """``(label, first frame, last frame)`` of every run of one non-background label."""
    items: list[tuple[str, int, int]] = []
    for k, label in enumerate(truth):
        label = "" if label == background else label
        if label and items and items[-1][0] == label and items[-1][2] == k - 1:
            items[-1] = (label, items[-1][1], k)
        elif label:
            items.append((label, k, k))
    return items


def score_run(announcements: Sequence[Any], truth: Sequence[str], fps: float, background: str = "background",
              rearm_s: float = 0.5) -> dict[str, Any]:
    """Match announcements (``.label``, ``.frame`` 1-based, ``.t_ns``, ``.t_capture_ns``) to the truth."""
    items = items_of(truth, background)
    grace = int(round((rearm_s + 1.0) * fps))
    said: list[list[Any]] = [[] for _ in items]
    false: list[dict[str, Any]] = []
    for a in announcements:
        k = a.frame - 1  # the source counts images from 1
        match = next((i for i, (label, first, last) in enumerate(items)
                      if first <= k <= last + grace and label == a.label), None)
        if match is None:
            up = next((label for label, first, last in items if first <= k <= last), background)
            false.append({"frame": a.frame, "said": a.label, "truth": up})
        else:
            said[match].append(a)
    rows, confusion = [], Counter()
    for (label, first, _last), hits in zip(items, said, strict=True):
        row: dict[str, Any] = {"label": label, "first_frame": first + 1, "said": len(hits), "latency_s": None}
        if hits:
            # frames waited at the camera's rate, plus the pipeline's own delay on the frame that triggered it
            a = hits[0]
            delay = max(0, a.t_ns - a.t_capture_ns) / 1e9 if a.t_capture_ns else 0.0
            row["latency_s"] = round((a.frame - 1 - first) / fps + delay, 3)
        rows.append(row)
        confusion[(label, label if hits else "(missed)")] += 1
    for f in false:
        confusion[(f["truth"], f["said"])] += 1
    plain = sum(1 for label in truth if not label or label == background)
    on_plain = sum(1 for f in false if f["truth"] == background)
    minutes = plain / fps / 60
    return {
        "items": rows,
        "missed": sum(1 for r in rows if r["said"] == 0),
        "repeated": sum(max(0, r["said"] - 1) for r in rows),
        "false": false,
        "false_on_background": on_plain,
        "background_s": round(plain / fps, 2),
        "false_per_min_background": round(on_plain / minutes, 3) if minutes else None,
        "confusion": [{"truth": t, "said": s, "count": n} for (t, s), n in sorted(confusion.items())],
    }


def print_acceptance(acc: dict[str, Any], out: TextIO) -> None:
    """The acceptance summary: one line per item, then misses, repeats, false rate, confusion."""
    print("acceptance (--truth):", file=out)
    for i, row in enumerate(acc["items"], 1):
        got = f"said after {row['latency_s']:.2f} s" if row["said"] else "MISSED"
        extra = f" (said {row['said']} times)" if row["said"] > 1 else ""
        print(f"  item {i:>3} {row['label']:<14} from frame {row['first_frame']:>5}: {got}{extra}", file=out)
    lat = sorted(r["latency_s"] for r in acc["items"] if r["latency_s"] is not None)
    if lat:
        print(f"  latency to announcement: p50 {lat[len(lat) // 2]:.2f} s, max {lat[-1]:.2f} s", file=out)
    rate = acc["false_per_min_background"]
    print(f"  items {len(acc['items'])}, missed {acc['missed']}, repeated {acc['repeated']}; false announcements "
          f"{len(acc['false'])} ({acc['false_on_background']} on {acc['background_s']:.1f} s of background: "
          f"{'n/a' if rate is None else f'{rate:.2f}'} per minute)", file=out)
    print("  confusion (truth -> said: count): " + ", ".join(
        f"{c['truth']} -> {c['said']}: {c['count']}" for c in acc["confusion"]), file=out)
