"""Build published models with `edgekit build` and table each one's gate verdicts (issue 37).

Needs the 17 published files issue 37 tried, found by file name anywhere under the models folder
(``--models`` or ``$EDGEKIT_REAL_MODELS``): MediaPipe v0.10.14's ``face_detection_short_range``,
``face_detection_full_range_sparse``, ``face_landmark``, ``face_landmark_with_attention``,
``iris_landmark``, ``palm_detection_lite``/``_full``, ``hand_landmark_lite``/``_full``, ``hand_recrop``,
``pose_detection``, ``pose_landmark_full``, ``selfie_segmentation``, ``selfie_segmentation_landscape``
(``.tflite``) and RapidOCR's PaddleOCR ``ch_ppocr_mobile_v2.0_cls_infer``, ``ch_PP-OCRv4_rec_infer``,
``ch_PP-OCRv4_det_infer`` (``.onnx``); and a data folder (``--data`` or ``$EDGEKIT_REAL_DATA``) holding
the image sets each row names: ``people/`` (photos with people; selfie segmentation calibrates and
is judged on it), ``people_c/`` (calibration for the face and palm detectors), ``faces_c/`` and
``faces_e/`` (face crops: calibration / eval), ``hands_c/``, ``hands_e/`` (hand crops), ``bodies_c/``,
``bodies_e/`` (person crops), ``text/``, ``text_eval/`` (rendered text lines in ``0/`` and ``180/``
class folders) and ``faces_coco/``, ``palms_coco/`` (COCO ``annotations.json`` and images, the
detectors' eval sets). A row whose model or folders are missing is skipped and says so.

Each build runs in a child process (``python -c 'from edgekit.cli import main'``, so the edgekit
on ``PYTHONPATH`` is the one measured) with a time limit, writes its bundles under ``--out``, and
the table is read back from each bundle's ``edgekit.json`` (and its ``.rejected`` twin): the gate
figure of fp16 and int8 in the task's own units, the default variant and the reason recorded for
it, int8's p50 against fp32's as the build timed them, and the Edge TPU op share where the target
was built::

    python benchmarks/published_models.py --models MODELS_DIR --data DATA_DIR --out out/published --only iris_landmark
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

LANDMARKS = "landmarks"
LETTERBOX = ["--resize", "letterbox", "--interpolation", "linear"]  # MediaPipe's detectors: bilinear, aspect kept


def _lm(n: int, side: int, output: int = 0, **extra) -> str:
    return json.dumps({"num_landmarks": n, "input_image_width": side, "input_image_height": side,
                       "output": output, **extra})


# name, model file, targets, calibration folder, eval folder, extra build flags
ROWS: list[tuple[str, str, str, str, str | None, list[str]]] = [
    ("ocr_cls", "ch_ppocr_mobile_v2.0_cls_infer.onnx", "cpu,edgetpu", "text", "text_eval",
     ["--task", "classify", "--input-size", "48x192", "--mean", "127.5", "--std", "127.5"]),
    ("face_short", "face_detection_short_range.tflite", "cpu,edgetpu", "people_c", "faces_coco",
     ["--task", "detect", "-T", "preset=mediapipe_face_short", *LETTERBOX, "--labels", "@face"]),
    ("iris", "iris_landmark.tflite", "cpu", "faces_c", "faces_e",
     ["--task", LANDMARKS, "-T", "landmarks=" + _lm(71, 64)]),
    ("face_landmark", "face_landmark.tflite", "cpu", "faces_c", "faces_e",
     ["--task", LANDMARKS, "-T", "landmarks=" + _lm(468, 192),
      "-T", 'presence={"output": 1, "activation": "sigmoid", "threshold": 0.5}']),
    ("pose_detection", "pose_detection.tflite", "cpu", "bodies_c", None,
     ["--task", "detect", "-T", "preset=mediapipe_pose", *LETTERBOX, "--labels", "@person"]),
    ("hand_lite", "hand_landmark_lite.tflite", "cpu", "hands_c", "hands_e",
     ["--task", LANDMARKS, "-T", "landmarks=" + _lm(21, 224, normalize_z=0.4),
      "-T", 'presence={"output": 1, "activation": "none", "threshold": 0.5}']),
    ("hand_full", "hand_landmark_full.tflite", "cpu", "hands_c", "hands_e",
     ["--task", LANDMARKS, "-T", "landmarks=" + _lm(21, 224, normalize_z=0.4),
      "-T", 'presence={"output": 1, "activation": "none", "threshold": 0.5}']),
    ("palm_lite", "palm_detection_lite.tflite", "cpu", "people_c", "palms_coco",
     ["--task", "detect", "-T", "preset=mediapipe_palm", *LETTERBOX, "--labels", "@palm"]),
    ("palm_full", "palm_detection_full.tflite", "cpu", "people_c", "palms_coco",
     ["--task", "detect", "-T", "preset=mediapipe_palm", *LETTERBOX, "--labels", "@palm"]),
    ("face_full", "face_detection_full_range_sparse.tflite", "cpu", "people_c", "faces_coco",
     ["--task", "detect", "-T", "preset=mediapipe_face_full", *LETTERBOX, "--labels", "@face"]),
    ("face_attention", "face_landmark_with_attention.tflite", "cpu", "faces_c", "faces_e",
     ["--task", LANDMARKS, "-T", "landmarks=" + _lm(468, 192),
      "-T", 'presence={"output": 6, "activation": "sigmoid", "threshold": 0.5}']),
    ("hand_recrop", "hand_recrop.tflite", "cpu", "hands_c", "hands_e",
     ["--task", LANDMARKS, "-T", "landmarks=" + _lm(2, 256)]),
    ("ocr_det", "ch_PP-OCRv4_det_infer.onnx", "cpu,edgetpu", "text", "text_eval",
     ["--task", "segment", "--input-size", "320x320", "-T", "threshold=0.3"]),
    ("ocr_rec", "ch_PP-OCRv4_rec_infer.onnx", "cpu,edgetpu", "text", "text_eval",
     ["--task", "raw", "--input-size", "48x320", "--mean", "127.5", "--std", "127.5"]),  # PaddleOCR's (x/255-0.5)/0.5
    ("selfie_landscape", "selfie_segmentation_landscape.tflite", "cpu", "people", "people", ["--task", "segment"]),
    ("selfie", "selfie_segmentation.tflite", "cpu", "people", "people", ["--task", "segment"]),
    ("pose_landmark_full", "pose_landmark_full.tflite", "cpu", "bodies_c", "bodies_e",
     ["--task", "segment", "-T", "output=2", "-T", "activation=sigmoid"]),
]
LABELS = {"face": "face", "palm": "palm", "person": "person"}


def gate_figure(task: str, v: dict) -> str:
    """The figure a variant was gated by, in its task's units, from ``verification.models.<variant>``
    (its ``eval`` figures, else those on the held-back calibration images)."""
    ev = v.get("eval") or v.get("holdout") or {}
    where = "" if v.get("eval") else " (held-back calibration images)"
    if task == "classify":
        return (f"top-1 ratio {ev.get('ratio')} ({ev.get('converted')} vs {ev.get('original')}), "
                f"agreement {ev.get('agreement')}" + where)
    if task == "detect":
        det = (ev.get("fidelity") or {}).get("detections") or {}
        agree = det.get("agreement", ev.get("agreement"))
        if ev.get("ratio") is not None:
            return (f"mAP ratio {ev.get('ratio')} ({ev.get('converted')} vs {ev.get('original')}), "
                    f"agreement {agree}" + where)
        return f"detection agreement {agree}, cosine {ev.get('cosine')}" + where
    if task == LANDMARKS:
        px = ev.get("landmark_error_px") or {}
        presence = ev.get("presence_agreement")
        return (f"{px.get('mean')} px mean, {px.get('p95')} px p95"
                + (f", presence {presence}" if presence is not None else "") + where)
    if task == "segment":
        iou = ev.get("mask_iou") or {}
        return f"IoU {iou.get('mean')} mean, {iou.get('p5')} p5, {iou.get('min')} min" + where
    return f"cosine {ev.get('cosine')} ({ev.get('worst_output')})" + where


def summarise(bundle: Path) -> dict:
    """One row from a bundle's ``edgekit.json`` and its ``.rejected`` twin."""
    row: dict = {"bundle": str(bundle)}
    variants: dict[str, dict] = {}
    speeds: dict[str, float] = {}
    for path in (bundle, Path(str(bundle) + ".rejected")):
        f = path / "edgekit.json"
        if not f.exists():
            continue
        m = json.loads(f.read_text())
        task = m.get("task", {}).get("name") if isinstance(m.get("task"), dict) else m.get("task")
        row["task"] = task
        ver = m.get("verification") or {}
        for name, v in (ver.get("models") or {}).items():
            variants.setdefault(name, {**v, "_rejected": path != bundle})
        for model in m.get("models", []):
            speed = model.get("speed") or {}
            if speed.get("p50_ms") is not None:
                speeds.setdefault(model["name"], speed["p50_ms"])
            if path == bundle and model["name"] == m.get("default_model"):
                row["default"] = model["name"]
                row["default_reason"] = (speed.get("default_choice") or {}).get("reason")
        if "edgetpu" in m and path == bundle or "edgetpu" not in row and "edgetpu" in m:
            tpu = m["edgetpu"] or {}
            off = tpu.get("offline") or {}
            row["edgetpu"] = {"status": tpu.get("status"), "tpu_ops": off.get("tpu_ops"),
                              "total_ops": off.get("total_ops"), "cut": off.get("cut"),
                              "before_rewrites": off.get("before_rewrites")}
    row["variants"] = {n: {"passed": v.get("passed", (v.get("eval") or v.get("holdout") or {}).get("passed")),
                           "kept": (v.get("recovery") and [r["label"] for r in v["recovery"] if r.get("kept")]) or None,
                           "figure": gate_figure(row.get("task") or "", v),
                           "precision": v.get("precision"), "rejected": v["_rejected"]} for n, v in variants.items()}
    row["p50_ms"] = speeds
    if speeds.get("int8") and speeds.get("fp32"):
        row["int8_per_fp32"] = round(speeds["int8"] / speeds["fp32"], 3)
    return row


def markdown(rows: list[dict]) -> str:
    """The rows as a Markdown table: fp16 and int8 gate figures and verdicts, default, int8/fp32 p50, TPU ops."""
    out = ["| model | target | fp16 | int8 | default (why) | int8/fp32 p50 | TPU ops |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = []
        for name in ("fp16", "int8"):
            v = r.get("variants", {}).get(name)
            cells.append("-" if not v else f"{'PASS' if v['passed'] else 'FAIL'} {v['figure']}"
                         + (f" [kept: {'; '.join(v['kept'])}]" if v.get("kept") else ""))
        p50 = r.get("p50_ms", {})
        speed = (f"{r['int8_per_fp32']}x ({p50['int8']} / {p50['fp32']} ms)" if "int8_per_fp32" in r else "-")
        tpu = r.get("edgetpu")
        ops = f"{tpu['tpu_ops']}/{tpu['total_ops']}" if tpu and tpu.get("total_ops") else "-"
        out.append(f"| {r['name']} | {r['target']} | {cells[0]} | {cells[1]} | {r.get('default', '-')} "
                   f"({r.get('default_reason') or '-'}) | {speed} | {ops} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=os.environ.get("EDGEKIT_REAL_MODELS"), help="folder with the model files")
    ap.add_argument("--data", default=os.environ.get("EDGEKIT_REAL_DATA"), help="folder with the image sets")
    ap.add_argument("--out", required=True, help="bundles, logs and results.jsonl go here")
    ap.add_argument("--only", help="comma-separated row names (default: all)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per build (default 900)")
    ap.add_argument("--summarise-only", action="store_true", help="table the bundles already under --out")
    args = ap.parse_args()
    if not args.models or not args.data:
        ap.error("give --models and --data (or $EDGEKIT_REAL_MODELS and $EDGEKIT_REAL_DATA)")
    models, data, out = Path(args.models), Path(args.data), Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    for key, label in LABELS.items():
        (out / f"{key}.txt").write_text(label + "\n")
    done: list[dict] = []
    for name, file, targets, calib, eval_dir, extra in ROWS:
        if only and name not in only:
            continue
        found = sorted(models.rglob(file))
        if not found or not (data / calib).is_dir() or (eval_dir and not (data / eval_dir).exists()):
            print(f"{name}: skipped (no {file} under {models}, or no {calib}/{eval_dir} under {data})")
            continue
        flags = [str(out / f"{f[1:]}.txt") if f.startswith("@") else f for f in extra]
        cmd = [sys.executable, "-c", "import sys; from edgekit.cli import main; sys.argv[0] = 'edgekit'; "
               "sys.exit(main())", "build", "--model", str(found[0]), "--name", name, "--target", targets,
               "--calib", str(data / calib), "--out", str(out / "bundles"), *flags]
        if eval_dir:
            cmd += ["--eval", str(data / eval_dir)]
        rc, start = None, time.time()
        if not args.summarise_only:
            with open(out / "logs" / f"{name}.out", "w") as so, open(out / "logs" / f"{name}.err", "w") as se:
                try:
                    rc = subprocess.run(cmd, stdout=so, stderr=se, timeout=args.timeout).returncode
                except subprocess.TimeoutExpired:
                    rc = "timeout"
        for target in targets.split(","):
            row = {"name": name, "target": target, "rc": rc, "seconds": round(time.time() - start, 1),
                   **summarise(out / "bundles" / f"{name}-{target}")}
            if not args.summarise_only:
                with open(out / "results.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
            done.append(row)
    print(markdown(done))
    return 0


if __name__ == "__main__":
    sys.exit(main())
