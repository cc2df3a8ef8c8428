"""A reduction's LANES partial results as one vector: `sums(row, lo, hi, lanes)` (`products`,
`maxima`, `minima`), and `sums_of(terms, rows, scalars, lo, hi, lanes)` (...) where each term is
arithmetic of several rows' elements.

`schedule.accumulate.split_accumulators` keeps a long reduction in LANES independent partial
results, lane q taking the terms at lo + q, lo + q + LANES, ... Written as LANES scalar
statements these stay scalar: numba leaves LLVM's SLP vectorizer off (`NUMBA_SLP_VECTORIZE`),
and the loop vectorizer may not reorder a float reduction. So a fold runs the rounds with the
lanes in vector registers: over a buffer's row in place where each term is its element; with the
terms computed in the fold, a vector at a time, where they are + - * / and negation of rows'
elements and of numbers (a variance's (x - m) * (x - m), softmax's gradient's ct * e); else over
a row of terms that the kernel writes first in a plain loop (which vectorizes). softmax's
backward row sum (a float32 product and division per term, summed in float64) ran 4x faster in
vectors than in scalar lanes; computing its terms in the fold instead of writing them to a row
first took another 8-10% off its backward (one thread).

One vector of lanes is still a chain of dependent operations, each waiting for the last (3-5
cycles a round; 128 rounds a row of 1024). So `fold` keeps SPLIT vectors: vector s takes the
rounds k with (k - lo) / LANES = s mod SPLIT, the rounds past the last whole group of SPLIT go
to vector 0, and the vectors combine pairwise at the end, ((v0 . v1) . (v2 . v3)).
`plain_python` folds the same terms in the same order: the same bits. `sums_of_all` (...) runs
several folds of the same rows in one pass (`schedule.fuse_folds`): a round loads the rows once
for all of them, each fold's lanes as its own `sums_of` would leave them. A maximum or minimum is
the same value as one vector's (the sign of a zero result and a NaN's payload may come from
another element); a sum or product rounds otherwise. softmax's forward over (4096, 1024), a
max and a sum a row, on one thread (CPU time, at 7070238): 3.07-3.14 ms with one vector, 2.77
with four for the max only, 2.52-2.56 with four for both.

A float32 sum in float64 lanes (`lower.accumulator_dtype`: 256 terms or more) adds its terms in
float32 vectors, a BLOCK of terms at a time (32 to a chain), then each block's combined vector
to the float64 lanes: a block's error is at most about 33 * 2**-24 times the sum of its terms'
magnitudes (31 adds a chain, 2 combining the vectors; a partial sum past float32's range is inf,
as in PyTorch's and JAX's float32 sums), whatever the row's length, at the speed of float32
lanes. Converting each term and adding it in float64 took twice the vector adds and two
conversions per 8 terms: over (4096, 1024) on two threads (PyTorch's time / ours, in the same
process, three alternating processes of each against 9e3ee41), layer norm's forward went from
0.76-0.88x to 0.94-1.01x, its backward from 0.75-0.90x to 0.89-1.04x, softmax's backward from
0.99-1.09x to 1.14-1.21x.
"""
from __future__ import annotations

import ast
import functools
from types import SimpleNamespace

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

LANES = 8  # independent partial results of a long reduction over a contiguous axis
SPLIT = 4  # vectors of LANES that fold keeps: the chain of each a quarter as long
BLOCK = 1024  # terms of a float32 sum that add in float32 before their float64 lanes take them
_IDENTITY = {"sum": 0.0, "prod": 1.0, "max": -np.inf, "min": np.inf}


def _combine(builder, op: str, acc, v):
    if op == "sum":
        return builder.fadd(acc, v)
    if op == "prod":
        return builder.fmul(acc, v)
    # numpy's maximum and minimum, as vmath's: v wins where it is larger (smaller) or NaN
    wins = builder.fcmp_ordered(">" if op == "max" else "<", v, acc)
    return builder.select(builder.or_(wins, builder.fcmp_unordered("uno", v, v)), v, acc)


def _fold(op: str):
    @intrinsic
    def fold(typingctx, row, lo, hi, lanes):
        """`lanes` after lane q combined row[k + q] for k in range(lo, hi, LANES), in SPLIT
        vectors as the module says, each element converted to the lanes' type first. `row` is a
        contiguous 1-d array of at least `hi` elements, and hi - lo a multiple of LANES: the
        caller's to ensure."""
        if not (_row(row) and _lanes(lanes)):
            return None

        def codegen(context, builder, sig, args):
            return _fold_code(context, builder, op, [(row, args[0])], [None], [], args[1:3], sig.args[1:3],
                              lanes, [args[3]])[0]
        return lanes(row, lo, hi, lanes), codegen
    return fold


def _fold_of(op: str):
    @intrinsic
    def fold_of(typingctx, terms, rows, scalars, lo, hi, lanes):
        """`fold` of the terms that `terms` (the text of an arithmetic expression: + - * / and
        unary -, over r0, r1, ... and s0, s1, ...) gives at each k: rk the element k of rows[k],
        sk the number scalars[k], computed as numba computes that expression of scalars, in the
        rows' float type (all rows of one type; a scalar is converted to it). The terms of a
        reduction read in place, where the loop that wrote them to a row first cost softmax's
        backward 8-10%."""
        if not (isinstance(terms, types.StringLiteral) and _lanes(lanes)):
            return None
        codes = _terms_codes((terms.literal_value,), rows, scalars)
        if codes is None:
            return None

        def codegen(context, builder, sig, args):
            vrows, values = _operands(context, builder, rows, scalars, args)
            return _fold_code(context, builder, op, vrows, codes, values, args[3:5], sig.args[3:5], lanes, [args[5]])[0]
        return lanes(terms, rows, scalars, lo, hi, lanes), codegen
    return fold_of


def _folds_of(op: str):
    @intrinsic
    def folds_of(typingctx, terms, rows, scalars, lo, hi, lanes):
        """`fold_of` of each of `terms` (a tuple of expression texts over the same rows and
        scalars) into the lanes of the same place in `lanes` (a tuple of lanes of one type), in
        one pass: each round loads the rows once for all of them, and their terms share what
        they have in common (a product both compute is computed once). The same bits as one
        `fold_of` each."""
        if not (isinstance(terms, types.BaseTuple) and len(terms) > 1
                and all(isinstance(t, types.StringLiteral) for t in terms)
                and isinstance(lanes, types.UniTuple) and lanes.count == len(terms) and _lanes(lanes.dtype)):
            return None
        codes = _terms_codes(tuple(t.literal_value for t in terms), rows, scalars)
        if codes is None:
            return None

        def codegen(context, builder, sig, args):
            vrows, values = _operands(context, builder, rows, scalars, args)
            folded = _fold_code(context, builder, op, vrows, codes, values, args[3:5], sig.args[3:5], lanes.dtype,
                                cgutils.unpack_tuple(builder, args[5], len(terms)))
            return context.make_tuple(builder, lanes, folded)
        return lanes(terms, rows, scalars, lo, hi, lanes), codegen
    return folds_of


def _terms_codes(texts: tuple[str, ...], rows, scalars) -> list | None:
    """The terms functions (`_terms_code`) of `texts` over `rows` (of one float type) and numeric
    `scalars`, or None where a fold of them does not type here."""
    if not (isinstance(rows, types.BaseTuple) and len(rows) and isinstance(scalars, types.BaseTuple)
            and all(map(_row, rows)) and all(r.dtype == rows[0].dtype for r in rows)
            and all(isinstance(s, (types.Float, types.Integer)) for s in scalars)):
        return None
    codes = [_terms_code(t, len(rows), len(scalars)) for t in texts]
    return None if any(c is None for c in codes) else codes


def _operands(context, builder, rows, scalars, args) -> tuple[list, list]:
    """A fold_of call's rows, as (type, value) pairs, and its scalars, converted to the rows' type."""
    vrows = list(zip(rows, cgutils.unpack_tuple(builder, args[1], len(rows))))
    values = [context.cast(builder, v, t, rows[0].dtype)  # (of the rows' type already, as the IR says)
              for v, t in zip(cgutils.unpack_tuple(builder, args[2], len(scalars)), scalars)]
    return vrows, values


def _row(row) -> bool:
    return (isinstance(row, types.Array) and row.ndim == 1 and row.layout == "C"
            and isinstance(row.dtype, types.Float))


def _lanes(lanes) -> bool:
    return isinstance(lanes, types.UniTuple) and lanes.count == LANES and isinstance(lanes.dtype, types.Float)


_BINARY = {ast.Add: "fadd", ast.Sub: "fsub", ast.Mult: "fmul", ast.Div: "fdiv"}


@functools.cache
def _terms_code(text: str, rows: int, scalars: int):
    """A function (builder, row vectors, scalar vectors) -> the vector of terms that `text` gives,
    or None where `text` is not such an expression over r0 .. r{rows-1} and s0 .. s{scalars-1}."""
    names = {f"r{k}": ("r", k) for k in range(rows)} | {f"s{k}": ("s", k) for k in range(scalars)}

    def build(node):
        match node:
            case ast.BinOp(lhs, op, rhs) if type(op) in _BINARY:
                a, b, name = build(lhs), build(rhs), _BINARY[type(op)]
                if a is None or b is None:
                    return None
                return lambda bd, r, s: getattr(bd, name)(a(bd, r, s), b(bd, r, s))
            case ast.UnaryOp(ast.USub(), operand):
                a = build(operand)
                return None if a is None else (lambda bd, r, s: bd.fneg(a(bd, r, s)))
            case ast.Name(name) if name in names:
                kind, k = names[name]
                return (lambda bd, r, s: r[k]) if kind == "r" else (lambda bd, r, s: s[k])
        return None
    try:
        return build(ast.parse(text, mode="eval").body)
    except SyntaxError:
        return None


def _fold_code(context, builder, op, rows, codes, scalars, bounds, bound_types, lanes, initials):
    """The LLVM code of folds over the same rows and rounds: `rows` (type, value) pairs, `codes`
    each fold's terms function (None: the one row's elements), `scalars` the values they read,
    `initials` each fold's lanes (of type `lanes`). Each round loads the rows' vectors once for
    every fold. Returns each fold's lanes (LLVM values of type `lanes`)."""
    element = context.get_value_type(lanes.dtype)
    vtype = ir.VectorType(element, LANES)
    intp = lambda v: context.get_constant(types.intp, v)
    accs = [[cgutils.alloca_once(builder, vtype) for _ in range(SPLIT)] for _ in codes]
    for fold_accs, initial in zip(accs, initials, strict=True):
        vec = vtype(ir.Undefined)
        for q in range(LANES):
            vec = builder.insert_element(vec, builder.extract_value(initial, q), ir.IntType(32)(q))
        builder.store(vec, fold_accs[0])
        for acc in fold_accs[1:]:
            builder.store(ir.Constant(vtype, [_IDENTITY[op]] * LANES), acc)
    row_type = rows[0][0].dtype
    data = [context.make_array(t)(context, builder, v).data for t, v in rows]
    ttype = ir.VectorType(data[0].type.pointee, LANES)
    splats = []
    for s in scalars:
        splat = ttype(ir.Undefined)
        for q in range(LANES):
            splat = builder.insert_element(splat, s, ir.IntType(32)(q))
        splats.append(splat)
    start, stop = (context.cast(builder, a, t, types.intp) for a, t in zip(bounds, bound_types))

    def add_round(targets, k, into):
        """Each fold's round at k into its acc of `targets`, the rows' vectors loaded once."""
        at = [builder.bitcast(builder.gep(d, [k]), ttype.as_pointer()) for d in data]
        loaded = [builder.load(a, align=row_type.bitwidth // 8) for a in at]
        for acc, code in zip(targets, codes, strict=True):
            terms = loaded[0] if code is None else code(builder, loaded, splats)
            if into is vtype and row_type.bitwidth < lanes.dtype.bitwidth:
                terms = builder.fpext(terms, vtype)
            elif into is vtype and row_type.bitwidth > lanes.dtype.bitwidth:
                terms = builder.fptrunc(terms, vtype)
            builder.store(_combine(builder, op, builder.load(acc), terms), acc)

    def rounds(accs, lo, hi, into):
        """The whole groups of SPLIT rounds in [lo, hi), into `accs` (per fold, SPLIT vectors of
        type `into`)."""
        with cgutils.for_range_slice(builder, lo, hi, group) as (k, _):
            for s in range(SPLIT):
                add_round([fold_accs[s] for fold_accs in accs], builder.add(k, intp(s * LANES)), into)

    def combined(accs):
        vecs = [builder.load(acc) for acc in accs]
        while len(vecs) > 1:
            vecs = [_combine(builder, op, a, b) for a, b in zip(vecs[::2], vecs[1::2])]
        return vecs[0]

    group = intp(LANES * SPLIT)
    whole = builder.add(start, builder.mul(builder.sdiv(builder.sub(stop, start), group), group))
    if op == "sum" and row_type.bitwidth < lanes.dtype.bitwidth:  # a float32 sum in float64 lanes: blocks
        narrow = [[cgutils.alloca_once(builder, ttype) for _ in range(SPLIT)] for _ in codes]
        zero = ir.Constant(ttype, [0.0] * LANES)

        def add_narrow():
            for fold_accs, fold_narrow in zip(accs, narrow, strict=True):
                builder.store(builder.fadd(builder.load(fold_accs[0]), builder.fpext(combined(fold_narrow), vtype)),
                              fold_accs[0])

        def clear_narrow():
            for fold_narrow in narrow:
                for acc in fold_narrow:
                    builder.store(zero, acc)

        with cgutils.for_range_slice(builder, start, whole, intp(BLOCK)) as (b, _):
            end = builder.add(b, intp(BLOCK))
            end = builder.select(builder.icmp_signed("<", end, whole), end, whole)
            clear_narrow()
            rounds(narrow, b, end, ttype)
            add_narrow()
        clear_narrow()
        with cgutils.for_range_slice(builder, whole, stop, intp(LANES)) as (k, _):
            add_round([fold_narrow[0] for fold_narrow in narrow], k, ttype)
        add_narrow()
        accs = [fold_accs[:1] for fold_accs in accs]
    else:
        rounds(accs, start, whole, vtype)
        with cgutils.for_range_slice(builder, whole, stop, intp(LANES)) as (k, _):
            add_round([fold_accs[0] for fold_accs in accs], k, vtype)
    out = []
    for fold_accs in accs:
        vec = combined(fold_accs)
        value = context.get_value_type(lanes)(ir.Undefined)
        for q in range(LANES):
            value = builder.insert_value(value, builder.extract_element(vec, ir.IntType(32)(q)), q)
        out.append(value)
    return out


SCRATCH_MAX = 2048  # elements: a longer row of terms goes to the heap (np.empty), not the stack


@intrinsic
def scratch(typingctx, n, dtype):
    """An uninitialized array of `n` (a literal, at most SCRATCH_MAX) elements of `dtype` on the
    kernel's stack, valid until it returns. np.empty in a kernel run once per row allocates on
    the heap each time: softmax's backward row sum (4096 rows of 1024, one thread) took 7-12%
    longer so."""
    if not (isinstance(n, types.IntegerLiteral) and 0 < n.literal_value <= SCRATCH_MAX
            and isinstance(dtype, (types.DType, types.NumberClass))):
        return None
    element = dtype.dtype
    out = types.Array(element, 1, "C")

    def codegen(context, builder, sig, args):
        data = cgutils.alloca_once(builder, context.get_value_type(element), size=n.literal_value)
        array = context.make_array(out)(context, builder)
        itemsize = context.get_abi_sizeof(context.get_value_type(element))
        populate_array(array, data=data, shape=[context.get_constant(types.intp, n.literal_value)],
                       strides=[context.get_constant(types.intp, itemsize)],
                       itemsize=context.get_constant(types.intp, itemsize), meminfo=None)
        return array._getvalue()

    return out(n, dtype), codegen


def _plain_scratch(n, dtype):
    return np.empty(n, dtype)


_OPS = {"sums": "sum", "products": "prod", "maxima": "max", "minima": "min"}
sums, products, maxima, minima = (_fold(op) for op in _OPS.values())
sums_of, products_of, maxima_of, minima_of = (_fold_of(op) for op in _OPS.values())
sums_of_all, products_of_all, maxima_of_all, minima_of_all = (_folds_of(op) for op in _OPS.values())
FOLD = {op: name for name, op in _OPS.items()}  # the fold of each op, by its name here


def _plain(op: str):
    combine = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]

    def rounds(vecs, row, lo, hi, whole):
        """Rounds k in [lo, hi): vector s those of whole groups of SPLIT (before `whole`), vector 0 the rest."""
        for k in range(lo, hi, LANES):
            vec = vecs[(k - lo) // LANES % SPLIT] if k < whole else vecs[0]
            for q in range(LANES):
                vec[q] = combine(vec[q], row[k + q])

    def combined(vecs):
        while len(vecs) > 1:
            vecs = [[combine(a, b) for a, b in zip(u, v)] for u, v in zip(vecs[::2], vecs[1::2])]
        return vecs[0]

    def fold(row, lo, hi, lanes):
        whole = lo + (hi - lo) // (LANES * SPLIT) * (LANES * SPLIT)
        if op == "sum" and row.dtype.itemsize < np.asarray(lanes[0]).dtype.itemsize:  # blocks, as `_fold_code`
            wide = [np.float64(v) for v in lanes]
            for b in [*range(lo, whole, BLOCK), whole]:  # the blocks, then the rounds past the whole groups
                narrow = [[row.dtype.type(0)] * LANES for _ in range(SPLIT)]
                rounds(narrow, row, b, min(b + BLOCK, whole) if b < whole else hi, whole)
                wide = [w + np.float64(n) for w, n in zip(wide, combined(narrow), strict=True)]
            return tuple(wide)
        vecs = [list(lanes)] + [[type(v)(_IDENTITY[op]) for v in lanes] for _ in range(SPLIT - 1)]
        rounds(vecs, row, lo, hi, whole)
        return tuple(combined(vecs))
    return fold


def _plain_of(op: str):
    fold = _plain(op)

    def fold_of(terms, rows, scalars, lo, hi, lanes):
        number = rows[0].dtype.type  # numpy's elementwise operations round as numba's scalar ones
        names = ({f"r{k}": r[lo:hi] for k, r in enumerate(rows)}
                 | {f"s{k}": number(s) for k, s in enumerate(scalars)})
        with np.errstate(all="ignore"):
            row = np.asarray(eval(_plain_code(terms), {}, names), rows[0].dtype)
        return fold(row, 0, hi - lo, lanes)
    return fold_of


@functools.cache
def _plain_code(terms: str):
    return compile(terms, "<terms>", "eval")


def _plain_of_all(op: str):
    fold_of = _plain_of(op)

    def folds_of(terms, rows, scalars, lo, hi, lanes):
        return tuple(fold_of(t, rows, scalars, lo, hi, ls) for t, ls in zip(terms, lanes, strict=True))
    return folds_of


plain_python = SimpleNamespace(scratch=_plain_scratch,  # no numba
                               **{name: _plain(op) for name, op in _OPS.items()},
                               **{f"{name}_of": _plain_of(op) for name, op in _OPS.items()},
                               **{f"{name}_of_all": _plain_of_all(op) for name, op in _OPS.items()})
