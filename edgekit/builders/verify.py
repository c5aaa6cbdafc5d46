"""Check a converted model against the original on the same images, every output.

Per output: cosine similarity and signal-to-quantisation-noise ratio (SQNR, dB) over all
images, and the max abs difference. For a classifier's class output also: top-1 of both
(with labels), their ratio, per-class accuracy and top-1 agreement. When no task metric
applies (``raw``), the worst output (lowest cosine) speaks for the model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgekit.results import dequantize


def run_litert(path, tensors: np.ndarray, order: Sequence[int] | None = None,
               delegate: str = "xnnpack") -> list[np.ndarray]:
    """Float outputs of a .tflite for a batch of input tensors, one inference each.

    ``order[j]`` is the interpreter output holding the original model's output ``j``
    (converters may reorder outputs); default: the interpreter's order.
    """
    from edgekit.runtime.litert import LiteRTRuntime

    with LiteRTRuntime(path, delegate=delegate) as rt:
        quant = [q or (None, None) for q in rt.output_quantization]
        rows = []
        for t in tensors:
            outs = rt.infer(t[None])
            # (scale, zero_point) per output, None when float: the device decodes the same way
            rows.append([dequantize(o, *quant[i])[0] for i, o in enumerate(outs)])
    order = list(order) if order is not None else list(range(len(rows[0]) if rows else 0))
    return [np.stack([r[i] for r in rows]) for i in order]


def run_onnx(path, tensors: np.ndarray, names: Sequence[str] | None = None) -> list[np.ndarray]:
    """Float outputs of an .onnx on the CPU provider, one inference each (batch 1, as deployed),
    in the order of ``names`` (default: the model's)."""
    from edgekit.runtime.onnxrt import OnnxRuntime

    with OnnxRuntime(path, providers=["cpu"]) as rt:
        have = [o["name"] for o in rt.output_details()]
        order = [have.index(n) for n in names] if names else list(range(len(have)))
        rows = [rt.infer(t[None]) for t in tensors]
    return [np.stack([r[i][0] for r in rows]).astype(np.float32) for i in order]


def align(reference: np.ndarray, converted: np.ndarray) -> np.ndarray:
    """The reference in the converted output's layout: an NCHW (or NCW) output that onnx2tf
    turned channels-last is transposed to match; anything else is returned as it is."""
    if reference.shape == converted.shape:
        return reference
    perms = {4: (0, 2, 3, 1), 3: (0, 2, 1)}
    perm = perms.get(reference.ndim)
    if perm and reference.transpose(perm).shape == converted.shape:
        return reference.transpose(perm)
    return reference


def output_metrics(reference: np.ndarray, converted: np.ndarray) -> dict:
    """Cosine similarity, SQNR (dB) and max abs difference of one output over all images."""
    ref = align(reference, converted).astype(np.float64).reshape(-1)
    conv = np.asarray(converted, np.float64).reshape(-1)
    if ref.shape != conv.shape:
        return {"cosine": None, "sqnr_db": None, "max_abs_diff": None,
                "error": f"shape {list(converted.shape)} does not match the original {list(reference.shape)}"}
    noise = float(np.sum((ref - conv) ** 2))
    signal = float(np.sum(ref**2))
    norms = float(np.linalg.norm(ref) * np.linalg.norm(conv))
    cosine = float(ref @ conv / norms) if norms > 0 else (1.0 if noise == 0 else 0.0)
    return {
        "cosine": round(cosine, 6),
        "sqnr_db": round(10 * np.log10(signal / noise), 2) if noise > 0 and signal > 0 else None,
        "max_abs_diff": round(float(np.max(np.abs(ref - conv))), 6) if ref.size else 0.0,
    }


def compare(reference: np.ndarray | list[np.ndarray], converted: np.ndarray | list[np.ndarray],
            labels: np.ndarray | None = None, class_names: list[str] | None = None, *,
            names: Sequence[str] | None = None, class_output: int | None = 0) -> dict:
    """Agreement and error of ``converted`` vs ``reference`` outputs; accuracy when labelled.

    ``reference``/``converted``: one array per output (or a single array), batch first.
    ``class_output``: the index of the class scores (None: no task metric, ``raw``).
    """
    refs = reference if isinstance(reference, list) else [reference]
    convs = converted if isinstance(converted, list) else [converted]
    names = list(names) if names else [f"output_{i}" for i in range(len(refs))]
    per_output = {n: output_metrics(r, c) for n, r, c in zip(names, refs, convs)}
    worst = min(per_output, key=lambda n: -1.0 if per_output[n]["cosine"] is None else per_output[n]["cosine"])
    main = per_output[names[class_output]] if class_output is not None else per_output[worst]
    result = {"n": int(len(refs[0])), "outputs": per_output, "worst_output": worst,
              "cosine": per_output[worst]["cosine"], "sqnr_db": main["sqnr_db"], "max_abs_diff": main["max_abs_diff"]}
    if class_output is not None:
        result.update(_top1(refs[class_output], convs[class_output], labels, class_names))
    return result


def _top1(reference: np.ndarray, converted: np.ndarray, labels: np.ndarray | None,
          class_names: list[str] | None) -> dict:
    """Top-1 agreement, and with labels the accuracy of both and per class."""
    ref_top1 = reference.reshape(len(reference), -1).argmax(axis=1)
    conv_top1 = converted.reshape(len(converted), -1).argmax(axis=1)
    result: dict = {"agreement": round(float(np.mean(ref_top1 == conv_top1)), 4) if len(ref_top1) else None}
    if labels is None:
        return result
    orig = float(np.mean(ref_top1 == labels))
    conv = float(np.mean(conv_top1 == labels))
    result.update(original=round(orig, 4), converted=round(conv, 4), ratio=round(conv / orig, 4) if orig > 0 else None)
    per_class = {}
    for c in np.unique(labels):
        mask = labels == c
        name = class_names[c] if class_names else str(int(c))
        per_class[name] = {"n": int(mask.sum()), "original": round(float(np.mean(ref_top1[mask] == c)), 4),
                           "converted": round(float(np.mean(conv_top1[mask] == c)), 4)}
    result["per_class"] = per_class
    return result
