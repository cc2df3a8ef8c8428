"""Dense Jacobians and Hessians against JAX, and every adjoint of a program against PyTorch."""
import numpy as np
import pytest

import halide_ad as hd

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
jax.config.update("jax_enable_x64", True)


def smooth(x, w):
    c = hd.repeat_edge(x)
    y = hd.compute(x.shape, lambda i: hd.tanh(c[i - 1] * w[0] + c[i] * w[1] + c[i + 1] * w[2]))
    return hd.sum(y * y) + hd.sum(hd.exp(w) * x[0])


def smooth_jax(x, w):
    c = jnp.pad(x, 1, mode="edge")
    y = jnp.tanh(c[:-2] * w[0] + c[1:-1] * w[1] + c[2:] * w[2])
    return jnp.sum(y * y) + jnp.sum(jnp.exp(w) * x[0])


@pytest.fixture(scope="module")
def xw():
    rng = np.random.default_rng(3)
    return rng.standard_normal(5), rng.standard_normal(3)


def test_hessian_matches_jax(xw):
    x, w = xw
    expected = jax.hessian(smooth_jax)(x, w)
    np.testing.assert_allclose(hd.hessian(smooth)(x, w), expected, rtol=1e-10, atol=1e-12)
    H = hd.hessian(smooth, argnums=(0, 1))(x, w)
    expected = jax.hessian(smooth_jax, argnums=(0, 1))(x, w)
    for row, expected_row in zip(H, expected, strict=True):
        for block, e in zip(row, expected_row, strict=True):
            assert block.shape == e.shape
            np.testing.assert_allclose(block, e, rtol=1e-10, atol=1e-12)


def elementwise(x, w):
    c = hd.repeat_edge(x)
    return hd.compute((4,), lambda i: hd.sin(c[i + 1]) * w[i % 3] + c[i - 1] * c[i - 1])


def elementwise_jax(x, w):
    c = jnp.pad(x, 1, mode="edge")
    return jnp.sin(c[2:6]) * w[jnp.arange(4) % 3] + c[0:4] ** 2


def test_jacrev_and_jacobian_match_jax(xw):
    x, w = xw
    J = hd.jacrev(elementwise, argnums=(0, 1))(x, w)
    expected = jax.jacrev(elementwise_jax, argnums=(0, 1))(x, w)
    for a, b in zip(J, expected, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(hd.jacobian(elementwise)(x, w), expected[0], rtol=1e-12)
    assert hd.jacobian is hd.jacrev


def test_jacrev_of_several_outputs_and_float32(xw):
    x = xw[0].astype(np.float32)

    def two(x):
        return {"sq": x * x, "total": hd.sum(x)}

    J = hd.jacrev(two)(x)
    assert J["sq"].shape == (5, 5) and J["total"].shape == (5,) and J["sq"].dtype == np.float32
    np.testing.assert_allclose(J["sq"], np.diag(2 * x), rtol=1e-6)
    np.testing.assert_allclose(J["total"], np.ones(5))


def test_jacrev_refuses_tracing_and_integer_arguments(xw):
    x, _ = xw
    with pytest.raises(hd.TraceError, match="while tracing"):
        hd.func(lambda x: hd.jacrev(lambda x: x * 2)(x))(x)
    with pytest.raises(hd.NotDifferentiableError, match="int64"):
        hd.jacrev(lambda x, i: x * 2.0, argnums=1)(x, np.arange(5))


# ---- hd.adjoints --------------------------------------------------------------------------------

def layers(u, w):
    c = hd.repeat_edge(u)
    a = hd.compute(u.shape, lambda i: c[i - 1] * w[0] + c[i + 1] * w[1], name="a")
    b = hd.compute(u.shape, lambda i: hd.tanh(a[i]), name="b")
    return hd.sum(b * b * u)


def test_adjoints_of_named_intermediates_match_torch_retain_grad():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    u, w = rng.standard_normal(6), rng.standard_normal(2)
    adj = hd.adjoints(layers, u, w)
    assert set(adj) == {"u", "w", "a", "b"}

    tu, tw = torch.tensor(u, requires_grad=True), torch.tensor(w, requires_grad=True)
    c = torch.cat([tu[:1], tu, tu[-1:]])
    a = c[:-2] * tw[0] + c[2:] * tw[1]
    b = torch.tanh(a)
    a.retain_grad()
    b.retain_grad()
    (b * b * tu).sum().backward()
    for name, t in (("u", tu), ("w", tw), ("a", a), ("b", b)):
        np.testing.assert_allclose(adj[name], t.grad.numpy(), rtol=1e-12, atol=1e-14, err_msg=name)


def test_adjoints_with_a_cotangent_and_errors():
    rng = np.random.default_rng(6)
    u, w = rng.standard_normal(6), rng.standard_normal(2)

    def vector(u, w):
        a = hd.compute(u.shape, lambda i: u[i] * w[0], name="a")
        return hd.compute(u.shape, lambda i: a[i] * a[i], name="out")

    ct = rng.standard_normal(6)
    adj = hd.adjoints(vector, u, w, cotangent=ct)
    np.testing.assert_allclose(adj["a"], 2 * u * w[0] * ct, rtol=1e-12)
    np.testing.assert_allclose(adj["u"], 2 * u * w[0] ** 2 * ct, rtol=1e-12)
    np.testing.assert_allclose(adj["out"], ct)  # a named output: its adjoint is its cotangent
    with pytest.raises(hd.ShapeError, match="cotangent="):
        hd.adjoints(vector, u, w)
    with pytest.raises(hd.ShapeError, match="shape"):
        hd.adjoints(vector, u, w, cotangent=np.ones(3))
