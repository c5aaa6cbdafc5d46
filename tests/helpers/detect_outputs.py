"""A runtime's detect-relevant contract for tests that feed the detect head arrays: the input
spec, the output shapes and their quantisation (no model behind them)."""

from __future__ import annotations

from edgekit.imaging.image import InputSpec

SPEC = InputSpec.from_dict({"shape": [1, 64, 64, 3], "dtype": "float32"})


class Outputs:
    """A runtime's detect-relevant contract: ``input_spec``, ``output_details``, ``output_quantization``."""

    def __init__(self, shapes, quant=None, spec=SPEC):
        self.input_spec = spec
        self._shapes = shapes
        self.output_quantization = quant

    def output_details(self):
        return [{"shape": list(s)} for s in self._shapes]
