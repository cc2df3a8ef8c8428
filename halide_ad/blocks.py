"""What a halide_ad.dask task runs, on whichever worker: assemble a block from its chunks, run
the block program's compiled kernels, crop the chunk. Numpy only; `halide_ad/dask.py` builds the
graphs whose tasks call these."""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from halide_ad import ir
from halide_ad.compiler import BackwardRun, ForwardRun, compile_forward, compile_gradient


@dataclass(frozen=True)
class Block:
    """A block program, sent to each worker once as a piece of the graph; `key` names its kernels
    in this process."""
    key: str
    program: ir.Program
    wrt: tuple[str, ...]


runs: dict = {}
runs_lock = threading.Lock()


def kernels(block: Block, kind: str):
    """The block's ForwardRun or BackwardRun, compiled once per process (from the disk cache
    when another process compiled it before)."""
    found = runs.get((block.key, kind))
    if found is None:
        with runs_lock:
            found = runs.get((block.key, kind))
            if found is None:
                found = (ForwardRun(block.program, compile_forward(block.program)) if kind == "forward"
                       else BackwardRun(*compile_gradient(block.program, block.wrt)))
                runs[(block.key, kind)] = found
    return found


def assemble(pieces, window: tuple[slice, ...]) -> np.ndarray:
    """The window of the array that the chunks `pieces` (nested lists, one level per dimension)
    tile, C-contiguous as kernels take it."""
    return np.ascontiguousarray(np.block(pieces)[window])


def arrays_of(inputs: list, weights: list) -> dict[str, np.ndarray]:
    """The block's arguments by buffer name. (Tasks take lists: dask finds keys in lists, not in
    dicts or tuples.)"""
    return {name: assemble(p, w) for name, p, w in inputs} | dict(weights)


def forward_task(block: Block, inputs: list, weights: list, crops: dict) -> tuple:
    arrays = arrays_of(inputs, weights)
    buffers = kernels(block, "forward")(arrays)
    return tuple(np.array(buffers[o][crop]) for o, crop in crops.items())


def backward_task(block: Block, inputs: list, weights: list, cts: list, crops: dict, sums: bool) -> tuple:
    """(the chunked inputs' gradients on this chunk, the weights' partial gradients). `cts` holds,
    per output, its cotangent's pieces and two placements in the block: the outputs that read this
    chunk (seeding the inputs' gradients), and this task's own output chunk (seeding the weights'
    gradients, so that every output point counts once over all tasks)."""
    arrays = arrays_of(inputs, weights)
    buffers = kernels(block, "forward")(arrays)
    backward = kernels(block, "backward")
    values = {name: None if pieces is None else assemble(pieces, window) for name, pieces, window, _, _ in cts}

    def seeds(which: int) -> dict:
        out = {}
        for name, _, _, places, shape in cts:
            ct = np.zeros(shape, block.program.func(name).dtype)
            if places[which] is not None:
                into, source = places[which]
                ct[into] = values[name][source]
            out[name] = ct
        return out

    grads = backward(buffers, seeds(0)) if crops else {}
    chunked = tuple(np.array(grads[name][crop]) for name, crop in crops.items())
    if not sums:
        return chunked, ()
    if not crops or any(places[0] != places[1] for _, _, _, places, _ in cts):
        grads = backward(buffers, seeds(1))
    return chunked, tuple(grads[name] for name, _ in weights if name in block.wrt)


def add(a, b):
    return a + b


def nested_getitem(value, i: int, k: int):
    return value[i][k]
