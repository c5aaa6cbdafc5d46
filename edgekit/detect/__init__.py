"""Object detection: the ``detect`` task head (:mod:`edgekit.detect.head`), its output layouts
(YOLO, SSD, NMS in the graph), NMS, and boxes mapped back to the source frame. Evaluation (datasets, mAP) is host-side:
:mod:`edgekit.evaluation`.

Device side: numpy and OpenCV (NMS) only.
"""
