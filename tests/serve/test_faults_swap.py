"""Fault catalogue 2 (issue 29), hot-swap: no silent swap, no frozen watcher.

A model file replaced under an unchanged ``edgekit.json`` is refused and counted live, in the
words a restart uses; a watched path turned into a directory that is not a bundle is refused
and counted (was: "does not exist", uncounted); a FIFO in a watched bundle is refused at once
and the watcher goes on to swap the next good bundle (against a real ``edgekit serve --watch``);
a check that hangs is abandoned at its deadline as a counted, logged refusal; a bundle that
changes the task or the labels is refused unless ``allow_task_change``.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edgekit.bundle import MANIFEST, BundleWriter, load_bundle
from edgekit.errors import BundleError
from edgekit.serve.daemon import Daemon
from tests.helpers.detector_model import detector_bundle
from tests.helpers.waiting import wait_until
from tests.runtime.test_adapters import write_bundle
from tests.serve.test_daemon import running
from tests.serve.test_swap import copy_bundle, flip, manifest_sha, swap_config


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    """Two good classifier bundles (float and int8 LiteRT models, labels a..e) for target cpu."""
    from tests.helpers import tflite_models

    d = tmp_path_factory.mktemp("swapfaults")
    models = {"fp32": tflite_models.model_path("small_float", d), "int8": tflite_models.model_path("small_int8", d)}
    return {"v1": write_bundle(d / "v1", {"fp32": models["fp32"]}),
            "v2": write_bundle(d / "v2", {"int8": models["int8"]}), "int8": models["int8"]}


def _age(path: Path, seconds: float = 120) -> None:
    """Files as a finished copy leaves them (``cp -p``): not being written now."""
    past = time.time() - seconds
    for f in [path, *path.rglob("*")]:
        os.utime(f, (past, past), follow_symlinks=False)


def _refusals(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "hot-swap refused" in r.getMessage()]


def _served(daemon: Daemon, n: int = 5) -> None:
    before = daemon.stats()["frames"]["processed"]
    wait_until(lambda: daemon.stats()["frames"]["processed"] >= before + n, timeout=10)


def test_a_model_file_replaced_under_an_unchanged_manifest_is_refused_as_at_a_restart(tmp_path, bundles, caplog):
    live = copy_bundle(bundles["v1"], tmp_path / "live", age_s=120)
    link = tmp_path / "bundle"
    link.symlink_to(live)
    daemon = Daemon(swap_config(tmp_path, link))
    caplog.set_level(logging.INFO, logger="edgekit")
    with running(daemon):
        _served(daemon)
        model = next(live.glob("*.tflite"))
        os.utime(model)  # touched, same bytes: nothing to do
        wait_until(lambda: any("unchanged" in r.getMessage() for r in caplog.records), timeout=10)
        assert daemon.stats()["swaps"]["refused"] == 0
        data = bytearray(model.read_bytes())
        data[len(data) // 2] ^= 0xFF  # same size, other bytes: what "unchanged; nothing to do" let through
        model.write_bytes(bytes(data))
        _age(live)
        wait_until(lambda: daemon.stats()["swaps"]["refused"] == 1, timeout=10)
        _served(daemon)
        stats = daemon.stats()
    [line] = _refusals(caplog)
    assert "does not match its sha256" in line and model.name in line
    assert stats["model"]["sha256"] == manifest_sha(bundles["v1"]) and stats["health"]["ready"] == 1
    with pytest.raises(BundleError, match="does not match its sha256"):  # a restart says the same
        load_bundle(link)


def test_a_watched_path_turned_into_another_directory_is_not_a_bundle_and_counted(tmp_path, bundles, caplog):
    link = tmp_path / "bundle"
    link.symlink_to(bundles["v1"])
    empty, notes = tmp_path / "empty", tmp_path / "notes"
    empty.mkdir()
    notes.mkdir()
    (notes / "README.txt").write_text("not a bundle\n")
    _age(notes)
    daemon = Daemon(swap_config(tmp_path, link))
    caplog.set_level(logging.INFO, logger="edgekit")
    with running(daemon):
        _served(daemon)
        for n, directory in enumerate((empty, notes), start=1):
            flip(link, directory)
            wait_until(lambda n=n: daemon.stats()["swaps"]["refused"] == n, timeout=10)
        flip(link, bundles["v2"])  # the watcher carries on
        wait_until(lambda: daemon.stats()["swaps"]["ok"] == 1, timeout=10)
    refusals = _refusals(caplog)
    assert len(refusals) == 2 and all("not an edgekit bundle" in r for r in refusals), refusals
    assert not any("does not exist" in r.getMessage() for r in caplog.records)


def test_a_check_that_hangs_is_a_counted_refusal_and_the_watcher_goes_on(tmp_path, bundles, caplog):
    link = tmp_path / "bundle"
    link.symlink_to(bundles["v1"])
    daemon = Daemon(swap_config(tmp_path, link))
    caplog.set_level(logging.INFO, logger="edgekit")
    release = threading.Event()
    with running(daemon):
        swap = daemon._swap
        swap._deadline = 0.5  # the default (CHECK_DEADLINE_S) leaves room for a TensorRT engine build
        opener = swap.opener

        def hanging(path):  # a runtime open blocked on a device (or a file that never ends)
            release.wait(30)
            return opener(path)

        swap.opener = hanging
        _served(daemon)
        flip(link, copy_bundle(bundles["v2"], tmp_path / "v2-stuck"))
        wait_until(lambda: daemon.stats()["swaps"]["refused"] == 1, timeout=10)
        _served(daemon)  # frames kept flowing on the running model
        swap.opener = opener
        release.set()  # the abandoned check finishes late: what it opened is closed, never installed
        flip(link, copy_bundle(bundles["v2"], tmp_path / "v2-good"))
        wait_until(lambda: daemon.stats()["swaps"]["ok"] == 1, timeout=10)
        stats = daemon.stats()
    [line] = _refusals(caplog)
    assert "did not finish within 0.5 s" in line
    assert stats["swaps"]["refused"] == 1 and stats["model"]["sha256"] == manifest_sha(bundles["v2"])


def test_a_bundle_that_changes_the_task_or_the_labels_is_refused_unless_allowed(tmp_path, bundles, caplog):
    relabelled = tmp_path / "relabelled"
    with BundleWriter(relabelled) as w:
        shutil.copy(bundles["int8"], w.dir / "m.tflite")
        (w.dir / "labels.txt").write_text("a\nb\nx\nd\ne\n")
        m = load_bundle(bundles["v2"]).manifest
        w.commit({**{k: v for k, v in m.items() if k not in ("files", "format_version")},
                  "models": [{**m["models"][0], "file": "m.tflite"}]})
    detector = detector_bundle(tmp_path / "detector")
    link = tmp_path / "bundle"
    link.symlink_to(bundles["v1"])
    daemon = Daemon(swap_config(tmp_path, link))
    caplog.set_level(logging.INFO, logger="edgekit")
    with running(daemon):
        _served(daemon)
        for n, bundle in enumerate((detector, relabelled), start=1):
            flip(link, bundle)
            wait_until(lambda n=n: daemon.stats()["swaps"]["refused"] == n, timeout=20)
        # [model] allow_task_change = true (the config key lives in serve/config/load.py)
        daemon._swap._allow_task_change = True
        daemon.request_reload("test")  # refused before and unchanged: still refused
        time.sleep(0.3)
        flip(link, copy_bundle(relabelled, tmp_path / "relabelled-2"))
        wait_until(lambda: daemon.stats()["swaps"]["ok"] == 1, timeout=10)
    task, labels = _refusals(caplog)
    assert "changes the task from classify to detect" in task and "allow_task_change" in task
    assert "changes the labels (5 -> 5, first difference: 2: 'c' -> 'x')" in labels


# ---- a FIFO under a real `edgekit serve --watch` ---------------------------------------------------------------

def _fifo_bundles(tmp_path: Path, good: Path) -> list[tuple[Path, str]]:
    """Bundles holding a FIFO where a file belongs, with what each refusal says."""
    out = []
    for name, words in (("labels.txt", "is not a regular file"), (MANIFEST, "not an edgekit bundle")):
        b = copy_bundle(good, tmp_path / f"fifo-{name}")
        (b / name).unlink()
        os.mkfifo(b / name)
        _age(b)
        out.append((b, words))
    return out


@pytest.mark.slow
def test_a_fifo_in_a_watched_bundle_never_freezes_edgekit_serve(tmp_path, bundles):
    """Was: the watcher blocked for good on the FIFO (no log, no count; later bundles ignored)."""
    link = tmp_path / "bundle"
    link.symlink_to(bundles["v1"])
    out, log = tmp_path / "results.jsonl", tmp_path / "serve.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "edgekit.cli", "serve", str(link), "--watch", "--camera",
             "synthetic:64x48@30", "--output", str(out), "--http", "off", "--log-level", "info"],
            stderr=err, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=tmp_path)
    try:
        wait_until(lambda: out.exists() and out.stat().st_size > 0, timeout=60)
        for n, (bundle, words) in enumerate(_fifo_bundles(tmp_path, bundles["v2"]), start=1):
            flip(link, bundle)
            wait_until(lambda n=n: log.read_text().count("hot-swap refused") == n, timeout=20)
            assert words in log.read_text().splitlines()[-1] or words in log.read_text()
        flip(link, bundles["v2"])  # the watcher is alive: the next good bundle goes in
        wait_until(lambda: "hot-swap done" in log.read_text(), timeout=20)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert proc.returncode == 0, text
    assert "Traceback" not in text and text.count("hot-swap refused") == 2
