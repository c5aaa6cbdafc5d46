"""A fake of Sony's PyTorch IMX500 stack for the imx500 toolchain's job script (tests/builders/test_imx500_build.py).

Three packages the job imports, each recording its calls on stderr (``FAKE IMX CALL [...]``, in
the job's log): ``torch`` (tensors wrap numpy arrays), ``onnx2torch`` (its module runs the ONNX
in ONNX Runtime: the float model itself) and ``model_compression_toolkit`` (the 'quantised'
model rounds the float outputs to 1/256 steps; ``FAKE_MCT_SWAP=1`` swaps the first two scores,
a quantisation that broke the model). The converter is ``imxconv_pt.py``, installed as the fake
venv's ``bin/imxconv-pt``: ``FAKE_IMX_FIT=0`` makes its memory report say the network does not fit.
"""
