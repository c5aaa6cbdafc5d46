"""Task heads: what a model's outputs mean.

:mod:`edgekit.heads.table` holds the table (``TASK_HEADS``: task name -> dotted factory path, install
hint, summary, options) and builds decoders from it; the plug-ins are :mod:`edgekit.heads.classify`,
:mod:`edgekit.heads.raw`, :mod:`edgekit.heads.landmarks`, :mod:`edgekit.heads.segment` and
:mod:`edgekit.detect.head`. Plug-ins import the shared tensor helpers
(:mod:`edgekit.heads.tensors`) and their option check (:mod:`edgekit.heads.options`), never the
table, so a row naming a plug-in is no import cycle. :mod:`edgekit.heads.openset` says when a
classifier's top class may be said at all.
"""
