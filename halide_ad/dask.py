"""halide_ad on dask arrays: `function(fn)` and `vjp(fn, *args)` run an `@hd.func` chunk by chunk,
each task on its chunk plus a halo that `halide_ad/chunks.py` derives from the program's index
expressions. docs/dask.md explains the construction and its limits.

Arguments that are dask arrays are chunked; numpy arrays (weights), arrays the function reads from
closures or globals, and static options go to every task whole. dask's schedulers run the graphs: the threaded one, or `dask.distributed`. The graphs
carry block programs (IR), not `fn`: a worker compiles each once, or loads its kernels from the
on-disk cache.
"""
from __future__ import annotations

import functools
import hashlib
import operator
import warnings

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from halide_ad import ir
from halide_ad.api import as_function, Function
from halide_ad.arguments import classify
from halide_ad.trees import leaves_like
from halide_ad.blocks import (Block, Destination, add, backward_task, both, forward_task, gathered,
                              nested_getitem)
from halide_ad.chunks import Layout, Region, block_extents, fits, layout, needed, readers
from halide_ad.compiler import engine_choices
from halide_ad.errors import DTypeError, HalideADWarning, ShapeError

__all__ = ["function", "vjp", "halo"]


# ---- planning: chunks, halos and blocks along each axis ----------------------------------------

class _Abstract:
    """What tracing needs of an array argument: its shape and dtype (no data)."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)


def _geometry(lay: Layout, axis: int, wanted: list[dict[str, Region]],
              chunks: list[Region] | None = None) -> list[tuple[int, int, dict]]:
    """For each task's wanted output regions along `axis` (and input chunk, whose gradient the
    task gives): (block start, block extent of the inputs, every buffer's needed region). One
    extent serves every task where it can, so that one kernel serves them all; a task it cannot
    serve gets a block of its own."""
    n = lay.shapes[lay.chunked[0]][axis]
    stride = lay.stride(axis)
    regions = [needed(lay, axis, w) for w in wanted]
    for r, chunk in zip(regions, chunks or (), strict=False):
        for x in lay.chunked:
            r[x] = chunk.hull(r.get(x))
    spans = [Region(min(r[x].lo for x in lay.chunked if x in r), max(r[x].hi for x in lay.chunked if x in r))
             for r in regions]
    m = min(n, max(s.hi + 1 - s.lo // stride * stride for s in spans))
    while (n - m) % stride:
        m += 1
    extents = block_extents(lay, axis, m)
    out = []
    for span, r in zip(spans, regions, strict=True):
        start = min(span.lo // stride * stride, n - m)
        if fits(lay, axis, r, start, extents):
            out.append((start, m, r))
            continue
        first = span.lo // stride * stride
        for start, end in ((first, span.hi + 1), (first, n), (0, n)):
            if fits(lay, axis, r, start, block_extents(lay, axis, end - start)):
                out.append((start, end - start, r))
                break
        else:
            raise ShapeError(f"{lay.program.name}'s stages along axis {axis} do not keep their extents "
                             "in step with the input's (e.g. a size computed from the whole shape), so no "
                             "block reproduces the whole array's edges; give that axis one chunk")
    return out


class _Result(da.Array):
    """An output or gradient of halide_ad.dask: `compute()` copies its chunks into an array from
    halide_ad's buffer pool, as the unchunked function's results come (dask's own copy is into a
    fresh array, whose first touch the OS pays for: 0.15-2 s for 256 MiB here, as the kernels'
    whole run). A compute of it has the tasks that run in this process copy their chunks into that
array as they finish (`blocks.Destination`). Arrays derived from it are dask's own."""

    def __dask_postcompute__(self):
        return gathered, (Destination(self.name, self.shape, self.dtype),)


def _boundaries(chunks: tuple[int, ...]) -> list[int]:
    return [0, *np.cumsum(chunks).tolist()]


def _overlapping(bounds: list[int], lo: int, hi: int) -> range:
    """The chunk indices whose chunks meet lo..hi-1."""
    first = int(np.searchsorted(bounds, lo, side="right")) - 1
    last = int(np.searchsorted(bounds, hi, side="left")) - 1
    return range(first, last + 1)


def _pieces(name: str, ndim: int, ranges: dict[int, range]):
    """Nested lists of the keys of `name`'s chunks in `ranges` (one chunk on other dimensions)."""
    def level(d: int, index: tuple):
        if d == ndim:
            return (name, *index)
        return [level(d + 1, index + (k,)) for k in ranges.get(d, range(1))]
    return level(0, ())


class _Call:
    """One call of a chunked function: the traced program at the whole arrays' shapes, its Layout,
    the dask arguments aligned to chunks the program can use, and the graphs built from them."""

    def __init__(self, f: Function, args: tuple, kwargs: dict):
        self.f, self.name = f, getattr(f.fn, "__name__", "fn")
        f._check_arguments(args, kwargs)
        names = f._param_names(len(args))
        dasks = {n: a for n, a in zip(names, args, strict=True) if isinstance(a, da.Array)}
        for k, v in kwargs.items():
            if isinstance(v, da.Array):
                raise ShapeError(f"{self.name} got the dask array {k}= as a keyword argument; pass "
                                 "chunked arrays positionally")
        if not dasks:
            raise ShapeError(f"halide_ad.dask runs {self.name} on dask arrays, but none of its arguments "
                             "is one; call it directly on numpy arrays instead")
        self.arrays = self._aligned_chunks(dasks)
        classified = []
        for n, a in zip(names, args, strict=True):
            if n in dasks:
                classify(n, np.empty((1,) * a.ndim, a.dtype))  # the dtype checks, on a stand-in
                classified.append(("array", _Abstract(a.shape, a.dtype)))
            else:
                classified.append(classify(n, a))
        kw = {k: classify(k, v) for k, v in sorted(kwargs.items())}
        self.traced, captured = f._trace(names, classified, kw)
        self.program = self.traced.program
        # arrays read from a closure or a global go whole to every task, as weights do (no gradient)
        self.weights = {n: v for n, (k, v) in list(zip(names, classified)) + list(kw.items())
                        if k == "array" and n not in dasks} | captured
        self.axes = tuple(a for a in range(self.ndim) if self.bounds[a] is not None)
        self.layout = layout(self.program, tuple(self.arrays), self.axes, self.name)
        self._realign()
        self.token = tokenize(f.fn.__module__, f.fn.__qualname__, args, kwargs, captured)

    def _aligned_chunks(self, dasks: dict) -> dict:
        ndims = {a.ndim for a in dasks.values()}
        if len(ndims) != 1:
            raise ShapeError(f"the dask arrays passed to {self.name} have different ranks "
                             f"{sorted(ndims)}; chunked arguments must share their axes (pass small "
                             "arguments as numpy arrays)")
        self.ndim = ndims.pop()
        chunks = []
        for d in range(self.ndim):
            split = [a for a in dasks.values() if len(a.chunks[d]) > 1]
            if split and any(a.shape[d] != split[0].shape[d] for a in dasks.values()):
                raise ShapeError(f"{self.name}'s dask arguments are chunked along axis {d} but differ in "
                                 f"size there ({[a.shape[d] for a in dasks.values()]}); chunked arguments "
                                 "must have equal extents along their chunked axes (pass small arguments, "
                                 "such as weights, as numpy arrays)")
            chunks.append(split[0].chunks[d] if split else -1)  # one chunk, whatever each one's extent
        self.bounds = [_boundaries(c) if c != -1 else None for c in chunks]
        return {n: a.rechunk(tuple(chunks)) for n, a in dasks.items()}

    def _realign(self) -> None:
        """Chunk boundaries at multiples of each axis's stride (a pooling's), leaving every output
        chunk non-empty: rechunk where they are not, and say so. Misaligned chunks become chunks
        of the largest one's size rounded up to the stride."""
        lay = self.layout
        for a in self.axes:
            stride = lay.stride(a)
            outs = [(lay.scale[a][o], lay.shapes[o][a]) for o in self.program.outputs]
            n = self.bounds[a][-1]
            inner = self.bounds[a][1:-1]
            why = "every output chunk must be non-empty"
            if any(b % stride for b in inner):  # the largest chunk, rounded up to the stride, throughout
                size = -(-max(np.diff(self.bounds[a])) // stride) * stride
                inner = range(size, n, size)
                why = f"chunk boundaries must be multiples of the stride {stride} of its reads"
            bounds = [0, *(b for b in inner if all(b // s < n_o for s, n_o in outs)), n]
            if bounds != self.bounds[a]:
                warnings.warn(f"halide_ad.dask rechunked {self.name}'s inputs along axis {a} to chunks "
                              f"{tuple(np.diff(bounds).tolist())}: {why}", HalideADWarning, stacklevel=4)
                self.bounds[a] = bounds
        chunks = {a: tuple(np.diff(self.bounds[a]).tolist()) for a in self.axes}
        self.arrays = {n: x.rechunk(chunks) for n, x in self.arrays.items()}

    # -- shared pieces of both graphs --

    def output_chunks(self, o: str, axis: int) -> list[tuple[int, int]]:
        """Output `o`'s chunks along a chunked axis: [lo, hi) in its own indices."""
        s, n_o = self.layout.scale[axis][o], self.layout.shapes[o][axis]
        b = self.bounds[axis]
        return [(b[k] // s, b[k + 1] // s if k + 2 < len(b) else n_o) for k in range(len(b) - 1)]

    def grid(self) -> list[tuple[int, ...]]:
        return list(np.ndindex(*(len(self.bounds[a]) - 1 for a in self.axes)))

    def _blocks(self, plans: dict[int, list], inputs: tuple[str, ...] = (),
                weights: tuple[str, ...] = ()) -> dict:
        """Block programs by their extents along the chunked axes, taking the whole program's
        engines (for its forward, and its gradients for `inputs`, for `weights` and for both)."""
        wrts = [wrt for wrt in (inputs, weights) if wrt]
        if inputs and weights:  # the one pass of a task whose seeds for both are the same
            wrts.append(both(self.program, inputs, weights))
        chosen = tuple(sorted((*key, engine) for key, engine in engine_choices(self.program, *wrts).items()))
        blocks = {}
        for key in {tuple(plans[a][index[i]][1] for i, a in enumerate(self.axes)) for index in self.grid()}:
            per_axis = {a: block_extents(self.layout, a, m) for a, m in zip(self.axes, key, strict=True)}
            extents = {}
            for a, ext in per_axis.items():
                for name, m in ext.items():
                    extents.setdefault(name, {})[a] = m
            program = self.layout.rebuild(extents)
            digest = hashlib.sha256(repr((program, inputs, weights, chosen)).encode()).hexdigest()[:16]
            blocks[key] = (Block(digest, program, inputs, weights, chosen), per_axis)
        return blocks

    def _layers(self, prefix: str, blocks: dict, extra=()) -> tuple[dict, dict, set, list, dict]:
        """The graph's layers so far (the inputs', `extra` collections', and one key for each
        weight and each block program, so that each is sent once to a worker rather than with
        every task), their dependencies, the layers that the tasks read, the weights' keys as
        tasks take them, and the block programs' keys."""
        layers, deps = {}, {}
        for x in (*self.arrays.values(), *extra):
            layers.update(x.dask.layers)
            deps.update(x.dask.dependencies)
        values = {name: (f"{prefix}-{name}",) for name in self.weights}
        values |= {key: (f"{prefix}-program-{block.key}",) for key, (block, _) in blocks.items()}
        for name, key in values.items():
            value = self.weights[name] if name in self.weights else blocks[name][0]
            layers[key[0]] = MaterializedLayer({key: value})
            deps[key[0]] = set()
        sources = {key[0] for key in values.values()}
        sources |= {layer for x in (*self.arrays.values(), *extra) for layer in x.__dask_layers__()}
        weights = [[name, values[name]] for name in self.weights]
        return layers, deps, sources, weights, {key: values[key] for key in blocks}

    def out_chunks(self, o: str) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(hi - lo for lo, hi in self.output_chunks(o, d)) if d in self.axes else (n,)
                     for d, n in enumerate(self.layout.shapes[o]))

    def _input_pieces(self, index: tuple, plans: dict) -> list:
        out = []
        for name, x in self.arrays.items():
            ranges, window = {}, [slice(None)] * self.ndim
            for i, a in enumerate(self.axes):
                start, m, _ = plans[a][index[i]]
                ranges[a] = _overlapping(self.bounds[a], start, start + m)
                first = self.bounds[a][ranges[a].start]
                window[a] = slice(start - first, start - first + m)
            out.append([name, _pieces(x.name, self.ndim, ranges), tuple(window)])
        return out

    def _array(self, layers, deps, name: str, tasks: dict, depends: str, chunks, dtype) -> da.Array:
        layers[name] = MaterializedLayer(tasks)
        deps[name] = {depends}
        graph = HighLevelGraph(dict(layers), dict(deps))
        return _Result(graph, name, chunks, meta=np.empty((0,) * len(chunks), dtype))

    # -- forward --

    def forward(self):
        program, lay = self.program, self.layout
        grid = self.grid()
        plans = {a: _geometry(lay, a, [{o: Region(lo, hi - 1) for o, (lo, hi) in
                                        ((o, self.output_chunks(o, a)[k]) for o in program.outputs)}
                                       for k in range(len(self.bounds[a]) - 1)]) for a in self.axes}
        blocks = self._blocks(plans)
        prefix = f"hd-{self.name}-{self.token}"
        layers, deps, sources, weights, block_keys = self._layers(prefix, blocks)
        tasks = {}
        for index in grid:
            key = tuple(plans[a][index[i]][1] for i, a in enumerate(self.axes))
            crops = {}
            for o in program.outputs:
                crop, at = [slice(None)] * len(lay.shapes[o]), [slice(None)] * len(lay.shapes[o])
                for i, a in enumerate(self.axes):
                    off = plans[a][index[i]][0] // lay.scale[a][o]
                    lo, hi = self.output_chunks(o, a)[index[i]]
                    crop[a], at[a] = slice(lo - off, hi - off), slice(lo, hi)
                crops[o] = (tuple(crop), (f"{prefix}-{o}", tuple(at)))
            tasks[(f"{prefix}-blocks", *index)] = (forward_task, block_keys[key],
                                                  self._input_pieces(index, plans), weights, crops)
        blocks_name = f"{prefix}-blocks"
        layers[blocks_name] = MaterializedLayer(tasks)
        deps[blocks_name] = sources
        outs = {}
        for k, o in enumerate(program.outputs):
            name = f"{prefix}-{o}"
            getters = {(name, *self._out_index(index, len(lay.shapes[o]))):
                       (operator.getitem, (blocks_name, *index), k) for index in grid}
            outs[o] = self._array(layers, deps, name, getters, blocks_name, self.out_chunks(o),
                                  program.func(o).dtype)
        return self.traced.outputs(outs)

    def _out_index(self, index: tuple, ndim: int) -> tuple:
        out = [0] * ndim
        for i, a in enumerate(self.axes):
            out[a] = index[i]
        return tuple(out)

    # -- gradient --

    def backward(self, cotangent) -> tuple:
        program, lay = self.program, self.layout
        leaves = self._cotangent_leaves(cotangent)
        floats = [n for n in self.traced.arg_names if n is not None and ir.is_float(program.buffer(n).dtype)]
        chunked = [n for n in floats if n in self.arrays]
        summed = [n for n in floats if n in self.weights]
        grid = self.grid()
        own, wanted, reading, chunks = {}, {}, {}, {}
        for a in self.axes:
            own[a], wanted[a], reading[a], chunks[a] = [], [], [], []
            for k in range(len(self.bounds[a]) - 1):
                chunk = Region(self.bounds[a][k], self.bounds[a][k + 1] - 1)
                found = readers(lay, a, {x: chunk for x in chunked})
                outs = {o: Region(lo, hi - 1) for o, (lo, hi) in
                        ((o, self.output_chunks(o, a)[k]) for o in program.outputs)}
                reads = {o: found[o] for o in program.outputs if o in found}
                own[a].append(outs)
                reading[a].append(reads)
                chunks[a].append(chunk)
                wanted[a].append({o: r.hull(reads.get(o)) if summed else reads.get(o, r)
                                  for o, r in outs.items()})
        plans = {a: _geometry(lay, a, wanted[a], chunks[a]) for a in self.axes}
        blocks = self._blocks(plans, tuple(chunked), tuple(summed))
        prefix = f"hd-vjp-{self.name}-{tokenize(self.token, leaves)}"
        layers, deps, sources, weights, block_keys = self._layers(prefix, blocks, leaves.values())
        tasks = {}
        for index in grid:
            key = tuple(plans[a][index[i]][1] for i, a in enumerate(self.axes))
            _, per_axis = blocks[key]
            cts = []
            for o, ct in leaves.items():
                regions = [[reading[a][index[i]].get(o) for i, a in enumerate(self.axes)],
                           [own[a][index[i]][o] for i, a in enumerate(self.axes)]]
                if not summed:
                    regions[1] = [None]
                cts.append([o, *self._placements(o, ct, index, plans, per_axis, regions)])
            crop, at = [slice(None)] * self.ndim, [slice(None)] * self.ndim
            for i, a in enumerate(self.axes):
                start, lo, hi = plans[a][index[i]][0], self.bounds[a][index[i]], self.bounds[a][index[i] + 1]
                crop[a], at[a] = slice(lo - start, hi - start), slice(lo, hi)
            crops = {x: (tuple(crop), (f"{prefix}-grad-{x}", tuple(at))) for x in chunked}
            tasks[(f"{prefix}-blocks", *index)] = (backward_task, block_keys[key],
                                                  self._input_pieces(index, plans), weights, cts, crops)
        blocks_name = f"{prefix}-blocks"
        layers[blocks_name] = MaterializedLayer(tasks)
        deps[blocks_name] = sources
        grads = {}
        for k, x in enumerate(chunked):
            name = f"{prefix}-grad-{x}"
            getters = {(name, *self._out_index(index, self.ndim)):
                       (nested_getitem, (blocks_name, *index), 0, k) for index in grid}
            grads[x] = self._array(layers, deps, name, getters, blocks_name, self.arrays[x].chunks,
                                   program.buffer(x).dtype)
        for k, w in enumerate(summed):
            grads[w] = self._tree_sum(layers, deps, f"{prefix}-grad-{w}", blocks_name, grid, k,
                                      program.buffer(w))
        return tuple(None if n is None else grads.get(n) for n in self.traced.arg_names)

    def _placements(self, o: str, ct: da.Array, index: tuple, plans: dict, per_axis: dict, regions: list):
        """Output o's cotangent for one task: (the keys of its chunks that cover both regions, for
        each region where it goes in the block's output and its window of those chunks (None for
        an empty region), the block output's shape)."""
        lay = self.layout
        shape = list(lay.shapes[o])
        spans = []
        for i, a in enumerate(self.axes):
            shape[a] = per_axis[a][o]
            parts = [r[i] for r in regions if None not in r]
            spans.append(functools.reduce(Region.hull, parts) if parts else None)
        if None in spans:
            return None, (None, None), tuple(shape)
        ranges = {}
        into = [[slice(None)] * len(shape) for _ in regions]
        source = [[slice(None)] * len(shape) for _ in regions]
        for i, a in enumerate(self.axes):
            bounds = [lo for lo, _ in self.output_chunks(o, a)] + [lay.shapes[o][a]]
            span = spans[i]
            ranges[a] = _overlapping(bounds, span.lo, span.hi + 1)
            first = bounds[ranges[a].start]
            off = plans[a][index[i]][0] // lay.scale[a][o]
            for r, region in enumerate(regions):
                if None not in region:
                    into[r][a] = slice(region[i].lo - off, region[i].hi + 1 - off)
                    source[r][a] = slice(region[i].lo - first, region[i].hi + 1 - first)
        places = tuple(None if None in region else (tuple(into[r]), tuple(source[r]))
                       for r, region in enumerate(regions))
        return _pieces(ct.name, len(shape), ranges), places, tuple(shape)

    def _tree_sum(self, layers, deps, name: str, blocks_name: str, grid, k: int,
                  buffer: ir.Buffer) -> da.Array:
        """The sum of the tasks' partial gradients of a weight, pairwise in the grid's order: the
        same additions in the same order whatever the scheduler runs first."""
        tasks = {}
        level = []
        for index in grid:
            key = (f"{name}-partial", *index)
            tasks[key] = (nested_getitem, (blocks_name, *index), 1, k)
            level.append(key)
        depth = 0
        while len(level) > 1:
            depth += 1
            pairs = []
            for i in range(0, len(level) - 1, 2):
                pairs.append((f"{name}-sum{depth}", i // 2))
                tasks[pairs[-1]] = (add, level[i], level[i + 1])
            level = pairs + level[len(pairs) * 2:]  # an odd one out joins the next level
        root = (name, *(0,) * len(buffer.shape))
        tasks[root] = (np.reshape, level[0], buffer.shape)
        return self._array(layers, deps, name, tasks, blocks_name, tuple((n,) for n in buffer.shape),
                           buffer.dtype)

    def _cotangent_leaves(self, cotangent) -> dict:
        """The cotangent per output as dask arrays in the outputs' chunks, checked as hd.vjp checks."""
        program, lay = self.program, self.layout
        try:
            leaves = leaves_like(self.traced.structure(), cotangent, len(program.outputs))
        except (TypeError, ValueError, KeyError):
            raise ShapeError(f"the cotangent must have the structure of {self.name}'s outputs") from None
        out = {}
        for o, ct in zip(program.outputs, leaves, strict=True):
            shape, chunks = lay.shapes[o], self.out_chunks(o)
            if not isinstance(ct, da.Array):
                ct = np.asarray(ct)
                if ct.shape == shape:
                    ct = da.from_array(ct, chunks=chunks)
            if tuple(ct.shape) != shape:
                raise ShapeError(f"the cotangent for output {o!r} has shape {tuple(ct.shape)}; it must be "
                                 f"{shape}, the output's shape")
            if np.dtype(ct.dtype).kind not in "fiu":
                raise DTypeError(f"the cotangent for output {o!r} has dtype {ct.dtype}; use a float array")
            out[o] = ct.rechunk(chunks)
        return out


# ---- the public functions -----------------------------------------------------------------------

def function(fn):
    """`fn` (an `@hd.func`, or a plain function traced as one) on dask arrays: it returns dask
    arrays, computed chunk by chunk with exact halos. Numpy arguments go whole to every task."""
    f = as_function(fn)

    @functools.wraps(f.fn)
    def chunked(*args, **kwargs):
        return _Call(f, args, kwargs).forward()
    return chunked


def vjp(fn, *args, **kwargs):
    """(fn(*args) as dask arrays, vjp_fn), as `hd.vjp`: vjp_fn(cotangent) gives one gradient per
    positional argument, dask arrays chunked as the arguments (a weight's in one chunk, summed over
    the chunks in a fixed order), None for static and integer arguments."""
    call = _Call(as_function(fn), args, kwargs)
    return call.forward(), call.backward


def halo(fn, *args, **kwargs) -> dict[int, tuple[int, int]]:
    """Per chunked axis, how far the inputs an output chunk reads reach past the input chunk it
    comes from, (before, after), measured away from the array's edges."""
    call = _Call(as_function(fn), args, kwargs)
    lay, out = call.layout, {}
    for a in call.axes:
        reach = []
        for o in call.program.outputs:
            s, n_o = lay.scale[a][o], lay.shapes[o][a]
            p = n_o // 2
            r = needed(lay, a, {o: Region(p, p)})
            lo = min(r[x].lo for x in call.arrays)
            hi = max(r[x].hi for x in call.arrays)
            reach.append((s * p - lo, hi - (s * p + s - 1)))
        out[a] = (max(r[0] for r in reach), max(r[1] for r in reach))
    return out

