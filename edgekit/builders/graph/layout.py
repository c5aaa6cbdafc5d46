"""Layout rewrites of a float TFLite graph for the Edge TPU, before quantising: exact, same function.

onnx2tf turns an NCHW export into NHWC but leaves layout transposes where it could not follow
the channels, and the Edge TPU compiler's table has no ``TRANSPOSE``: it cuts the graph at the
first one and runs the rest on the CPU. A standard Ultralytics YOLOv8n ONNX came out of onnx2tf
with each C2f block's concatenation done in NCHW: ``STRIDED_SLICE -> TRANSPOSE(0,3,1,2)`` on every
input, ``CONCATENATION(axis=1)``, ``TRANSPOSE(0,2,3,1)`` back (18 TRANSPOSEs in the backbone, cut
at op 13 of 279). Two rewrites:

- :func:`drop_transpose_pairs`: a CONCATENATION whose inputs all come through one permutation
  ``P`` and whose output only goes through its inverse is the concatenation of the untransposed
  inputs along axis ``P[axis]`` (the transposes go);
- :func:`defer_unmapped`: the operators are put in another valid execution order, in which ops
  the Edge TPU maps run before those it does not whenever the graph allows (a detector's head
  branches: each level's convolutions before the first level's layout TRANSPOSE/RESHAPE).
  TFLite runs operators in list order; any topological order computes the same outputs.

Runs of elementwise ops between a TRANSPOSE and its inverse go in builders/graph/transposes.py.
"""

from __future__ import annotations

import numpy as np

from edgekit.builders.graph import edit

CONCATENATION, TRANSPOSE = 2, 39  # tflite::BuiltinOperator


def _consumers(sg) -> dict[int, list]:
    found: dict[int, list] = {}
    for op in sg.operators:
        for t in edit.valid_indices(op.inputs):
            found.setdefault(t, []).append(op)
    return found


def _perm(model, sg, op) -> list[int] | None:
    """A TRANSPOSE's constant permutation, else None."""
    if edit.opcode_of(model, op.opcodeIndex) != TRANSPOSE or len(op.inputs) < 2:
        return None
    data = edit.constant_data(model, sg.tensors[int(op.inputs[1])])
    return None if data is None else [int(v) for v in np.frombuffer(data.tobytes(), np.int32)]


def drop_transpose_pairs(model) -> int:
    """Remove TRANSPOSE pairs around CONCATENATIONs (see the module doc) in ``model`` (the
    flatbuffer object, edited in place); returns how many TRANSPOSEs went."""
    removed = 0
    for sg in model.subgraphs:
        outputs = set(edit.valid_indices(sg.outputs))
        producers = {t: op for op in sg.operators for t in edit.valid_indices(op.outputs)}
        consumers = _consumers(sg)
        gone: set[int] = set()
        for op in sg.operators:
            if edit.opcode_of(model, op.opcodeIndex) != CONCATENATION or id(op) in gone:
                continue
            before = [producers.get(int(t)) for t in op.inputs]
            perms = [_perm(model, sg, p) if p is not None else None for p in before]
            after = consumers.get(int(op.outputs[0]), [])
            if not perms or perms[0] is None or any(p != perms[0] for p in perms) or len(after) != 1 \
                    or int(op.outputs[0]) in outputs:
                continue
            perm, back = perms[0], _perm(model, sg, after[0])
            if back is None or [perm[q] for q in back] != list(range(len(perm))):
                continue
            axis = op.builtinOptions.axis % len(perm)
            op.builtinOptions.axis = perm[axis]
            op.inputs = [int(p.inputs[0]) for p in before]
            op.outputs = [int(after[0].outputs[0])]  # the layout the next op already reads
            gone.add(id(after[0]))
            for p in before:  # an input transpose another op still reads stays
                if id(p) not in gone and all(c is op for c in consumers.get(int(p.outputs[0]), [])):
                    gone.add(id(p))
        removed += len(gone)
        sg.operators = [op for op in sg.operators if id(op) not in gone]
    return removed


def first_unmapped(model, mapped) -> tuple[int, int]:
    """The position of the main subgraph's first op ``mapped(opcode name)`` says the Edge TPU does
    not map (the number of ops when none), and the number of ops: where the compiler would cut."""
    _, fb = edit.load_schema()
    names = [fb.opcode_to_name(model, op.opcodeIndex) for op in model.subgraphs[0].operators]
    return next((i for i, name in enumerate(names) if not mapped(name)), len(names)), len(names)


def defer_unmapped(model, mapped) -> tuple[int, int]:
    """Reorder the main subgraph's operators so ops ``mapped(opcode name)`` says the Edge TPU maps
    come first whenever their inputs are ready; returns the position of the first unmapped op
    before and after (the number of ops when none is unmapped).

    Kahn's topological sort over the operators: among the ready ops the earliest mapped one runs
    next, and an unmapped op only when no mapped op is ready, so the graph's first unmapped op
    (where the compiler cuts) comes as late as the data flow allows.
    """
    _, fb = edit.load_schema()
    sg = model.subgraphs[0]
    ops = list(sg.operators)
    producer = {t: i for i, op in enumerate(ops) for t in edit.valid_indices(op.outputs)}
    needs = [{producer[t] for t in edit.valid_indices(op.inputs) if t in producer} for op in ops]
    users: dict[int, list[int]] = {}
    for i, deps in enumerate(needs):
        for d in deps:
            users.setdefault(d, []).append(i)
    waiting = [len(d) for d in needs]
    ok = [bool(mapped(fb.opcode_to_name(model, op.opcodeIndex))) for op in ops]
    ready = sorted(i for i, n in enumerate(waiting) if n == 0)
    order: list[int] = []
    while ready:
        pick = next((i for i in ready if ok[i]), ready[0])
        ready.remove(pick)
        order.append(pick)
        for u in users.get(pick, []):
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
        ready.sort()
    before = next((i for i, m in enumerate(ok) if not m), len(ops))
    after = next((pos for pos, i in enumerate(order) if not ok[i]), len(ops))
    if len(order) != len(ops) or after <= before:  # no gain (a cycle cannot happen): the order stays
        return before, before
    sg.operators = [ops[i] for i in order]
    return before, after
