"""The driver, a table of contents of the passes:

    trace (Python -> IR) -> reverse_mode (IR -> scatters) -> solver.invert (-> gathers or a
    proven-safe scatter) -> runtime.codegen (-> Python source) -> numba -> run
"""
from __future__ import annotations

import functools
import math
import operator
import os
from dataclasses import dataclass, replace

import numpy as np

from halide_ad.ad import Adjoint, reverse_mode
from halide_ad.errors import BoundsError, ShapeError
from halide_ad.ir import (Bin, Buffer, Call, Expr, Load, Op, Program, Reduce, Scatter, Select, Var,
                          adjoint_name, argindex_name, const, dtype_of, is_float)
from halide_ad.runtime.buffers import MIN_POOLED_BYTES, pool
from halide_ad.runtime.codegen import emit_backward, emit_forward, settings as codegen_settings, split_reduction
from halide_ad.runtime.compile import compile_kernel
from halide_ad.runtime.contract import Contraction, contraction, formula, tap_product_vars
from halide_ad.runtime.fusion import inline_stages
from halide_ad.runtime.schedule import piece_exprs
from halide_ad.solver import Fallback, Gather, disk_cache, invert
from halide_ad.traverse import larger_than, rewrite, simplify, substitute, walk


@dataclass(frozen=True)
class AdjointPlan:
    """adj_<buffer>[new_vars] = cotangent + the sum of `contributions`, each inverted. An inlined
    adjoint is never stored: the plans that read it compute it in place."""
    adjoint: Adjoint
    new_vars: tuple[Var, ...]
    contributions: tuple[Gather | Fallback, ...]
    inlined: bool = False


_NO_STATUS = np.zeros(3, np.int64)  # for steps without checks: no kernel writes it


@dataclass
class NumbaStep:
    """A compiled numba function over named buffers."""
    fn: object
    params: list[str]
    checks: list[str]

    def __post_init__(self):
        self._args = _getter(self.params)

    def __call__(self, buffers: dict[str, np.ndarray]) -> None:
        if not self.checks:  # `status` is written only by the `checked` reads that checks describe
            self.fn(*self._args(buffers), _NO_STATUS)
            return
        status = np.zeros(3, np.int64)
        self.fn(*self._args(buffers), status)
        if status[0]:
            raise BoundsError(self.checks[status[1]].replace("{value}", str(status[2])))


def _getter(names: list[str]):
    """buffers -> (buffers[name] for name in names), as a tuple."""
    if len(names) == 1:
        return lambda buffers, name=names[0]: (buffers[name],)
    return operator.itemgetter(*names) if names else lambda buffers: ()


@dataclass
class ContractionStep:
    """`out` = (zeros, its cotangent, or what the kernels before wrote) + BLAS contractions."""
    out: str
    init: str  # "zeros", "ct_<name>" or "kernel"
    contractions: tuple[Contraction, ...]

    def __call__(self, buffers: dict[str, np.ndarray]) -> None:
        if self.init not in ("zeros", "kernel"):
            np.copyto(buffers[self.out], buffers[self.init].reshape(buffers[self.out].shape))
        for k, c in enumerate(self.contractions):
            c.accumulate(buffers, assign=self.init == "zeros" and k == 0)


@dataclass
class Kernel:
    """The steps that fill a program's buffers (numba loop nests and BLAS contractions), and the
    source `hd.explain` shows."""
    steps: list
    source: str
    scratch: tuple[Buffer, ...] = ()  # buffers of its own, not the program's

    def __call__(self, buffers: dict[str, np.ndarray]) -> None:
        for step in self.steps:
            step(buffers)

    @functools.cached_property
    def _buffers(self) -> frozenset[str]:
        return frozenset(name for step in self.steps for name in (
            step.params if isinstance(step, NumbaStep) else
            [step.out, step.init] + [x.buffer for c in step.contractions for x in c.loads]))

    def buffers(self) -> frozenset[str]:
        """The buffers its steps read or write."""
        return self._buffers

    def compiled(self) -> bool:
        """Whether its steps run without compiling first (see `halide_ad/tiered.py`)."""
        return all(getattr(step.fn, "ready", lambda: True)() for step in self.steps if isinstance(step, NumbaStep))


def _dump(stage: str, text: str) -> None:
    if stage in os.environ.get("HALIDE_AD_DUMP", "").split(","):
        print(text)


def _numba_step(source: str, params: list[str], checks: list[str], entry: str, title: str) -> NumbaStep:
    _dump("source", source)
    return NumbaStep(compile_kernel(source, entry, title), params, checks)


def _shapes(program: Program) -> dict[str, tuple[int, ...]]:
    shapes = {b.name: b.shape for b in program.inputs} | {f.name: f.shape for f in program.funcs}
    return shapes | {adjoint_name(n): sh for n, sh in shapes.items()}


def compile_forward(program: Program) -> Kernel:
    """Consecutive loop-nest stages share one numba function; contractions run between them.
    Funcs that need not be stored are computed where they are read (`inline_stages`); a reduction
    to one point runs as partial results first (`split_reduction`), in a buffer of the kernel's
    own (`Kernel.scratch`)."""
    steps, sources, segment, scratch = [], [], [], []
    funcs, taken = [], {b.name for b in program.inputs} | {f.name for f in program.funcs}
    stored_shapes = _shapes(program)
    for f in inline_stages(program, lambda f: _func_contraction(f, stored_shapes) is not None):
        parts = split_reduction(f, taken)
        if parts is not None:
            scratch.append(parts[0].buffer)
            taken.add(parts[0].name)
        funcs += parts or [f]
    program = replace(program, funcs=tuple(funcs))
    shapes = _shapes(program)

    def flush():
        if segment:
            entry = f"forward{len(sources)}" if len(sources) or len(segment) < len(program.funcs) else "forward"
            source, params, checks = emit_forward(program, tuple(segment), entry)
            steps.append(_numba_step(source, params, checks, entry, f"forward of {program.name}"))
            sources.append(source)
            segment.clear()

    for f in program.funcs:
        c = _func_contraction(f, shapes)
        if c is None:
            segment.append(f)
            continue
        flush()
        steps.append(ContractionStep(f.name, "zeros", (c,)))
        sources.append(f"# {f.name} by {c.engine}: {c.formula}\n")
    flush()
    return Kernel(steps, "\n".join(sources), tuple(scratch))


def _func_contraction(f, shapes) -> Contraction | None:
    if not (isinstance(f.body, Reduce) and f.body.op == "sum" and is_float(f.dtype)):
        return None
    return contraction(f.name, f.vars, f.body.body, f.domain + f.body.rvars, f.body.where, shapes)


def plan_gradient(program: Program, wrt: tuple[str, ...]) -> list[AdjointPlan]:
    plans = []
    shapes = _shapes(program)
    for adj in reverse_mode(program, wrt):
        new_vars = _gather_vars(adj)
        contributions = []
        for s in adj.scatters:
            inverse = invert(s, adj.shape, new_vars)
            c = contraction(adjoint_name(s.buffer), s.index, s.value, s.domain, s.where, shapes,
                            one_operand=True)
            if c is not None and isinstance(inverse, Gather):  # BLAS computes the same gather
                split = None if c.direct is not None else _tap_product(s, c, adj, new_vars, shapes)
                if split is None:
                    contributions.append(replace(c, inverse=inverse))
                else:  # its products are filled before the kernel that reads them
                    plans.append(split[0])
                    contributions.append(split[1])
            else:
                contributions.append(inverse)
        plans.append(AdjointPlan(adj, new_vars, tuple(contributions)))
    return _inline_pointwise(plans, wrt)


MAX_TAP_PRODUCT_BYTES = 1 << 30  # else the strided input gradient runs as correlations, one per phase


def _tap_product(s: Scatter, c: Contraction, adj: Adjoint, new_vars: tuple[Var, ...],
                 shapes: dict[str, tuple[int, ...]]) -> tuple[AdjointPlan, Gather] | None:
    """A strided convolution's input gradient, `adj_x[n, c, 2*i + r] += ct[n, k, i] * w[k, c, r]`,
    in two steps (contract.tap_product_vars): BLAS writes every tap's product, `adj_x_taps[n, c,
    r, i] = sum over k of ct[n, k, i] * w[k, c, r]`, one call per image and no copies, and a
    gather adds each pixel's taps, as for an average pool's gradient (conv2d stride 2's whole
    gradient: 9.6 -> 6.1 ms). The plan that fills the products, and the gather; None where the
    contraction is not of that form, or its products would be too big."""
    order = tap_product_vars(c)
    if order is None:
        return None
    ranges = {r.var: r for r in s.domain}
    shape = tuple(ranges[v].extent for v in order)
    if math.prod(shape) * np.dtype(adj.dtype).itemsize > MAX_TAP_PRODUCT_BYTES:
        return None
    name = adj.buffer + "_taps"
    while name in shapes or adjoint_name(name) in shapes:
        name += "_"
    out = adjoint_name(name)
    blas = contraction(out, order, s.value, s.domain, None, shapes | {out: shape})
    if blas is None or blas.taps:
        return None
    products = Adjoint(name, shape, adj.dtype, False, (Scatter(name, order, s.value, s.domain, None, s.loc),))
    products_vars = _gather_vars(products)
    filled = invert(products.scatters[0], shape, products_vars)  # what hd.explain shows
    gather = invert(Scatter(s.buffer, s.index, Load(out, order, adj.dtype), tuple(ranges[v] for v in order),
                            None, s.loc), adj.shape, new_vars)
    if not isinstance(filled, Gather) or not isinstance(gather, Gather):
        return None
    shapes[name] = shapes[out] = shape  # a second split into the same adjoint takes another name
    return AdjointPlan(products, products_vars, (replace(blas, inverse=filled),)), gather


MAX_INLINED_LOADS = 2  # per tap of a window that reads an inlined adjoint
MAX_INLINED_NODES = 200  # a reshape's div/mod index: inlined into the next one, the sizes multiply


def _inline_pointwise(plans: list[AdjointPlan], wrt: tuple[str, ...]) -> list[AdjointPlan]:
    """Don't store an intermediate adjoint that is one cheap expression per element (the
    `adj_sum[j] = adj_avg[j] / 9` of an average, the `adj_y[j] * (x[j] > 0)` of a relu): the
    adjoints that read it compute it where they read it, saving a pass over memory."""
    out = list(plans)
    for k, plan in enumerate(out):
        value = _pointwise_value(plan, wrt)
        name = adjoint_name(plan.adjoint.buffer)
        later = out[k + 1:]
        blas_reads = any(isinstance(c, Contraction) and _reads(c.inverse.scatter.value, name)
                         for p in later for c in p.contributions)
        if blas_reads and _copy_of_stored(plan, value, out[:k]):
            # a copy of a stored adjoint (a bias's `adj_sum[j] = adj_y[j]`): BLAS reads that one
            out[k] = replace(plan, inlined=True)
            out[k + 1:] = [replace(p, contributions=tuple(_reading(c, name, value.buffer)
                                                          for c in p.contributions)) for p in later]
            continue
        if value is None or blas_reads or larger_than([value], MAX_INLINED_NODES):
            continue

        readers = [c for p in later for c in p.contributions if any(_reads(v, name) for v in _values(c))]
        windows = any(isinstance(c, Fallback) or any(piece.loops for piece in c.pieces) for c in readers)
        if windows and not (_cheap(value) and sum(isinstance(n, Load) for n in walk(value)) <= MAX_INLINED_LOADS):
            continue  # a window would recompute it once per tap: store it once instead

        def inline(e, plan=plan, value=value, name=name):
            def rule(n):
                if isinstance(n, Load) and n.buffer == name:
                    return substitute(value, dict(zip(plan.new_vars, n.index, strict=True)))
                return None
            return simplify(rewrite(e, rule))
        out[k] = replace(plan, inlined=True)
        out[k + 1:] = [replace(p, contributions=tuple(_map_values(c, inline) for c in p.contributions))
                       for p in later]
    return out


def _copy_of_stored(plan: AdjointPlan, value: Expr | None, earlier: list[AdjointPlan]) -> bool:
    """Whether `value`, the adjoint's at each point, is another adjoint's at the same point, of the
    same shape and dtype, stored (or the cotangent itself)."""
    if not (isinstance(value, Load) and value.index == plan.new_vars and value.dtype == plan.adjoint.dtype):
        return False
    return any(adjoint_name(p.adjoint.buffer) == value.buffer and not p.inlined
               and p.adjoint.shape == plan.adjoint.shape and (p.contributions or p.adjoint.seeded)
               for p in earlier)


def _reading(c, old: str, new: str):
    """Contribution `c` reading buffer `new` where it read `old` (at the same points)."""
    def rename(e: Expr) -> Expr:
        return rewrite(e, lambda n: replace(n, buffer=new) if isinstance(n, Load) and n.buffer == old
                       else None)

    if not isinstance(c, Contraction):
        return _map_values(c, rename)
    inverse = _map_values(c.inverse, rename)
    inverse = replace(inverse, scatter=replace(inverse.scatter, value=rename(inverse.scatter.value)))
    shapes = tuple(dict((new if n == old else n, shape) for n, shape in c.shapes).items())
    return replace(c, a=rename(c.a), b=None if c.b is None else rename(c.b), shapes=shapes, inverse=inverse,
                   formula=formula(c.out, c.out_index, inverse.scatter.value))


def _cheap(e: Expr) -> bool:
    """No division, power or transcendental function: a few cycles to recompute per tap."""
    return not any((isinstance(n, Bin) and n.op in (Op.DIV, Op.POW, Op.FLOORDIV, Op.MOD))
                   or (isinstance(n, Call) and n.fn not in ("neg", "not", "abs")) for n in walk(e))


def _values(c) -> list[Expr]:
    """The values a contribution adds (each piece's, for a gather)."""
    if isinstance(c, Gather):
        return [p.value for p in c.pieces]
    return [c.scatter.value if isinstance(c, Fallback) else c.inverse.scatter.value]


def _pointwise_value(plan: AdjointPlan, wrt) -> Expr | None:
    """The value of adj_<buffer>[new_vars] when it is one cheap expression with no loop or test."""
    adj = plan.adjoint
    if adj.buffer in wrt or adj.seeded or len(plan.contributions) != 1:
        return None
    (g,) = plan.contributions
    if not isinstance(g, Gather) or len(g.pieces) != 1:
        return None
    (piece,) = g.pieces
    tests = []  # in order: a loop's `lo < hi` comes before the tests that read at its point
    while piece.loops:  # a loop that runs at most once (a pooling window at a ragged edge)
        if not piece.single[0]:
            return None
        tests.append(Bin(Op.LT, piece.loops[0].lo, piece.loops[0].hi))
        piece = piece.fixing(0, piece.loops[0].lo)
    tests += piece.guards[0]  # tests on j alone, e.g. a relu's x[j] > 0
    if not tests:
        return piece.value
    return Select(functools.reduce(lambda a, b: Bin(Op.AND, a, b), tests), piece.value,
                  const(0, dtype_of(piece.value)))


def _reads(e, name: str) -> bool:
    return any(isinstance(n, Load) and n.buffer == name for n in walk(e))


def _map_values(c, fn):
    """Contribution `c` with `fn` applied to the values it adds."""
    if isinstance(c, Gather):
        return replace(c, pieces=tuple(replace(p, value=fn(p.value)) for p in c.pieces))
    if isinstance(c, Fallback):
        return replace(c, scatter=replace(c.scatter, value=fn(c.scatter.value)))
    return c


def _gather_vars(adj: Adjoint, avoid: frozenset[str] = frozenset()) -> tuple[Var, ...]:
    """j (or j0, j1, ...): one per dimension, never the name of a variable the scatters use (nor
    one in `avoid`)."""
    taken = {r.var.name for s in adj.scatters for r in s.domain} | avoid
    names = ["j"] if len(adj.shape) == 1 else [f"j{d}" for d in range(len(adj.shape))]
    out = []
    for n in names:
        while n in taken:
            n += "_"
        out.append(Var(n))
    return tuple(out)


def compile_gradient(program: Program, wrt: tuple[str, ...]) -> tuple[Kernel, list[AdjointPlan]]:
    """Loop-nest adjoints share numba functions; an adjoint with BLAS contributions ends one, and
    its contractions are added after the loop nest has written the rest."""
    plans = plan_gradient(program, wrt)
    private = _private_adjoints(program, plans, wrt)
    named = {b.name for b in program.inputs} | {f.name for f in program.funcs}
    temporaries = tuple((adjoint_name(p.adjoint.buffer), p.adjoint.shape)  # products per tap (`_tap_product`)
                        for p in plans if p.adjoint.buffer not in named)
    steps, sources, segment = [], [], []

    def flush():
        if any(p.contributions and not p.inlined for p in segment):
            entry = f"backward{len(sources)}"
            mine = private & {adjoint_name(p.adjoint.buffer) for p in segment}
            key = ("emit_backward", program, tuple(segment), entry, tuple(sorted(mine)),
                   temporaries, codegen_settings())  # scheduling asks z3 too
            emit = functools.partial(emit_backward, program, list(segment), entry, frozenset(mine),
                                     temporaries)
            source, params, checks = disk_cache.cached(key, emit)
            steps.append(_numba_step(source, params, checks, entry, f"gradient of {program.name}"))
            sources.append(source)
        segment.clear()

    for plan in plans:
        blas = tuple(c for c in plan.contributions if isinstance(c, Contraction))
        if not blas:
            segment.append(plan)
            continue
        rest = replace(plan, contributions=tuple(c for c in plan.contributions if not isinstance(c, Contraction)))
        if rest.contributions:
            segment.append(rest)
            init = "kernel"
        else:
            init = "ct_" + plan.adjoint.buffer if plan.adjoint.seeded else "zeros"
        flush()
        steps.append(ContractionStep(adjoint_name(plan.adjoint.buffer), init, blas))
        sources.append("".join(f"# {c.formula}  ({c.engine}{_calls(c)})\n" for c in blas))
    flush()
    return Kernel(steps, "\n".join(sources)), plans


def _calls(c: Contraction) -> str:
    """How the BLAS calls of a contraction go, as its source comment says."""
    if c.direct is not None:
        return ""
    taps = ", ".join(t.var.name for t in c.taps)
    return f", per tap of {taps}" if taps else ", one call"


def _private_adjoints(program: Program, plans: list[AdjointPlan], wrt: tuple[str, ...]) -> frozenset[str]:
    """The stored adjoints of intermediate buffers that exactly one gather reads, and nothing else
    (no BLAS contraction, no scatter, no other plan): the loop nest that computes one may hand it
    to its reader a plane at a time (codegen's stages). Not those in `wrt` (`hd.adjoints` asks
    for intermediates): they are results."""
    inputs = {b.name for b in program.inputs}
    readers: dict[str, list] = {}
    for plan in plans:
        for c in () if plan.inlined else plan.contributions:  # an inlined one's readers read what it reads
            exprs = ([e for p in c.pieces for e in piece_exprs(p)] if isinstance(c, Gather) else
                     [c.scatter.value, *c.scatter.index] + ([c.scatter.where] if c.scatter.where is not None else [])
                     if isinstance(c, Fallback) else list(c.loads))
            for name in {n.buffer for e in exprs for n in walk(e) if isinstance(n, Load)}:
                readers.setdefault(name, []).append(c)
    return frozenset(adjoint_name(p.adjoint.buffer) for p in plans
                     if not p.inlined and p.adjoint.buffer not in inputs and p.adjoint.buffer not in wrt
                     and [isinstance(c, Gather) for c in readers.get(adjoint_name(p.adjoint.buffer), [])] == [True])


def allocate(shape: tuple[int, ...], dtype: str, *, zero: bool = False) -> np.ndarray:
    """Kernels see 0-d buffers as shape (1,). Big uninitialized ones may be recycled (see
    runtime/buffers.py)."""
    try:
        return np.zeros(shape or (1,), dtype) if zero else pool.empty(shape or (1,), dtype)
    except MemoryError:
        size = np.dtype(dtype).itemsize * int(np.prod(shape, dtype=object))
        raise ShapeError(f"a buffer of shape {shape} and dtype {dtype} needs {size / 2**30:.3g} GiB, more "
                         "than this machine can allocate; shrink the program's sizes") from None


class Allocation:
    """A buffer a run allocates, `allocate(shape, dtype, zero=zero)`: plain np.empty where it is
    too small for the pool to keep (the same array, without the pool's checks per call)."""

    __slots__ = ("name", "shape", "dtype", "zero", "small")

    def __init__(self, name: str, shape: tuple[int, ...], dtype: str, *, zero: bool = False):
        self.name, self.shape, self.dtype, self.zero = name, shape, np.dtype(dtype), zero
        self.small = not zero and self.dtype.itemsize * math.prod(shape) < MIN_POOLED_BYTES

    def __call__(self) -> np.ndarray:
        if self.small:
            return np.empty(self.shape or (1,), self.dtype)
        return allocate(self.shape, self.dtype, zero=self.zero)


class ForwardRun:
    """`run_forward` for one program and its kernel, with what they fix worked out once: the 0-d
    inputs (kernels see shape (1,)) and the buffers to allocate. A cached call pays for the
    allocations and the kernel, and nothing else."""

    def __init__(self, program: Program, kernel: Kernel):
        stored = kernel.buffers()  # not the Funcs it computes where they are read
        allocations = []
        for f in program.funcs:
            if f.name not in stored:
                continue
            allocations.append(Allocation(f.name, f.shape, f.dtype))
            if f.keeps_argindex:
                allocations.append(Allocation(argindex_name(f.name), f.shape, f.argindex_dtype))
        allocations += [Allocation(b.name, b.shape, b.dtype) for b in kernel.scratch]
        self.kernel = kernel
        self.scalars = tuple(b.name for b in program.inputs if b.shape == ())
        self.allocations = tuple(allocations)

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        buffers = dict(inputs)
        for name in self.scalars:
            buffers[name] = buffers[name].reshape(1)
        for a in self.allocations:
            buffers[a.name] = a()
        self.kernel(buffers)
        return buffers


def run_forward(program: Program, kernel: Kernel, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return ForwardRun(program, kernel)(inputs)


class BackwardRun:
    """`run_backward` for one gradient kernel and its plans, with what they fix worked out once:
    which adjoints are allocated (zeroed where nothing contributes), which are the cotangents."""

    def __init__(self, kernel: Kernel, plans: list[AdjointPlan]):
        used = kernel.buffers()
        fills = []  # (buffer name, the output whose cotangent it is, or an Allocation), in plan order
        results = []
        for plan in plans:
            if plan.inlined:
                continue
            adj = plan.adjoint
            name = adjoint_name(adj.buffer)
            results.append((adj.buffer, name))
            if plan.contributions:
                if name in used:  # else a kernel keeps it one plane at a time (codegen's stages)
                    fills.append((name, Allocation(name, adj.shape, adj.dtype)))
                if adj.seeded:
                    fills.append(("ct_" + adj.buffer, adj.buffer))
            else:
                fills.append((name, adj.buffer if adj.seeded else
                              Allocation(name, adj.shape, adj.dtype, zero=True)))
        self.kernel = kernel
        self.plans = plans
        self.fills = tuple(fills)
        self.results = tuple(results)

    def __call__(self, buffers: dict[str, np.ndarray], cotangents: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        buffers = dict(buffers)
        for name, fill in self.fills:
            if isinstance(fill, str):
                ct = cotangents.get(fill)
                buffers[name] = ct.reshape(1) if ct is not None and ct.ndim == 0 else ct
            else:
                buffers[name] = fill()
        self.kernel(buffers)
        return {buffer: buffers[name] for buffer, name in self.results if name in buffers}


def run_backward(kernel: Kernel, plans: list[AdjointPlan], buffers: dict[str, np.ndarray],
                 cotangents: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Adjoint buffers by name; `cotangents` are keyed by output name."""
    return BackwardRun(kernel, plans)(buffers, cotangents)
