"""Models as outside users bring them: PyTorch exports (written here with onnx.helper the way
torch.onnx.export shapes them), Keras Sequential models, Keras SavedModels.

Each test is a defect found by building such a model with ``edgekit build``.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import CALIB


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def torch_gelu_onnx(path, constant_nodes: bool = False, tf2onnx_order: bool = False, size: int = 16):
    """``input.1 [batch_size,3,S,S] -> Conv -> GELU (exact, as Div/Erf/Add/Mul/Mul) -> GlobalAveragePool
    -> Flatten -> Gemm -> output [batch_size,4]``; constants as initializers (onnxsim, torch's
    constant folding) or as Constant nodes (torch without folding). ``tf2onnx_order``: the GELU as
    ``(0.5 * x) * (1 + erf(x * 0.7071))``."""
    rng = np.random.default_rng(0)
    scalars = {"/act/c_sqrt2": 1 / math.sqrt(2) if tf2onnx_order else math.sqrt(2), "/act/c_one": 1.0,
               "/act/c_half": 0.5}
    inits = [_const("conv.weight", rng.normal(0, 0.5, (8, 3, 3, 3))), _const("conv.bias", rng.normal(0, 0.1, 8)),
             _const("fc.weight", rng.normal(0, 0.5, (4, 8))), _const("fc.bias", np.zeros(4))]
    nodes = [helper.make_node("Conv", ["input.1", "conv.weight", "conv.bias"], ["c"], name="/conv/Conv",
                              kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    if constant_nodes:
        nodes += [helper.make_node("Constant", [], [k], name=f"{k}_node", value=_const(k, v))
                  for k, v in scalars.items()]
    else:
        inits += [_const(k, v) for k, v in scalars.items()]
    if tf2onnx_order:
        nodes += [helper.make_node("Mul", ["c", "/act/c_half"], ["h"], name="/act/Mul_half"),
                  helper.make_node("Mul", ["c", "/act/c_sqrt2"], ["d"], name="/act/Mul"),
                  helper.make_node("Erf", ["d"], ["e"], name="/act/Erf"),
                  helper.make_node("Add", ["e", "/act/c_one"], ["a"], name="/act/Add"),
                  helper.make_node("Mul", ["h", "a"], ["g"], name="/act/Mul_1")]
    else:
        nodes += [helper.make_node("Div", ["c", "/act/c_sqrt2"], ["d"], name="/act/Div"),
                  helper.make_node("Erf", ["d"], ["e"], name="/act/Erf"),
                  helper.make_node("Add", ["e", "/act/c_one"], ["a"], name="/act/Add"),
                  helper.make_node("Mul", ["c", "a"], ["m"], name="/act/Mul"),
                  helper.make_node("Mul", ["m", "/act/c_half"], ["g"], name="/act/Mul_1")]
    nodes += [helper.make_node("GlobalAveragePool", ["g"], ["p"], name="/pool/GlobalAveragePool"),
              helper.make_node("Flatten", ["p"], ["f"], name="/Flatten", axis=1),
              helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["output"], name="/fc/Gemm", transB=1)]
    graph = helper.make_graph(
        nodes, "main_graph",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, ["batch_size", 3, size, size])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch_size", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytorch")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("constant_nodes, tf2onnx_order", [(False, False), (True, False), (False, True)])
def test_erf_gelu_chain_is_fused_into_one_gelu_with_the_same_outputs(tmp_path, constant_nodes, tf2onnx_order):
    """TFLite has no Erf: the onnx2tf copy of a PyTorch GELU becomes one Gelu node, same function."""
    import onnxruntime as ort

    from edgekit.builders.convert.onnx_rewrite import fuse_gelu

    model = onnx.load(torch_gelu_onnx(tmp_path / "m.onnx", constant_nodes, tf2onnx_order))
    before = model.SerializeToString()
    assert fuse_gelu(model) == 1
    ops = [n.op_type for n in model.graph.node if n.op_type != "Constant"]
    assert ops == ["Conv", "Gelu", "GlobalAveragePool", "Flatten", "Gemm"]
    x = np.random.default_rng(1).normal(0, 2, (2, 3, 16, 16)).astype(np.float32)
    def run(blob: bytes) -> np.ndarray:
        return ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"input.1": x})[0]

    want, got = run(before), run(model.SerializeToString())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_gelu_fusion_leaves_other_erf_and_exposed_tensors_alone(tmp_path):
    from edgekit.builders.convert.onnx_rewrite import fuse_gelu

    model = onnx.load(torch_gelu_onnx(tmp_path / "m.onnx"))
    model.graph.output.append(helper.make_tensor_value_info("e", TensorProto.FLOAT, None))  # the Erf is an output
    assert fuse_gelu(model) == 0 and "Erf" in [n.op_type for n in model.graph.node]
    model = onnx.load(torch_gelu_onnx(tmp_path / "m.onnx"))
    next(i for i in model.graph.initializer if i.name == "/act/c_half").CopyFrom(_const("/act/c_half", 0.25))
    assert fuse_gelu(model) == 0  # not a GELU


def test_a_converted_model_that_fails_at_run_time_is_one_error(tmp_path):
    """A kernel check that fails on the first verified image (seen: int8 DIV by a zero-quantised
    value) was a traceback; it is one line naming the file."""
    from edgekit.builders.gate.verify import OnnxRunner
    from edgekit.errors import ModelError

    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "idx"], ["y"], axis=2)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 2, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 1, 1])],
        [numpy_helper.from_array(np.array([9], np.int64), "idx")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "bad_fp32.onnx")
    with OnnxRunner(tmp_path / "bad_fp32.onnx") as run, pytest.raises(ModelError) as err:
        run(np.zeros((2, 2, 2, 1), np.float32))
    assert err.value.message.startswith("the converted bad_fp32.onnx fails to run in ONNX Runtime: ")
    assert "--variants" in err.value.hint


@pytest.mark.slow
def test_pytorch_gelu_model_builds_for_tflite_targets_with_tflite_gelu(tmp_path):
    """Before: 'TFLite conversion (fp32) failed: tf.Erf is neither a custom op nor a flex op'."""
    from ai_edge_litert.interpreter import Interpreter

    from edgekit.builders.build import build

    model = torch_gelu_onnx(tmp_path / "vit_like.onnx")
    [r] = build(model, "cpu", [CALIB], out=tmp_path / "dist", variants="fp32,int8", calib_count=60, quiet=True)
    assert r.passed
    for variant in ("fp32", "int8"):
        ops = {o["op_name"] for o in Interpreter(str(r.bundle / f"vit_like_{variant}.tflite"))._get_ops_details()}
        assert "GELU" in ops, ops
    log = (r.bundle / "build.log").read_text()
    assert "1 Div-Erf-Add-Mul-Mul chain(s) fused into Gelu" in log


@pytest.mark.slow
def test_keras_sequential_model_loads_named_after_its_last_layer(tmp_path):
    """Keras 3's Sequential has no output_names: loading one was an AttributeError traceback."""
    import keras

    from edgekit.builders.sources.load import load_source_model

    model = keras.Sequential([keras.Input((12, 12, 3)), keras.layers.Rescaling(1 / 127.5, offset=-1),
                              keras.layers.Conv2D(4, 3), keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(5, name="logits")])
    for name in ("seq.keras", "seq.h5"):
        model.save(tmp_path / name)
        source = load_source_model(tmp_path / name)
        assert source.output_names == ["logits"] and source.input_hwc == (12, 12, 3)
        assert source.predict(np.zeros((3, 12, 12, 3), np.float32))[0].shape == (3, 5)


@pytest.mark.slow
def test_keras_normalization_and_exact_gelu_build_for_jetson(tmp_path):
    """Keras 3's Normalization(mean=, variance=) keeps its statistics as captured tensors, which
    tf2onnx made two extra graph inputs ('..._fp32.onnx has 3 inputs'); an exact gelu is Erfc in
    TF 2.21, which tf2onnx left unconverted ('the file is corrupt')."""
    import keras

    from edgekit.builders.build import build
    from edgekit.runtime.onnxrt import OnnxRuntime

    model = keras.Sequential([
        keras.Input((16, 16, 3)),
        keras.layers.Normalization(mean=[123.7, 116.3, 103.5], variance=[3410.0, 3262.0, 3291.0]),
        keras.layers.Conv2D(4, 3, activation="gelu"), keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])
    model.save(tmp_path / "imagenet_norm.keras")
    [r] = build(tmp_path / "imagenet_norm.keras", "jetson", [CALIB], out=tmp_path / "dist", calib_count=40, quiet=True)
    assert r.passed
    with OnnxRuntime(r.bundle / "imagenet_norm_fp32.onnx", providers=["cpu"]) as rt:
        assert rt.input_spec.shape == (1, 16, 16, 3)
    holdout = r.manifest["verification"]["models"]["fp32"]["holdout"]
    assert holdout["cosine"] > 0.9999  # the statistics are inlined, not zeros fed to an input


def _tiny_onnx(path, in_type=TensorProto.FLOAT, batch="batch_size", reshape_batch: int | None = None):
    """``input.1 [batch,3,8,8] -> (Cast) -> GlobalAveragePool -> Flatten (or a Reshape to a fixed batch) -> y``."""
    nodes, inits, x = [], [], "input.1"
    if in_type != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", [x], ["xf"], to=TensorProto.FLOAT))
        x = "xf"
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["p"]))
    if reshape_batch is None:
        nodes.append(helper.make_node("Flatten", ["p"], ["y"], axis=1))
    else:  # x.view(4, -1), as a model traced at batch 4 writes it
        inits.append(numpy_helper.from_array(np.array([reshape_batch, -1], np.int64), "shape"))
        nodes.append(helper.make_node("Reshape", ["p", "shape"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input.1", in_type, [batch, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("in_type, kind", [(TensorProto.UINT8, "uint8"), (TensorProto.FLOAT16, "float16")])
def test_onnx_input_that_is_not_float32_is_refused_by_type(tmp_path, in_type, kind):
    """Was 'ONNX Runtime cannot run ... Unexpected input data type' with the hint 'check --input-size'."""
    from edgekit.builders.sources.onnx import load_onnx
    from edgekit.errors import ModelError

    with pytest.raises(ModelError) as err:
        load_onnx(_tiny_onnx(tmp_path / "m.onnx", in_type))
    assert err.value.message == (f"m.onnx: input 'input.1' is {kind}; edgekit feeds an ONNX model float32 images "
                                 "(scaled with --mean/--std)")
    assert "export the model with a float32 input" in err.value.hint


def test_onnx_traced_at_a_fixed_batch_says_to_export_batch_one(tmp_path):
    from edgekit.builders.sources.onnx import load_onnx
    from edgekit.errors import ModelError

    assert load_onnx(_tiny_onnx(tmp_path / "ok.onnx", batch=4)).input_hwc == (8, 8, 3)  # batch 4 alone is fine
    with pytest.raises(ModelError) as err:
        load_onnx(_tiny_onnx(tmp_path / "b4.onnx", batch=4, reshape_batch=4))
    assert err.value.message.startswith("ONNX Runtime cannot run b4.onnx")
    assert "exported for batch 4: export it with batch 1 or a dynamic batch" in err.value.hint


def test_onnx_with_external_weights_loads_and_a_missing_weights_file_is_named(tmp_path):
    """torch.onnx.export(..., external_data=True) writes model.onnx + model.onnx.data."""
    from edgekit.builders.sources.onnx import load_onnx
    from edgekit.errors import ModelError

    model = onnx.load(torch_gelu_onnx(tmp_path / "src.onnx"))
    onnx.save(model, tmp_path / "net.onnx", save_as_external_data=True, location="net.onnx.data", size_threshold=0)
    source = load_onnx(tmp_path / "net.onnx")
    assert source.input_hwc == (16, 16, 3) and source.layout == "NCHW"
    assert len(source.onnx) > (tmp_path / "net.onnx.data").stat().st_size  # the weights travel inside
    (tmp_path / "net.onnx.data").unlink()
    with pytest.raises(ModelError) as err:
        load_onnx(tmp_path / "net.onnx")
    assert err.value.message == "net.onnx keeps its weights in a separate file, net.onnx.data, which is not beside it"
    assert err.value.hint.startswith("copy net.onnx.data into ")


def test_an_original_model_near_chance_on_the_eval_set_is_warned_about():
    """A PyTorch model fed [0, 1] pixels instead of ImageNet-normalised ones scores near chance,
    and the converted model just as badly: the ratio gate passes. The build now says so."""
    from edgekit.builders.gate.verify import weak_original_warning
    from edgekit.imaging.image import InputSpec

    spec = InputSpec(shape=(1, 3, 8, 8), layout="NCHW", colour="rgb", mean=(0.0,) * 3, std=(255.0,) * 3)
    labels = np.repeat(np.arange(4), 10)
    scores = np.eye(4, dtype=np.float32)[labels]
    assert weak_original_warning([scores[:16], scores[16:]], labels, spec) is None  # 100 %: nothing to say
    collapsed = np.eye(4, dtype=np.float32)[np.zeros(40, int)]  # every image called class 0
    text = weak_original_warning([collapsed[:16], collapsed[16:]], labels, spec)
    assert text.startswith("the original model itself gets 25% top-1 on the eval set (chance 25%)")
    assert "colour rgb, mean [0.0, 0.0, 0.0], std [255.0, 255.0, 255.0]" in text and "--mean 123.675" in text


@pytest.mark.slow
def test_keras_model_with_open_height_width_takes_input_size(tmp_path):
    """--input-size was ignored for Keras and SavedModel sources ('give the model a fixed NHWC
    image input'); it now fixes their open height/width as it does an ONNX model's."""
    import keras

    from edgekit.builders.sources.load import load_source_model
    from edgekit.errors import ModelError

    model = keras.Sequential([keras.Input((None, None, 3)), keras.layers.Conv2D(4, 3),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(5)])
    model.save(tmp_path / "fcn.keras")
    model.export(tmp_path / "fcn_sm", verbose=False)
    for path in (tmp_path / "fcn.keras", tmp_path / "fcn_sm"):
        with pytest.raises(ModelError, match=r"its height/width are not fixed") as err:
            load_source_model(path)
        assert "--input-size HxW" in err.value.hint
        source = load_source_model(path, (40, 24))
        assert source.input_hwc == (40, 24, 3)
        export = source.export_static(tmp_path / f"{path.name}_static")
        assert (export / "saved_model.pb").is_file()
    fixed = keras.Sequential([keras.Input((20, 20, 1)), keras.layers.Flatten(), keras.layers.Dense(2)])
    fixed.save(tmp_path / "fixed.keras")
    with pytest.raises(ModelError, match=r"--input-size 40x24 does not fit .*fixed at 20x20"):
        load_source_model(tmp_path / "fixed.keras", (40, 24))


def test_weights_listed_as_inputs_are_dropped_so_fp16_loads(tmp_path):
    """torch.onnx.export(keep_initializers_as_inputs=True): the jetson FP16 model kept those
    inputs float32 with float16 weights, and ONNX Runtime refused it ('the file is corrupt')."""
    import onnxruntime as ort

    from edgekit.builders.onnx import to_fp16
    from edgekit.builders.sources.onnx import load_onnx

    model = onnx.load(torch_gelu_onnx(tmp_path / "src.onnx"))
    for init in model.graph.initializer:
        model.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    onnx.save(model, tmp_path / "legacy.onnx")
    source = load_onnx(tmp_path / "legacy.onnx")
    assert [i.name for i in onnx.load_from_string(source.onnx).graph.input] == ["input.1"]
    (tmp_path / "fp32.onnx").write_bytes(source.onnx)
    to_fp16(tmp_path / "fp32.onnx", tmp_path / "fp16.onnx")
    x = np.random.default_rng(0).random((1, 3, 16, 16), np.float32)
    want = source.predict(x)[0]
    session = ort.InferenceSession(str(tmp_path / "fp16.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {"input.1": x})[0]
    np.testing.assert_allclose(got, want, atol=2e-2)


@pytest.mark.slow
def test_keras_file_that_needs_python_code_says_to_export_a_savedmodel(tmp_path):
    """A Lambda layer or an unregistered custom class: the hint was 'check the file is a complete
    model saved with model.save()', which it is."""
    import keras

    from edgekit.builders.sources.load import load_source_model
    from edgekit.errors import ModelError

    inp = keras.Input((8, 8, 3))
    out = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(keras.layers.Lambda(lambda t: t * 2.0)(inp)))
    model = keras.Model(inp, out)
    model.save(tmp_path / "lambda.keras")
    with pytest.raises(ModelError) as err:
        load_source_model(tmp_path / "lambda.keras")
    assert err.value.message.endswith("lambda.keras holds a Keras Lambda layer (Python code), which edgekit does "
                                      "not run from a file")
    assert err.value.hint.startswith("export it with model.export(DIR)")
    model.export(tmp_path / "lambda_sm", verbose=False)  # what the hint says works
    assert load_source_model(tmp_path / "lambda_sm").predict(np.ones((1, 8, 8, 3), np.float32))[0].shape == (1, 2)

    class Twice(keras.layers.Layer):
        def call(self, t):
            return t * 2.0

    keras.Model(inp, keras.layers.Flatten()(Twice(name="twice")(inp))).save(tmp_path / "custom.keras")
    with pytest.raises(ModelError, match=r"custom.keras needs the custom Keras class 'Twice', which is not importable"):
        load_source_model(tmp_path / "custom.keras")


def yolo_like_onnx(path, size: int = 64, classes: int = 3):
    """A YOLOv8-style export: ``images [1,3,S,S] -> output0 [1, 4+nc, N]``, boxes in input pixels
    concatenated with sigmoid class scores in [0, 1] (the int8 pitfall of ultralytics/yolov5#10164)."""
    rng = np.random.default_rng(0)
    inits = [_const("w1", rng.normal(0, 0.1, (16, 3, 8, 8))), _const("w2", rng.normal(0, 0.5, (4 + classes, 16, 1, 1))),
             numpy_helper.from_array(np.array([1, 4 + classes, -1], np.int64), "shape"), _const("scale", [size]),
             numpy_helper.from_array(np.array([4, classes], np.int64), "split")]
    nodes = [helper.make_node("Conv", ["images", "w1"], ["c1"], strides=[8, 8], kernel_shape=[8, 8], name="/m/c1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="/m/r"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], kernel_shape=[1, 1], name="/m/c2"),
             helper.make_node("Reshape", ["c2", "shape"], ["flat"], name="/m/rs"),
             helper.make_node("Sigmoid", ["flat"], ["sig"], name="/m/sig"),
             helper.make_node("Split", ["sig", "split"], ["box", "cls"], axis=1, name="/m/split"),
             helper.make_node("Mul", ["box", "scale"], ["boxpx"], name="/m/mul"),
             helper.make_node("Concat", ["boxpx", "cls"], ["output0"], axis=1, name="/m/cat")]
    n = (size // 8) ** 2
    graph = helper.make_graph(nodes, "main_graph", [helper.make_tensor_value_info("images", TensorProto.FLOAT,
                                                                                  [1, 3, size, size])],
                              [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 4 + classes, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytorch")
    model.ir_version = 8
    onnx.save(model, path)
    path.with_suffix(".labels.txt").write_text("".join(f"k{i}\n" for i in range(classes)))
    return path


@pytest.mark.slow
def test_a_yolo_like_int8_without_eval_is_held_to_the_originals_detections(tmp_path):
    """Without --eval nothing gated a detector's int8: a YOLO-style model (pixel boxes beside
    [0, 1] scores) agreed on 12 % of the original's detections and the build said nothing. Its
    held-back images now gate it on what users see; with the boxes normalised in the graph and
    the observed calibration ranges it agrees and passes."""
    from edgekit.builders.build import build
    from tests.conftest import ROOT

    model = yolo_like_onnx(tmp_path / "yolo.onnx")
    [r] = build(model, "cpu", [ROOT / "calib" / "detect"], out=tmp_path / "dist", variants="int8", task="detect",
                calib_count=100, quiet=True)
    held = r.manifest["verification"]["models"]["int8"]["holdout"]
    assert r.passed and r.manifest["verification"]["gated"] and held["passed"]
    assert held["fidelity"]["detections"]["agreement"] >= 0.9 and held["agreement"] >= 0.9


@pytest.mark.slow
def test_savedmodel_with_one_named_signature_builds_from_it(tmp_path):
    """tf.saved_model.save(obj, dir, signatures={'predict': fn}): was "cannot load SavedModel: 'serving_default'"."""
    import tensorflow as tf

    from edgekit.builders.sources.load import load_source_model
    from edgekit.errors import ModelError

    class Net(tf.Module):
        def __init__(self):
            self.w = tf.Variable(tf.eye(3))

        @tf.function(input_signature=[tf.TensorSpec((None, 8, 8, 3), tf.float32)])
        def predict(self, x):
            return {"scores": tf.reduce_mean(x, axis=[1, 2]) @ self.w}

        @tf.function(input_signature=[tf.TensorSpec((None, 8, 8, 3), tf.float32)])
        def other(self, x):
            return {"scores": x[:, 0, 0, :]}

    net = Net()
    tf.saved_model.save(net, str(tmp_path / "one"), signatures={"predict": net.predict})
    source = load_source_model(tmp_path / "one")
    assert source.signature == "predict" and source.output_names == ["scores"]
    x = np.random.default_rng(0).random((2, 8, 8, 3), np.float32)
    np.testing.assert_allclose(source.predict(x)[0], x.mean(axis=(1, 2)), rtol=1e-5)
    static = load_source_model(source.export_static(tmp_path / "static"))
    np.testing.assert_allclose(static.predict(x[:1])[0], x[:1].mean(axis=(1, 2)), rtol=1e-5)
    tf.saved_model.save(net, str(tmp_path / "two"), signatures={"predict": net.predict, "other": net.other})
    with pytest.raises(ModelError, match=r"has no serving_default signature \(it has other, predict\)"):
        load_source_model(tmp_path / "two")


@pytest.mark.slow
def test_savedmodel_with_a_uint8_input_is_refused_by_type(tmp_path):
    """A TF Object Detection API style uint8 input was a TensorFlow InvalidArgumentError traceback."""
    import tensorflow as tf

    from edgekit.builders.sources.load import load_source_model
    from edgekit.errors import ModelError

    class Net(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec((1, 8, 8, 3), tf.uint8, name="input_tensor")])
        def serve(self, x):
            return {"scores": tf.reduce_mean(tf.cast(x, tf.float32), axis=[1, 2])}

    net = Net()
    tf.saved_model.save(net, str(tmp_path / "u8"), signatures={"serving_default": net.serve})
    with pytest.raises(ModelError, match=r"u8: input 'input_tensor' is uint8; edgekit feeds a model float32 images"):
        load_source_model(tmp_path / "u8")


def test_onnx_whose_output_size_changes_with_the_image_is_one_error(tmp_path):
    """A detector exported with NMS inside: the reference run was a numpy concatenate traceback."""
    from edgekit.builders.sources.onnx import load_onnx
    from edgekit.errors import ModelError

    rng = np.random.default_rng(0)
    ints = {"shp": [1, 5, 16], "max_out": [10], "split": [4, 1], "two": [2], "ax": [1]}
    inits = [_const("w", rng.normal(0, 0.1, (5, 3, 8, 8))), _const("iou", [0.5]), _const("thr", [0.1])]
    inits += [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items()]
    nodes = [helper.make_node("Conv", ["images", "w"], ["c"], strides=[8, 8], kernel_shape=[8, 8]),
             helper.make_node("Reshape", ["c", "shp"], ["r"]), helper.make_node("Sigmoid", ["r"], ["s"]),
             helper.make_node("Split", ["s", "split"], ["boxes_t", "scores"], axis=1),
             helper.make_node("Transpose", ["boxes_t"], ["boxes"], perm=[0, 2, 1]),
             helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "thr"], ["sel"]),
             helper.make_node("Gather", ["sel", "two"], ["i2"], axis=1),
             helper.make_node("Squeeze", ["i2", "ax"], ["i"]),
             helper.make_node("Gather", ["boxes", "i"], ["det"], axis=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("det", TensorProto.FLOAT, [1, "K", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "nms.onnx")
    source = load_onnx(tmp_path / "nms.onnx")
    # the wider the pixel range, the more spread the boxes: NMS keeps a different number
    images = (rng.random((4, 3, 32, 32)) - 0.5) * np.array([1, 16, 64, 128])[:, None, None, None]
    with pytest.raises(ModelError) as err:
        source.predict(images.astype(np.float32))
    assert err.value.message.startswith("output 'det' of nms.onnx changes shape with the image (")
    assert "Ultralytics nms=False" in err.value.hint


def test_a_model_that_scales_its_own_pixels_defaults_to_raw_pixels():
    from edgekit.builders.sources.inputs import preprocessing

    assert preprocessing({}, 3)["std"] == (255.0,) * 3
    assert preprocessing({}, 3, raw_pixels=True)["std"] == (1.0,) * 3
    assert preprocessing({"std": (127.5,)}, 3, raw_pixels=True)["std"] == (127.5,) * 3  # what is given wins
    assert preprocessing({"mean": (127.5,)}, 3, raw_pixels=True)["std"] == (255.0,) * 3


@pytest.mark.slow
def test_keras_model_with_its_own_rescaling_is_fed_0_255_pixels(tmp_path):
    """keras.applications-style models rescale inside (Rescaling(1/255), Normalization in pixel
    units): fed edgekit's default [0, 1] they saw inputs 255 times too small, and the gate passed."""
    import keras

    from edgekit.builders.build import build
    from edgekit.builders.sources.load import load_source_model

    aug = keras.Sequential([keras.layers.RandomFlip()], name="augment")
    inp = keras.Input((16, 16, 3))
    x = keras.layers.Rescaling(1 / 255.0, name="to_unit")(aug(inp))
    model = keras.Model(inp, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(x)))
    model.save(tmp_path / "app.keras")
    assert load_source_model(tmp_path / "app.keras").scales_own_pixels == (
        "its first layer 'to_unit' is Rescaling(0.00392157)")
    norm = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Normalization(mean=[123.7] * 3,
                                                                                  variance=[3400.0] * 3),
                             keras.layers.Flatten(), keras.layers.Dense(2)])
    norm.save(tmp_path / "norm.keras")
    assert "Normalization with a mean in pixel units" in load_source_model(tmp_path / "norm.keras").scales_own_pixels
    plain = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Rescaling(2.0), keras.layers.Flatten(),
                              keras.layers.Dense(2)])
    plain.save(tmp_path / "plain.keras")
    assert load_source_model(tmp_path / "plain.keras").scales_own_pixels is None
    [r] = build(tmp_path / "app.keras", "cpu", [CALIB], out=tmp_path / "dist", variants="fp32", calib_count=20,
                quiet=True)
    assert r.manifest["input"]["std"] == [1.0, 1.0, 1.0] and r.manifest["input"]["mean"] == [0.0, 0.0, 0.0]
    signed = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Rescaling(1 / 127.5, offset=-1),
                               keras.layers.Flatten(), keras.layers.Dense(2)])
    signed.export(tmp_path / "signed_sm", verbose=False)  # as a SavedModel: found in its graph
    assert load_source_model(tmp_path / "signed_sm").scales_own_pixels.endswith("divides the image by 127.5")
    plain.export(tmp_path / "plain_sm", verbose=False)
    assert load_source_model(tmp_path / "plain_sm").scales_own_pixels is None


@pytest.mark.parametrize("factor, op, expected", [(1 / 255, "Mul", 255.0), (127.5, "Div", 127.5), (2.0, "Mul", None),
                                                  (0.5, "Div", None)])
def test_onnx_that_rescales_its_own_pixels_is_found(tmp_path, factor, op, expected):
    """A Keras model with Rescaling exported by tf2onnx (NCHW: Transpose, then Mul by 1/127.5)."""
    from edgekit.builders.sources.onnx import load_onnx
    from edgekit.modelinfo.rescale import in_graph_rescale

    nodes = [helper.make_node("Transpose", ["input.1"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node(op, ["t", "k"], ["s"], name="rescaling/mul"),
             helper.make_node("ReduceMean", ["s"], ["y"], axes=[1, 2], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [_const("k", factor)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    found = load_onnx(tmp_path / "m.onnx").scales_own_pixels
    assert in_graph_rescale(tmp_path / "m.onnx") == found  # run and bench read the file by the build's rule
    if expected is None:
        assert found is None
    else:
        assert found == f"its first op 'rescaling/mul' divides the image by {expected:.6g}"


def test_onnx_output_without_a_batch_dimension_is_named(tmp_path):
    """A constant output (anchors, priors) was stacked image by image into a wrong shape, and every
    variant was rejected with 'cosine None < 0.98'."""
    from edgekit.builders.sources.onnx import load_onnx
    from edgekit.errors import ModelError

    model = onnx.load(_tiny_onnx(tmp_path / "m.onnx"))
    model.graph.initializer.append(numpy_helper.from_array(np.zeros((2, 4), np.float32), "priors"))
    model.graph.node.append(helper.make_node("Identity", ["priors"], ["anchors"]))
    model.graph.output.append(helper.make_tensor_value_info("anchors", TensorProto.FLOAT, [2, 4]))
    onnx.save(model, tmp_path / "anchors.onnx")
    with pytest.raises(ModelError) as err:
        load_onnx(tmp_path / "anchors.onnx")
    assert err.value.message == ("anchors.onnx: output 'anchors' has shape [2, 4] for one image: it has no batch "
                                 "dimension (a constant such as anchors, or a count)")


def save_torch_style(path, nodes, inits, size: int):
    """Save ``nodes`` as torch.onnx.export names and shapes them: input ``input.1`` of
    ``[batch_size, 3, size, size]``, output ``logits`` of 10 classes, opset 13, IR 8."""
    image = helper.make_tensor_value_info("input.1", TensorProto.FLOAT, ["batch_size", 3, size, size])
    graph = helper.make_graph(nodes, "main_graph", [image],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def resnet_stem_onnx(path, relu: bool = True, ceil_mode: int = 0, pads=(1, 1, 1, 1), size: int = 32):
    """torchvision's ResNet stem (Conv 3x3/2, ReLU, MaxPool 3/2 pads 1); ``ceil_mode``: SqueezeNet's pool."""
    rng = np.random.default_rng(0)
    inits = [_const("w", rng.normal(0, 0.3, (8, 3, 3, 3))), _const("b", rng.normal(0, 0.3, 8)),
             _const("fw", rng.normal(0, 0.3, (10, 8))), _const("fb", np.zeros(10))]
    nodes = [helper.make_node("Conv", ["input.1", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              strides=[2, 2], name="/conv1/Conv")]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["r"], name="/relu/Relu"))
    nodes += [helper.make_node("MaxPool", ["r" if relu else "c"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                               pads=list(pads), ceil_mode=ceil_mode, name="/maxpool/MaxPool"),
              helper.make_node("GlobalAveragePool", ["p"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
              helper.make_node("Gemm", ["f", "fw", "fb"], ["logits"], transB=1)]
    return save_torch_style(path, nodes, inits, size)


@pytest.mark.parametrize("ceil_mode, pads, size", [(0, (1, 1, 1, 1), 32), (1, (0, 0, 0, 0), 30), (1, (1, 1, 1, 1), 26)])
def test_padded_maxpool_after_relu_gets_an_explicit_zero_pad_with_the_same_outputs(tmp_path, ceil_mode, pads, size):
    import onnxruntime as ort

    from edgekit.builders.convert.onnx_rewrite import pad_maxpools
    from edgekit.builders.sources.onnx import load_onnx

    source = load_onnx(resnet_stem_onnx(tmp_path / "stem.onnx", ceil_mode=ceil_mode, pads=pads, size=size))
    model = onnx.load_from_string(source.onnx)
    assert pad_maxpools(model) == 1
    pool = next(n for n in model.graph.node if n.op_type == "MaxPool")
    assert list(next(a for a in pool.attribute if a.name == "pads").ints) == [0, 0, 0, 0]
    assert [n.op_type for n in model.graph.node][:3] == ["Conv", "Relu", "Pad"]
    x = np.random.default_rng(1).normal(0, 1, (1, 3, size, size)).astype(np.float32)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input.1": x})
    np.testing.assert_allclose(got[0], source.predict(x)[0], rtol=1e-5, atol=1e-6)


def test_maxpool_of_a_possibly_negative_input_is_left_alone(tmp_path):
    from edgekit.builders.convert.onnx_rewrite import pad_maxpools
    from edgekit.builders.sources.onnx import load_onnx

    model = onnx.load_from_string(load_onnx(resnet_stem_onnx(tmp_path / "s.onnx", relu=False)).onnx)
    assert pad_maxpools(model) == 0  # zeros would beat negative values at the border


@pytest.mark.slow
def test_resnet_stem_int8_matches_the_original(tmp_path):
    """int8 of conv-relu-maxpool(pads 1) agreed with the original on 0 % of images (cosine 0.55):
    onnx2tf's -3.4e38 pad value went into the int8 calibration."""
    from edgekit.builders.build import build
    from tests.conftest import FRAMES

    [r] = build(resnet_stem_onnx(tmp_path / "stem.onnx"), "cpu", [FRAMES], out=tmp_path / "dist", variants="int8",
                quiet=True)
    assert r.manifest["verification"]["models"]["int8"]["holdout"]["cosine"] > 0.999
    log = (r.bundle / "build.log").read_text()
    assert "padded MaxPool(s) given an explicit finite Pad (0 after a ReLU" in log


def pools_onnx(path):
    """Conv, MaxPool ceil_mode (no ReLU before it), Resize align_corners, padded AveragePool, Gemm."""
    rng = np.random.default_rng(0)
    inits = [_const("w", rng.normal(0, 0.3, (8, 3, 3, 3))), _const("fw", rng.normal(0, 0.3, (10, 128))),
             _const("fb", np.zeros(10)), numpy_helper.from_array(np.array([1, 8, 8, 8], np.int64), "sizes"),
             _const("roi", np.zeros(0)), _const("scales", np.zeros(0))]
    nodes = [helper.make_node("Conv", ["input.1", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
             helper.make_node("Resize", ["p", "roi", "scales", "sizes"], ["r"], mode="linear",
                              coordinate_transformation_mode="align_corners"),
             helper.make_node("AveragePool", ["r"], ["a"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                              count_include_pad=1),
             helper.make_node("Flatten", ["a"], ["f"]),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["logits"], transB=1)]
    return save_torch_style(path, nodes, inits, 32)


@pytest.mark.slow
def test_maxpool_of_a_signed_input_is_padded_with_a_floor_from_calibration(tmp_path):
    """No ReLU before the MaxPool: onnx2tf's -3.4e38 pad made the int8 model output a constant
    (cosine 0.0) and XNNPACK refuse to prepare it; padded with twice the calibration minimum,
    int8 follows the original."""
    from edgekit.builders.build import build
    from tests.conftest import FRAMES

    [r] = build(pools_onnx(tmp_path / "pools.onnx"), "cpu", [FRAMES], out=tmp_path / "dist", variants="int8",
                quiet=True)
    assert r.manifest["verification"]["models"]["int8"]["holdout"]["cosine"] > 0.99
    assert all("runtime_options" not in m for m in r.manifest["models"])  # XNNPACK takes it again


@pytest.mark.slow
def test_int8_model_xnnpack_cannot_prepare_runs_without_it(tmp_path):
    """XNNPACK refused to prepare such an int8 model ('failed to create XNNPACK runtime'): the build
    died naming its temporary folder with 'check that the file is a complete .tflite model'. Made
    here as onnx2tf made it before the MaxPool pad rewrite; it now runs with LiteRT's built-in
    kernels (delegate none), and the build says so."""
    import json
    import subprocess
    import sys

    from edgekit.builders.convert.onnx2tf_job import SAMPLE_FILE
    from edgekit.builders.sources.onnx import load_onnx
    from edgekit.builders.tflite import _open_details, convert

    source = load_onnx(pools_onnx(tmp_path / "pools.onnx"))
    job = tmp_path / "job"
    job.mkdir()
    (job / "model.onnx").write_bytes(source.onnx)
    samples = np.random.default_rng(0).random((20, 32, 32, 3)).astype(np.float32)
    np.save(job / SAMPLE_FILE, samples)
    (job / "job.json").write_text(json.dumps({"onnx": "model.onnx", "input": "input.1", "layout": "NCHW",
                                              "keys": ["logits"]}))
    subprocess.run([sys.executable, "-m", "edgekit.builders.convert.onnx2tf_job", "job.json"], cwd=job, check=True,
                   capture_output=True, timeout=600)
    int8 = tmp_path / "pools_int8.tflite"
    int8.write_bytes(convert(job / "saved_model", "int8", list(samples), "uint8"))

    class Log:  # what _open_details uses of a BuildContext: its log's warn
        def __init__(self):
            self.warnings: list[str] = []

        def warn(self, msg: str) -> None:
            self.warnings.append(msg)

    class Ctx:
        log = Log()

    class Target:
        name = "cpu"

    delegate, (input_detail, outputs, desc) = _open_details(Ctx, Target, int8)
    assert delegate == "none" and desc["delegated_nodes"] == 0 and input_detail["shape"].tolist() == [1, 32, 32, 3]
    assert Ctx.log.warnings[0].startswith("[cpu] XNNPACK cannot run pools_int8.tflite (failed to create XNNPACK")


def test_maxpool_floors_measure_twice_the_lowest_input(tmp_path):
    import onnxruntime as ort

    from edgekit.builders.convert.onnx_rewrite import maxpool_floors, pad_maxpools
    from edgekit.builders.sources.onnx import load_onnx

    source = load_onnx(resnet_stem_onnx(tmp_path / "s.onnx", relu=False))
    x = np.random.default_rng(2).random((4, 3, 32, 32)).astype(np.float32)
    floors = maxpool_floors(source.onnx, "input.1", x)
    model = onnx.load_from_string(source.onnx)
    model.graph.output.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    low = min(float(session.run(["c"], {"input.1": x[i:i + 1]})[0].min()) for i in range(4))
    assert floors == {"c": pytest.approx(min(0.0, 2 * low))}
    model = onnx.load_from_string(source.onnx)
    assert pad_maxpools(model, floors) == 1
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"input.1": x[:1]})
    np.testing.assert_allclose(got[0], source.predict(x[:1])[0], rtol=1e-5, atol=1e-6)  # on what it was measured on


def test_task_choice_for_several_outputs_and_vector_shapes(tmp_path):
    """Several outputs stay ``raw`` by default (every output gated on its cosine); ``--task
    classify`` scores the vector sized like the eval set's class folders, else the first."""
    from types import SimpleNamespace

    from edgekit.builders.build import choose_task
    from edgekit.builders.sources.model import SourceOutput

    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()

    def source(*shapes):
        return SimpleNamespace(outputs=tuple(SourceOutput(f"o{i}", f"o{i}", s) for i, s in enumerate(shapes)))

    assert choose_task(None, source((4,), (3,)), tmp_path) == ("raw", None)
    assert choose_task("classify", source((4,), (3,)), tmp_path) == ("classify", 1)  # sized like the classes
    assert choose_task("classify", source((3,), (3,)), tmp_path) == ("classify", 0)  # main head first
    assert choose_task("classify", source((4,), (3,))) == ("classify", 0)  # no eval set: the first
    assert choose_task(None, source((3, 1, 1),)) == ("classify", 0)  # a 1x1-conv head's [C, 1, 1]
    assert choose_task(None, source((8, 4, 4),), tmp_path) == ("raw", None)  # a map, not classes


@pytest.mark.slow
def test_keras_classifier_with_an_auxiliary_output(tmp_path):
    """By default every output is gated on cosine and the log says top-1 is not measured and how
    to get it; with --task classify top-1 of the class output is gated."""
    import keras

    from edgekit.builders.build import build
    from tests.conftest import DEMO_MODEL, EVAL

    demo = keras.saving.load_model(DEMO_MODEL)
    aux = keras.layers.Dense(4, name="aux")(demo.get_layer("global_average_pooling2d").output)
    keras.Model(demo.inputs, [aux, demo.output]).save(tmp_path / "two.keras")
    labels = DEMO_MODEL.with_suffix(".labels.txt").read_text(encoding="utf-8").split()
    common = dict(calib=[CALIB], eval_dir=EVAL, variants=["fp32"], quiet=True, calib_count=40)
    raw = build(tmp_path / "two.keras", ["cpu"], out=tmp_path / "raw", **common)[0]
    assert raw.manifest["task"] == "raw" and raw.manifest["verification"]["metric"] == "cosine_worst_output"
    assert ("top-1 is not measured (--task classify scores output 'scores'"
            in (raw.bundle / "build.log").read_text(encoding="utf-8"))
    built = build(tmp_path / "two.keras", ["cpu"], out=tmp_path / "dist", task="classify", labels=labels,
                  **common)[0]
    verification = built.manifest["verification"]
    assert built.manifest["task"] == "classify" and verification["metric"] == "top1"
    assert verification["models"]["fp32"]["eval"]["original"] == pytest.approx(0.9345, abs=0.01)
    assert "class scores from output 'scores' of 2" in (built.bundle / "build.log").read_text(encoding="utf-8")
