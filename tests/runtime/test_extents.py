"""A program called with another batch size runs the kernels of the sizes before it, reading the
extent at run time (runtime/extents.py), with the same results as kernels compiled for the size;
a dimension whose extent the kernels use otherwise (a stencil's edges) still gets kernels of its own."""
import numpy as np
import pytest

import halide_ad as hd
from halide_ad import ops
from halide_ad.api import CALL, forget_shared_traces
from halide_ad.runtime import extents
from halide_ad.runtime.execute import NumbaStep

torch = pytest.importorskip("torch")


def layer(x, w, b):
    return ops.max_pool2d(ops.relu(ops.conv2d(x, w, b, padding=1)), 2)


def dense(x, w, b):
    return ops.relu(ops.dense(x, w, b))


def torch_layer(x, w, b):
    return torch.nn.functional.max_pool2d(torch.relu(torch.nn.functional.conv2d(x, w, b, padding=1)), 2)


def torch_dense(x, w, b):
    return torch.relu(x @ w.T + b)


def blur(img):
    c = hd.repeat_edge(img)
    return hd.compute(img.shape, lambda y, x: (c[y, x - 1] + c[y, x] + c[y, x + 1]) / 3, name="blur")


CASES = {  # name: (function, its torch twin, dtype, the arguments' shapes but the batch's, batch axis first)
    "conv-relu-pool float32": (layer, torch_layer, np.float32, ((3, 6, 6), (4, 3, 3, 3), (4,))),
    "dense float64": (dense, torch_dense, np.float64, ((7,), (5, 7), (5,))),
}
FUNCTIONS = {name: hd.func(case[0]) for name, case in CASES.items()}


def _arguments(case, batch, rng):
    _, _, dtype, (x, *params) = case
    return [rng.standard_normal((batch, *x)).astype(dtype)] + [rng.standard_normal(p).astype(dtype) for p in params]


def _kernels(f, args) -> list:
    """The numba functions of the plain call's forward and of the gradient by every argument (a
    shared kernel's, inside its fallback to the size's own source)."""
    traced, _ = f.trace(tuple(args), {})
    steps = traced.forward_run(CALL).kernel.steps + traced.backward(traced.float_args).kernel.steps
    return [getattr(s.fn, "kernel", s.fn) for s in steps if isinstance(s, NumbaStep)]


def _run(f, args):
    out, vjp = hd.vjp(f, *args)
    ct = np.cos(np.arange(out.size)).reshape(out.shape).astype(out.dtype)
    return out, ct, vjp(ct)


@pytest.fixture(autouse=True)
def fresh_sources(monkeypatch):
    """Each test starts from an empty memory of generated sources: which sizes share depends on
    what came before, and another test's program of the same text (test_tiers' layer at other
    sizes) may have come first in this process."""
    monkeypatch.setattr(extents, "_seen", {})


@pytest.mark.parametrize("name", list(CASES))
def test_batch_sizes_share_kernels(name, rng):
    case, f = CASES[name], FUNCTIONS[name]
    kernels, results = {}, {}
    for batch in (4, 3, 1, 5):
        args = _arguments(case, batch, rng)
        if batch == 5:  # a strided view: the kernels read a C-contiguous copy
            args[0] = np.concatenate([args[0], args[0]], axis=-1)[..., ::2]
            assert not args[0].flags.c_contiguous
        out, ct, grads = _run(f, args)
        results[batch] = (out, *grads)
        targs = [torch.tensor(np.ascontiguousarray(a), requires_grad=True) for a in args]
        expected = case[1](*targs)
        expected.backward(torch.tensor(ct))
        tol = 1e-4 if case[2] == np.float32 else 1e-10
        np.testing.assert_allclose(out, expected.detach().numpy(), rtol=tol, atol=tol)
        for g, t in zip(grads, targs, strict=True):
            np.testing.assert_allclose(g, t.grad.numpy(), rtol=tol, atol=tol)
        kernels[batch] = _kernels(f, args)
    # the first size keeps its own kernels; the second's read the batch at run time, and serve the fifth
    assert all(getattr(k, "extents", None) is None for k in kernels[4])
    assert kernels[5] == kernels[3]
    assert any(k.extents for k in kernels[3])
    assert "shared with other sizes of this program: reads" in str(hd.explain(f, *args))
    # kernels compiled for batch 5 alone give the same bits
    fresh = hd.func(case[0])
    forget_shared_traces()
    extents._seen.clear()
    alone = _run(fresh, args)
    assert all(getattr(k, "extents", None) is None for k in _kernels(fresh, args))
    for a, b in zip(results[5], [alone[0], *alone[2]], strict=True):
        np.testing.assert_array_equal(a, b)


def test_gradient_at_a_shared_size():
    f = FUNCTIONS["dense float64"]
    rng = np.random.default_rng(1)
    for batch in (2, 6):
        args = _arguments(CASES["dense float64"], batch, rng)
        _run(f, args)
    assert any(k.extents for k in _kernels(f, args))
    hd.check_grad(f, *args, modes="rev")


def test_a_stencil_axis_is_no_batch(rng):
    """The blur's rows are indexed by their bare variable: one kernel serves every height. Its
    columns are split at the edges (range(1, width - 1)): each width compiles its own."""
    f = hd.func(blur)

    def expected(img):
        padded = np.pad(img, ((0, 0), (1, 1)), mode="edge")
        return (padded[:, :-2] + padded[:, 1:-1] + padded[:, 2:]) / np.float32(3)

    kernels = {}
    for shape in ((6, 8), (5, 8), (7, 8), (7, 10), (7, 12)):
        img = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(f(img), expected(img), rtol=1e-6, atol=1e-6)
        kernels[shape] = _kernels(f, [img])
    assert kernels[(7, 8)] == kernels[(5, 8)] != kernels[(6, 8)]
    for shape in ((7, 10), (7, 12)):
        assert all(k.extents is None for k in kernels[shape])
        assert not set(kernels[shape]) & {k for ks in kernels.values() if ks is not kernels[shape] for k in ks}


def test_a_shared_kernel_numba_cannot_type_runs_the_sizes_own_source():
    """An extent read where numba needs a constant (here a heterogeneous tuple's index) fails to
    type; the call then compiles and runs the size's own source instead of raising."""
    from halide_ad.runtime.compile import compile_kernel
    source = "@kernel\ndef pick_extent(x, out):\n    t = (1j, 1j, 4.5, 5.5)\n    out[0] = t[{}] + x[0]\n"
    first = compile_kernel(source.format(2), "pick_extent", "test", {"x": (2,), "out": (1,)})
    second = compile_kernel(source.format(3), "pick_extent", "test", {"x": (3,), "out": (1,)})
    assert second.extents == ("x.shape[0]",)  # shared: it reads x's extent where the literal was
    out = np.zeros(1)
    first(np.ones(2), out)
    assert out[0] == 5.5
    second(np.ones(3), out)
    assert out[0] == 6.5 and second.extents is None  # t[3], from its own source


def test_sizes_share_after_a_program_of_the_same_text_that_shares_nothing():
    """A program of the same text but for its literals came first, with a literal no extent
    explains (5 against 3: a pooled width). The sizes after it still share among themselves:
    each is compared with the latest source that no shared kernel serves."""
    source = ("def k(x, out):\n    for i in range(0, {}):\n        for j in range(0, {}):\n"
              "            out[i] = x[i, j] * {}\n")
    other = source.format(2, 10, 5)
    assert extents.shared(other, {"x": (2, 10), "out": (2,)}) is None
    assert extents.shared(source.format(4, 6, 3), {"x": (4, 6), "out": (4,)}) is None  # 5 -> 3: no extent
    made = extents.shared(source.format(3, 6, 3), {"x": (3, 6), "out": (3,)})
    assert made is not None and made.reads == ("x.shape[0]",)
    assert "range(0, x.shape[0])" in made.source and "* 3" in made.source
    assert extents.shared(source.format(5, 6, 3), {"x": (5, 6), "out": (5,)}) is made
    assert extents.shared(source.format(5, 6, 4), {"x": (5, 6), "out": (5,)}) is None  # a constant changed
    # the other program's next size shares with it, and this one's kernel still serves its sizes
    assert extents.shared(source.format(3, 10, 5), {"x": (3, 10), "out": (3,)}) is not None
    assert extents.shared(source.format(7, 6, 3), {"x": (7, 6), "out": (7,)}) is made
