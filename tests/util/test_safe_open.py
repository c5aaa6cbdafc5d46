"""edgekit.util.safe_open: regular files only, never a hang on a FIFO, never through a link when asked."""

from __future__ import annotations

import fcntl
import os

import pytest

from edgekit.util.safe_open import NotARegularFile, check_regular, open_regular, read_regular


def test_a_regular_file_reads_in_blocking_mode(tmp_path):
    path = tmp_path / "f.txt"
    path.write_bytes(b"hello")
    with open_regular(path) as f:
        assert not fcntl.fcntl(f.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK
        assert f.read() == b"hello"
    assert read_regular(path, 3) == b"hell"  # limit + 1: the caller sees it is too large
    link = tmp_path / "link"
    link.symlink_to(path)
    assert read_regular(link, 10) == b"hello"  # a user's link (/etc/ssl/certs) is followed by default


@pytest.mark.parametrize(("make", "kind"), [
    (lambda p: os.mkfifo(p), "a FIFO (named pipe)"),
    (lambda p: p.mkdir(), "a directory"),
    (lambda p: p.symlink_to("/dev/null"), "a character device"),
])
def test_anything_else_is_refused_at_once(tmp_path, make, kind):
    path = tmp_path / "x"
    make(path)
    with pytest.raises(NotARegularFile) as err:
        check_regular(path)
    assert str(err.value) == f"{path} is {kind}, not a regular file" and isinstance(err.value, OSError)


def test_no_follow_refuses_a_link_and_missing_files_keep_their_error(tmp_path):
    (tmp_path / "f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    with pytest.raises(NotARegularFile, match="a symbolic link"):
        check_regular(tmp_path / "link", follow=False)
    with pytest.raises(FileNotFoundError):
        check_regular(tmp_path / "missing")
