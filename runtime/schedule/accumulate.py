"""split_accumulators: a long reduction over a contiguous axis as LANES independent partial results.

One running total is a chain of dependent adds, each waiting for the last (~4 cycles); LANES of
them keep the adder busy, and held in one vector register (`runtime/lanes.py`) they take one
vector operation a round. The lanes combine in a fixed tree after the loop, so the result depends
on the extent only, never on the thread count.
"""
from __future__ import annotations

from dataclasses import replace

from halide_ad.ir import INDEX_DTYPE, Bin, Call, Cast, Const, Expr, Load, Op, Reduce, Var, dtype_of, is_float
from halide_ad.runtime.lanes import LANES, SCRATCH_MAX
from halide_ad.runtime.loops import (COMBINE, Accumulate, Allocate, Block, Combine, Element, Fold, For, If, Kind, Lanes,
                                     Let, Local, Row, Stmt, Term, block)
from halide_ad.affine import linear_form
from halide_ad.traverse import simplify, substitute, walk


def unit_stride(e: Expr, v: Var) -> bool:
    """Whether the last index of some load in `e` steps by one with `v`."""
    return any(n.index and (form := linear_form(n.index[-1])) is not None and form[0].get(v) == 1
               for n in walk(e) if isinstance(n, Load))


def pairwise(lanes: list[Local], op: str) -> Expr:
    """((a + b) + (c + d)) + ...: the lanes combined in a fixed tree."""
    terms: list[Expr] = list(lanes)
    while len(terms) > 1:
        terms = [Combine(op, a, b) for a, b in zip(terms[::2], terms[1::2])] + terms[len(terms) // 2 * 2:]
    return terms[0]


def lane_rounds(var: Var, lo: int, whole: int, body: Expr, lanes: list[Local], op: str) -> Block:
    """Lane q accumulating `body` at var = lo + q, lo + q + LANES, ... below `whole`, folded in
    one vector (`runtime/lanes.py`), each lane combining its terms in the order a loop of LANES
    scalar statements would: the same bits. Terms that are arithmetic of loads walking buffers'
    last axes (and of values fixed along the loop) are computed by the fold from the buffers'
    rows in place; other terms are written to a local row (on the stack where short) by a loop
    that vectorizes, in their own float type where it is narrower than the lanes' (the fold
    widens them, as the scalar adds did: float32 terms of a float64 sum write half the bytes)."""
    tuple_ = Lanes(tuple(lanes))
    term = "float32" if dtype_of(body) == "float32" else lanes[0].dtype
    if (in_place := _in_place(body, var, term)) is not None:
        loads, terms, offset = in_place
        rows = tuple(Row(simplify(substitute(load, {var: Const(lo, INDEX_DTYPE)}))) for load in loads)
        return block(Let(tuple_, Fold(op, rows, lo + offset, whole + offset, tuple_, terms)))
    row = Local(f"{lanes[0].name.split('_lane')[0]}_terms{term[-2:]}", term)  # float32 -> acc_terms32
    n = whole - lo
    return block(
        Allocate(row.name, (n,), term, stack=n <= SCRATCH_MAX),
        For(var, lo, whole, Kind.SERIAL, block(Let(Element(row.name, (simplify(Bin(Op.SUB, var, Const(lo, INDEX_DTYPE))),),
                                                          term), body))),
        Let(tuple_, Fold(op, (row,), 0, n, tuple_)))


_ARITHMETIC = (Op.ADD, Op.SUB, Op.MUL, Op.DIV)


def _in_place(body: Expr, var: Var, term: str) -> tuple[tuple[Load, ...], Expr | None, int] | None:
    """(loads, terms, c) where `body`, of the terms' type `term`, is + - * / and negation in that
    type of loads whose last index is var + c (the same c for all) and whose others do not
    depend on var, and of expressions without var: `terms` is `body` with the k-th load a Term
    k (None where `body` is the one load). Else None."""
    loads: dict[Load, Term] = {}
    offsets: set[int] = set()

    def rewrite(e: Expr) -> Expr | None:
        if dtype_of(e) != term:
            return None
        if var not in _vars(e):
            return None if any(isinstance(n, Reduce) for n in walk(e)) else e
        match e:
            case Load(index=index) if index:
                form = linear_form(index[-1])
                if form is None or form[0] != {var: 1} or any(var in _vars(i) for i in index[:-1]):
                    return None
                offsets.add(form[1])
                return loads.setdefault(e, Term(len(loads), term))
            case Bin(op, a, b) if op in _ARITHMETIC:
                a, b = rewrite(a), rewrite(b)
                return None if a is None or b is None else Bin(op, a, b)
            case Call("neg", (a,)):
                a = rewrite(a)
                return None if a is None else Call("neg", (a,))
            case Call("stop_gradient", (a,)):
                return rewrite(a)
        return None

    if not is_float(term) or (terms := rewrite(body)) is None or len(offsets) != 1:
        return None
    return tuple(loads), None if isinstance(terms, Term) else terms, offsets.pop()


def _vars(e: Expr) -> set[Var]:
    return {n for n in walk(e) if isinstance(n, Var)}


def split_accumulators(s: Stmt) -> Stmt:
    """`s` with each accumulation that runs better in lanes split into LANES of them:

    * `acc = identity; for ...: for v: acc = acc <op> term` (a reduction) whose innermost loop
      qualifies (`_lane_loop`) runs its rounds in lanes, `acc` the first, the loop's remainder
      added to `acc`, and the lanes combined after the loops;
    * `for v: acc += term` (a gather's window) the same, its lanes starting at zero and added
      to `acc` after the rounds, then the remainder."""
    match s:
        case Block(body):
            out: list[Stmt] = []
            k = 0
            while k < len(body):
                stmt = body[k]
                if (isinstance(stmt, Let) and isinstance(stmt.var, Local) and k + 1 < len(body)
                        and (split := _split(stmt, body[k + 1])) is not None):
                    out.extend(split)
                    k += 2
                elif isinstance(stmt, For) and (split := _split_window(stmt)) is not None:
                    out.extend(split)
                    k += 1
                else:
                    out.append(split_accumulators(stmt))
                    k += 1
            return Block(tuple(out))
        case For(body=body):
            return replace(s, body=split_accumulators(body))
        case If(_, then, otherwise):
            return replace(s, then=split_accumulators(then), otherwise=otherwise and split_accumulators(otherwise))
    return s


def _split(init: Let, loops: Stmt) -> tuple[Stmt, ...] | None:
    acc = init.var
    chain = []
    while isinstance(loops, For) and loops.kind is Kind.SERIAL and loops.step == 1:
        chain.append(loops)
        inner = loops.body.body
        loops = inner[0] if len(inner) == 1 else None
    if (not chain or not isinstance(loops, Accumulate) or loops.target != acc or loops.augmented
            or not _lane_loop(chain[-1], loops, acc)):
        return None
    last, step = chain[-1], loops
    whole = last.lo + (last.hi - last.lo) // LANES * LANES
    lanes = [acc] + [Local(f"{acc.name}_lane{q}", acc.dtype) for q in range(1, LANES)]
    # one loop's sum from zero: its terms' factor fixed along it multiplies the lanes once
    core, factor = _factored(step.value, last.var) if step.op == "sum" and len(chain) == 1 and \
        init.value == Const(0, acc.dtype) else (step.value, None)
    rounds = [lane_rounds(last.var, last.lo, whole, core, lanes, step.op)]
    if whole < last.hi:
        rounds.append(For(last.var, whole, last.hi, Kind.SERIAL, block(replace(step, value=core))))
    nest: Stmt = block(*rounds)
    for loop in reversed(chain[:-1]):
        nest = replace(loop, body=block(nest))
    combine = Let(acc, _times(pairwise(lanes, step.op), factor, acc.dtype))
    return (init, *(Let(lane, init.value) for lane in lanes[1:]), *block(nest).body, combine)


def _factored(term: Expr, var: Var) -> tuple[Expr, Expr | None]:
    """(core, factor) with term = core * factor, `factor` (None for 1) the product of the
    factors, signs and divisors of `term` that do not change with `var`: a sum's terms as the
    fold adds them, and what multiplies their sum once. A mean's x * (1 / n), a gradient's
    -(g * y * (x - m)) * c * r: the fold did 2-3 operations a vector fewer (and each term rounded
    once less)."""
    if isinstance(term, Bin) and not dtype_of(term.lhs) == dtype_of(term.rhs) == dtype_of(term):
        return term, None  # (x * 0.5 in float64 sums float64 terms, not x in its own type)
    match term:
        case Bin(Op.MUL, a, b) if var not in _vars(b):
            core, f = _factored(a, var)
            return core, b if f is None else Bin(Op.MUL, f, b)
        case Bin(Op.MUL, a, b) if var not in _vars(a):
            core, f = _factored(b, var)
            return core, a if f is None else Bin(Op.MUL, a, f)
        case Bin(Op.DIV, a, b) if var not in _vars(b) and var in _vars(a):
            core, f = _factored(a, var)
            one = Const(1, dtype_of(term))
            return core, Bin(Op.DIV, one if f is None else f, b)
        case Call("neg", (a,)) if var in _vars(a):
            core, f = _factored(a, var)
            return core, Call("neg", (Const(1, dtype_of(term)) if f is None else f,))
    return term, None


def _times(total: Expr, factor: Expr | None, dtype: str) -> Expr:
    if factor is None:
        return total
    return Combine("prod", total, factor if dtype_of(factor) == dtype else Cast(dtype, factor))


def _split_window(loop: For) -> tuple[Stmt, ...] | None:
    inner = loop.body.body
    if (loop.kind is not Kind.SERIAL or loop.step != 1 or len(inner) != 1 or not isinstance(inner[0], Accumulate)
            or not inner[0].augmented):
        return None
    step, acc = inner[0], inner[0].target
    lo, hi = _constant(loop.lo), _constant(loop.hi)
    if lo is None or hi is None or not isinstance(acc, Local):
        return None
    loop = replace(loop, lo=lo, hi=hi)
    if not _lane_loop(loop, step, acc):
        return None
    whole = lo + (hi - lo) // LANES * LANES
    lanes = [Local(f"{acc.name}_lane{q}", acc.dtype) for q in range(LANES)]
    core, factor = _factored(step.value, loop.var) if step.op == "sum" else (step.value, None)
    rounds = lane_rounds(loop.var, lo, whole, core, lanes, step.op)
    combined = Accumulate(acc, _times(pairwise(lanes, "sum"), factor, acc.dtype), augmented=True)
    rest = (For(loop.var, whole, hi, Kind.SERIAL, block(step)),) if whole < hi else ()
    return (*(Let(lane, Const(0, acc.dtype)) for lane in lanes), *rounds.body, combined, *rest)


def _constant(e) -> int | None:
    return e if isinstance(e, int) else e.value if isinstance(e, Const) else None


def _lane_loop(loop: For, step: Accumulate, acc: Local) -> bool:
    """Whether the innermost loop of an accumulation runs in lanes: a float max, min, sum or
    product, constant bounds and at least two rounds, its terms read walking a contiguous axis
    with the loop (so the lanes read one cache line). A masked accumulation (its step under an
    If) keeps one total."""
    return (step.op in COMBINE and is_float(acc.dtype) and isinstance(loop.lo, int) and isinstance(loop.hi, int)
            and loop.hi - loop.lo >= 2 * LANES and isinstance(loop.var, Var) and unit_stride(step.value, loop.var))
