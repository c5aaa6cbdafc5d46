"""Host-side evaluation of detectors: datasets (COCO JSON, YOLO txt), label sets and mAP through pycocotools.
Needs the eval extra; the device-side decoders in ``edgekit.detect`` never import it.
"""
