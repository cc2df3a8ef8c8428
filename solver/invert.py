"""The index inverter: a scatter `adj_B[index(i)] += value(i)` over a domain becomes a gather
`adj_B[j] = sum over {i : index(i) == j} of value(i)`, one writer per j.

A worked example (Halide's Derivative.cpp does this). The forward pass reads x[2*i + 1] for
0 <= i < n, so reverse mode produces

    adj_x[2*i + 1] += adj_out[i]                        (a scatter: racy in parallel)

Solving j == 2*i + 1 gives i == (j - 1) // 2, guarded by (j - 1) % 2 == 0 and 0 <= i < n:

    adj_x[j] = adj_out[(j - 1) // 2] if guard else 0    (a gather: one writer per j)

The ladder: affine indices are solved exactly, picking one pivot variable per index dimension
(preferring unit coefficients and long loops); the variables left over (reduction windows,
broadcast dimensions, div/mod remainders) become small loops whose bounds come from the domain.
Clamps, min/max, select and abs split the domain into pieces that are each affine. Every piece
is checked by z3 (both directions: the gather enumerates exactly the preimage) before use.
Whatever cannot be inverted or proved becomes a `Fallback` scatter, parallel over a loop variable
that z3 proves gives distinct write addresses.

Results are cached in memory and on disk (halide_ad/disk_cache.py, next to the compiled kernels), so a
new process does not run z3 again; a result for which any z3 query timed out is not stored on disk.
"""
from __future__ import annotations

import dataclasses
import threading
import warnings
from dataclasses import dataclass

from halide_ad import disk_cache
from halide_ad.affine import Affine, Constraint, Linearizer
from halide_ad.errors import HalideADWarning
from halide_ad.ir import Bin, Call, Expr, Op, Range, Scatter, Select, Var, const
from halide_ad.solver import z3_bridge
from halide_ad.solver.bounds import box
from halide_ad.solver.eliminate import loops_and_guards, solve
from halide_ad.solver.z3_bridge import Query, Unsupported
from halide_ad.traverse import conjuncts, simplify, substitute

MAX_PIECES = 256


@dataclass(frozen=True)
class GatherPiece:
    """acc += value at every point of `loops` (outermost first) where the guards hold.

    guards[0] are tested before any loop, guards[d] inside loop d.
    """
    loops: tuple[Range, ...]
    guards: tuple[tuple[Expr, ...], ...]
    value: Expr
    solution: tuple[tuple[Var, Expr], ...]
    single: tuple[bool, ...] = ()  # per loop: z3 proved it runs at most once (a pooling window)

    def fixing(self, k: int, value: Expr) -> GatherPiece:
        """This piece with loop k, which runs exactly once, replaced by `loop var = value`: the
        loop's body moves out to the loop's level."""
        env = {self.loops[k].var: value}
        sub = lambda e: simplify(substitute(e, env))
        guards = [tuple(sub(c) for c in level) for level in self.guards]
        guards[k] += guards.pop(k + 1)
        return GatherPiece(tuple(Range(r.var, sub(r.lo), sub(r.hi)) for r in self.loops[:k] + self.loops[k + 1:]),
                           tuple(guards), sub(self.value),
                           tuple((v, sub(e)) for v, e in self.solution) + ((self.loops[k].var, value),),
                           self.single[:k] + self.single[k + 1:] if self.single else ())


@dataclass(frozen=True)
class Gather:
    scatter: Scatter
    new_vars: tuple[Var, ...]
    pieces: tuple[GatherPiece, ...]

    @property
    def form(self) -> str:
        return "gather-window" if any(p.loops for p in self.pieces) else "gather"


@dataclass(frozen=True)
class Fallback:
    """A scatter kept as a scatter: parallel over `parallel` (proved injective) if not None."""
    scatter: Scatter
    reason: str
    parallel: Var | None

    @property
    def form(self) -> str:
        return "scatter-parallel" if self.parallel is not None else "scatter-serial"


_cache: dict = {}
_cache_lock = threading.Lock()


def invert(scatter: Scatter, shape: tuple[int, ...], new_vars: tuple[Var, ...]) -> Gather | Fallback:
    """The gather form of `scatter` into a buffer of `shape`, over `new_vars`, else a Fallback.

    Cached in memory, and on disk (halide_ad/disk_cache.py) unless a z3 query timed out on the way.
    """
    key = (scatter, shape, new_vars)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    result = disk_cache.load(key)
    if isinstance(result, (Gather, Fallback)):
        result = dataclasses.replace(result, scatter=scatter)  # this trace's source location
    else:
        unknowns = z3_bridge.unknown_answers()
        result = _invert(scatter, shape, new_vars)
        if isinstance(result, str):
            result = Fallback(scatter, result, parallel_var(scatter))
        timed_out = isinstance(result, Fallback) and TIME_LIMIT in result.reason
        if timed_out:
            _warn_timeout(result)
        elif z3_bridge.unknown_answers() == unknowns:  # a later run, with more time, may do better
            disk_cache.store(key, result)
    with _cache_lock:
        _cache[key] = result
    return result


TIME_LIMIT = "within its time limit"


def _warn_timeout(f: Fallback) -> None:
    """A z3 timeout is not an error: the scatter is correct, only slower. Say so once, here and in
    hd.explain (which shows `f.reason`)."""
    s = f.scatter
    where = f" ({s.loc})" if s.loc else ""
    warnings.warn(f"adj_{s.buffer}[{', '.join(map(str, s.index))}]{where} stays a {f.form}: {f.reason} "
                  f"({z3_bridge.DEFAULT_TIMEOUT_MS} ms). The gradient is still exact, but slower; "
                  "hd.explain shows it. Raise the limit with HALIDE_AD_Z3_TIMEOUT_MS to retry.",
                  HalideADWarning, stacklevel=3)


def _invert(scatter: Scatter, shape, js) -> Gather | str:
    pieces = _index_pieces(scatter.index)
    if isinstance(pieces, str):
        return pieces
    out = []
    for index, preds in pieces:
        piece = _invert_piece(scatter, index, preds, shape, js)
        if isinstance(piece, str):
            return piece
        if piece is not None:
            out.append(piece)
    return Gather(scatter, js, tuple(out))


# ---- piecewise indices --------------------------------------------------------------------------

def _pieces_of(e: Expr) -> list[tuple[Expr, list[Expr]]]:
    """`e` as (affine-candidate expression, predicates) pairs that partition the domain."""
    match e:
        case Bin(Op.MIN | Op.MAX as op, a, b):
            out = []
            first_if, second_if = (Op.LE, Op.GT) if op is Op.MIN else (Op.GE, Op.LT)
            for ea, pa in _pieces_of(a):
                for eb, pb in _pieces_of(b):
                    out.append((ea, pa + pb + [Bin(first_if, ea, eb)]))
                    out.append((eb, pa + pb + [Bin(second_if, ea, eb)]))
            return out
        case Select(c, t, f):
            return ([(et, pt + [c]) for et, pt in _pieces_of(t)]
                    + [(ef, pf + [Call("not", (c,))]) for ef, pf in _pieces_of(f)])
        case Call("abs", (a,)):
            return [x for ea, pa in _pieces_of(a)
                    for x in ((ea, pa + [Bin(Op.GE, ea, const(0))]),
                              (Call("neg", (ea,)), pa + [Bin(Op.LT, ea, const(0))]))]
        case Call("neg", (a,)):
            return [(Call("neg", (ea,)), pa) for ea, pa in _pieces_of(a)]
        case Bin(op, a, b):
            return [(Bin(op, ea, eb), pa + pb) for ea, pa in _pieces_of(a) for eb, pb in _pieces_of(b)]
    return [(e, [])]


def _index_pieces(index: tuple[Expr, ...]) -> list[tuple[tuple[Expr, ...], list[Expr]]] | str:
    combos: list[tuple[tuple[Expr, ...], list[Expr]]] = [((), [])]
    for e in index:
        combos = [(idx + (pe,), preds + pp) for idx, preds in combos for pe, pp in _pieces_of(e)]
        if len(combos) > MAX_PIECES:
            return f"the index splits into more than {MAX_PIECES} affine pieces"
    return combos


# ---- one affine piece ---------------------------------------------------------------------------

def _invert_piece(scatter: Scatter, index, preds, shape, js) -> GatherPiece | str | None:
    """The gather of one piece, None if the piece is empty, or why it cannot be inverted."""
    domain = scatter.domain
    lin = Linearizer(box(domain))
    index_aff = []
    for e in index:
        a = lin.affine(e)
        if a is None:
            return f"the index `{e}` is not affine in the loop variables (data-dependent or non-linear)"
        index_aff.append(a)
    constraints: list[Constraint] = []
    runtime_guards: list[Expr] = []
    linear_preds: list[Expr] = []
    for pred in preds + conjuncts(scatter.where):
        cs = lin.constraints(pred)
        if cs is None:
            runtime_guards.append(pred)
        else:
            constraints += cs
            linear_preds.append(pred)
    if not _feasible(domain, linear_preds):
        return None
    unknowns = [r.var for r in domain] + list(lin.definitions)
    for v in unknowns:
        lo, hi = lin.ranges[v]
        constraints += [Constraint("ge", Affine.var(v) - Affine.of({}, lo)),
                        Constraint("ge", Affine.of({}, hi) - Affine.var(v))]
    equations = [a - Affine.var(j) for a, j in zip(index_aff, js, strict=True)] + lin.equations
    pivots, constraints = solve(equations, constraints, unknowns, lin.ranges)
    free = [v for v in unknowns if v not in pivots]
    built = loops_and_guards(free, constraints, {j: (0, n - 1) for j, n in zip(js, shape, strict=True)})
    if built is None:
        return None
    loops, guards = built
    solution = {p: (num.to_expr() if den == 1 else Bin(Op.FLOORDIV, num.to_expr(), const(den)))
                for p, (num, den) in pivots.items() if p in {r.var for r in domain}}
    solution = {p: simplify(e) for p, e in solution.items()}
    checked = GatherPiece(tuple(loops), tuple(tuple(g) for g in guards),
                          simplify(substitute(scatter.value, solution)), tuple(solution.items()))
    problem = _verify(scatter, linear_preds, checked, shape, js, free, lin)
    if problem:
        return problem
    # Predicates that are not linear (data-dependent ones, like a max's argindex) are tested at
    # the solution point, exactly where the scatter would have tested them.
    guards[-1] += [simplify(substitute(g, solution)) for g in runtime_guards]
    single = tuple(_at_most_once(loop, checked.loops[:k], shape, js) for k, loop in enumerate(checked.loops))
    piece = GatherPiece(checked.loops, tuple(tuple(g) for g in guards), checked.value, checked.solution, single)
    k = 0
    while k < len(piece.loops):  # a loop that always runs once (a non-overlapping window) goes
        if piece.single[k] and _never_empty(piece.loops[k], piece.loops[:k], shape, js):
            piece = piece.fixing(k, piece.loops[k].lo)
        else:
            k += 1
    return piece


def piece_is_empty(piece: GatherPiece, box: dict[Var, tuple[int, int]]) -> bool:
    """True when z3 proves the piece adds nothing for any j in the box (inclusive ranges)."""
    q = Query()
    for j, (lo, hi) in box.items():
        x = q.var(j)
        q.add(lo <= x, x <= hi)
    for level, guards in enumerate(piece.guards):
        if level > 0:
            loop = piece.loops[level - 1]
            try:
                x = q.var(loop.var)
                q.add(q.to_z3(loop.lo) <= x, x < q.to_z3(loop.hi))
            except Unsupported:
                return False
        for g in guards:
            try:
                q.add(q.to_z3(g))
            except Unsupported:
                pass  # a data-dependent test: leaving it out only widens the search
    return q.check() == "unsat"


def _at_most_once(loop: Range, outer: tuple[Range, ...], shape, js) -> bool:
    """True when z3 proves hi - lo <= 1 for every j (and outer loop point): `for i in range(lo,
    hi)` is then `i = lo; if i < hi`, straight-line code instead of a loop."""
    return _trip_count_never(lambda lo, hi: hi - lo >= 2, loop, outer, shape, js)


def _never_empty(loop: Range, outer: tuple[Range, ...], shape, js) -> bool:
    """True when z3 proves lo < hi for every j (and outer loop point)."""
    return _trip_count_never(lambda lo, hi: hi <= lo, loop, outer, shape, js)


def _trip_count_never(claim, loop: Range, outer: tuple[Range, ...], shape, js) -> bool:
    """True when z3 proves claim(lo, hi) false for every j in the shape and outer loop point."""
    q = Query()
    try:
        for j, n in zip(js, shape, strict=True):
            x = q.var(j)
            q.add(0 <= x, x < n)
        for r in outer:
            x = q.var(r.var)
            q.add(q.to_z3(r.lo) <= x, x < q.to_z3(r.hi))
        q.add(claim(q.to_z3(loop.lo), q.to_z3(loop.hi)))
    except Unsupported:
        return False
    return q.check() == "unsat"


# ---- z3 checks ----------------------------------------------------------------------------------

def _feasible(domain, preds: list[Expr]) -> bool:
    if not preds:
        return True
    q = Query()
    try:
        for r in domain:
            x = q.var(r.var)
            q.add(r.lo <= x, x < r.hi)
        for p in preds:
            q.add(q.to_z3(p))
    except Unsupported:
        return True
    return q.check() != "unsat"


def _verify(scatter, linear_preds, piece: GatherPiece, shape, js, free, lin) -> str | None:
    """Prove the piece enumerates exactly the domain points it covers; a message if not."""
    solution = dict(piece.solution)
    domain_vars = [r.var for r in scatter.domain]
    all_guards = [g for level in piece.guards for g in level]
    try:
        # Completeness: every covered domain point v is produced, at j = index(v).
        q = Query()
        v = {x: q.var(x) for x in domain_vars}
        for r in scatter.domain:
            q.add(r.lo <= v[r.var], v[r.var] < r.hi)
        for p in linear_preds:
            q.add(q.to_z3(p))
        env = {j: q.to_z3(e) for j, e in zip(js, scatter.index, strict=True)}
        for f in free:
            env[f] = v[f] if f in v else q.to_z3(lin.definitions[f])
        claims = [q.to_z3(g, env) for g in all_guards]
        for loop in piece.loops:
            x = env[loop.var]
            claims += [q.to_z3(loop.lo, env) <= x, x < q.to_z3(loop.hi, env)]
        claims += [q.to_z3(e, env) == v[p] for p, e in solution.items()]
        complete = q.refute(claims)
        # Soundness: every produced point is a covered domain point with index(v) == j.
        q2 = Query()
        env2 = {j: q2.var(j) for j in js}
        for j, n in zip(js, shape, strict=True):
            q2.add(0 <= env2[j], env2[j] < n)
        for f in free:
            env2[f] = q2.var(f)
        for g in all_guards:
            q2.add(q2.to_z3(g, env2))
        for loop in piece.loops:
            x = env2[loop.var]
            q2.add(q2.to_z3(loop.lo, env2) <= x, x < q2.to_z3(loop.hi, env2))
        point = {x: (q2.to_z3(solution[x], env2) if x in solution else env2[x]) for x in domain_vars}
        claims2 = [lo_ok for r in scatter.domain for lo_ok in (r.lo <= point[r.var], point[r.var] < r.hi)]
        claims2 += [q2.to_z3(p, point) for p in linear_preds]
        claims2 += [q2.to_z3(e, point) == env2[j] for j, e in zip(js, scatter.index, strict=True)]
        claims2 += [env2[f] == q2.to_z3(lin.definitions[f], point) for f in free if f not in point]
        sound = q2.refute(claims2)
    except Unsupported as e:
        return f"z3 cannot check the inverse: {e}"
    if complete == "unsat" and sound == "unsat":
        return None
    if "unknown" in (complete, sound):
        return f"z3 could not decide the inverse {TIME_LIMIT}"
    return "z3 found the candidate inverse wrong (a bug in halide_ad's solver; falling back to a scatter)"


def parallel_var(scatter: Scatter) -> Var | None:
    """A domain variable whose iterations write disjoint addresses (z3-proved), longest first."""
    for r in sorted(scatter.domain, key=lambda r: -(r.hi - r.lo)):
        q = Query()
        try:
            a = {x.var: q.var(x.var) for x in scatter.domain}
            b = {x.var: q.var(x.var, "_other") for x in scatter.domain}
            for x in scatter.domain:
                q.add(x.lo <= a[x.var], a[x.var] < x.hi, x.lo <= b[x.var], b[x.var] < x.hi)
            q.add(a[r.var] != b[r.var])
            for e in scatter.index:
                q.add(q.to_z3(e, a) == q.to_z3(e, b))
        except Unsupported:
            return None
        if q.check() == "unsat":
            return r.var
    return None
