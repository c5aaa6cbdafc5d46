"""Edits of a float TFLite graph before quantising: the flatbuffer editor, its small shared ops,
and the rewrites (layout, scale push-up, YOLO box normalising, clamps) an int8 accelerator needs."""
