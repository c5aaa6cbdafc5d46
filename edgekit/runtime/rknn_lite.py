"""Rockchip NPU on the board (RK3588, RK3566/8, RK3576...): a ``.rknn`` through ``rknn-toolkit-lite2``.

``rknnlite.api.RKNNLite`` loads the model (``load_rknn``), binds it to NPU cores
(``init_runtime(core_mask=...)``) and runs ``inference(inputs=[x], data_format="nhwc")``. It is
imported only when a bundle is opened with this adapter (``pip install rknn-toolkit-lite2`` on
the board, with Rockchip's ``librknnrt.so`` in /usr/lib). The ``.rknn`` edgekit builds takes
edgekit's preprocessed float tensor (it was built with mean 0 and std 1): the runtime
quantises it, so the device's preprocessing is :mod:`edgekit.imaging.image`, as everywhere.
An NCHW bundle input is handed over as NHWC, which is what the toolkit's API takes for 4-D.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from edgekit.errors import BackendUnavailable, DeviceError, ModelError
from edgekit.imaging.image import InputSpec
from edgekit.util.optionspec import Option, defaults

INSTALL_HINT = ("pip install rknn-toolkit-lite2 on the board (Rockchip's librknnrt.so must be in /usr/lib: "
                "it comes with the board's image or airockchip/rknn-toolkit2's rknpu2 runtime)")

#: core_mask option -> the RKNNLite constant's name (RK3588 has three NPU cores)
CORE_MASKS = {"auto": "NPU_CORE_AUTO", "0": "NPU_CORE_0", "1": "NPU_CORE_1", "2": "NPU_CORE_2",
              "0_1": "NPU_CORE_0_1", "0_1_2": "NPU_CORE_0_1_2", "all": "NPU_CORE_ALL"}


def to_nhwc(tensor: np.ndarray, layout: str) -> np.ndarray:
    """The tensor as the RKNN API takes a 4-D input (NHWC), from the bundle's layout."""
    if layout == "NCHW" and tensor.ndim == 4:
        return np.ascontiguousarray(tensor.transpose(0, 2, 3, 1))
    return tensor


class RknnLiteRuntime:
    """Run a ``.rknn`` on a Rockchip board's NPU.

    Args:
        model_path: the ``.rknn`` file.
        input_spec: the bundle's input (a bare ``.rknn`` carries no preprocessing: refused).
        core_mask: NPU cores (``auto``, ``0``, ``1``, ``2``, ``0_1``, ``0_1_2``, ``all``).

    ``infer`` returns float32 arrays the caller owns. Not thread-safe: one ``inference`` at a time.
    """

    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("core_mask", "str", "auto", "NPU cores to run on", choices=tuple(CORE_MASKS)),
    )
    _DEFAULT = defaults(OPTIONS)

    def __init__(self, model_path: str | Path, input_spec: InputSpec | None = None,
                 core_mask: str = _DEFAULT["core_mask"]):
        if input_spec is None:
            raise ModelError(f"{model_path}: a bare .rknn does not say its preprocessing",
                             "run the bundle edgekit build --target rk3588 wrote, not the file inside it")
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise ModelError(f"model {self.model_path} does not exist")
        try:
            from rknnlite.api import RKNNLite
        except ImportError as exc:
            raise BackendUnavailable("rknn-toolkit-lite2 is not installed", INSTALL_HINT) from exc
        self.input_spec, self.core_mask = input_spec, core_mask
        t0 = time.perf_counter_ns()
        self._rknn = RKNNLite(verbose=False)
        if self._rknn.load_rknn(str(self.model_path)) != 0:
            self.close()
            raise ModelError(f"RKNNLite cannot load {self.model_path}", "copy the bundle again, or rebuild it")
        if self._rknn.init_runtime(core_mask=getattr(RKNNLite, CORE_MASKS[core_mask])) != 0:
            self.close()
            raise DeviceError(f"RKNNLite cannot start the NPU runtime for {self.model_path.name} (core_mask "
                              f"{core_mask})", "run on a Rockchip board with librknnrt.so; check dmesg for rknpu")
        # one inference on zeros: the output shapes (the Python API has no query for them) and a warm-up
        self._outputs = [list(o.shape) for o in self.infer(np.zeros(input_spec.shape, np.float32))]
        self.init_ms = (time.perf_counter_ns() - t0) / 1e6

    def output_details(self) -> list[dict[str, Any]]:
        """Each output's ``name`` and ``shape``, as the first inference gave them."""
        return [{"name": f"output{i}", "shape": shape} for i, shape in enumerate(self._outputs)]

    def infer(self, tensor: np.ndarray) -> list[np.ndarray]:
        """One inference; float32 outputs in the model's order."""
        outputs = self._rknn.inference(inputs=[to_nhwc(tensor, self.input_spec.layout)], data_format="nhwc")
        if outputs is None:
            raise DeviceError(f"RKNNLite inference on {self.model_path.name} returned nothing",
                              "see the rknn log lines above; check the board's NPU driver (dmesg)")
        return [np.array(o, dtype=np.float32, copy=True) for o in outputs]

    def describe(self) -> dict[str, Any]:
        """The backend, its version and the cores used."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            lib = version("rknn-toolkit-lite2")
        except PackageNotFoundError:
            lib = "?"
        return {"backend": "rknn-lite", "version": lib, "core_mask": self.core_mask, "init_ms": self.init_ms,
                "device": "Rockchip NPU"}

    def close(self) -> None:
        """Release the NPU context (idempotent)."""
        rknn, self._rknn = getattr(self, "_rknn", None), None
        if rknn is not None:
            rknn.release()

    def __enter__(self) -> RknnLiteRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
