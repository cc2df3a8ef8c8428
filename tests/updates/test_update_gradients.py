import numpy as np
import pytest

import halide_ad as hd
from halide_ad.ad import reverse_mode
from halide_ad.ir import Load
from halide_ad.traverse import walk
from tests.updates import programs as P


def _finite_difference(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for k in range(x.size):
        d = np.zeros_like(x)
        d.flat[k] = eps
        g.flat[k] = (f(x + d) - f(x - d)) / (2 * eps)
    return g


def test_histogram_gradient_is_a_gather(rng):
    idx = rng.integers(-2, 8, 40)
    w = rng.random(40)
    g = hd.grad(P.histogram_loss, argnums=1)(idx, w, 6)
    expected = _finite_difference(lambda v: np.sum(np.bincount(np.clip(idx, 0, 5), v, 6) ** 2), w)
    np.testing.assert_allclose(g, expected, rtol=1e-6, atol=1e-8)
    assert hd.explain(P.histogram_loss, idx, w, 6).forms("w") == ["gather"]


def test_histogram_gradient_matches_torch_index_add(rng):
    torch = pytest.importorskip("torch")
    idx = rng.integers(0, 6, 50)
    w = rng.random(50).astype(np.float32)
    ct = rng.standard_normal(6).astype(np.float32)
    _, vjp = hd.vjp(P.histogram, idx, w, 6)
    tw = torch.tensor(w, requires_grad=True)
    out = torch.zeros(6).index_add(0, torch.tensor(idx), tw)
    out.backward(torch.tensor(ct))
    np.testing.assert_allclose(vjp(ct)[1], tw.grad.numpy(), rtol=1e-6)


def test_a_stage_read_only_in_a_floored_index_has_no_adjoint_buffer(rng):
    """`level` reaches the output only through the floor in the write index: its adjoint is zero,
    so the gradient allocates none and no gather reads one, unless hd.adjoints asks for it."""
    x = (rng.integers(0, 4, 30) + rng.uniform(0.1, 0.9, 30)) / 3  # away from the bins' edges
    ct = rng.standard_normal(4)
    traced, _ = P.binned.trace((x,), {})
    adjoints = reverse_mode(traced.program, ("x",))
    reads = {n.buffer for a in adjoints for s in a.scatters for n in walk(s.value) if isinstance(n, Load)}
    assert [a.buffer for a in adjoints] == [traced.program.outputs[0], "x"] and "adj_level" not in reads
    (g,) = hd.vjp(P.binned, x)[1](ct)
    np.testing.assert_allclose(g, 2 * x * ct[np.floor(3 * x).astype(int)], rtol=1e-12)
    np.testing.assert_allclose(g, _finite_difference(lambda v: P.binned(v) @ ct, x), rtol=1e-6)
    named = hd.adjoints(P.binned, x, cotangent=ct)
    assert np.array_equal(named["level"], np.zeros(30)) and np.allclose(named["x"], g, rtol=1e-12)


def test_one_to_one_update_gradients(rng):
    x, w = rng.random(6), rng.random(3)
    hd.check_grad(P.overwrite, x, w, modes=("rev",))
    gx = hd.vjp(P.overwrite, x, w)[1](np.ones(6))[0]
    # y[1..3] = sin(w) * 3x: those x still count, through the value; the others get 3
    np.testing.assert_allclose(gx, [3, *(3 * np.sin(w)), 3, 3])


def test_inplace_max_routes_ties_to_the_old_value(rng):
    x = np.array([1.0, 2.0, 3.0, 4.0])
    z = np.array([0.5, 2.0, 5.0, 4.0])  # ties at 1 and 3
    gx, gz = hd.vjp(P.inplace_max, x, z)[1](np.ones(4))
    np.testing.assert_array_equal(gx, [1, 1, 0, 1])
    np.testing.assert_array_equal(gz, [0, 0, 1, 0])


def test_accumulation_gradients_vs_finite_differences(rng):
    x = rng.random(10)
    hd.check_grad(P.two_updates, x, modes=("rev",))
    hd.check_grad(P.strided_scatter, x[:5], modes=("rev",))


def _iir_loop(a, b):
    y = [b[:, 0]]
    for n in range(1, b.shape[1]):
        y.append(a[:, n] * y[-1] + b[:, n])
    return y


def test_iir_gradient_vs_finite_differences(rng):
    a, b, ct = rng.random((2, 5)), rng.random((2, 5)), rng.standard_normal((2, 5))
    ga, gb = hd.vjp(P.iir, a, b)[1](ct)
    loss = lambda a, b: np.sum(np.stack(_iir_loop(a, b), axis=1) * ct)  # noqa: E731
    np.testing.assert_allclose(ga, _finite_difference(lambda v: loss(v, b), a), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gb, _finite_difference(lambda v: loss(a, v), b), rtol=1e-6, atol=1e-8)
    assert "reverse-scan" in hd.explain(P.iir, a, b).forms()


def test_iir_gradient_matches_a_torch_loop(rng):
    torch = pytest.importorskip("torch")
    a, b = rng.random((3, 6)).astype(np.float32), rng.random((3, 6)).astype(np.float32)
    ct = rng.standard_normal((3, 6)).astype(np.float32)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    torch.stack(_iir_loop(ta, tb), dim=1).backward(torch.tensor(ct))
    ga, gb = hd.vjp(P.iir, a, b)[1](ct)
    np.testing.assert_allclose(ga, ta.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gb, tb.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_cumsum_and_rnn_gradients_match_torch(rng):
    torch = pytest.importorskip("torch")
    x, ct = rng.random(7), rng.standard_normal(7)
    tx = torch.tensor(x, requires_grad=True)
    torch.cumsum(tx, 0).backward(torch.tensor(ct))
    np.testing.assert_allclose(hd.vjp(P.cumsum, x)[1](ct)[0], tx.grad.numpy(), rtol=1e-12)

    w, u = rng.standard_normal(1), rng.standard_normal(6)
    tw, tu = torch.tensor(w, requires_grad=True), torch.tensor(u, requires_grad=True)
    h = [torch.tanh(tu[0])]
    for n in range(1, 6):
        h.append(torch.tanh(tw[0] * h[-1] + tu[n]))
    torch.stack(h).backward(torch.tensor(ct[:6]))
    gw, gu = hd.vjp(P.rnn, w, u)[1](ct[:6])
    np.testing.assert_allclose(gw, tw.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(gu, tu.grad.numpy(), rtol=1e-10)
    hd.check_grad(P.rnn, w, u, modes=("rev",))


def test_ring_scan_rolls_back_through_its_tape(rng):
    x, ct = rng.random(3), rng.standard_normal(3)

    def ring(x):
        c = x.copy()
        for r in range(6):
            c[r % 3] += c[(r + 1) % 3]
        return c

    np.testing.assert_allclose(P.ring(x), ring(x))
    g = hd.vjp(P.ring, x)[1](ct)[0]
    np.testing.assert_allclose(g, _finite_difference(lambda v: np.sum(ring(v) * ct), x), rtol=1e-6)


def test_horner_matches_polyval_and_torch(rng):
    c, x, ct = rng.standard_normal(5), rng.standard_normal(4), rng.standard_normal(4)
    np.testing.assert_allclose(P.horner(c, x), np.polyval(c, x), rtol=1e-12)
    gc, gx = hd.vjp(P.horner, c, x)[1](ct)
    np.testing.assert_allclose(gc, _finite_difference(lambda v: np.sum(np.polyval(v, x) * ct), c), rtol=1e-6)
    np.testing.assert_allclose(gx, _finite_difference(lambda v: np.sum(np.polyval(c, v) * ct), x), rtol=1e-6)
    torch = pytest.importorskip("torch")
    tc, tx = torch.tensor(c, requires_grad=True), torch.tensor(x, requires_grad=True)
    p = torch.zeros(4, dtype=torch.float64)
    for k in range(5):
        p = p * tx + tc[k]
    p.backward(torch.tensor(ct))
    np.testing.assert_allclose(gc, tc.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-12)


def test_inplace_max_over_a_reduction_routes_to_the_first_extremum():
    x = np.array([[1.0, 3.0, 3.0, 2.0], [5.0, 0.0, 5.0, 1.0], [-2.0, -3.0, -4.0, -5.0]])
    np.testing.assert_array_equal(P.row_max(x), [3, 5, -1])  # the start value -1 wins row 2
    g = hd.vjp(P.row_max, x)[1](np.array([1.0, 2.0, 3.0]))[0]
    expected = np.zeros_like(x)
    expected[0, 1], expected[1, 0] = 1, 2
    np.testing.assert_array_equal(g, expected)


def test_colliding_assignment_gives_the_last_write_the_gradient(rng):
    idx, w = np.array([0, 2, 2, 1, 0]), rng.random(5)
    np.testing.assert_allclose(P.assign(idx, w), [w[4], w[3], w[2]] * np.array([1.0, 1.0, 1.0]) * 2)
    g = hd.vjp(P.assign, idx, w)[1](np.array([1.0, 10.0, 100.0]))[1]
    np.testing.assert_allclose(g, [0, 0, 200, 20, 2])


def test_index_reading_the_tensor_is_refused(rng):
    @hd.func
    def f(x):
        t = hd.compute(x.shape, lambda i: x[i])
        r = hd.rdom(3)
        first = t[r * 0]  # t[0], read as the update runs
        t[hd.clamp(hd.cast(hd.floor(first * 3), "int64"), 0, 2)] = first + x[r]
        return t

    with pytest.raises(hd.NotDifferentiableError, match="its index or predicate reads"):
        hd.vjp(f, rng.random(3))[1](np.ones(3))


def test_explain_names_the_rungs(rng):
    idx, w = rng.integers(0, 5, 64), rng.random(64)
    text = str(hd.explain(P.histogram, idx, w, 5))
    assert "runs at rung 3" in text and "16 fixed partitions" in text
    text = str(hd.explain(P.iir, rng.random((2, 5)), rng.random((2, 5))))
    assert "runs at rung 4: serial over the rdom" in text and "run backwards (r from 4 down to 1)" in text
    assert "runs at rung 1" in str(hd.explain(P.strided_scatter, rng.random(4)))


def test_reference_interpreter_agrees_with_the_kernels(rng):
    from halide_ad.ad import reverse_mode
    from halide_ad.runtime.reference import evaluate, scatter_adjoints
    a, b, ct = rng.random((2, 5)), rng.random((2, 5)), rng.standard_normal((2, 5))
    traced, arrays = P.iir.trace((a, b), {})
    program = traced.program
    wrt = tuple(traced.arg_names)  # the buffers of a and b
    expected = scatter_adjoints(program, reverse_mode(program, wrt), wrt, arrays | evaluate(program, arrays),
                                {program.outputs[0]: ct})
    ga, gb = hd.vjp(P.iir, a, b)[1](ct)
    np.testing.assert_allclose(expected[wrt[0]], ga, rtol=1e-12)
    np.testing.assert_allclose(expected[wrt[1]], gb, rtol=1e-12)


def test_gradients_of_bins_constant_indices_and_predicates(rng):
    i, j, w = rng.integers(0, 4, 30), rng.integers(0, 5, 30), rng.random(30)
    ct = rng.standard_normal((4, 5))
    np.testing.assert_allclose(hd.vjp(P.hist2d, i, j, w)[1](ct)[2], ct[i, j])
    x = rng.random(12)
    np.testing.assert_allclose(hd.grad(P.sum_of_squares)(x), 2 * x)
    hd.check_grad(P.ends, x, modes=("rev",))
    hd.check_grad(P.masked, x, modes=("rev",))


def test_rung_two_gradient_and_explain(rng):
    x = rng.random(9)
    hd.check_grad(P.pairs, x, modes=("rev",))
    assert "runs at rung 2: an affine accumulation that z3 inverts" in str(hd.explain(P.pairs, x))


def test_reverse_scan_matches_torch(rng):
    torch = pytest.importorskip("torch")
    x, ct = rng.standard_normal(8), rng.standard_normal(8)
    np.testing.assert_allclose(P.suffix_sum(x), np.cumsum(x[::-1])[::-1], rtol=1e-12)
    tx = torch.tensor(x, requires_grad=True)
    torch.flip(torch.cumsum(torch.flip(tx, (0,)), 0), (0,)).backward(torch.tensor(ct))
    np.testing.assert_allclose(hd.vjp(P.suffix_sum, x)[1](ct)[0], tx.grad.numpy(), rtol=1e-12)
    assert "reverse-scan" in hd.explain(P.suffix_sum, x).forms()
