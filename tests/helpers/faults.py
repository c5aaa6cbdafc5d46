"""What every fault case asserts: a clean refusal, nothing left behind.

A clean refusal is the exit code (2 unless said otherwise), exactly one ``error:`` line, a
``fix:`` line right after it (argparse's own errors carry the ``usage:`` line instead), and no
Python traceback anywhere in the output. "Nothing left behind" is checked on the directories
a case names and on a private system temp dir (``tempfile.tempdir`` and ``TMPDIR`` point into
the case's ``tmp_path``, so other processes' temp files never count): what is there after
the command must have been there before, or be what the command was meant to write.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from edgekit.cli import main


@dataclass
class Outcome:
    """What one command did: its exit code, stdout and stderr."""

    code: int
    out: str
    err: str
    usage: bool = False  # argparse refused it (exit 2 with a usage line)

    @property
    def text(self) -> str:
        return self.out + self.err

    def error_line(self) -> str:
        """The one ``error:`` line (asserts there is exactly one)."""
        lines = [line for line in self.err.splitlines() if "error:" in line]
        assert len(lines) == 1, f"expected one error line, got {len(lines)}:\n{self.err}"
        return lines[0]


# Not ours: a session-id file a library writes to the temp dir once, and the code TensorFlow's
# autograph generates (removed at exit: tensorflow/python/autograph/pyct/loader.py registers it).
_LIBRARY_FILES = {".ses"}
_LIBRARY_PREFIXES = ("__autograph_generated_file",)


def snapshot(*dirs: Path) -> set[str]:
    """Every path under ``dirs`` and the system temp dir (recursively)."""
    seen: set[str] = set()
    for d in (*dirs, Path(tempfile.gettempdir())):
        if d.exists():
            seen.update(str(p) for p in d.rglob("*")
                        if p.name not in _LIBRARY_FILES and not p.name.startswith(_LIBRARY_PREFIXES))
    return seen


def edgekit(capsys, *argv: str) -> Outcome:
    """Run ``edgekit ARGV`` in this process (much faster than a subprocess)."""
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
        usage = False
    except SystemExit as exc:  # argparse: bad flag or value
        code, usage = int(exc.code or 0), True
    captured = capsys.readouterr()
    return Outcome(code, captured.out, captured.err, usage)


def assert_refused(result: Outcome, *needles: str, code: int = 2) -> str:
    """A clean refusal: exit ``code``, one error line (holding every needle), a fix, no traceback."""
    assert "Traceback" not in result.text, result.text
    assert result.code == code, f"exit {result.code}, expected {code}:\n{result.text}"
    line = result.error_line()
    lines = result.err.splitlines()
    after = lines[lines.index(line) + 1 :]
    if result.usage:
        assert "usage:" in result.err, result.err
    else:
        assert after and after[0].strip().startswith("fix:"), f"no fix line after the error:\n{result.err}"
    for needle in needles:
        assert needle.lower() in line.lower(), f"{needle!r} not in {line!r}"
    return line


def assert_nothing_left(before: set[str], *dirs: Path, allowed: tuple[Path, ...] = ()) -> None:
    """No new path under ``dirs`` or the system temp dir, except under ``allowed``."""
    after = snapshot(*dirs)
    new = sorted(p for p in after - before if not any(p == str(a) or p.startswith(str(a) + os.sep)
                                                        for a in allowed))
    assert not new, f"left behind: {new}"
