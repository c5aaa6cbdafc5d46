"""Models get their real preprocessing: what the file declares, its sidecar, flags; NCHW .tflite inputs.

Made here: an ONNX model carrying Ultralytics' ``metadata_props`` (set with the onnx API, as
``yolo export format=onnx`` writes them), Keras models converted to .tflite with TFLite Support
metadata attached (the metadata flatbuffer built with ``flatbuffers.Builder`` from
tflite-support's ``metadata_schema.fbs``, label file zipped onto the model as MediaPipe does).
"""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.cli import main as cli
from edgekit.errors import ModelError, UsageError
from edgekit.imaging.image import InputSpec, Preprocessor
from edgekit.model import open_model
from edgekit.modelinfo.embedded import read_embedded, read_onnx_metadata
from edgekit.modelinfo.tflite_metadata import read_tflite_metadata

NAMES = "{0: 'person', 1: 'bicycle'}"


def yolo_onnx(path, props: dict | None = None, dims=(1, 3, 32, 32)):
    """A [1, 4+2, N] detector (sigmoid of a 1x1 conv) with Ultralytics' metadata_props."""
    w = numpy_helper.from_array(np.full((6, 3, 1, 1), 0.1, np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, 6, -1], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["images", "w"], ["c"]), helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Reshape", ["s", "shape"], ["output0"])]
    graph = helper.make_graph(nodes, "main_graph", [helper.make_tensor_value_info("images", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 6, "n"])], [w, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    props = {"author": "Ultralytics", "task": "detect", "stride": "32", "batch": "1", "imgsz": "[32, 32]",
             "names": NAMES} if props is None else props
    helper.set_model_props(model, props)
    path.write_bytes(model.SerializeToString())
    return path


def test_ultralytics_metadata_is_read_without_loading_the_model(tmp_path):
    path = yolo_onnx(tmp_path / "yolo.onnx")
    props, dims = read_onnx_metadata(path)
    assert props["task"] == "detect" and props["imgsz"] == "[32, 32]" and dims == (1, 3, 32, 32)
    found = read_embedded(path)
    assert found.source == "Ultralytics ONNX metadata" and found.task == "detect"
    assert found.labels == ["person", "bicycle"] and found.input_size == (32, 32)
    assert found.preprocess == {"colour": "rgb", "mean": [0.0], "std": [255.0], "interpolation": "linear",
                                "crop": None, "resize": "letterbox", "pad_value": 114}
    classify = read_embedded(yolo_onnx(tmp_path / "cls.onnx", {"task": "classify", "names": "['a', 'b']",
                                                                "imgsz": "224"}))
    assert classify.task == "classify" and classify.labels == ["a", "b"] and classify.input_size == (224, 224)
    assert classify.preprocess["crop"] == "square" and classify.preprocess["resize"] == "stretch"
    pose = read_embedded(yolo_onnx(tmp_path / "pose.onnx", {"author": "Ultralytics", "task": "pose"}))
    assert pose.task is None and "no edgekit head" in pose.notes[0]
    plain = read_embedded(yolo_onnx(tmp_path / "plain.onnx", {"producer": "pytorch"}))
    assert plain.source == "" and plain.preprocess == {} and plain.labels is None


@pytest.mark.parametrize("props, message", [
    ({"task": "detect", "imgsz": "[32, 32]", "names": "__import__('os').system('touch pwned')"},
     "'names' is not a dict or list literal"),
    ({"task": "detect", "imgsz": "[32, 32]", "names": "{0: 'a', 2: 'b'}"}, "'names' is not numbered 0..1"),
    ({"task": "detect", "imgsz": "[32, 32]", "names": "{0: 'a', 1: 5}"}, "not a list of class names"),
    ({"task": "detect", "imgsz": "[32, 32]", "names": "{0: 'a', 1: '\\x1b[2J'}"}, "holds control characters"),
    ({"task": "detect", "imgsz": "[32, 32]", "names": "{0: 'a', 1: ' '}"}, "blank names"),
    ({"task": "detect", "imgsz": "[0, 640]", "names": NAMES}, "'imgsz' '[0, 640]' is not [height, width]"),
    ({"task": "detect", "imgsz": "[99999, 640]", "names": NAMES}, "is not [height, width] (1 to 16384)"),
])
def test_untrusted_ultralytics_metadata_is_one_error_naming_the_file(tmp_path, monkeypatch, props, message):
    monkeypatch.chdir(tmp_path)
    path = yolo_onnx(tmp_path / "bad.onnx", props)
    with pytest.raises(ModelError, match="bad.onnx") as info:
        read_embedded(path)
    assert message in info.value.message
    assert not (tmp_path / "pwned").exists()


def test_a_cut_or_oversized_onnx_is_refused_by_name(tmp_path):
    path = yolo_onnx(tmp_path / "m.onnx")
    data = path.read_bytes()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) - 7])
    with pytest.raises(ModelError, match=r"cut.onnx is not a readable ONNX model"):
        read_onnx_metadata(tmp_path / "cut.onnx")
    big = yolo_onnx(tmp_path / "big.onnx", {"task": "detect", "names": "[" + "'a'," * 300_000 + "]"})
    with pytest.raises(ModelError, match="a metadata entry of 1200013 bytes"):
        read_embedded(big)
    (tmp_path / "noise.onnx").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ModelError, match="noise.onnx"):
        read_embedded(tmp_path / "noise.onnx")


def test_bare_ultralytics_onnx_runs_letterboxed_in_grey_as_a_detector(tmp_path):
    path = yolo_onnx(tmp_path / "yolo.onnx")
    with open_model(path) as m:
        spec = m.runtime.input_spec
        assert (spec.layout, spec.resize, spec.pad_value, spec.interpolation) == ("NCHW", "letterbox", 114, "linear")
        assert m.task == "detect" and m.labels == ["person", "bicycle"]
        line = m.assumed_input()
        # a 64x32 white frame letterboxed into 32x32: rows 8..23 are the frame, the rest grey 114
        tensor = Preprocessor(spec)(np.full((32, 64, 3), 255, np.uint8))
        assert tensor.shape == (1, 3, 32, 32)
        np.testing.assert_allclose(tensor[0, :, 0, :], 114 / 255, rtol=1e-6)
        np.testing.assert_allclose(tensor[0, :, 8:24, :], 1.0)
    assert line == ("NCHW 1x3x32x32 float32; assumed: colour rgb, crop none, resize letterbox, interpolation linear, "
                    "mean 0, std 255, pad_value 114 (Ultralytics ONNX metadata); labels 2 (Ultralytics ONNX metadata), "
                    "task detect (Ultralytics ONNX metadata)")


def test_flags_over_sidecar_over_metadata_key_by_key(tmp_path):
    path = yolo_onnx(tmp_path / "yolo.onnx")
    (tmp_path / "yolo.preprocess.json").write_text(json.dumps({"pad_value": 0, "mean": 127.5}))
    (tmp_path / "yolo.labels.txt").write_text("car\ntruck\n")
    with open_model(path, preprocess={"std": [127.5], "resize": "stretch"}) as m:
        spec = m.runtime.input_spec
        assert (spec.resize, spec.pad_value, spec.mean, spec.std) == ("stretch", 0, (127.5,) * 3, (127.5,) * 3)
        assert m.labels == ["car", "truck"]
        assert m.origin["labels"] == "sidecar yolo.labels.txt" and m.origin["task"] == "Ultralytics ONNX metadata"
        line = m.assumed_input()
    # no border to fill when stretched: the pad value is not worth a word unless a flag gave it
    assert ("resize stretch, std 127.5 (flag); mean 127.5 (sidecar yolo.preprocess.json); "
            "colour rgb, crop none, interpolation linear (Ultralytics ONNX metadata); labels 2") in line


def test_a_dynamic_export_takes_its_size_from_imgsz(tmp_path):
    path = yolo_onnx(tmp_path / "dyn.onnx", dims=("batch", 3, "height", "width"))
    assert read_onnx_metadata(path)[1] == ("batch", 3, "height", "width")
    with open_model(path) as m:
        assert m.runtime.input_spec.shape == (1, 3, 32, 32) and m.origin["input size"] == "Ultralytics ONNX metadata"
        assert "input size 32x32 (Ultralytics ONNX metadata)" in m.assumed_input()
    with open_model(path, input_size="16x16") as m:  # a flag wins
        assert m.runtime.input_spec.shape == (1, 3, 16, 16)


def test_resize_crop_cuts_the_inputs_aspect_ratio_and_boxes_map_back_through_it(tmp_path):
    from edgekit.imaging.geometry import box_map

    path = yolo_onnx(tmp_path / "yolo.onnx", {}, dims=(1, 3, 16, 32))
    with open_model(path, preprocess={"resize": "crop"}) as m:
        spec = m.runtime.input_spec
        assert (spec.crop, spec.resize) == ("16:32", "stretch")
        assert "crop 16:32, resize stretch (flag)" in m.assumed_input()
    frame = np.zeros((100, 100, 3), np.uint8)
    frame[25:75] = 255  # the centred 1:2 window of a 100x100 frame is rows 25..74
    assert (Preprocessor(spec)(frame) == 1.0).all()
    mapping = box_map(spec, frame.shape)
    np.testing.assert_allclose(mapping(np.array([[0, 0, 32, 16]], np.float32)), [[0, 25, 100, 75]])
    with pytest.raises(UsageError, match="--resize crop crops to the input's aspect ratio"):
        open_model(path, preprocess={"resize": "crop", "crop": [8, 8]})


def test_preprocessing_flags_are_refused_for_a_bundle(tmp_path):
    (tmp_path / "b").mkdir()  # refused before the bundle is read: its input was calibrated and gated as recorded
    with pytest.raises(UsageError, match="--pad-value applies to a bare model; bundle b records its preprocessing"):
        open_model(tmp_path / "b", preprocess={"pad_value": 114})


def test_metadata_that_does_not_fit_the_model_names_its_source(tmp_path):
    path = yolo_onnx(tmp_path / "gray.onnx", {"task": "detect", "names": NAMES, "imgsz": "[32, 32]", "channels": "1"})
    with pytest.raises(UsageError, match="gray.onnx: colour gray does not fit a 3-channel model input "
                                         r"\(preprocessing from Ultralytics ONNX metadata\)"):
        open_model(path)
    with open_model(path, preprocess={"colour": "bgr"}) as m:
        assert m.runtime.input_spec.colour == "bgr"


def test_pad_value_in_the_manifest(tmp_path):
    spec = InputSpec(shape=(1, 8, 8, 3), resize="letterbox", pad_value=114)
    assert spec.to_dict()["pad_value"] == 114 and InputSpec.from_dict(spec.to_dict()) == spec
    old = spec.to_dict()
    del old["pad_value"]  # a bundle written before pad_value: padded black, as it was calibrated
    assert InputSpec.from_dict(old).pad_value == 0


# --- TFLite metadata ----------------------------------------------------------------------------


def _metadata(mean=(127.5,), std=(127.5,), colour=1, label_file="labels.txt") -> bytes:
    """A ModelMetadata flatbuffer (tflite-support metadata_schema.fbs) as MediaPipe's models carry it."""
    import flatbuffers

    b = flatbuffers.Builder(256)

    def table(fields):  # fields: [(slot, kind, value)]
        b.StartObject(max(s for s, _, _ in fields) + 1)
        for slot, kind, value in fields:
            {"off": b.PrependUOffsetTRelativeSlot, "i8": b.PrependInt8Slot, "u8": b.PrependUint8Slot}[kind](
                slot, value, 0)
        return b.EndObject()

    def offsets(items):
        b.StartVector(4, len(items), 4)
        for item in reversed(items):
            b.PrependUOffsetTRelative(item)
        return b.EndVector()

    def floats(values):
        b.StartVector(4, len(values), 4)
        for v in reversed(values):
            b.PrependFloat32(v)
        return b.EndVector()

    af = table([(0, "off", b.CreateString(label_file)), (2, "i8", 2)])  # TENSOR_AXIS_LABELS
    output = table([(0, "off", b.CreateString("probability")), (6, "off", offsets([af]))])
    norm = table([(0, "off", floats(mean)), (1, "off", floats(std))])
    unit = table([(0, "u8", 1), (1, "off", norm)])  # ProcessUnitOptions.NormalizationOptions
    props = table([(0, "i8", colour)])  # ImageProperties.color_space
    content = table([(0, "u8", 2), (1, "off", props)])  # ContentProperties.ImageProperties
    image = table([(0, "off", b.CreateString("image")), (3, "off", content), (4, "off", offsets([unit]))])
    subgraph = table([(2, "off", offsets([image])), (3, "off", offsets([output]))])
    root = table([(0, "off", b.CreateString("tiny classifier")), (3, "off", offsets([subgraph]))])
    b.Finish(root, file_identifier=b"M001")
    return bytes(b.Output())


def _with_metadata(tflite: bytes, metadata: bytes) -> bytes:
    """``tflite`` with a ``TFLITE_METADATA`` buffer, as tflite-support's MetadataPopulator writes it."""
    import flatbuffers
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(tflite, 0))
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(metadata, np.uint8)
    model.buffers.append(buffer)
    entry = schema.MetadataT()
    entry.name, entry.buffer = "TFLITE_METADATA", len(model.buffers) - 1
    model.metadata = [*(model.metadata or []), entry]
    b = flatbuffers.Builder(1024)
    b.Finish(model.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


@pytest.fixture(scope="module")
def keras_tflite():
    """Float .tflite of a 3-class RGB classifier (NHWC) and of the same layers fed channels first."""
    import keras

    from tests.helpers import tflite_models

    keras.utils.set_random_seed(0)
    cnn = [keras.layers.Conv2D(4, 3, activation="relu"), keras.layers.GlobalAveragePooling2D(),
           keras.layers.Dense(3, activation="softmax")]
    nhwc = keras.Sequential([keras.Input((16, 16, 3)), *cnn])
    nchw = keras.Sequential([keras.Input((3, 16, 16)), keras.layers.Permute((2, 3, 1)), *cnn])
    return (tflite_models.convert(nhwc, (1, 16, 16, 3), int8=False),
            tflite_models.convert(nchw, (1, 3, 16, 16), int8=False))


def _model_with_metadata(tmp_path, keras_tflite, labels="cat\ndog\nbird\n", **kw):
    path = tmp_path / "classifier.tflite"
    path.write_bytes(_with_metadata(keras_tflite[0], _metadata(**kw)))
    with zipfile.ZipFile(path, "a") as z:  # MediaPipe/Model Maker: a zip appended to the model
        z.writestr("labels.txt", labels)
    return path


def test_tflite_metadata_gives_normalisation_colour_and_labels(tmp_path, keras_tflite):
    path = _model_with_metadata(tmp_path, keras_tflite)
    assert read_tflite_metadata(path) == {"name": "tiny classifier", "mean": [127.5], "std": [127.5],
                                          "colour": "rgb", "labels": ["cat", "dog", "bird"]}
    with open_model(path) as m:
        spec = m.runtime.input_spec
        assert spec.mean == (127.5,) * 3 and spec.std == (127.5,) * 3 and m.labels == ["cat", "dog", "bird"]
        assert m.task == "classify"
        line = m.assumed_input()
        tensor = Preprocessor(spec)(np.zeros((16, 16, 3), np.uint8))
        np.testing.assert_allclose(tensor, -1.0)  # [-1, 1] input, as the metadata says
    assert line == ("NHWC 1x16x16x3 float32; assumed: colour rgb, mean 127.5, std 127.5 (TFLite metadata); "
                    "crop none, resize stretch, interpolation area (default); labels 3 (TFLite metadata), "
                    "task classify (default)")
    with open_model(path, preprocess={"mean": [0], "std": [255]}) as m:
        assert m.runtime.input_spec.std == (255.0,) * 3 and "mean 0, std 255 (flag)" in m.assumed_input()


def test_tflite_labels_of_another_size_are_left_out_with_a_note(tmp_path, keras_tflite):
    path = _model_with_metadata(tmp_path, keras_tflite, labels="cat\ndog\n")
    with open_model(path) as m:
        assert m.labels == []
        assert "note: 2 labels from TFLite metadata left out: 2 labels for a model with 3 classes" in m.assumed_input()


def test_bad_tflite_metadata_is_one_error_naming_the_file(tmp_path, keras_tflite):
    path = _model_with_metadata(tmp_path, keras_tflite, mean=(1.0,) * 9)
    with pytest.raises(ModelError, match=r"classifier.tflite: its TFLite metadata is malformed \(9 normalisation"):
        read_tflite_metadata(path)
    path = _model_with_metadata(tmp_path, keras_tflite, label_file="missing.txt")
    with pytest.raises(ModelError, match="names the label file 'missing.txt', which cannot be read"):
        read_tflite_metadata(path)
    good = _with_metadata(keras_tflite[0], _metadata())
    at = good.index(b"M001") - 4
    rng = np.random.default_rng(0)
    for _ in range(300):  # flipped bytes in the metadata: a result or a ModelError, never another exception
        data = bytearray(good)
        for i in rng.integers(at, at + 200, 3):
            data[i] = int(rng.integers(0, 256))
        (tmp_path / "flip.tflite").write_bytes(bytes(data))
        try:
            found = read_tflite_metadata(tmp_path / "flip.tflite")
        except ModelError as exc:
            assert "flip.tflite" in exc.message
        else:
            assert isinstance(found, dict)


def test_nchw_float_tflite_is_fed_channels_first(tmp_path, keras_tflite):
    from edgekit.runtime.litert import LiteRTRuntime

    (tmp_path / "nhwc.tflite").write_bytes(keras_tflite[0])
    (tmp_path / "nchw.tflite").write_bytes(keras_tflite[1])
    frame = np.random.default_rng(1).integers(0, 256, (40, 60, 3), np.uint8)
    with LiteRTRuntime(tmp_path / "nchw.tflite") as nchw, LiteRTRuntime(tmp_path / "nhwc.tflite") as nhwc:
        assert (nchw.input_spec.layout, nchw.input_spec.shape) == ("NCHW", (1, 3, 16, 16))
        a, b = Preprocessor(nchw.input_spec)(frame), Preprocessor(nhwc.input_spec)(frame)
        np.testing.assert_array_equal(a, b.transpose(0, 3, 1, 2))
        np.testing.assert_allclose(nchw.infer(a)[0], nhwc.infer(b)[0], atol=1e-5)  # same layers, same answer


def test_run_cli_takes_the_preprocessing_flags(tmp_path, capsys):
    path = yolo_onnx(tmp_path / "yolo.onnx")
    code = cli(["run", str(path), "--camera", "synthetic:64x48", "--max-frames", "2", "--warmup", "0",
                "--pad-value", "0", "--mean", "127.5", "--std", "127.5", "--json"])
    assert code == 0
    header = json.loads(capsys.readouterr().out.splitlines()[0])
    assert header["task"] == "detect" and header["input_from"]["pad_value"] == "flag"
    assert header["input_from"]["resize"] == "Ultralytics ONNX metadata"
    assert "mean 127.5, std 127.5, pad_value 0 (flag)" in header["assumed_input"]
