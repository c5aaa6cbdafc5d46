"""Check a converted model against the original on the same images.

Reports top-1 of both (with labels), their ratio, per-class accuracy, top-1 agreement, the
output signal-to-quantisation-noise ratio (SQNR, dB) and the max abs difference.
"""

from __future__ import annotations

import numpy as np

from edgekit.results import dequantize


def run_litert(path, tensors: np.ndarray, delegate: str = "xnnpack") -> np.ndarray:
    """Float outputs of a .tflite for a batch of input tensors, one inference each."""
    from edgekit.runtime.litert import LiteRTRuntime

    with LiteRTRuntime(path, delegate=delegate) as rt:
        # (scale, zero_point) of the output, None when it is float: the device decodes the same way
        scale, zero_point = rt.output_quantization[0] or (None, None)
        return np.stack([dequantize(rt.infer(t[None])[0], scale, zero_point)[0] for t in tensors])


def run_onnx(path, tensors: np.ndarray) -> np.ndarray:
    """Float outputs of an .onnx on the CPU provider, one inference each (batch 1, as deployed)."""
    from edgekit.runtime.onnxrt import OnnxRuntime

    with OnnxRuntime(path, providers=["cpu"]) as rt:
        return np.stack([rt.infer(t[None])[0][0].astype(np.float32) for t in tensors])


def compare(reference: np.ndarray, converted: np.ndarray, labels: np.ndarray | None = None,
            class_names: list[str] | None = None) -> dict:
    """Agreement and error of ``converted`` vs ``reference`` outputs; accuracy when labelled."""
    ref_top1 = reference.argmax(axis=1)
    conv_top1 = converted.argmax(axis=1)
    noise = float(np.sum((reference.astype(np.float64) - converted) ** 2))
    signal = float(np.sum(reference.astype(np.float64) ** 2))
    result = {
        "n": int(len(reference)),
        "agreement": round(float(np.mean(ref_top1 == conv_top1)), 4),
        "max_abs_diff": round(float(np.max(np.abs(reference - converted))), 6),
        "sqnr_db": round(10 * np.log10(signal / noise), 2) if noise > 0 else None,
    }
    if labels is not None:
        orig = float(np.mean(ref_top1 == labels))
        conv = float(np.mean(conv_top1 == labels))
        result.update(
            original=round(orig, 4),
            converted=round(conv, 4),
            ratio=round(conv / orig, 4) if orig > 0 else None,
        )
        per_class = {}
        for c in np.unique(labels):
            mask = labels == c
            name = class_names[c] if class_names else str(int(c))
            per_class[name] = {"n": int(mask.sum()), "original": round(float(np.mean(ref_top1[mask] == c)), 4),
                               "converted": round(float(np.mean(conv_top1[mask] == c)), 4)}
        result["per_class"] = per_class
    return result
