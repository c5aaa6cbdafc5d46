"""docs/design.md stays true: every room its layout names exists, and every package and top-level
module of edgekit/ is named there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = (ROOT / "docs" / "design.md").read_text()
LAYOUT = DESIGN.split("## Rooms", 1)[1].split("```", 2)[1]


def named_rooms() -> set[str]:
    """The paths in the layout block: 'edgekit/' then its indented entries (two spaces), the entries of
    a package indented under it (four: 'builders/' then 'gate/'), and top-level folders."""
    rooms, parent, package = set(), "", ""
    for line in LAYOUT.splitlines():
        match = re.match(r"^( *)(\S+)", line)
        if not match or not match.group(2).endswith(("/", ".py")):
            continue
        depth, name = len(match.group(1)), match.group(2)
        if depth == 0:
            parent = name if name == "edgekit/" else ""
            package = ""
            rooms.add(name)
        elif depth == 2 or not package:
            package = parent + name if name.endswith("/") else ""
            rooms.add(parent + name)
        else:
            rooms.add(package + name)
    return rooms


def test_every_room_the_design_names_exists():
    missing = sorted(r for r in named_rooms() if not (ROOT / r).exists())
    assert missing == []


def test_every_package_and_top_level_module_is_named():
    top = {f"edgekit/{p.name}/" for p in (ROOT / "edgekit").iterdir() if p.is_dir() and not p.name.startswith("__")}
    top |= {f"edgekit/{p.name}" for p in (ROOT / "edgekit").glob("*.py")}
    mentioned = named_rooms() | set(re.findall(r"edgekit/[\w/]+\.py|[\w]+\.py", DESIGN))
    unnamed = sorted(t for t in top if t not in mentioned and t.rsplit("/", 1)[-1] not in mentioned)
    assert unnamed == [], "name them in docs/design.md"


def test_the_tables_it_points_at_are_where_it_says():
    for symbol, path in re.findall(r"`(\w+)` in `(edgekit/[\w/]+\.py)`", DESIGN):
        assert re.search(rf"^{symbol}\b", (ROOT / path).read_text(), re.M), f"{symbol} is not defined in {path}"


def test_every_module_the_data_paths_name_exists():
    named = re.findall(r"`((?:builders|serve|detect|runtime|camera|commands|tflite|vector|doctor)/\w+\.py)`", DESIGN)
    assert named and [m for m in named if not (ROOT / "edgekit" / m).is_file()] == []
