"""Forward mode (hd.jvp) through update definitions: against central differences in float64 and
against jax.jvp of the same program written in JAX."""
import numpy as np
import pytest

import halide_ad as hd
from halide_ad import ops
from tests.transforms.helpers import check_jvp
from tests.updates import programs as P


@hd.func
def running_product(x):  # t[0] *= x[r]: colliding writes of a product
    t = hd.full((2,), 1.0, x.dtype)
    r = hd.rdom(x.shape[0])
    t[0] *= x[r]
    return t


@hd.func
def scaled(x, w):  # t[i] *= w[i] and t[i] -= x[i]: one write per point
    t = hd.compute(x.shape, lambda i: x[i] * x[i])
    i = hd.var()
    t[i] *= w[i]
    t[i] -= x[i]
    return t


@hd.func
def self_indexed(x):  # the index reads the tensor being updated
    t = hd.compute(x.shape, lambda i: x[i])
    r = hd.rdom(3)
    first = t[r * 0]
    t[hd.clamp(hd.cast(hd.floor(first * 3), "int64"), 0, 2)] = first + x[r]
    return t


def _float(*args):
    return tuple(a for a in args if isinstance(a, np.ndarray) and a.dtype.kind == "f")


CASES = {  # name: (program, arguments)
    "histogram": (P.histogram, lambda rng: (rng.integers(-2, 8, 40), rng.random(40), 6)),
    "iir": (P.iir, lambda rng: (rng.random((3, 6)), rng.random((3, 6)))),
    "rnn": (P.rnn, lambda rng: (rng.standard_normal(1), rng.standard_normal(6))),
    "inplace_max": (P.inplace_max, lambda rng: (rng.random(5), rng.random(5))),
    "row_max": (P.row_max, lambda rng: (rng.standard_normal((3, 4)),)),
    "horner": (P.horner, lambda rng: (rng.standard_normal(4), rng.standard_normal(3))),
    "running_product": (running_product, lambda rng: (rng.random(5) + 0.5,)),
    "scaled": (scaled, lambda rng: (rng.random(4), rng.random(4))),
    "overwrite": (P.overwrite, lambda rng: (rng.random(6), rng.random(3))),
    "assign": (P.assign, lambda rng: (np.array([0, 2, 2, 1, 0, 2]), rng.random(6))),
    "two_updates": (P.two_updates, lambda rng: (rng.random(10),)),
    "ring": (P.ring, lambda rng: (rng.random(3),)),
    "pairs": (P.pairs, lambda rng: (rng.random(7),)),
    "suffix_sum": (P.suffix_sum, lambda rng: (rng.random(5),)),
    "masked": (P.masked, lambda rng: (rng.random(8),)),
    "ends": (P.ends, lambda rng: (rng.random(4),)),
    "hist2d": (P.hist2d, lambda rng: (rng.integers(0, 4, 9), rng.integers(0, 5, 9), rng.random(9))),
    "self_indexed": (self_indexed, lambda rng: (rng.random(3) * 0.9,)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_jvp_through_updates_matches_finite_differences(name, rng):
    fn, make = CASES[name]
    check_jvp(fn, *make(rng))


# ---- against jax.jvp -------------------------------------------------------------------------

def _jax_programs(jnp, lax):
    def histogram(w, idx, bins):
        return jnp.zeros(bins, w.dtype).at[jnp.clip(idx, 0, bins - 1)].add(w)

    def iir(a, b):
        def step(y, ab):
            y = ab[0] * y + ab[1]
            return y, y
        _, ys = lax.scan(step, b[:, 0], (a[:, 1:].T, b[:, 1:].T))
        return jnp.concatenate([b[:, :1], ys.T], axis=1)

    def row_max(x):  # keeps the old value on a tie, as the in-place max does
        t = jnp.full(x.shape[0], -1.0, x.dtype)
        for r in range(x.shape[1]):
            t = jnp.where(x[:, r] > t, x[:, r], t)
        return t

    def running_product(x):
        return jnp.stack([jnp.prod(x), jnp.ones((), x.dtype)])

    def assign(w, idx):  # the last write wins
        t = jnp.zeros(3, w.dtype)
        for r in range(w.shape[0]):
            t = t.at[jnp.clip(idx[r], 0, 2)].set(2 * w[r])
        return t

    def overwrite(x, w):
        y = 3 * x
        return y.at[1:w.shape[0] + 1].set(jnp.sin(w) * y[1:w.shape[0] + 1])

    return dict(histogram=histogram, iir=iir, row_max=row_max, running_product=running_product,
                assign=assign, overwrite=overwrite)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_jvp_through_updates_matches_jax(dtype, rng, jax_x64):
    jax = pytest.importorskip("jax")
    J = _jax_programs(jax.numpy, jax.lax)
    idx = rng.integers(-2, 8, 30)
    cases = [  # (halide_ad program, its arguments, the JAX function of the float arguments)
        (P.histogram, (idx, rng.random(30).astype(dtype), 6), lambda w: J["histogram"](w, idx, 6)),
        (P.iir, (rng.random((3, 7)).astype(dtype), rng.random((3, 7)).astype(dtype)), J["iir"]),
        (P.row_max, (rng.standard_normal((3, 5)).astype(dtype),), J["row_max"]),
        (running_product, ((rng.random(6) + 0.5).astype(dtype),), J["running_product"]),
        (P.assign, (np.array([0, 2, 2, 1, 0]), rng.random(5).astype(dtype)),
         lambda w: J["assign"](w, np.array([0, 2, 2, 1, 0]))),
        (P.overwrite, (rng.random(6).astype(dtype), rng.random(3).astype(dtype)), J["overwrite"]),
    ]
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == "float64" else dict(rtol=1e-5, atol=1e-6)
    for fn, args, jax_fn in cases:
        floats = _float(*args)
        tangents = tuple(rng.standard_normal(a.shape).astype(dtype) if any(a is f for f in floats) else None
                         for a in args)
        out, tangent_out = hd.jvp(fn, args, tangents)
        ref_out, ref_tangent = jax.jvp(jax_fn, floats, tuple(t for t in tangents if t is not None))
        assert tangent_out.dtype == np.dtype(dtype)
        np.testing.assert_allclose(out, ref_out, **tol, err_msg=fn.__name__)
        np.testing.assert_allclose(tangent_out, ref_tangent, **tol, err_msg=fn.__name__)


def test_inplace_max_carries_the_tangent_of_the_first_extremum():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    z = np.array([0.5, 2.0, 5.0, 4.0])  # ties at 1 and 3 keep the old value's tangent
    _, t = hd.jvp(P.inplace_max, (x, z), (np.full(4, 10.0), np.full(4, 1.0)))
    np.testing.assert_array_equal(t, [10, 10, 1, 10])
    x = np.array([[1.0, 3.0, 3.0, 2.0], [5.0, 0.0, 5.0, 1.0], [-2.0, -3.0, -4.0, -5.0]])
    _, t = hd.jvp(P.row_max, (x,), (np.arange(12.0).reshape(3, 4),))
    np.testing.assert_array_equal(t, [1, 4, 0])  # the first 3, the first 5, the start value


@hd.func
def first_points(idx, w, count):  # updates at the first `count` points only: none for 0
    h = hd.zeros((4,), w.dtype)
    r = hd.rdom(idx.shape[0], where=lambda r: r < count)
    h[hd.clamp(idx[r], 0, 3)] += w[r]
    p = hd.full((1,), 1.0, w.dtype)
    p[0] *= w[r]
    m = hd.full((1,), -1.0, w.dtype)
    m[0] = hd.maximum(m[0], w[r])
    return h, p, m


@pytest.mark.parametrize("n", [0, 1])
def test_jvp_through_updates_with_empty_and_one_point_rdoms(n, rng):
    idx, w = rng.integers(0, 4, 3), rng.random(3)
    (h, p, m), (th, tp, tm) = check_jvp(first_points, idx, w, n)
    np.testing.assert_allclose(h, np.bincount(idx[:n], w[:n], 4))
    t = check_jvp(first_points, idx, w, n, seed=1)[1]
    assert (np.count_nonzero(t[0]), np.count_nonzero(t[1]), np.count_nonzero(t[2])) == (n, n, n)
    check_jvp(P.iir, rng.random((2, 2)), rng.random((2, 2)))  # a scan over one point


def test_jvp_of_a_scan_is_a_scan_and_of_a_histogram_a_histogram(rng):
    """The tangent updates run at the primal's rungs: hd.explain on the jvp program."""
    a, b = rng.random((2, 5)), rng.random((2, 5))
    text = str(hd.explain(lambda a, b, ta, tb: hd.jvp(P.iir, (a, b), (ta, tb)), a, b, a, b))
    assert text.count("runs at rung 4: serial over the rdom") == 2, text
    idx, w = rng.integers(0, 5, 64), rng.random(64)
    text = str(hd.explain(lambda idx, w, t: hd.jvp(P.histogram, (idx, w, 5), (None, t, None)), idx, w, w))
    assert text.count("runs at rung 3") == 2, text


def test_jacfwd_through_an_update_matches_jacrev(rng):
    a, b = rng.random((2, 4)), rng.random((2, 4))
    np.testing.assert_allclose(hd.jacfwd(P.iir)(a, b), hd.jacrev(P.iir)(a, b), rtol=1e-12)
    x = rng.random(5) + 0.5
    np.testing.assert_allclose(hd.jacfwd(running_product)(x), hd.jacrev(running_product)(x), rtol=1e-12)


def test_check_grad_both_modes_on_the_update_operators(rng):
    x = rng.standard_normal((3, 4))
    hd.check_grad(ops.cumsum, x, 1, modes=("rev", "fwd"))
    hd.check_grad(ops.cumprod, x, 0, modes=("rev", "fwd"))
    index, src = np.array([0, 2, 2, 1, 0, 1]), rng.standard_normal((6, 3))
    hd.check_grad(ops.index_add, x[:, :3], 0, index, src, modes=("rev", "fwd"))
    hd.check_grad(ops.scatter_add, x[:, :3], 0, rng.integers(0, 3, (6, 3)), src, modes=("rev", "fwd"))
    hd.check_grad(ops.segment_sum, src, index, 4, modes=("rev", "fwd"))
    hd.check_grad(ops.bincount, index, rng.random(6), 4, modes=("rev", "fwd"))
    hd.check_grad(ops.histogram, rng.uniform(-1, 1, 20), 5, -1.0, 1.0, rng.random(20), modes=("rev", "fwd"))
    hd.check_grad(ops.embedding_bag, rng.standard_normal((5, 3)), np.array([0, 4, 4, 2, 1]), np.array([0, 2]),
                  modes=("rev", "fwd"))
