"""The inverter on hand-built scatters, with brute force as the oracle, and structural tests."""
import numpy as np
from hypothesis import given, settings, strategies as st

import halide_ad as hd
from halide_ad.ir import Bin, Load, Op, Range, Scatter, Var, const
from halide_ad.solver import Gather, invert
from tests import programs as P

i, r, j = Var("i"), Var("r"), Var("j")


def preimages(g: Gather, shape: tuple[int, ...]) -> dict[int, list[dict]]:
    """Enumerate the gather's loops and guards by brute force, in Python."""
    from halide_ad.traverse import simplify, substitute
    out = {}
    for jv in range(shape[0]):
        points = []
        for piece in g.pieces:
            env = {j: const(jv)}

            def walk(level, env):
                if not all(simplify(substitute(c, env)).value for c in piece.guards[level]):
                    return
                if level == len(piece.loops):
                    sol = {v.name: simplify(substitute(e, env)).value for v, e in piece.solution}
                    sol |= {v.name: val.value for v, val in env.items() if v != j}
                    points.append(sol)
                    return
                loop = piece.loops[level]
                lo, hi = (simplify(substitute(b, env)).value for b in (loop.lo, loop.hi))
                for x in range(lo, hi):
                    walk(level + 1, env | {loop.var: const(x)})
            walk(0, env)
        out[jv] = points
    return out


@settings(max_examples=60, deadline=None)
@given(a=st.integers(-4, 4).filter(bool), b=st.integers(-8, 8), n=st.integers(1, 12), k=st.integers(1, 3))
def test_affine_inverse_with_window_matches_brute_force(a, b, n, k):
    """adj_x[a*i + r + b] += ... over i < n, r < k: each j gets exactly its preimage."""
    index = Bin(Op.ADD, Bin(Op.ADD, Bin(Op.MUL, const(a), i), r), const(b))
    values = [a * iv + rv + b for iv in range(n) for rv in range(k)]
    offset = -min(values)
    index = Bin(Op.ADD, index, const(offset))
    size = max(values) + offset + 1
    s = Scatter("x", (index,), Load("adj_y", (i,), "float64"), (Range(i, 0, n), Range(r, 0, k)))
    g = invert(s, (size,), (j,))
    assert isinstance(g, Gather), g
    found = preimages(g, (size,))
    for jv in range(size):
        expect = sorted((iv, rv) for iv in range(n) for rv in range(k) if a * iv + rv + b + offset == jv)
        assert sorted((p["i"], p["r"]) for p in found[jv]) == expect


def test_blur3_adjoint_is_a_gather_for_every_shift(rng):
    report = hd.explain(P.blur3, rng.random((5, 6)), "repeat_edge")
    forms = report.forms("img")
    assert len(forms) == 3 and set(forms) <= {"gather", "gather-window"}
    assert "scatter" not in report.backward_source.split("def backward")[1]


def test_conv_and_pool_adjoints_are_gathers(rng):
    x, w = rng.random((1, 2, 5, 5)), rng.random((2, 2, 3, 3))
    assert set(hd.explain(P.conv2d, x, w).forms()) == {"gather-window"}
    # 2x2 windows at stride 2 do not overlap: each input is in one window, so no window loop is left
    assert hd.explain(P.maxpool2, rng.random((1, 2, 4, 4))).forms("x") == ["gather"]


def test_data_dependent_index_falls_back_with_a_reason(rng):
    f = hd.func(lambda t, idx: hd.compute((idx.shape[0], t.shape[1]), lambda i, f: t[idx[i], f]))
    report = hd.explain(f, rng.random((4, 3)), np.array([1, 1, 0]))
    (c,) = report.contributions
    assert c.form == "scatter-parallel" and "not affine" in c.reason


def test_stride_two_plus_one_inverse_is_exact():
    s = Scatter("x", (Bin(Op.ADD, Bin(Op.MUL, const(2), i), const(1)),), Load("adj_y", (i,), "float64"),
                (Range(i, 0, 4),))
    g = invert(s, (9,), (j,))
    assert g.form == "gather"
    assert {jv: [p["i"] for p in ps] for jv, ps in preimages(g, (9,)).items() if ps} == {1: [0], 3: [1], 5: [2], 7: [3]}
