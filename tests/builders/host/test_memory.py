"""A build's memory does not grow with its images: spooled images, chunked reference outputs and
verification, and the up-front check that refuses what cannot fit (issue 19)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgekit.builders.gate.verify import Comparison, compare
from edgekit.builders.host.resources import (
    GB,
    OVERRIDE_FLAG,
    available_memory,
    check_memory,
    chunk_size,
    estimate_memory,
)
from edgekit.builders.sources.spool import Spool
from edgekit.errors import UsageError
from tests.conftest import CALIB, ROOT


def test_spool_reads_back_rows_in_any_order_and_in_chunks():
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 256, (11, 5, 4, 3), dtype=np.uint8)
    spool = Spool()
    for row in rows:
        spool.append(row)
    assert len(spool) == 11 and spool.shape == (5, 4, 3)
    np.testing.assert_array_equal(spool.read([3, 4, 5]), rows[3:6])  # one read for a run
    np.testing.assert_array_equal(spool.read([7, 0, 7]), rows[[7, 0, 7]])
    np.testing.assert_array_equal(np.concatenate(list(spool.chunks(4))), rows)
    assert [len(c) for c in spool.chunks(4)] == [4, 4, 3]
    with pytest.raises(ValueError, match="spool of"):
        spool.append(rows[0][:2])
    with pytest.raises(IndexError):
        spool.read([11])
    spool.close()


def test_chunk_size_keeps_the_pixels_of_a_chunk_bounded():
    assert chunk_size(224, 224) == 8
    assert chunk_size(32, 32) == 32  # capped
    assert chunk_size(640, 640) == chunk_size(4096, 4096) == 1


def test_comparison_chunk_by_chunk_equals_comparing_everything_at_once():
    rng = np.random.default_rng(1)
    ref = [rng.normal(size=(50, 10)).astype(np.float32), rng.normal(size=(50, 6, 6, 2)).astype(np.float32)]
    conv = [r + rng.normal(scale=0.1, size=r.shape).astype(np.float32) for r in ref]
    labels = rng.integers(0, 10, 50)
    whole = compare(ref, conv, labels, [str(i) for i in range(10)], names=["scores", "grid"])
    chunked = Comparison(["scores", "grid"], class_output=0)
    for start in range(0, 50, 8):
        chunked.add([r[start:start + 8] for r in ref], [c[start:start + 8] for c in conv])
    got = chunked.result(labels, [str(i) for i in range(10)])
    assert got["n"] == whole["n"] == 50
    for name in ("scores", "grid"):
        for key in ("cosine", "sqnr_db", "max_abs_diff"):
            assert got["outputs"][name][key] == pytest.approx(whole["outputs"][name][key], abs=1e-5)
    assert (got["agreement"], got["original"], got["converted"], got["per_class"]) == \
        (whole["agreement"], whole["original"], whole["converted"], whole["per_class"])
    # the noise really is measured: a 0.1 sigma error on unit signals is about 20 dB
    assert 15 < got["outputs"]["scores"]["sqnr_db"] < 25


def test_memory_estimate_follows_the_input_size_not_the_number_of_images():
    small = estimate_memory(224, 224, chunk_size(224, 224), 300, 14 << 20)
    many = estimate_memory(224, 224, chunk_size(224, 224), 1000, 14 << 20)
    huge = estimate_memory(4096, 4096, chunk_size(4096, 4096), 300, 14 << 20)
    assert small < 2.5 * GB and many - small < 0.01 * GB
    assert huge > 10 * GB


def test_memory_check_refuses_with_the_override_flag_and_lets_it_through():
    have, where = available_memory()
    assert have is not None and have > 0 and where  # Linux: /proc/meminfo at least
    with pytest.raises(UsageError, match="GB of memory") as err:
        check_memory(1 << 50, "building a 16384x16384 model", override=False)
    assert OVERRIDE_FLAG in err.value.hint
    check_memory(1 << 50, "building a 16384x16384 model", override=True)
    check_memory(1 << 20, "a small build", override=False)


@pytest.fixture(scope="module")
def giant_model(tmp_path_factory):
    """A few-parameter Keras model with a 16384x16384 input: any build of it needs far more than RAM."""
    import keras

    inp = keras.Input((16384, 16384, 3))
    x = keras.layers.Conv2D(2, 3, strides=64)(inp)
    out = keras.layers.Dense(2, activation="softmax")(keras.layers.GlobalAveragePooling2D()(x))
    path = tmp_path_factory.mktemp("giant") / "giant.keras"
    keras.Model(inp, out).save(path)
    return path


def test_a_build_that_cannot_fit_is_refused_before_reading_an_image(giant_model, tmp_path, capsys):
    from edgekit.cli import main

    code = main(["build", "--model", str(giant_model), "--target", "cpu", "--calib", str(CALIB),
                 "--out", str(tmp_path / "dist"), "--variants", "fp32", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "building a 16384x16384 model with" in err and "GB of memory" in err and OVERRIDE_FLAG in err
    assert not (tmp_path / "dist").exists()


def _images(folder: Path, count: int, size: int) -> Path:
    import cv2

    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(count):
        small = rng.integers(0, 256, (size // 16, size // 16, 3), dtype=np.uint8)
        cv2.imwrite(str(folder / f"{i:04d}.jpg"), cv2.resize(small, (size, size), interpolation=cv2.INTER_CUBIC))
    return folder


def _wide_model(path: Path, size: int) -> Path:
    import keras

    keras.utils.set_random_seed(0)  # random weights: the int8 agreement of an unseeded draw ranged 0.84-1.0
    inp = keras.Input((size, size, 3))
    x = keras.layers.Conv2D(8, 3, strides=4, activation="relu")(inp)
    x = keras.layers.Conv2D(16, 3, strides=4, activation="relu")(x)
    out = keras.layers.Dense(4, activation="softmax")(keras.layers.GlobalAveragePooling2D()(x))
    keras.Model(inp, out).save(path)
    return path


# Before issue 19 this build (600 images of 384x384, int8) peaked at 2.79 GB: every image held
# as uint8, the calibration set as one float32 batch, the held-back images run eagerly in one
# batch. Streaming, it peaks at about 0.7 GB (measured on a 2-core x86-64 with TF 2.21).
RSS_BOUND = int(1.2 * GB)


@pytest.mark.slow
def test_a_calibration_set_the_old_build_could_not_hold_builds_in_bounded_memory(tmp_path):
    images = _images(tmp_path / "calib", 600, 384)
    model = _wide_model(tmp_path / "wide.keras", 384)
    out = tmp_path / "dist"
    proc = subprocess.Popen([sys.executable, "-m", "edgekit.cli", "build", "--model", str(model), "--target", "cpu",
                             "--variants", "int8", "--calib", str(images), "--calib-count", "600", "--out", str(out),
                             "--quiet"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    stderr = proc.stderr.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.stderr.close()
    assert os.waitstatus_to_exitcode(status) == 0, stderr[-2000:]
    manifest = json.loads((out / "wide-cpu" / "edgekit.json").read_text())
    # the build's own high-water mark (VmHWM): the child's ru_maxrss starts at the resident size of
    # this test runner, which spawned it (1.22 GB "peak" when the whole suite ran before it)
    peak = manifest["provenance"]["peak_rss_bytes_so_far"]
    assert 0 < peak < RSS_BOUND, f"peak RSS {peak / GB:.2f} GB"
    assert peak <= 1.01 * usage.ru_maxrss * 1024  # VmHWM and ru_maxrss count a few pages differently
    calib = manifest["provenance"]["calibration"]
    assert (calib["images"], calib["held_back"], calib["converter_images"]) == (480, 120, 150)
    held_back = manifest["verification"]["models"]["int8"]["holdout"]
    assert held_back["n"] == 120 and held_back["agreement"] >= 0.9
    log = (out / "wide-cpu" / "build.log").read_text()
    assert "the converter sees the first 150 of the 480 calibration images" in log
    assert "reference outputs of the original model: done in" in log and "peak RSS so far" in log
