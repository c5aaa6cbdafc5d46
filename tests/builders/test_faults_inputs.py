"""Fault catalogue, `edgekit build`: bad models, bad image folders, bad flags and names.

Every case runs the real CLI in this process and asserts a clean refusal (one error line, a
fix, no traceback, the documented exit code) and that nothing was written outside ``--out``
(and nothing half-written inside it).
"""

from __future__ import annotations

import io
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import CALIB, DEMO_MODEL, EVAL, FRAMES
from tests.helpers.faults import assert_nothing_left, assert_refused, edgekit, snapshot


def _png(path: Path, h: int, w: int, value: int = 128) -> Path:
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.full((h, w), value, np.uint8))
    return path


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    path.write_bytes(buf.getvalue())
    return path


def build_argv(tmp_path: Path, model=DEMO_MODEL, calib=CALIB, target="cpu", extra=()) -> list[str]:
    return ["build", "--model", str(model), "--target", target, "--calib", str(calib), "--out",
            str(tmp_path / "dist"), "--quiet", "--calib-count", "12", *extra]


def refused_build(capsys, tmp_path, *needles, code=2, **kw) -> str:
    """Run a build that must be refused; nothing may be left anywhere, not even in --out."""
    before = snapshot(tmp_path)
    line = assert_refused(edgekit(capsys, *build_argv(tmp_path, **kw)), *needles, code=code)
    assert_nothing_left(before, tmp_path)
    return line


# ---- bad model files -------------------------------------------------------------------------------------------

def _models(tmp: Path) -> dict[str, tuple[Path, str, str]]:
    """name -> (model path, target, a word the error names)."""
    keras_bytes = DEMO_MODEL.read_bytes()
    cases: dict[str, tuple[Path, str, str]] = {}

    def add(name, filename, data, target="cpu", needle=""):
        path = tmp / filename
        if data is not None:
            path.write_bytes(data)
        cases[name] = (path, target, needle or filename)

    add("missing", "nope.keras", None, needle="does not exist")
    add("empty-keras", "empty.keras", b"")
    add("garbage-keras", "garbage.keras", b"garbage" * 100)
    add("truncated-keras-half", "half.keras", keras_bytes[: len(keras_bytes) // 2])
    add("truncated-keras-tail", "tail.keras", keras_bytes[:-100])
    add("keras-one-byte", "one.keras", keras_bytes[:1])
    cases["zip-not-keras"] = (_zip(tmp / "other.keras", {"readme.txt": b"hello"}), "cpu", "other.keras")
    cases["keras-bad-config"] = (_zip(tmp / "cfg.keras", {"config.json": b"{not json", "metadata.json": b"{}"}),
                                 "cpu", "cfg.keras")
    cases["keras-config-list"] = (_zip(tmp / "lst.keras", {"config.json": b"[1, 2]", "metadata.json": b"{}"}),
                                  "cpu", "lst.keras")
    add("empty-h5", "empty.h5", b"")
    add("garbage-h5", "garbage.h5", b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
    add("empty-onnx", "empty.onnx", b"", target="jetson")
    add("garbage-onnx", "garbage.onnx", b"\x08\x07garbage" * 10, target="jetson")
    add("garbage-onnx-cpu", "garbage2.onnx", b"\xff" * 100, target="cpu")
    add("tflite-as-source", "model.tflite", b"TFL3" + b"\0" * 60, needle="not a TFLite model")
    add("tflite-garbage", "garbage.tflite", b"\x1c\0\0\0TFL3" + b"\xff" * 200, needle="garbage.tflite")
    add("pytorch-file", "model.pt", b"\x80\x02", needle="unsupported")
    add("no-suffix", "model", b"\0" * 10)
    add("text-file", "model.txt", b"hello", needle="unsupported")
    empty_dir = tmp / "empty_dir"
    empty_dir.mkdir()
    cases["empty-directory"] = (empty_dir, "cpu", "empty_dir")
    keras_dir = tmp / "dir.keras"
    keras_dir.mkdir()
    cases["directory-named-keras"] = (keras_dir, "cpu", "dir.keras")
    saved = tmp / "saved"
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"garbage")
    cases["savedmodel-garbage-pb"] = (saved, "cpu", "saved")
    saved2 = tmp / "saved2"
    saved2.mkdir()
    (saved2 / "saved_model.pb").write_bytes(b"")
    cases["savedmodel-empty-pb"] = (saved2, "cpu", "saved2")
    loop = tmp / "loop.keras"
    loop.symlink_to(loop)
    cases["symlink-loop"] = (loop, "cpu", "loop.keras")
    dangling = tmp / "dangling.keras"
    dangling.symlink_to(tmp / "gone.keras")
    cases["dangling-symlink"] = (dangling, "cpu", "dangling.keras")
    cases["dev-null"] = (Path("/dev/null"), "cpu", "/dev/null")
    return cases


MODEL_CASES = [
    "missing", "empty-keras", "garbage-keras", "truncated-keras-half", "truncated-keras-tail", "keras-one-byte",
    "zip-not-keras", "keras-bad-config", "keras-config-list", "empty-h5", "garbage-h5", "empty-onnx",
    "garbage-onnx", "garbage-onnx-cpu", "tflite-as-source", "tflite-garbage", "pytorch-file", "no-suffix", "text-file",
    "empty-directory", "directory-named-keras", "savedmodel-garbage-pb", "savedmodel-empty-pb", "symlink-loop",
    "dangling-symlink", "dev-null",
]


@pytest.mark.parametrize("case", MODEL_CASES)
def test_bad_model_file(tmp_path, capsys, case):
    models = tmp_path / "models"
    models.mkdir()
    path, target, needle = _models(models)[case]
    refused_build(capsys, tmp_path, needle, model=path, target=target)


def _keras(tmp_path: Path, name: str, make) -> Path:
    import keras

    path = tmp_path / name
    make(keras).save(path)
    return path


def _lambda_model(keras):
    inp = keras.Input((32, 32, 1))
    x = keras.layers.Lambda(lambda t: t * 2)(inp)
    return keras.Model(inp, keras.layers.Dense(3)(keras.layers.Flatten()(x)))


def _two_inputs(keras):
    a, b = keras.Input((32, 32, 1)), keras.Input((32, 32, 1))
    return keras.Model([a, b], keras.layers.Dense(3)(keras.layers.Flatten()(keras.layers.Add()([a, b]))))


def _vector_input(keras):
    inp = keras.Input((16,))
    return keras.Model(inp, keras.layers.Dense(3)(inp))


@pytest.mark.parametrize("name,make,needle", [
    ("lambda.keras", _lambda_model, "lambda"),
    ("two_inputs.keras", _two_inputs, "input"),
    ("vector.keras", _vector_input, "input"),
])
def test_model_edgekit_cannot_take(tmp_path, capsys, name, make, needle):
    refused_build(capsys, tmp_path, needle, model=_keras(tmp_path, name, make))


# ---- calibration and evaluation folders -----------------------------------------------------------------------

def _folder(tmp: Path, kind: str) -> Path:
    d = tmp / kind
    d.mkdir()
    if kind == "text-only":
        (d / "a.txt").write_text("hello")
    elif kind == "garbage-pngs":
        for i in range(3):
            (d / f"{i}.png").write_bytes(b"not a png")
    elif kind == "empty-pngs":
        for i in range(3):
            (d / f"{i}.png").write_bytes(b"")
    elif kind == "truncated-jpegs":
        jpg = next(FRAMES.glob("*.jpg")).read_bytes()
        for i in range(3):
            (d / f"{i}.jpg").write_bytes(jpg[: len(jpg) // 3])
    elif kind == "png-header-only":
        for i in range(3):
            (d / f"{i}.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    elif kind == "empty-subfolders":
        (d / "a").mkdir()
        (d / "b").mkdir()
    elif kind == "directory-named-png":
        (d / "x.png").mkdir()
    elif kind == "dangling-links":
        (d / "x.png").symlink_to(tmp / "gone.png")
    return d


@pytest.mark.parametrize("kind,needle", [
    ("missing", "does not exist"),
    ("empty", "no images"),
    ("text-only", "no images"),
    ("garbage-pngs", "readable image"),
    ("empty-pngs", "readable image"),
    ("truncated-jpegs", "readable image"),
    ("png-header-only", "readable image"),
    ("empty-subfolders", "no images"),
    ("directory-named-png", ""),
    ("dangling-links", ""),
])
def test_bad_calibration_folder(tmp_path, capsys, kind, needle):
    calib = tmp_path / "missing" if kind == "missing" else _folder(tmp_path, kind)
    refused_build(capsys, tmp_path, needle, calib=calib)


@pytest.mark.parametrize("kind", ["garbage.mp4", "empty.mp4", "text.avi"])
def test_bad_calibration_video(tmp_path, capsys, kind):
    path = tmp_path / kind
    path.write_bytes(b"" if kind.startswith("empty") else b"this is not a video" * 20)
    refused_build(capsys, tmp_path, kind, calib=path)


def test_calibration_is_a_plain_file(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    refused_build(capsys, tmp_path, "notes.txt", calib=path)


@pytest.mark.parametrize("kind,needle", [
    ("missing", "does not exist"),
    ("empty", "eval"),
    ("flat", "no class subfolders"),
    ("classes-without-images", "eval"),
    ("garbage-images", "eval"),
    ("unknown-class-names", "eval"),
])
def test_bad_eval_folder(tmp_path, capsys, kind, needle):
    ev = tmp_path / "eval"
    if kind != "missing":
        ev.mkdir()
    if kind == "flat":
        for src in sorted(CALIB.iterdir())[:3]:
            shutil.copy(src, ev / src.name)
    elif kind == "classes-without-images":
        (ev / "a").mkdir()
        (ev / "b").mkdir()
    elif kind == "garbage-images":
        for c in ("a", "b"):
            (ev / c).mkdir()
            (ev / c / "x.png").write_bytes(b"junk")
    elif kind == "unknown-class-names":
        for c in ("zebra", "giraffe"):
            _png(ev / c / "x.png", 32, 32)
    refused_build(capsys, tmp_path, needle, extra=("--eval", str(ev)))


def _warnings(err: str) -> list[str]:
    """The build's warnings, less the one about the number of images (12 here, on purpose)."""
    return [line for line in err.splitlines() if line.startswith("WARNING: ") and "calibration images;" not in line
            and "absl" not in line]


def _tiny_images(tmp_path: Path, h: int, w: int) -> Path:
    d = tmp_path / f"img{h}x{w}"
    for i in range(12):
        _png(d / f"{i}.png", h, w, value=10 * i)
    return d


def test_one_pixel_calibration_images_warn(tmp_path, capsys):
    """1x1 images calibrate nothing useful: the build must say so (or refuse them)."""
    argv = [a for a in build_argv(tmp_path, calib=_tiny_images(tmp_path, 1, 1), extra=("--variants", "fp32"))
            if a != "--quiet"]
    result = edgekit(capsys, *argv)
    assert "Traceback" not in result.text
    assert result.code != 0 or _warnings(result.err), result.err


def test_crop_larger_than_every_calibration_image_warns(tmp_path, capsys):
    """The demo crops 200x200: 40x40 images never fill it, which the build must say."""
    argv = [a for a in build_argv(tmp_path, calib=_tiny_images(tmp_path, 40, 40), extra=("--variants", "fp32"))
            if a != "--quiet"]
    result = edgekit(capsys, *argv)
    assert "Traceback" not in result.text
    assert result.code != 0 or any("crop" in w.lower() for w in _warnings(result.err)), result.err


# ---- flags -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra,needle", [
    (("--crop", "-5x0"), "crop"),
    (("--crop", "0x0"), "crop"),
    (("--crop", "axb"), "crop"),
    (("--crop", "10x10x10"), "crop"),
    (("--mean", "a"), "--mean"),
    (("--mean", "1,,2"), "--mean"),
    (("--std", "0"), "--std"),
    (("--std", "-1"), "--std"),
    (("--std", "nan"), "--std"),
    (("--mean", "inf"), "--mean"),
    (("--colour", "rgb"), "colour"),
    (("--min-accuracy-ratio", "0"), "ratio"),
    (("--min-accuracy-ratio", "nan"), "ratio"),
    (("--min-accuracy-ratio", "x"), "--min-accuracy-ratio"),
    (("--min-cosine", "0"), "cosine"),
    (("--min-cosine", "2"), "cosine"),
    (("--calib-count", "0"), "--calib-count 0 makes no sense"),
    (("--calib-count", "-3"), "--calib-count -3 makes no sense"),
    (("--calib-count", "many"), "--calib-count"),
    (("--input-size", "0x0"), "input-size"),
    (("--input-size", "axb"), "input-size"),
    (("--input-size", "1x2x3"), "input-size"),
    (("--labels", "/nonexistent/labels.txt"), "labels"),
    (("--io-dtype", "float"), "--io-dtype"),
    (("--task", "detect"), "--task"),
    (("--variants", "fp8"), "fp8"),
    (("--variants", "fp32,bogus"), "bogus"),
    (("--variants", ","), "variant"),
    (("--io-dtype", "int8", "--variants", "fp32"), "io-dtype"),
    (("--min-tpu-ops", "2"), "min-tpu-ops"),
    (("--seed", "x"), "--seed"),
])
def test_bad_flag(tmp_path, capsys, extra, needle):
    refused_build(capsys, tmp_path, needle, extra=extra)


def test_labels_file_not_text(tmp_path, capsys):
    labels = tmp_path / "labels.txt"
    labels.write_bytes(b"\xff\xfe\x00\x01" * 10)
    refused_build(capsys, tmp_path, "labels", extra=("--labels", str(labels)))


def test_labels_count_differs_from_outputs(tmp_path, capsys):
    labels = tmp_path / "labels.txt"
    labels.write_text("a\nb\nc\n")
    refused_build(capsys, tmp_path, "3 labels", extra=("--labels", str(labels)))


def test_labels_is_a_directory(tmp_path, capsys):
    refused_build(capsys, tmp_path, "labels", extra=("--labels", str(tmp_path)))


def test_corrupt_preprocess_sidecar(tmp_path, capsys):
    model = tmp_path / "m.keras"
    shutil.copy(DEMO_MODEL, model)
    (tmp_path / "m.preprocess.json").write_text("{ not json")
    refused_build(capsys, tmp_path, "preprocess.json", model=model)


@pytest.mark.parametrize("content,needle", [
    ('{"crop": ["a", 1]}', "crop"),
    ('{"crop": [-5, 0]}', "crop"),
    ('{"mean": "x"}', "mean"),
    ('{"std": [0]}', "std"),
    ('{"colour": 5}', "colour"),
    ('{"resize": "zoom"}', "resize"),
    ('{"interpolation": "lanczos"}', "interpolation"),
    ("[1, 2]", "preprocess.json"),
])
def test_bad_preprocess_sidecar_value(tmp_path, capsys, content, needle):
    model = tmp_path / "m.keras"
    shutil.copy(DEMO_MODEL, model)
    (tmp_path / "m.preprocess.json").write_text(content)
    refused_build(capsys, tmp_path, needle, model=model)


# ---- names, targets, output directory ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../escape", "ABS", "a/b", "..", ".", "", ".hidden", "a\\b", "-x", "x" * 300])
def test_name_cannot_leave_out(tmp_path, capsys, name):
    name = str(tmp_path / "abs") if name == "ABS" else name
    refused_build(capsys, tmp_path, "--name", extra=("--name", name))
    assert not (tmp_path / "escape-cpu").exists() and not (tmp_path / "abs-cpu").exists()


@pytest.mark.parametrize("targets,needle", [
    ("cpu,cpu", "cpu"),
    ("cpu, cpu", "cpu"),
    ("", "target"),
    (",", "target"),
    ("nope", "unknown target"),
    ("../cpu", "unknown target"),
    ("/nonexistent/t.toml", "unknown target"),
])
def test_bad_target_list(tmp_path, capsys, targets, needle):
    refused_build(capsys, tmp_path, needle, target=targets)


def _target_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "custom.toml"
    path.write_text(text)
    return path


GOOD_TARGET = ('name = "custom"\nsummary = "s"\nbuilder = "edgekit.builders.tflite:build"\n'
               'adapter = "edgekit.runtime.litert:LiteRTRuntime"\n')


@pytest.mark.parametrize("text,needle", [
    ("not toml ][", "toml"),
    ("", "name"),
    ('name = "x"\n', "summary"),
    (GOOD_TARGET.replace("edgekit.builders.tflite:build", "nonexistent_module_xyz:build"), "nonexistent_module_xyz"),
    (GOOD_TARGET.replace("tflite:build", "tflite:nothing_here"), "nothing_here"),
    (GOOD_TARGET.replace('"edgekit.builders.tflite:build"', "5"), "builder"),
    (GOOD_TARGET + "build_requires = 5\n", "build_requires"),
    (GOOD_TARGET + "build_requires = ['not_installed_mod_xyz']\n", "not_installed_mod_xyz"),
    (GOOD_TARGET + "build = 'x'\n", "build"),
    (GOOD_TARGET + "[build]\nvariants = 'fp32'\n", "variants"),
    (GOOD_TARGET + "[build]\nvariants = ['fp64']\n", "fp64"),
    (GOOD_TARGET + "[runtime]\noptions = 3\n", "options"),
])
def test_bad_custom_target_file(tmp_path, capsys, text, needle):
    refused_build(capsys, tmp_path, needle, target=str(_target_toml(tmp_path, text)))


@pytest.mark.parametrize("extra,needle", [
    (("--variants", "int8"), "int8"),
    (("--variants", "int8", "--io-dtype", "int8"), "int8"),
    (("--io-dtype", "int8"), "io-dtype"),
    (("--variants", "fp32,int8"), "int8"),
])
def test_jetson_variants_it_cannot_build_are_refused(tmp_path, capsys, extra, needle):
    refused_build(capsys, tmp_path, needle, target="jetson", extra=extra)


def test_out_is_a_file(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    before = snapshot(tmp_path)
    argv = build_argv(tmp_path, extra=("--variants", "fp32"))
    argv[argv.index("--out") + 1] = str(blocker)
    assert_refused(edgekit(capsys, *argv), "file")
    assert_nothing_left(before, tmp_path)
    assert blocker.read_text() == "x"


def test_eval_with_wrong_classes_for_labels_needs_no_model_load(tmp_path, capsys):
    ev = tmp_path / "eval"
    shutil.copytree(EVAL, ev)
    extra_class = ev / "not_a_label"
    _png(extra_class / "x.png", 32, 32)
    refused_build(capsys, tmp_path, "not_a_label", extra=("--eval", str(ev)))
