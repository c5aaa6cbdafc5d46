"""What the onnx2tf child says when the conversion fails (edgekit/builders/convert/onnx2tf_job.py, issue 37 item 7):
the telling line of TensorFlow's "in user code:" wrapper, the cause Keras puts on the next line, and the
ONNX node onnx2tf named the failing op after. The text is PP-OCRv4's recogniser's, as TF 2.21 raised it."""

from __future__ import annotations

from edgekit.builders.convert.onnx2tf_job import describe_failure

PPOCR_REC = """in user code:

    File "edgekit/builders/convert/onnx2tf_job.py", line 85, in serve  *
        outputs = model(tf.transpose(image, [0, 3, 1, 2]) if nchw else image)

    ValueError: Exception encountered when calling layer 'tf.math.multiply_338' (type TFOpLambda).

    Dimensions must be equal, but are 4800 and 120 for '{{node model_54/tf.math.multiply_338/Mul}} = Mul[T=DT_FLOAT]\
(model_54/tf.math.divide_28/truediv, model_54/tf.math.multiply_338/Mul/y)' with input shapes: [1,1,4800], [120].

    Call arguments received by layer 'tf.math.multiply_338' (type TFOpLambda):
      * x=tf.Tensor(shape=(1, 1, 4800), dtype=float32)
      * name='p2o.Mul.178'
"""


def test_the_real_error_and_its_node_not_in_user_code():
    found = describe_failure(ValueError(PPOCR_REC))
    assert found["error"] == ("ValueError: Exception encountered when calling layer 'tf.math.multiply_338' (type "
                              "TFOpLambda): Dimensions must be equal, but are 4800 and 120 (input shapes "
                              "[1,1,4800], [120])")
    assert found["node"] == "p2o.Mul.178"


def test_plain_errors_keep_their_one_line():
    found = describe_failure(RuntimeError("onnx2tf returned no model"))
    assert found == {"error": "RuntimeError: onnx2tf returned no model"}
    wrapped = describe_failure(ValueError("in user code:\n\n  ValueError: shapes differ"))
    assert wrapped["error"] == "ValueError: shapes differ"


def test_the_node_comes_from_onnx2tf_op_functions_graph_node():
    class Node:
        name, op = "Conv_12", "Conv"

    def convert(graph_node):  # stands for onnx2tf/ops/Conv.py's make_node, found by its file name
        raise ValueError("kernel shape mismatch")

    convert.__code__ = convert.__code__.replace(co_filename="site-packages/onnx2tf/ops/Conv.py")
    try:
        convert(Node())
    except ValueError as exc:
        found = describe_failure(exc)
    assert found == {"error": "ValueError: kernel shape mismatch", "node": "Conv_12", "op": "Conv"}
