"""A reduction's LANES partial results as one vector: `fold(op, row, lo, hi, lanes)`.

`schedule.accumulate.split_accumulators` keeps a long reduction in LANES independent partial
results, lane q taking the terms at lo + q, lo + q + LANES, ... Written as LANES scalar
statements these stay scalar: numba leaves LLVM's SLP vectorizer off (`NUMBA_SLP_VECTORIZE`),
and the loop vectorizer may not reorder a float reduction. So the kernel writes a row's terms to
a local array in a plain loop (which vectorizes), and `fold` runs the rounds over it with the
lanes in vector registers. softmax's backward row sum (a float32 product and division per term,
summed in float64) ran 4x faster so.

One vector of lanes is still a chain of dependent operations, each waiting for the last (3-5
cycles a round; 128 rounds a row of 1024). So `fold` keeps SPLIT vectors: vector s takes the
rounds k with (k - lo) / LANES = s mod SPLIT, the rounds past the last whole group of SPLIT go
to vector 0, and the vectors combine pairwise at the end, ((v0 . v1) . (v2 . v3)).
`plain_python` folds the same terms in the same order: the same bits. A maximum or minimum is
the same value as one vector's (the sign of a zero result and a NaN's payload may come from
another element); a sum or product rounds otherwise. softmax's forward over (4096, 1024), a
max and a sum a row, on one thread (CPU time, at 7070238): 3.07-3.14 ms with one vector, 2.77
with four for the max only, 2.52-2.56 with four for both.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

LANES = 8  # independent partial results of a long reduction over a contiguous axis
SPLIT = 4  # vectors of LANES that fold keeps: the chain of each a quarter as long
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
        return _typed_fold(op, row, lo, hi, lanes, None)
    return fold


@intrinsic
def scaled_sums(typingctx, row, lo, hi, lanes, scale):
    """`sums` of the terms row[k] * scale, each product in the row's type (what a row of terms
    x[k] * c would have held, without writing the row): a mean's terms read from x in place."""
    return _typed_fold("sum", row, lo, hi, lanes, scale)


def _typed_fold(op: str, row, lo, hi, lanes, scale):
    """The signature and code of a fold (`scale` a number type, or None)."""
    scaled = scale is not None
    if not (isinstance(row, types.Array) and row.ndim == 1 and row.layout == "C"
            and isinstance(lanes, types.UniTuple) and lanes.count == LANES
            and isinstance(lanes.dtype, types.Float) and isinstance(row.dtype, types.Float)
            and (not scaled or isinstance(scale, types.Float))):
        return None

    def codegen(context, builder, sig, args):
        element = context.get_value_type(lanes.dtype)
        vtype = ir.VectorType(element, LANES)
        intp = lambda v: context.get_constant(types.intp, v)
        accs = [cgutils.alloca_once(builder, vtype) for _ in range(SPLIT)]
        vec = vtype(ir.Undefined)
        for q in range(LANES):
            vec = builder.insert_element(vec, builder.extract_value(args[3], q), ir.IntType(32)(q))
        builder.store(vec, accs[0])
        for acc in accs[1:]:
            builder.store(ir.Constant(vtype, [_IDENTITY[op]] * LANES), acc)
        data = context.make_array(row)(context, builder, args[0]).data
        start, stop = (context.cast(builder, a, t, types.intp) for a, t in zip(args[1:3], sig.args[1:3]))
        if scaled:
            one = context.cast(builder, args[4], sig.args[4], row.dtype)
            factor = ir.VectorType(data.type.pointee, LANES)(ir.Undefined)
            for q in range(LANES):
                factor = builder.insert_element(factor, one, ir.IntType(32)(q))

        def add_round(acc, k):
            at = builder.bitcast(builder.gep(data, [k]), ir.VectorType(data.type.pointee, LANES).as_pointer())
            terms = builder.load(at, align=row.dtype.bitwidth // 8)
            if scaled:
                terms = builder.fmul(terms, factor)
            if row.dtype.bitwidth < lanes.dtype.bitwidth:
                terms = builder.fpext(terms, vtype)
            elif row.dtype.bitwidth > lanes.dtype.bitwidth:
                terms = builder.fptrunc(terms, vtype)
            builder.store(_combine(builder, op, builder.load(acc), terms), acc)

        group = intp(LANES * SPLIT)
        whole = builder.add(start, builder.mul(builder.sdiv(builder.sub(stop, start), group), group))
        with cgutils.for_range_slice(builder, start, whole, group) as (k, _):
            for s, acc in enumerate(accs):
                add_round(acc, builder.add(k, intp(s * LANES)))
        with cgutils.for_range_slice(builder, whole, stop, intp(LANES)) as (k, _):
            add_round(accs[0], k)
        vecs = [builder.load(acc) for acc in accs]
        while len(vecs) > 1:
            vecs = [_combine(builder, op, a, b) for a, b in zip(vecs[::2], vecs[1::2])]
        out = context.get_value_type(sig.return_type)(ir.Undefined)
        for q in range(LANES):
            out = builder.insert_value(out, builder.extract_element(vecs[0], ir.IntType(32)(q)), q)
        return out

    return (lanes(row, lo, hi, lanes, scale) if scaled else lanes(row, lo, hi, lanes)), codegen


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
FOLD = {op: name for name, op in _OPS.items()}  # the fold of each op, by its name here


def _plain(op: str):
    combine = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]

    def fold(row, lo, hi, lanes, *scale):
        if scale:
            row = row * row.dtype.type(scale[0])  # (in the row's type, as the intrinsic)
        vecs = [list(lanes)] + [[type(v)(_IDENTITY[op]) for v in lanes] for _ in range(SPLIT - 1)]
        whole = lo + (hi - lo) // (LANES * SPLIT) * (LANES * SPLIT)
        for k in range(lo, hi, LANES):
            vec = vecs[(k - lo) // LANES % SPLIT] if k < whole else vecs[0]
            for q in range(LANES):
                vec[q] = combine(vec[q], row[k + q])
        while len(vecs) > 1:
            vecs = [[combine(a, b) for a, b in zip(u, v)] for u, v in zip(vecs[::2], vecs[1::2])]
        return tuple(vecs[0])
    return fold


plain_python = SimpleNamespace(scratch=_plain_scratch, scaled_sums=_plain("sum"),  # no numba
                               **{name: _plain(op) for name, op in _OPS.items()})
