"""Check a converted model against the original on the same images, every output.

Per output: cosine similarity and signal-to-quantisation-noise ratio (SQNR, dB) over all
images, the max and the mean absolute difference (in the output's own units: a raw model's
figure a user can read, which cosine is not). For a classifier's class output also: top-1 of both
(with labels), their ratio, per-class accuracy and top-1 agreement. When no task metric
applies (``raw``), the worst output (lowest cosine) speaks for the model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from edgekit.builders.gate.verdict import Verdict
from edgekit.errors import ModelError
from edgekit.heads.tensors import dequantize
from edgekit.imaging.image import InputSpec


class LiteRTRunner:
    """Float outputs of a .tflite for batches of input tensors, one inference each; the
    interpreter is opened once for every chunk of a verification (``with`` closes it).

    ``order[j]`` is the interpreter output holding the original model's output ``j``
    (converters may reorder outputs); default: the interpreter's order.
    """

    def __init__(self, path, order: Sequence[int] | None = None, delegate: str = "xnnpack"):
        from edgekit.runtime.litert import LiteRTRuntime

        self._name = Path(path).name
        self._rt = LiteRTRuntime(path, delegate=delegate)
        # (scale, zero_point) per output, None when float: the device decodes the same way
        self._quant = [q or (None, None) for q in self._rt.output_quantization]
        self._order = list(order) if order is not None else list(range(len(self._quant)))

    def __call__(self, tensors: np.ndarray) -> list[np.ndarray]:
        rows = []
        for t in tensors:
            try:
                outs = self._rt.infer(t[None])
            except (RuntimeError, ValueError) as exc:  # a kernel check fails at run time, not at conversion
                raise _failed_to_run(self._name, "LiteRT", exc) from exc
            rows.append([dequantize(o, *self._quant[i])[0] for i, o in enumerate(outs)])
        return [np.stack([r[i] for r in rows]) for i in self._order]

    def close(self) -> None:
        self._rt.close()

    def __enter__(self) -> LiteRTRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _failed_to_run(name: str, runtime: str, exc: Exception) -> ModelError:
    """One line for a converted model that was written but fails on the first images it runs."""
    lines = str(exc).strip().splitlines()
    text = lines[0][:240] if lines else type(exc).__name__
    return ModelError(f"the converted {name} fails to run in {runtime}: {text}",
                      "build the other variants (--variants fp32,fp16), or see build.log (--debug)")


def run_litert(path, tensors: np.ndarray, order: Sequence[int] | None = None,
               delegate: str = "xnnpack") -> list[np.ndarray]:
    """Float outputs of a .tflite for one batch of input tensors (see :class:`LiteRTRunner`)."""
    with LiteRTRunner(path, order, delegate) as run:
        return run(tensors)


class OnnxRunner:
    """Float outputs of an .onnx on the CPU provider, one inference each (batch 1, as deployed),
    in the order of ``names`` (default: the model's); the session is opened once."""

    def __init__(self, path, names: Sequence[str] | None = None):
        from edgekit.runtime.onnxrt import OnnxRuntime

        self._name = Path(path).name
        self._rt = OnnxRuntime(path, providers=["cpu"])
        have = [o["name"] for o in self._rt.output_details()]
        self._order = [have.index(n) for n in names] if names else list(range(len(have)))

    def __call__(self, tensors: np.ndarray) -> list[np.ndarray]:
        try:
            rows = [self._rt.infer(t[None]) for t in tensors]
        except Exception as exc:  # onnxruntime's own types (InvalidArgument, Fail, ...) derive from Exception only
            raise _failed_to_run(self._name, "ONNX Runtime", exc) from exc
        return [np.stack([r[i][0] for r in rows]).astype(np.float32) for i in self._order]

    def close(self) -> None:
        self._rt.close()

    def __enter__(self) -> OnnxRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_onnx(path, tensors: np.ndarray, names: Sequence[str] | None = None) -> list[np.ndarray]:
    """Float outputs of an .onnx for one batch of input tensors (see :class:`OnnxRunner`)."""
    with OnnxRunner(path, names) as run:
        return run(tensors)


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


class OutputStats:
    """Cosine similarity, SQNR and max abs difference of one output, summed chunk by chunk
    (float64 sums: the same figures as over all images at once, without holding them)."""

    def __init__(self) -> None:
        self.dot = self.ref2 = self.conv2 = self.noise = self.max_abs = self.abs_sum = 0.0
        self.size = 0
        self.error: str | None = None

    def add(self, reference: np.ndarray, converted: np.ndarray) -> None:
        """Add one chunk (batch first) of the original's and the converted model's outputs."""
        ref = align(reference, converted).astype(np.float64).reshape(-1)
        conv = np.asarray(converted, np.float64).reshape(-1)
        if ref.shape != conv.shape:
            self.error = f"shape {list(converted.shape)} does not match the original {list(reference.shape)}"
            return
        diff = ref - conv
        self.dot += float(ref @ conv)
        self.ref2 += float(ref @ ref)
        self.conv2 += float(conv @ conv)
        self.noise += float(diff @ diff)
        self.max_abs = max(self.max_abs, float(np.max(np.abs(diff)))) if diff.size else self.max_abs
        self.abs_sum += float(np.abs(diff).sum())
        self.size += ref.size

    def result(self) -> dict:
        if self.error:
            return {"cosine": None, "sqnr_db": None, "max_abs_diff": None, "mean_abs_diff": None, "error": self.error}
        norms = float(np.sqrt(self.ref2) * np.sqrt(self.conv2))
        cosine = self.dot / norms if norms > 0 else (1.0 if self.noise == 0 else 0.0)
        return {
            "cosine": round(cosine, 6),
            "sqnr_db": round(10 * np.log10(self.ref2 / self.noise), 2) if self.noise > 0 and self.ref2 > 0 else None,
            "max_abs_diff": round(self.max_abs, 6),
            "mean_abs_diff": round(self.abs_sum / self.size, 6) if self.size else None,
        }


def output_metrics(reference: np.ndarray, converted: np.ndarray) -> dict:
    """Cosine similarity, SQNR (dB) and max abs difference of one output over all images."""
    stats = OutputStats()
    stats.add(reference, converted)
    return stats.result()


class Comparison:
    """What :func:`compare` reports, accumulated one chunk of images at a time: per output the
    sums behind cosine/SQNR, and for the class output each image's top-1 (one integer each)."""

    def __init__(self, names: Sequence[str], class_output: int | None = 0):
        self.names = list(names)
        self.class_output = class_output
        self.stats = [OutputStats() for _ in self.names]
        self.n = 0
        self._top1: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])

    def add(self, reference: np.ndarray | list[np.ndarray], converted: np.ndarray | list[np.ndarray]) -> None:
        """Add one chunk: one array per output (or a single array), batch first."""
        refs = reference if isinstance(reference, list) else [reference]
        convs = converted if isinstance(converted, list) else [converted]
        for stats, r, c in zip(self.stats, refs, convs):
            stats.add(r, c)
        self.n += len(refs[0])
        if self.class_output is not None:
            for top1, out in zip(self._top1, (refs[self.class_output], convs[self.class_output])):
                top1.append(np.asarray(out).reshape(len(out), -1).argmax(axis=1))

    def result(self, labels: np.ndarray | None = None, class_names: list[str] | None = None) -> dict:
        """Per output metrics, the worst output, and with a class output its top-1 figures."""
        per_output = {n: s.result() for n, s in zip(self.names, self.stats)}
        worst = min(per_output,
                    key=lambda n: -1.0 if per_output[n]["cosine"] is None else per_output[n]["cosine"])
        main = per_output[self.names[self.class_output]] if self.class_output is not None else per_output[worst]
        result = {"n": self.n, "outputs": per_output, "worst_output": worst, "cosine": per_output[worst]["cosine"],
                  "sqnr_db": main["sqnr_db"], "max_abs_diff": main["max_abs_diff"],
                  "mean_abs_diff": main["mean_abs_diff"]}
        if self.class_output is not None:
            ref_top1, conv_top1 = (np.concatenate(t) if t else np.zeros(0, np.int64) for t in self._top1)
            result.update(_top1(ref_top1, conv_top1, labels, class_names))
        return result

    @staticmethod
    def gate(res: dict, min_ratio: float, min_agreement: float) -> dict:
        """:func:`classify_gate` of a result (reached through the class the build's verify step holds)."""
        return classify_gate(res, min_ratio, min_agreement)

    @staticmethod
    def raw_gate(res: dict, min_cosine: float) -> dict:
        """``passed`` of a ``raw`` task's result: its worst output's cosine at or above ``min_cosine``."""
        return Verdict(res["cosine"] is not None and res["cosine"] >= min_cosine).fields()


def compare(reference: np.ndarray | list[np.ndarray], converted: np.ndarray | list[np.ndarray],
            labels: np.ndarray | None = None, class_names: list[str] | None = None, *,
            names: Sequence[str] | None = None, class_output: int | None = 0) -> dict:
    """Agreement and error of ``converted`` vs ``reference`` outputs; accuracy when labelled.

    ``reference``/``converted``: one array per output (or a single array), batch first.
    ``class_output``: the index of the class scores (None: no task metric, ``raw``).
    :class:`Comparison` gives the same result chunk by chunk.
    """
    n_out = len(reference) if isinstance(reference, list) else 1
    comparison = Comparison(list(names) if names else [f"output_{i}" for i in range(n_out)], class_output)
    comparison.add(reference, converted)
    return comparison.result(labels, class_names)


def _top1(ref_top1: np.ndarray, conv_top1: np.ndarray, labels: np.ndarray | None,
          class_names: list[str] | None) -> dict:
    """Top-1 agreement of the two models' top-1 classes, and with labels the accuracy of both and per class."""
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


WEAK_ORIGINAL = 0.5
"""Below this top-1 of the original model on the eval set, the build warns: a converted model is
gated against the original, so a wrong preprocessing guess passes the gate with both equally bad."""


def weak_original_warning(chunks: Iterable[np.ndarray], labels: np.ndarray, spec: InputSpec) -> str | None:
    """A warning when the original model itself scores under WEAK_ORIGINAL top-1 on the eval set.

    ``chunks``: its class output for the eval images, in order. The usual causes: preprocessing
    that differs from training (a PyTorch model normalised with ImageNet's mean/std, BGR vs RGB),
    or eval folders that do not match the label order.
    """
    top1 = np.concatenate([np.asarray(c).reshape(len(c), -1).argmax(axis=1) for c in chunks] or [np.zeros(0, int)])
    if not len(top1) or len(top1) != len(labels):
        return None
    accuracy = float(np.mean(top1 == labels))
    if accuracy >= WEAK_ORIGINAL:
        return None
    n_classes = max(int(labels.max()) + 1, 1)
    used = f"colour {spec.colour}, mean {list(spec.mean)}, std {list(spec.std)}"
    return (f"the original model itself gets {accuracy:.0%} top-1 on the eval set (chance {1 / n_classes:.0%}); "
            f"the gate compares converted with original, so it cannot see a wrong preprocessing: check {used} "
            "against the model's training (--colour, --mean, --std; ImageNet-trained PyTorch models take "
            "--mean 123.675,116.28,103.53 --std 58.395,57.12,57.375) and that the eval folders match its label order")


ACCURATE_ORIGINAL = 0.9
"""At or above this top-1 of the original on the eval set, a converted classifier is also held to
its top-1 agreement with the original (``--min-top1-agreement``): by the ratio alone, a model
that breaks as many answers as it mends passes. Under it, the original's own errors make
disagreement expected, and only the ratio judges."""


def classify_gate(res: dict, min_ratio: float, min_agreement: float) -> dict:
    """``passed`` of a labelled classifier's eval result (:func:`compare`'s), and when its agreement
    failed, ``gate_failures``: flag -> one line per figure that failed (the ratio's too)."""
    ratio, original, agreement = res.get("ratio"), res.get("original"), res.get("agreement")
    lines = {}
    if original is not None and original >= ACCURATE_ORIGINAL and agreement is not None and agreement < min_agreement:
        if ratio is not None and ratio < min_ratio:
            lines["--min-accuracy-ratio"] = (f"top-1 {res['converted']:.4f} vs original {original:.4f}: ratio {ratio} "
                                             f"< {min_ratio} (--min-accuracy-ratio)")
        lines["--min-top1-agreement"] = (f"top-1 the same as the original's on {agreement:.4f} of the eval images < "
                                         f"{min_agreement:g}, the original being accurate ({original:.4f} >= "
                                         f"{ACCURATE_ORIGINAL}) (--min-top1-agreement)")
    return Verdict.judged(lines, also=ratio is not None and ratio >= min_ratio).fields()


WEAK_AGREEMENT = 0.9
"""An ungated int8 model (no --eval) agreeing with the original on fewer held-back images than
this gets the quantisation report and its hints anyway: a YOLO-style output of pixel boxes
beside [0, 1] scores agreed on 12 % of the detections and the build said nothing."""


def weak_ungated_warning(verification: dict) -> str | None:
    """A warning when an int8 model that no gate judged (no eval set) agrees with the original on
    under WEAK_AGREEMENT of the held-back images; None otherwise."""
    holdout = verification.get("holdout")
    if "eval" in verification or not isinstance(holdout, dict) or holdout.get("agreement") is None:
        return None
    if Verdict.of(holdout).passed is not None:  # a gate judged the held-back images (a detector's fidelity)
        return None
    agreement = float(holdout["agreement"])
    if agreement >= WEAK_AGREEMENT:
        return None
    return (f"int8 agrees with the original on only {agreement:.0%} of the held-back images (not gated: give "
            "--eval to gate it); the per-layer report below says where it loses")
