"""What a halide_ad.dask task runs, on whichever worker: assemble a block from its chunks, run
the block program's compiled kernels, crop the chunk. Numpy only; `halide_ad/dask.py` builds the
graphs whose tasks call these."""
from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from dataclasses import dataclass

import numba
import numpy as np

from halide_ad import ir
from halide_ad.compiler import compile_forward, compile_gradient
from halide_ad.runtime.buffers import pool
from halide_ad.runtime.execute import BackwardRun, ForwardRun
from halide_ad.runtime.parallel import one_blas_thread
from halide_ad.runtime.route import engines


@dataclass(frozen=True)
class Block:
    """A block program, sent to each worker once as a piece of the graph; `key` names its kernels
    in this process. A gradient runs two passes, seeded differently (one for the chunked inputs,
    one for the weights), or one for both where the seeds are the same. `engines`: (output,
    formula, engine) of each contraction, as the whole program chose them
    (`compiler.engine_choices`), which the block's take whatever their sizes, so that they sum
    in the same order."""
    key: str
    program: ir.Program
    inputs: tuple[str, ...] = ()   # the chunked float inputs
    weights: tuple[str, ...] = ()  # the float weights
    engines: tuple[tuple[str, str, str], ...] = ()


runs: dict = {}
runs_lock = threading.Lock()


def kernels(block: Block, kind: str):
    """The block's ForwardRun ("forward"), or the BackwardRun for its "inputs", its "weights" or
    "both", compiled once per process (from the disk cache when another process compiled it)."""
    found = runs.get((block.key, kind))
    if found is None:
        with runs_lock:
            found = runs.get((block.key, kind))
            if found is None:
                with engines({(out, formula): engine for out, formula, engine in block.engines}):
                    found = (ForwardRun(block.program, compile_forward(block.program)) if kind == "forward"
                             else BackwardRun(*compile_gradient(block.program, wrt(block, kind))))
                runs[(block.key, kind)] = found
    return found


def wrt(block: Block, kind: str) -> tuple[str, ...]:
    return both(block.program, block.inputs, block.weights) if kind == "both" else getattr(block, kind)


def both(program: ir.Program, inputs: tuple[str, ...], weights: tuple[str, ...]) -> tuple[str, ...]:
    """The chunked inputs and the weights in the order of the program's arguments, as hd.vjp takes them."""
    return tuple(b.name for b in program.inputs if b.name in inputs or b.name in weights)


def reads_forward(block: Block, kinds: tuple[str, ...]) -> bool:
    """Whether the block's gradient passes of `kinds` read what its forward computes (a stage's
    values, a pooling's argmax): a linear program's gradient reads its inputs and the cotangent
    only, and its task skips the forward (a third of a 5x5 blur's vjp task)."""
    found = runs.get((block.key, "reads forward", kinds))
    if found is None:
        computed = {f.name for f in block.program.funcs}
        computed |= {ir.argindex_name(f.name) for f in block.program.funcs if f.keeps_argindex}
        found = runs[(block.key, "reads forward", kinds)] = any(
            computed & kernels(block, kind).kernel.buffers() for kind in kinds)
    return found


def assemble(pieces, window: tuple[slice, ...], out: np.ndarray | None = None) -> np.ndarray:
    """The window of the array that the chunks `pieces` (nested lists, one level per dimension)
    tile, copied once into `out`, else into a C-contiguous array (kernels take those) from the
    buffer pool: a task after the first reuses a block that an earlier one let go, without the
    OS's page faults."""
    shape = []
    first = pieces
    while isinstance(first, list):
        shape.append(len(first))
        first = first[0]
    grid = np.empty(shape, object)
    for index in np.ndindex(*shape):
        piece = pieces
        for k in index:
            piece = piece[k]
        grid[index] = piece
    starts = [np.cumsum([0] + [grid[(0,) * d + (k,) + (0,) * (len(shape) - d - 1)].shape[d]
                               for k in range(n)]) for d, n in enumerate(shape)]
    lo = [w.start or 0 for w in window]
    hi = [starts[d][-1] if w.stop is None else w.stop for d, w in enumerate(window)]
    if out is None:
        out = pool.empty(tuple(b - a for a, b in zip(lo, hi, strict=True)), first.dtype)
    for index in np.ndindex(*shape):
        source, target = [], []
        for d, k in enumerate(index):
            a, b = max(lo[d], starts[d][k]), min(hi[d], starts[d][k + 1])
            if a >= b:
                break
            source.append(slice(a - starts[d][k], b - starts[d][k]))
            target.append(slice(a - lo[d], b - lo[d]))
        else:
            out[tuple(target)] = grid[index][tuple(source)]
    return out


class Destination:
    """The array that a compute in this process gathers the array `name` into, allocated from
    the buffer pool by the first task that copies its chunk into it (`placed`). It lives as long
    as the compute's graph holds it (as an argument of the final task, `gathered`); until then,
    tasks in this process find it by name. In another process (a dask.distributed worker) it is
    None: each chunk goes back whole, and `gathered` copies them."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype):
        self.name, self.shape, self.dtype = name, shape, dtype
        self.array: np.ndarray | None = None
        self.lock = threading.Lock()
        _destinations[name] = self

    def get(self) -> np.ndarray:
        with self.lock:
            if self.array is None:
                self.array = pool.empty(self.shape, self.dtype)
            return self.array

    def __reduce__(self):
        return type(None), ()


_destinations: weakref.WeakValueDictionary[str, Destination] = weakref.WeakValueDictionary()


def placed(chunk: np.ndarray, name: str, at: tuple[slice, ...]) -> np.ndarray:
    """Array `name`'s chunk at `at`, as a task returns it: copied into the array that a compute
    in this process gathers `name` into, where there is one; else the view of the kernel's
    buffer. The copy runs in the task, on the task's share of the cores and while the block is
    fresh in the cache, rather than in one thread after every task; and the block's buffer goes
    back to the pool for the next task (the views held every block until the end)."""
    destination = _destinations.get(name)
    if destination is None:
        return chunk
    dest = destination.get()
    dest[at] = chunk
    return dest[at]


def gathered(results, destination: Destination | None = None):
    """An array computed from its chunks' results (nested lists, as dask gives them to
    `__dask_postcompute__`'s function): the array that `placed` copied every chunk into, else
    the chunks copied into one from the buffer pool."""
    if destination is not None and _destinations.get(destination.name) is destination:
        _destinations.pop(destination.name, None)  # it is a result now: no task writes into it again
    if not isinstance(results, list):  # a 0-d array's one chunk
        return np.array(results)
    dest = None if destination is None else destination.array
    if dest is not None and all(getattr(r, "base", None) is dest for r in _leaves(results)):
        return dest
    return assemble(results, (slice(None),) * _depth(results))


def _depth(pieces) -> int:
    return 1 + _depth(pieces[0]) if isinstance(pieces, list) else 0


def _leaves(pieces):
    if not isinstance(pieces, list):
        yield pieces
        return
    for p in pieces:
        yield from _leaves(p)


def arrays_of(inputs: list, weights: list) -> dict[str, np.ndarray]:
    """The block's arguments by buffer name. (Tasks take lists: dask finds keys in lists, not in
    dicts or tuples.)"""
    return {name: assemble(p, w) for name, p, w in inputs} | dict(weights)


_running = 0  # tasks running in this process
_running_lock = threading.Lock()


def _cores() -> int:
    """The cores this process's tasks share: a dask.distributed worker's `nthreads` (dask's
    share of the machine for it; its nanny already gives BLAS one thread per task), else every
    core numba may use (dask's threaded scheduler, in the client's process)."""
    distributed = sys.modules.get("distributed")
    if distributed is not None:
        try:
            return min(distributed.get_worker().state.nthreads, numba.config.NUMBA_NUM_THREADS)
        except ValueError:  # not in a worker
            pass
    return numba.config.NUMBA_NUM_THREADS


@contextlib.contextmanager
def task_threads():
    """The task's kernels on its share of the cores: the cores over the tasks running in this
    process when it starts (numba's thread count is per calling thread), BLAS on one thread
    where that share is one core. Each task's kernels otherwise used every core while others
    did too: on 2 cores, 2 worker processes ran 4 threads (a 5x5 blur of 8192^2 at 0.94x
    dask-image's speed). The kernels give the same bits on any number of threads."""
    global _running
    with _running_lock:
        _running += 1
        share = max(1, _cores() // _running)
    before = numba.get_num_threads()
    if share != before:  # (a task that has the cores it had: nothing to set)
        numba.set_num_threads(share)
    try:
        with one_blas_thread() if share == 1 else contextlib.nullcontext():
            yield share
    finally:
        if share != before:
            numba.set_num_threads(before)
        with _running_lock:
            _running -= 1


def forward_task(block: Block, inputs: list, weights: list, crops: dict) -> tuple:
    """Each output's chunk: `crops` holds, per output, its crop of the block and where the chunk
    goes in the whole output (the output array's name, its slices)."""
    with task_threads():
        arrays = arrays_of(inputs, weights)
        buffers = kernels(block, "forward")(arrays)
        return tuple(placed(buffers[o][crop], *where) for o, (crop, where) in crops.items())


def backward_task(block: Block, inputs: list, weights: list, cts: list, crops: dict) -> tuple:
    """(the chunked inputs' gradients on this chunk, the weights' partial gradients). `cts` holds,
    per output, its cotangent's pieces and two placements in the block: the outputs that read this
    chunk (seeding the inputs' gradients), and this task's own output chunk (seeding the weights'
    gradients, so that every output point counts once over all tasks)."""
    with task_threads():
        return _backward(block, inputs, weights, cts, crops)


def _backward(block: Block, inputs: list, weights: list, cts: list, crops: dict) -> tuple:
    buffers = arrays_of(inputs, weights)
    # one pass for all the gradients where both placements of every cotangent are one (no halo)
    passes = ((("both", 0),) if block.inputs and block.weights and all(p[0] == p[1] for _, _, p, _ in cts)
              else tuple((kind, k) for k, kind in enumerate(("inputs", "weights")) if getattr(block, kind)))
    if reads_forward(block, tuple(kind for kind, _ in passes)):
        buffers = kernels(block, "forward")(buffers)
    grads = {}
    for kind, which in passes:
        seeds = {name: _seed(pieces, places[which], shape, block.program.func(name).dtype)
                 for name, pieces, places, shape in cts}
        got = kernels(block, kind)(buffers, seeds)  # (and the adjoints of stages, which stay here)
        grads |= {name: got[name] for name in wrt(block, kind)}
    return (tuple(placed(grads[name][crop], *where) for name, (crop, where) in crops.items()),
            tuple(grads[name] for name in block.weights))


def _seed(pieces, place, shape: tuple[int, ...], dtype) -> np.ndarray:
    """A block output's cotangent: its chunks' window copied straight into its place, zero
    elsewhere (each element written once)."""
    ct = pool.empty(shape, dtype)
    if place is None:
        ct.fill(0)
        return ct
    into, window = place
    for d, s in enumerate(into):  # the slabs around the place: in it along earlier dimensions
        lo, hi, _ = s.indices(shape[d])
        ct[into[:d] + (slice(0, lo),)] = 0
        ct[into[:d] + (slice(hi, None),)] = 0
    assemble(pieces, window, ct[into])
    return ct


def add(a, b):
    return a + b


def nested_getitem(value, i: int, k: int):
    return value[i][k]
