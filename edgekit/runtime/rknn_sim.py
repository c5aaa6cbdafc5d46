"""RKNN-Toolkit2's simulator as a host backend (``--backend rknn-sim``): a simulation, not the NPU.

The toolkit cannot be imported here (it pins numpy 1.26 and torch 2.4), so the simulator runs
in the rk3588 toolchain's interpreter (``edgekit toolchain install rk3588``) as a child process
that stays up for the run (:class:`edgekit.toolchain.session.ChildSession`): each frame's tensor
goes over a pipe as ``.npy`` and the outputs come back the same way. The simulator runs only a
model the toolkit has just built, so the child rebuilds it from what the bundle keeps beside
its ``.rknn`` (``model.rknn.sim.json``: the ONNX, the calibration tensors and the ``config`` the
build used). Opening takes as long as that build (seconds for small models).

Its outputs are what the quantised model computes; its timings are the host's, through a pipe,
and say nothing about the NPU's speed: :meth:`RknnSimRuntime.describe` marks it a simulation.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from edgekit.errors import BundleError, ModelError
from edgekit.imaging.image import InputSpec
from edgekit.runtime.rknn_lite import to_nhwc
from edgekit.util.optionspec import Option, defaults

SIM_SUFFIX = ".sim.json"
SIM_KEYS = ("platform", "channels", "disable_rules", "quantized_algorithm", "input", "input_shape")
"""The ``config`` and ``load_onnx`` facts of the sidecar the simulator's rebuild takes."""
SIMULATION_NOTE = "RKNN-Toolkit2 simulator on the host: the NPU's outputs, not its speed"


def sim_job(model_path: Path) -> dict[str, Any]:
    """The simulator's job from ``MODEL.rknn.sim.json``: its files resolved inside the bundle folder."""
    sidecar = model_path.with_name(model_path.name + SIM_SUFFIX)
    try:
        spec = json.loads(sidecar.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BundleError(f"{sidecar.name} is missing or unreadable beside {model_path.name}: the simulator "
                          "needs the ONNX and calibration the build used", "rebuild with edgekit build --target "
                          "rk3588 (this edgekit writes it)") from exc
    folder = model_path.parent.resolve()
    job = {k: v for k, v in spec.items() if k in SIM_KEYS}
    for key in ("onnx", "calib"):
        path = (folder / str(spec.get(key, ""))).resolve()
        if folder not in path.parents or not path.is_file():
            raise BundleError(f"{sidecar.name}: {key} {spec.get(key)!r} is not a file of the bundle", "rebuild it")
        job[key] = str(path)
    return job


class RknnSimRuntime:
    """The rk3588 toolchain's simulator behind the Runtime contract.

    Args:
        model_path: the bundle's ``.rknn`` (its ``.sim.json`` sidecar says what to rebuild).
        input_spec: the bundle's input.
        start_timeout_s: how long the child may take to build and start.

    ``infer`` returns float32 arrays the caller owns. One call at a time (one child, one pipe).
    """

    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("start_timeout_s", "float", 900.0, "seconds the simulator may take to build and start",
               ge=1, le=86400),
    )
    _DEFAULT = defaults(OPTIONS)

    def __init__(self, model_path: str | Path, input_spec: InputSpec | None = None,
                 start_timeout_s: float = _DEFAULT["start_timeout_s"]):
        from edgekit.toolchain.session import ChildSession
        from edgekit.toolchain.store import find_toolchain

        if input_spec is None:
            raise ModelError(f"{model_path}: a bare .rknn does not say its preprocessing",
                             "run the bundle edgekit build --target rk3588 wrote")
        self.model_path, self.input_spec = Path(model_path), input_spec
        job = sim_job(self.model_path)
        self.toolchain = find_toolchain("rk3588")
        self._workdir = Path(tempfile.mkdtemp(prefix="edgekit-rknn-sim-"))
        t0 = time.perf_counter_ns()
        try:
            self._session = ChildSession(self.toolchain, "rknn_sim", job, self._workdir, start_timeout_s)
        except BaseException:
            self._session = None
            raise  # the folder stays: its job.log says why
        self._outputs = [list(o.shape) for o in self.infer(np.zeros(input_spec.shape, np.float32))]
        self.init_ms = (time.perf_counter_ns() - t0) / 1e6

    def output_details(self) -> list[dict[str, Any]]:
        """Each output's ``name`` and ``shape``, as the first inference gave them."""
        return [{"name": f"output{i}", "shape": shape} for i, shape in enumerate(self._outputs)]

    def infer(self, tensor: np.ndarray) -> list[np.ndarray]:
        """One inference in the simulator; float32 outputs in the model's order."""
        _, outputs = self._session.request({"op": "infer"}, [to_nhwc(tensor, self.input_spec.layout)])
        return [np.array(o, dtype=np.float32, copy=True) for o in outputs]

    def describe(self) -> dict[str, Any]:
        """The backend, the toolkit's version, and that this is a simulation."""
        return {"backend": "rknn-sim", "version": self.toolchain.versions.get("rknn-toolkit2", "?"),
                "simulation": True, "note": SIMULATION_NOTE, "init_ms": self.init_ms}

    def close(self) -> None:
        """End the child and remove its folder (idempotent)."""
        session, self._session = getattr(self, "_session", None), None
        if session is not None:
            session.close()
            shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> RknnSimRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
