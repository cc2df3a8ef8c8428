"""Chunking a traced program along some axes of its inputs: how each stage reads along those axes,
the exact regions a chunk of the output needs (its halo), and the program that runs on one block.

No dask here: `halide_ad/dask.py` builds the graphs from what this module works out.

Along a chunked axis `a`, every read of a chunked buffer must be `view(s * i + c)`: `i` is the
reading stage's own index variable of dimension `a`, `s >= 1` a stride, `c` a constant plus
reduction variables over fixed ranges, and `view` one of the boundary views (`hd.repeat_edge` or a
clamp to the edges, `hd.mirror`, `hd.constant_exterior`) or none. Such a read has an exact reach
per side, and boundary views act only at the whole array's edges.

A block program is the traced program with chunked extents replaced by a block's: the same
expressions, index for index, with the boundary views re-emitted at the block's edges. A block
that contains everything an output chunk needs, and reaches a true edge of the array wherever a
view acts there, computes that chunk bit for bit as the whole program does (docs/dask.md).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from halide_ad import ir
from halide_ad.errors import InternalError, ShapeError, SourceLoc
from halide_ad.ir import Bin, Call, Const, Load, Op, Reduce, Select, Var
from halide_ad.affine import linear_form
from halide_ad.solver.bounds import check_bounds
from halide_ad.traverse import children, conjuncts, free_vars, map_children, walk


@dataclass(frozen=True)
class Read:
    """One read of a chunked buffer along a chunked axis: `view(scale * i + [lo, hi])`."""
    buffer: str
    scale: int
    lo: int
    hi: int
    view: str  # "none", "clamp", "mirror" or "guard" (constant_exterior)


class Refusal(Exception):
    def __init__(self, axis: int, reason: str, loc: SourceLoc | None):
        super().__init__(reason)
        self.axis, self.reason, self.loc = axis, reason, loc


# ---- boundary views in index expressions --------------------------------------------------------

def _is_int(e: ir.Expr, value: int) -> bool:
    return isinstance(e, Const) and not isinstance(e.value, (bool, float)) and e.value == value


def peel(e: ir.Expr, n: int) -> tuple[str, ir.Expr]:
    """(view, raw index) of an index into a dimension of extent n: the boundary view that
    `hd.repeat_edge` (or a clamp to 0 and n - 1) or `hd.mirror` wrapped around `raw`."""
    if isinstance(e, Bin) and e.op is Op.MIN and _is_int(e.rhs, n - 1):
        inner = e.lhs
        if isinstance(inner, Bin) and inner.op is Op.MAX and _is_int(inner.rhs, 0):
            return "clamp", inner.lhs
        return "clamp", inner
    if isinstance(e, Bin) and e.op is Op.MAX and _is_int(e.rhs, 0):
        return "clamp", e.lhs
    match e:
        case Bin(Op.SUB, a, Call("abs", (Bin(Op.SUB, b, Bin(Op.MOD, Call("abs", (raw,)), p)),))) if (
                _is_int(a, n - 1) and _is_int(b, n - 1) and _is_int(p, 2 * (n - 1))):
            return "mirror", raw
    return "none", e


def remap(view: str, raw: ir.Expr, n: int, span: tuple[int, int]) -> ir.Expr:
    """`raw` under `view` for extent n, with only the sides that `span` (raw's range) crosses,
    as the boundary views emit it."""
    inside = 0 <= span[0] and span[1] <= n - 1
    if view in ("none", "guard") or inside:
        return raw
    if view == "mirror" and n > 1:
        folded = Bin(Op.MOD, Call("abs", (raw,)), ir.const(2 * (n - 1)))
        return Bin(Op.SUB, ir.const(n - 1), Call("abs", (Bin(Op.SUB, ir.const(n - 1), folded),)))
    e = Bin(Op.MAX, raw, ir.const(0)) if span[0] < 0 else raw
    return Bin(Op.MIN, e, ir.const(n - 1)) if span[1] > n - 1 else e


def _guard(e: ir.Expr, shape_of) -> tuple[Load, tuple[ir.Expr, ...]] | None:
    """The load of `hd.constant_exterior`'s select, `select(0 <= e_d < n_d for every d, load, value)`."""
    if not isinstance(e, Select):
        return None
    load = e.true.value if isinstance(e.true, ir.Cast) else e.true
    if not isinstance(load, Load):
        return None
    terms = conjuncts(e.cond)
    shape = shape_of(load.buffer)
    if len(terms) != 2 * len(shape):
        return None
    for d, n in enumerate(shape):
        ge, lt = terms[2 * d], terms[2 * d + 1]
        at = load.index[d]
        if not (isinstance(ge, Bin) and ge.op is Op.GE and ge.lhs == at and _is_int(ge.rhs, 0)
                and isinstance(lt, Bin) and lt.op is Op.LT and lt.lhs == at and _is_int(lt.rhs, n)):
            return None
    return load, terms


# ---- reading a program along chunked axes -------------------------------------------------------

class Layout:
    """How `program` reads along `axes` when the inputs `chunked` are chunked there: the buffers
    that carry each axis (with their stride against the inputs) and every stage's reads.

    With `extents` (buffer name -> its extent along each axis, for the carriers), `rebuild` gives
    the block program of those extents; `Layout(...)` itself checks the program with its own."""

    def __init__(self, program: ir.Program, chunked: tuple[str, ...], axes: tuple[int, ...]):
        self.program, self.chunked, self.axes = program, chunked, axes
        self.shapes = {b.name: b.shape for b in program.inputs} | {f.name: f.shape for f in program.funcs}
        self.scale: dict[int, dict[str, int]] = {}
        for a in axes:
            self.scale[a] = dict.fromkeys(chunked, 1)
            for f in program.funcs:
                if any(isinstance(n, Load) and n.buffer in self.scale[a] for n in walk(f.body)):
                    if len(f.shape) <= a:
                        raise Refusal(a, f"{f.name} (shape {f.shape}) has no dimension {a}: it reduces "
                                      "or reshapes that axis away", f.loc)
                    self.scale[a][f.name] = 0  # set by its reads, in _rewrite
        self.reads: dict[int, dict[str, list[Read]]] = {a: {} for a in axes}
        for f in program.funcs:
            self._rewrite(f, self.shapes)
        for o in program.outputs:
            for a in axes:
                if o not in self.scale[a]:
                    raise Refusal(a, f"the output {o} does not depend on the chunked inputs along it",
                                  program.func(o).loc)

    def carries(self, name: str, axis: int) -> bool:
        return name in self.scale[axis]

    def stride(self, axis: int) -> int:
        """Block starts along `axis` must be multiples of this: every stage's start is then whole."""
        return math.lcm(*self.scale[axis].values())

    def rebuild(self, extents: dict[str, dict[int, int]]) -> ir.Program:
        """The block program whose carriers have `extents` along the chunked axes."""
        def shape(name: str) -> tuple[int, ...]:
            s = list(self.shapes[name])
            for a, m in extents.get(name, {}).items():
                s[a] = m
            return tuple(s)
        shapes = {name: shape(name) for name in self.shapes}
        inputs = tuple(dataclasses.replace(b, shape=shapes[b.name]) for b in self.program.inputs)
        funcs = []
        for f in self.program.funcs:
            body = self._rewrite(f, shapes)
            funcs.append(check_bounds(dataclasses.replace(f, shape=shapes[f.name], body=body),
                                      lambda n: ir.Buffer(n, shapes[n], "float64")))
        return dataclasses.replace(self.program, inputs=inputs, funcs=tuple(funcs))

    # -- the one traversal: it checks and records reads, and re-emits views for new extents --

    def _rewrite(self, f: ir.Func, shapes: dict[str, tuple[int, ...]]) -> ir.Expr:
        axes = [a for a in self.axes if self.carries(f.name, a)]
        own = {f.vars[a]: a for a in axes}
        rvars = f.body.rvars if isinstance(f.body, Reduce) else ()
        ranges = {v: (0, n - 1) for v, n in zip(f.vars, shapes[f.name], strict=True)}
        ranges |= {r.var: (r.lo, r.hi - 1) for r in rvars}
        recording = shapes is self.shapes

        def index(load: Load, d: int, e: ir.Expr, guarded: bool) -> ir.Expr:
            if d not in axes or not self.carries(load.buffer, d):
                # a position along a chunked axis may reach this index only through a read (a lookup)
                for v in _bare_vars(e) & own.keys():
                    raise Refusal(own[v], f"{f.name} reads {load.buffer}, which is not chunked along "
                                  f"axis {own[v]}, at `{e}`: a position along that axis", load.loc or f.loc)
                return visit(e)
            a = d
            n_old = self.shapes[load.buffer][a]
            view, raw = ("guard", e) if guarded else peel(e, n_old)
            if any(isinstance(n, Load) for n in walk(raw)):
                raise Refusal(a, f"{f.name} reads {load.buffer} at `{e}`, an index that depends on "
                              "data, along it", load.loc or f.loc)
            form = linear_form(raw)
            var = f.vars[a]
            if form is None or form[0].get(var, 0) < 1:
                others = [v.name for v in free_vars(raw) if v in f.vars and v != var]
                why = (f"which moves the axis to {f.name}'s index {others[0]} (a transpose)" if others else
                       f"which is not s * {var.name} + c with s >= 1" if var in free_vars(raw) or form is None
                       else "a reduction over the axis" if free_vars(raw) else "a fixed position")
                raise Refusal(a, f"{f.name} reads {load.buffer} at `{e}` along it, {why}", load.loc or f.loc)
            coeffs, c = form
            s = coeffs.pop(var)
            lo = hi = c
            for v, k in coeffs.items():
                if v not in ranges or v in f.vars:
                    raise Refusal(a, f"{f.name} reads {load.buffer} at `{e}`, which mixes in its index "
                                  f"{v.name} along it", load.loc or f.loc)
                r0, r1 = ranges[v]
                lo, hi = lo + min(k * r0, k * r1), hi + max(k * r0, k * r1)
            if recording:
                scale = self.scale[a][load.buffer] * s
                if self.scale[a][f.name] not in (0, scale):
                    raise Refusal(a, f"{f.name} reads its inputs at different strides along it "
                                  f"({self.scale[a][f.name]} and {scale})", load.loc or f.loc)
                self.scale[a][f.name] = scale
                self.reads[a].setdefault(f.name, []).append(Read(load.buffer, s, lo, hi, view))
            m = shapes[load.buffer][a]
            return remap(view, raw, m, (s * ranges[var][0] + lo, s * ranges[var][1] + hi))

        def visit_load(load: Load, guarded: bool) -> Load:
            new = tuple(index(load, d, e, guarded) for d, e in enumerate(load.index))
            return load if new == load.index else dataclasses.replace(load, index=new)

        def visit(e: ir.Expr) -> ir.Expr:
            if isinstance(e, Var) and e in own:
                raise Refusal(own[e], f"{f.name} uses its index {e.name} as a value, not to read an "
                              "array: the result depends on the position in the whole array", f.loc)
            guard = _guard(e, lambda b: self.shapes[b])
            if guard is not None:
                load, terms = guard
                new = visit_load(load, True)
                shape = shapes[load.buffer]
                cond = None
                for d, e_d in enumerate(new.index):
                    inside = Bin(Op.AND, Bin(Op.GE, e_d, terms[2 * d].rhs),
                                 Bin(Op.LT, e_d, ir.const(shape[d])))
                    cond = inside if cond is None else Bin(Op.AND, cond, inside)
                true = dataclasses.replace(e.true, value=new) if isinstance(e.true, ir.Cast) else new
                return Select(cond, true, visit(e.false))
            if isinstance(e, Load):
                return visit_load(e, False)
            return map_children(e, visit)

        return visit(f.body)


def _bare_vars(e: ir.Expr) -> set[Var]:
    """The variables of `e` outside the index expressions of its reads."""
    if isinstance(e, Var):
        return {e}
    if isinstance(e, Load):
        return set()
    return set().union(*(_bare_vars(c) for c in children(e)))


def layout(program: ir.Program, chunked: tuple[str, ...], axes: tuple[int, ...], fn_name: str) -> Layout:
    """The Layout, or a ShapeError that says why an axis cannot be chunked and which can."""
    update = next((f for f in program.funcs if isinstance(f, ir.Update)), None)
    if update is not None:
        raise ShapeError(f"{fn_name} has an update definition (of {update.prev}): halide_ad.dask does not "
                         "chunk programs with update definitions yet; call it on numpy arrays",
                         update.loc)
    try:
        return Layout(program, chunked, axes)
    except Refusal as refusal:
        ndim = min(len(program.buffer(n).shape) for n in chunked)
        able = []
        for a in range(ndim):
            try:
                Layout(program, chunked, (a,))
                able.append(a)
            except Refusal:
                pass
        fix = (f"It can be chunked along axes {tuple(able)}; give the other axes one chunk (e.g. "
               f"x.rechunk({{{refusal.axis}: -1}}))" if able else
               "It can be chunked along no axis: call it on numpy arrays")
        raise ShapeError(f"{fn_name} cannot be chunked along axis {refusal.axis}: {refusal.reason}. {fix}",
                         refusal.loc) from None


# ---- regions along one axis ---------------------------------------------------------------------

@dataclass(frozen=True)
class Region:
    """Indices lo..hi (inclusive) of a buffer along an axis, and whether a boundary view reads
    across its first or last index (then a block must reach that edge of the whole array)."""
    lo: int
    hi: int
    left: bool = False
    right: bool = False

    def hull(self, o: Region | None) -> Region:
        if o is None:
            return self
        return Region(min(self.lo, o.lo), max(self.hi, o.hi), self.left or o.left, self.right or o.right)


def _reads_of(raw_lo: int, raw_hi: int, view: str, n: int) -> Region:
    """The indices that raw indices raw_lo..raw_hi read through `view` in an extent of n."""
    if view == "none":
        if raw_lo < 0 or raw_hi > n - 1:
            raise InternalError(f"a read proved in range reaches {raw_lo}..{raw_hi} of {n}")
        return Region(raw_lo, raw_hi)
    left, right = raw_lo < 0, raw_hi > n - 1
    if view == "mirror" and (raw_lo < -(n - 1) or raw_hi > 2 * (n - 1)):
        return Region(0, n - 1, True, True)  # reflected more than once: the whole axis
    lo, hi = max(raw_lo, 0), min(raw_hi, n - 1)
    if view == "mirror":
        if left:
            lo, hi = 0, max(hi, -raw_lo)
        if right:
            lo, hi = min(lo, 2 * (n - 1) - raw_hi), n - 1
    return Region(min(lo, n - 1), max(hi, 0), left, right)


def needed(lay: Layout, axis: int, wanted: dict[str, Region]) -> dict[str, Region]:
    """Every carrier's region that computing the `wanted` output regions reads, exactly (to the
    hull of its reads), from the outputs back to the inputs."""
    regions = dict(wanted)
    for f in reversed(lay.program.funcs):
        r = regions.get(f.name)
        for read in lay.reads[axis].get(f.name, ()) if r is not None else ():
            got = _reads_of(read.scale * r.lo + read.lo, read.scale * r.hi + read.hi, read.view,
                            lay.shapes[read.buffer][axis])
            regions[read.buffer] = got.hull(regions.get(read.buffer))
    return regions


def readers(lay: Layout, axis: int, sources: dict[str, Region]) -> dict[str, Region]:
    """Every carrier's region whose values read the `sources` regions: the inverse reach, from the
    inputs forward to the outputs."""
    regions = dict(sources)
    for f in lay.program.funcs:
        n_f = lay.shapes[f.name][axis] if lay.carries(f.name, axis) else 0
        for read in lay.reads[axis].get(f.name, ()):
            src = regions.get(read.buffer)
            if src is None:
                continue
            n = lay.shapes[read.buffer][axis]
            lo, hi = src.lo, src.hi  # raw indices that read src
            if read.view == "clamp":
                lo, hi = (-math.inf if lo == 0 else lo), (math.inf if hi == n - 1 else hi)
            elif read.view == "mirror":
                raw_lo, raw_hi = read.lo, read.scale * (n_f - 1) + read.hi
                if raw_lo < -(n - 1) or raw_hi > 2 * (n - 1):
                    lo, hi = -math.inf, math.inf
                else:
                    lo, hi = min(lo, -hi), max(hi, 2 * (n - 1) - lo)
            v_lo = max(0, math.ceil((lo - read.hi) / read.scale)) if lo > -math.inf else 0
            v_hi = min(n_f - 1, (hi - read.lo) // read.scale) if hi < math.inf else n_f - 1
            if v_lo <= v_hi:
                regions[f.name] = Region(int(v_lo), int(v_hi)).hull(regions.get(f.name))
    return regions


def block_extents(lay: Layout, axis: int, m: int) -> dict[str, int]:
    """Each carrier's extent along `axis` in a block whose chunked inputs have extent m: in step
    with the whole program's extents (a stage as much longer or shorter than its input as there),
    no longer than its reads without a view allow, at least 1 and at most the whole extent.

    A block ending at the array's far edge then ends at every stage's far edge, and a block of
    the whole axis is the whole program."""
    extents = dict.fromkeys(lay.chunked, m)
    for f in lay.program.funcs:
        reads = lay.reads[axis].get(f.name)
        if not reads:
            continue
        n_f = lay.shapes[f.name][axis]
        sizes = []
        for read in reads:
            m_b, n_b = extents[read.buffer], lay.shapes[read.buffer][axis]
            sizes.append(-(-m_b // read.scale) + n_f - -(-n_b // read.scale))
            if read.view == "none":
                sizes.append((m_b - 1 - read.hi) // read.scale + 1)
        extents[f.name] = max(1, min(min(sizes), n_f))
    return extents


def fits(lay: Layout, axis: int, regions: dict[str, Region], start: int, extents: dict[str, int]) -> bool:
    """Whether the block starting at `start` (in the inputs' indices) with `extents` holds every
    region, and reaches each edge of the whole array where a boundary view reads across it."""
    for name, r in regions.items():
        scale = lay.scale[axis][name]
        if start % scale:
            return False
        off, m = start // scale, extents[name]
        if r.lo < off or r.hi >= off + m or (r.left and off != 0) or (
                r.right and off + m != lay.shapes[name][axis]):
            return False
    return True
