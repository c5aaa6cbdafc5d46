"""The Edge TPU's compiler: running ``edgetpu_compiler`` and reading what it says into a report."""
