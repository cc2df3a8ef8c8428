"""The BLAS engine: a contraction as matrix products through numpy, planned once per shapes.

An operand read at an offset is stacked once per tap of its last offset axis (a third of
im2col's copy), and the other taps loop around BLAS calls on views of that copy, or, where they
shift the output (an input gradient), become rows of one product whose slices are summed
shifted; an output written at an offset gets one window per tap added (col2im). Written at a
stride (`adj_x[n, c, 2*i + r]`), the router instead asks for the product of every tap, which a
generated gather adds up (`contract.tap_product_vars`). `matmuls.einsum_matmul` lays each product
out as BLAS calls on views, batched over the image index, so that neither the operands nor the
products are copied again. All of that depends on the shapes and dtypes alone: a plan works it
out once, on stand-in arrays that take no memory, into a `Plan` (blas_plan.py) of temporaries,
copies and products, and each call runs it (the Python that derives it cost ~1 ms of a
convolution's gradient). A contraction of one operand (a bias's gradient) is numpy's sum.
"""
from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from halide_ad.ir import Range, Var
from halide_ad.runtime.buffers import pool
from halide_ad.runtime.contract import Contraction, offset_vars, plain, terms, used
from halide_ad.runtime.engines.blas_plan import Lazy, Plan, Shifted, add_products, stand_in, write_product
from halide_ad.runtime.parallel import each_image


def plan(c: Contraction, *, any_size: bool = False) -> BlasPlan:
    """BLAS takes every contraction, of any size."""
    return BlasPlan(c)


class BlasPlan:
    """How BLAS computes contraction `c`, per shapes and dtypes of its arrays."""

    def __init__(self, c: Contraction):
        self.out, self.out_index, self.a, self.b = c.out, c.out_index, c.a, c.b
        self.scale, self.domain, self.taps, self.shapes = c.scale, c.domain, c.taps, c.shapes

    @property
    def name(self) -> str:
        return "BLAS" if self.b is not None else "numpy"

    def accumulate(self, buffers: dict[str, np.ndarray], *, assign: bool = False) -> None:
        """out += the contraction, or with `assign`, out = it (zero where it does not write).

        BLAS products over all taps (`matmuls.einsum_matmul`). Taps that shift the output window (as
        in a convolution's input gradient) move onto the operand that carries the window
        (`_correlation`); where they cannot, their products are added window by window. Which
        views, copies and products that takes depends on the shapes and dtypes alone: it is
        worked out once (`_plan`), and each call only runs it.

        A convolution big enough runs image by image on the threads (`images`): each image's
        copies, products and sums run one after the other on one thread, while what they wrote
        is still in its cache (conv2d's input gradient: 8.5 -> 7.4 ms)."""
        if self.b is None:
            self._sum(buffers, assign)
            return
        shapes = self._shapes
        arrays = {n: buffers[n].reshape(shapes[n]) for n in (self.out, self.a.buffer, self.b.buffer)}
        if self.images is None:
            self._plan_for(shapes, arrays).run(arrays, self.scale, assign)
            return
        var, count, split = self.images
        plan = self._plan_for({n: (1, *s[1:]) if n in split else s for n, s in shapes.items()}, arrays,
                              {var: Range(var, 0, 1)})
        out = arrays[self.out]
        partial = None if self.out in split else pool.empty((count, *out.shape), out.dtype)

        def image(j: int) -> None:
            one = {n: a[j:j + 1] if n in split else a for n, a in arrays.items()}
            if partial is not None:  # the images are summed: each writes its own part, added up below
                one[self.out] = partial[j]
            plan.run(one, self.scale, assign or partial is not None)

        each_image(image, count)
        if partial is not None:
            add_products(out, [partial.sum(axis=0)], 1.0, assign)

    MIN_IMAGE_WORK = 1 << 22  # multiply-adds per image from which images run one by one

    @functools.cached_property
    def images(self) -> tuple[Var, int, frozenset[str]] | None:
        """The image variable, its count and the arrays that have it as their first axis, where
        the contraction has taps (a convolution), some operand's first axis is that variable's
        whole range, every read of an array reads it there or not at all, and each image's
        share is at least MIN_IMAGE_WORK; else None."""
        shapes = dict(self.shapes)
        taps = {t.var for t in self.taps}
        reads = ((self.out, self.out_index), (self.a.buffer, self.a.index), (self.b.buffer, self.b.index))
        for operand in (self.a, self.b) if taps else ():
            first = terms(operand.index[0]) if operand.index else None
            var = next((v for v in first or () if v is not None), None)
            if var is None or var in taps or first != {var: 1, None: 0}:
                continue
            r = next(r for r in self.domain if r.var == var)
            split = frozenset(name for name, index in reads if var in used(index))
            # (an array read twice is split only if both reads allow it)
            if r.lo == 0 and r.extent > 1 and all(
                    name not in split or (terms(index[0]) == first and var not in used(index[1:])
                                          and shapes[name][0] == r.extent) for name, index in reads):
                work = math.prod(d.extent for d in self.domain) // r.extent
                return (var, r.extent, split) if work >= self.MIN_IMAGE_WORK else None
        return None

    def _plan_for(self, shapes: dict, arrays: dict, ranges: dict | None = None) -> Plan:
        """The plan for arrays of these shapes and of the dtypes of `arrays`, with the ranges of
        some variables replaced (see `_plan`), made once."""
        # (the shapes are the contraction's, or with `ranges`, one image's: the dtypes tell plans apart)
        key = (ranges is None, *(a.dtype for a in arrays.values()))
        plans = self.__dict__.setdefault("_plans", {})  # frozen, but a cache is not a field
        plan = plans.get(key)
        if plan is None:
            plan = plans[key] = self._plan(shapes, {n: a.dtype for n, a in arrays.items()}, ranges or {})
        return plan

    def _sum(self, buffers: dict[str, np.ndarray], assign: bool) -> None:
        """out (+)= scale * a summed over the variables out does not have, by numpy, which sums
        along memory: the gather would walk each output's window across rows, one element a
        cache line (dense's bias gradient, 512 rows of 1024: 2.03 -> 0.35 ms)."""
        a_key, out_key, subs = self._summed
        shapes = self._shapes
        a = buffers[self.a.buffer].reshape(shapes[self.a.buffer])
        out = buffers[self.out].reshape(shapes[self.out])
        if assign:
            out.fill(0)
        # (a sum to one number is a numpy scalar, which _write cannot scale in place)
        write_product(out[out_key], np.asarray(np.einsum(subs, a[a_key])), self.scale, False)

    @functools.cached_property
    def _summed(self) -> tuple[tuple, tuple, str]:
        """`_sum`'s views of a and out (their indices) and its einsum subscripts: the same every
        call (worked out per call, they were most of a small bias gradient's 20 us)."""
        ranges = {r.var: r for r in self.domain}
        letters = {r.var: chr(ord("a") + k) for k, r in enumerate(self.domain)}
        a_key, subs = _window(self.a.index, {}, ranges, letters)
        out_key, out_subs = _window(self.out_index, {}, ranges, letters)
        return a_key, out_key, f"{subs}->{out_subs}"

    @functools.cached_property
    def _shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self.shapes)

    def _plan(self, shapes: dict, dtypes: dict, replaced: dict[Var, Range]) -> Plan:
        """The work for buffers of these shapes and dtypes (see `Plan`), derived on stand-in
        arrays, with the variables in `replaced` running over those ranges instead."""
        plan = Plan(self.out)
        arrays = {n: Lazy(n, (), stand_in(shapes[n], dtypes[n])) for n in dtypes}
        ranges = {r.var: r for r in self.domain} | replaced
        letters = {r.var: chr(ord("a") + k) for k, r in enumerate(self.domain)}
        shifting = {v for e in self.out_index for v in offset_vars(terms(e))}
        shifting_taps = [t for t in self.taps if t.var in shifting]
        windows = self._correlation(shifting_taps, arrays, ranges, letters, plan)
        if windows is None and not shifting_taps:
            windows = self._products(arrays, ranges, letters, plan)
        if windows is not None:  # disjoint windows: each is written once, with the sum of its products
            plan.windows = windows
            plan.unwritten = _unwritten([key for key, *_ in windows], shapes[self.out])
            return plan
        va, sa = self._operand(arrays[self.a.buffer], self.a.index, ranges, letters, (), plan)({})
        vb, sb = self._operand(arrays[self.b.buffer], self.b.index, ranges, letters, (), plan)({})
        so = _window(self.out_index, {t.var: t.lo for t in shifting_taps}, ranges, letters)[1]
        windows = []
        for values in itertools.product(*(range(t.lo, t.hi) for t in shifting_taps)):
            env = dict(zip((t.var for t in shifting_taps), values, strict=True))
            windows.append((_window(self.out_index, env, ranges, letters)[0],
                            tuple(v - t.lo for v, t in zip(values, shifting_taps, strict=True))))
        plan.sums = (va, sa, vb, sb, "".join(letters[t.var] for t in shifting_taps) + so, windows)
        return plan

    def _products(self, arrays, ranges, letters, plan):
        """The output's windows (their indices and subscripts), each with the operand pairs whose
        products sum into it: one pair per value of the row taps (`_row_taps`), which stay loops
        around BLAS instead of going into the stacked copy."""
        rows = [] if self._stack_small else _row_taps(self.taps, (self.a.index, self.b.index))
        operand_a = self._operand(arrays[self.a.buffer], self.a.index, ranges, letters, rows, plan)
        operand_b = self._operand(arrays[self.b.buffer], self.b.index, ranges, letters, rows, plan)
        written = used(self.out_index)
        windows: dict[tuple, tuple] = {}
        for values in itertools.product(*(range(t.lo, t.hi) for t in rows)):
            env = dict(zip((t.var for t in rows), values, strict=True))
            key = tuple(v for t, v in zip(rows, values, strict=True) if t.var in written)
            if key not in windows:
                windows[key] = (*_window(self.out_index, env, ranges, letters), [])
            windows[key][2].append((operand_a(env), operand_b(env)))
        return [(*window, [...]) for window in windows.values()]

    SMALL_STACK = 1 << 16  # elements of an operand's copy with every tap stacked, up to which it is made

    @functools.cached_property
    def _stack_small(self) -> bool:
        """Whether an operand is small enough that every tap goes into its stacked copy, row taps
        too (`_row_taps`): one product instead of one per row tap, whose copy is in cache anyway
        (the digits example's weight gradient: 75 -> 59 us; the small layer's: 56 -> 46)."""
        taps = math.prod(t.extent for t in self.taps)
        return all(taps * math.prod(self._shapes[x.buffer]) <= self.SMALL_STACK for x in (self.a, self.b)
                   if any(offset_vars(terms(e)) for e in x.index))

    def _correlation(self, shifting_taps, arrays, ranges, letters, plan):
        """`out[s*i + r] += a[i] * b[r]` as correlations, `out[s*u + f] += sum_m a_padded[u - m] *
        b[s*m + f]`, one per phase f of the stride s: the operand that carries the output's
        window is zero-padded and stacked once per tap, so that the products of a phase, with the
        taps summed inside BLAS, write that phase of the output, and no window sums follow (a
        convolution's input gradient). Of the carrier's shifted axes, the last is its lane, whose
        taps are stacked; taps of stride 1 on the others are row taps, read from the one stacked
        copy instead of more copies. One row tap goes into the rows of one product over all of
        the copy's padded rows, whose slices for each tap, shifted, sum into the output: BLAS
        runs one product of 96 rows (32 channels, 3 taps) faster than three of 32 (conv2d's
        input gradient: 11.4 -> 9.0 ms). More row taps (a 3-D convolution's) run one product per
        tap on views of the copy, as that product would grow with their count.
        Strided, this is the fallback for products per tap too big to keep (`tap_product_vars`).
        Per phase: the output's window (its index), its subscripts, its operand pairs, and the
        slices of each product that sum into the window (`...`: the whole product); None where
        the indices are not of that form."""
        if not shifting_taps:
            return None
        taps = {t.var: t for t in shifting_taps}
        shifted = {}  # tap -> (the variable whose output axis it shifts, that variable's stride)
        for e in self.out_index:
            t = terms(e)
            vs = [v for v in t if v is not None and t[v]]
            tap, main = [v for v in vs if v in taps], [v for v in vs if v not in taps]
            if tap and (len(tap) != 1 or len(main) != 1 or t[tap[0]] != 1 or t[main[0]] < 1 or tap[0] in shifted):
                return None
            if tap:
                shifted[tap[0]] = (main[0], t[main[0]])
        if len(shifted) != len(taps):
            return None
        mains = {m for m, _ in shifted.values()}
        # the carrier reads the shifted variables whole and no tap; the other reads only whole variables,
        # the taps among them and none of the shifted ones
        for carrier, other in ((self.a, self.b), (self.b, self.a)):
            whole = plain(other.index)
            if (mains <= plain(carrier.index) and not taps.keys() & used(carrier.index)
                    and whole == used(other.index) and taps.keys() <= whole and not mains & whole):
                break
        else:
            return None
        axis = {v: letters[m] for v, (m, _) in shifted.items()}  # the carrier's axis each tap shifts
        stride = {v: s for v, (_, s) in shifted.items()}
        view, subs = _view(arrays[carrier.buffer], carrier.index, {}, ranges, letters)
        lane = max((axis[t.var] for t in shifting_taps), key=subs.index)  # stacked; the other axes' taps loop
        rows = [t for t in shifting_taps if stride[t.var] == 1 and axis[t.var] != lane]
        lanes = [t for t in shifting_taps if t not in rows]
        pad = {axis[v]: -(-t.extent // stride[v]) - 1 for v, t in taps.items()}  # most taps of a phase, less 1
        extent = dict(zip(subs, view.shape))
        other_view, other_subs = _view(arrays[other.buffer], other.index, {}, ranges, letters)
        windows = []
        for phase in itertools.product(*(range(min(stride[t.var], t.extent)) for t in lanes)):
            first = {t.var: f for t, f in zip(lanes, phase, strict=True)} | {t.var: 0 for t in rows}
            count = {v: -(-(taps[v].extent - f) // stride[v]) for v, f in first.items()}  # taps s*m + f

            def window(m: int, v: Var) -> slice:  # tap s*m + f reads a[u - m]
                start = pad[axis[v]] - m
                return slice(start, start + extent[axis[v]] + count[v] - 1)

            copies = []  # windows of the carrier zero-padded by `pad`, copied without a padded copy
            for ms in itertools.product(*(range(count[t.var]) for t in lanes)):
                at = {axis[t.var]: window(m, t.var) for t, m in zip(lanes, ms, strict=True)}
                spans = [at.get(c, slice(0, extent[c] + 2 * pad.get(c, 0))) for c in subs]  # padded coords
                copies.append(Shifted(view, tuple(w.start - pad.get(c, 0) for w, c in zip(spans, subs)),
                                       tuple(w.stop - w.start for w in spans)))
            stacked, stacked_subs = _stacked(copies, subs, "".join(letters[t.var] for t in lanes),
                                             [count[t.var] for t in lanes], plan)
            of_phase = {letters[t.var]: slice(first[t.var], first[t.var] + stride[t.var] * (count[t.var] - 1) + 1,
                                              stride[t.var]) for t in lanes}
            wide = ranges | {m: Range(m, ranges[m].lo, ranges[m].hi + count[v] - 1) for v, (m, _) in shifted.items()}
            starts = {v: taps[v].lo + f for v, f in first.items()}
            out_window, out_subs = _window(self.out_index, starts, wide, letters)
            if len(rows) == 1:  # one product with the row tap among its rows, its slices summed shifted
                (t,) = rows
                tap, shifted_axis = letters[t.var], axis[t.var]
                weights = _index(other_view, other_subs, of_phase)
                at = out_subs.index(shifted_axis)  # the tap's letter before the axis it shifts: the
                subs = out_subs[:at] + tap + out_subs[at:]  # product is (channels x taps) x pixels
                carried = (stacked, stacked_subs)
                pair = (carried, weights) if carrier is self.a else (weights, carried)
                shifts = [tuple(m if c == tap else window(m, t.var) if c == shifted_axis else slice(None)
                                for c in subs) for m in range(t.extent)]
                windows.append((out_window, subs, [pair], shifts))
                continue
            products = []
            for ms in itertools.product(*(range(t.extent) for t in rows)):
                carried = _index(stacked, stacked_subs,
                                 {axis[t.var]: window(m, t.var) for t, m in zip(rows, ms, strict=True)})
                weights = _index(other_view, other_subs,
                                 of_phase | {letters[t.var]: m for t, m in zip(rows, ms, strict=True)})
                products.append((carried, weights) if carrier is self.a else (weights, carried))
            windows.append((out_window, out_subs, products, [...]))
        return windows

    def _operand(self, array, index, ranges, letters, rows, plan):
        """The operand's view as a function of the row taps' values. Other taps it reads at an
        offset (x[n, c, i + r]) become axes of a stacked copy (im2col) right after its first axis
        (x_stacked[n, r, c, i]), so that they go into BLAS calls batched over that axis (see
        `matmuls.einsum_matmul`); the copy spans the row taps' whole windows, and each of their
        values is a view of it."""
        offset = {t.var for t in self.taps if any(t.var in offset_vars(terms(e)) for e in index)}
        stacked = [t for t in self.taps if t.var in offset and t not in rows]
        shifted = [t for t in rows if t.var in offset]
        if not stacked and not shifted:
            return lambda env: _view(array, index, env, ranges, letters)
        mains = {v: _main(index, v) for v in (t.var for t in shifted)}
        wide = ranges | {mains[t.var]: Range(mains[t.var], ranges[mains[t.var]].lo,
                                             ranges[mains[t.var]].hi + t.extent - 1) for t in shifted}
        starts = {t.var: t.lo for t in shifted}
        combos = list(itertools.product(*(range(t.lo, t.hi) for t in stacked)))
        views = [_view(array, index, starts | dict(zip((t.var for t in stacked), values, strict=True)), wide, letters)
                 for values in combos]
        data, subs = _stacked([v for v, _ in views], views[0][1], "".join(letters[t.var] for t in stacked),
                              [t.extent for t in stacked], plan)

        def at(env):
            window = {letters[mains[t.var]]: slice(env[t.var] - t.lo, env[t.var] - t.lo + ranges[mains[t.var]].extent)
                      for t in shifted}
            return _index(data, subs, window)
        return at


def _row_taps(taps: tuple[Range, ...], indices) -> list[Range]:
    """The taps that BLAS calls loop over rather than stack (see `Contraction._products`). Of the
    components of an index that read at an offset, the last is its lane: its taps are stacked.
    Each operand reads a row tap whole, or in one other component `v + tap` of unit stride
    whose variable v it reads nowhere else. A row tap's values are then windows of the one
    stacked copy that still merge with the lane into one BLAS dimension."""
    rows = []
    for t in taps:
        for index in indices:
            forms = [terms(e) for e in index]
            at = [k for k, f in enumerate(forms) if f.get(t.var)]
            if len(at) > 1:
                break
            if not at or forms[at[0]] == {t.var: 1, None: 0}:
                continue
            f = forms[at[0]]
            main = [v for v in f if v is not None and v != t.var and f[v]]
            lane = max(k for k, g in enumerate(forms) if offset_vars(g))
            if (at[0] == lane or f[t.var] != 1 or len(main) != 1 or f[main[0]] != 1
                    or sum(1 for g in forms if g.get(main[0])) > 1):
                break
        else:
            rows.append(t)
    return rows


def _main(index, tap: Var) -> Var:
    """The variable that `tap` offsets in `index`."""
    form = next(f for f in map(terms, index) if f.get(tap))
    return next(v for v in form if v is not None and v != tap and form[v])


def _index(view: np.ndarray, subs: str, at: dict) -> tuple[np.ndarray, str]:
    """view[at], at mapping subscripts to an int (the axis goes) or a slice, and its subscripts."""
    return (view[tuple(at.get(c, slice(None)) for c in subs) + (Ellipsis,)],
            "".join(c for c in subs if not isinstance(at.get(c), int)))


def _stacked(windows: list[Lazy | Shifted], subs: str, tap_subs: str, extents: list[int],
             plan: Plan) -> tuple[Lazy, str]:
    """The windows copied into one temporary, their taps as axes right after the first axis
    (im2col), so that all taps go into BLAS calls batched over that axis (see
    `matmuls.einsum_matmul`), and its subscripts."""
    shape = windows[0].shape
    at = min(1, len(shape))
    data = plan.temporary(shape[:at] + (len(windows),) + shape[at:], windows[0].dtype)
    for k, view in enumerate(windows):
        dst = data[(slice(None),) * at + (k,)]
        if isinstance(view, Shifted):
            plan.copy_shifted(dst, view)
        else:
            plan.copy(dst, view)
    return data.reshape(shape[:at] + tuple(extents) + shape[at:]), subs[:at] + tap_subs + subs[at:]


def _view(array, index, env, ranges, letters):
    """The strided view of `array` that `index` reads as the non-tap variables run, and its subscripts."""
    key, subs = _window(index, env, ranges, letters)
    return array[key], subs


def _window(index, env, ranges, letters) -> tuple[tuple, str]:
    """The index of `_view`'s view (ints and slices, one per axis, then `...`) and its subscripts."""
    slices, subs = [], ""
    for e in index:
        t = terms(e)
        offset = t.get(None, 0) + sum(c * env[v] for v, c in t.items() if v in env)
        main = [(v, c) for v, c in t.items() if v is not None and v not in env and c]
        if not main:
            slices.append(offset)
            continue
        (v, c), = main
        r = ranges[v]
        start = offset + c * r.lo
        slices.append(slice(start, start + c * (r.hi - r.lo - 1) + 1, c))
        subs += letters[v]
    return tuple(slices) + (Ellipsis,), subs  # with `...`, a 0-d result is a view, not a copy


def _unwritten(keys: list[tuple], shape: tuple[int, ...]) -> list[tuple] | None:
    """What disjoint windows of an array of `shape` (their `_window` indices) leave unwritten,
    as indices, where the windows tile a box: each axis's indices that no window covers. None
    where they do not (the phases of a strided output tile one; a window of no points may not)."""
    covered = [set() for _ in shape]
    points = 0
    for key in keys:
        per_axis = [range(*k.indices(n)) if isinstance(k, slice) else (k,) for k, n in zip(key, shape)]
        points += math.prod(map(len, per_axis))
        for axis, at in zip(covered, per_axis):
            axis.update(at)
    if points != math.prod(map(len, covered)):
        return None
    return [(slice(None),) * a + (sorted(set(range(n)) - axis),)
            for a, (n, axis) in enumerate(zip(shape, covered)) if len(axis) < n]
