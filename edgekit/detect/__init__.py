"""Object detection: the ``detect`` task head (:mod:`edgekit.detect.head`), its output layouts
(YOLO, SSD, NMS in the graph), NMS, boxes mapped back to the source frame, and mAP.

Device side: numpy and OpenCV (NMS) only.
"""
