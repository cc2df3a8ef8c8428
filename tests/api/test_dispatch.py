"""A cached call goes from arguments to kernels without tracing, classifying or planning again:
the same results as the first call, a new trace for a new shape, dtype or option, the same
errors for bad arguments, and threads that never wait for another signature's compile."""
import threading

import numpy as np
import pytest

import halide_ad as hd
from halide_ad import api, ops, tiered
from halide_ad.runtime import parallel

TRACES: list = []  # one entry per trace of `axpy`: its body runs only while tracing


@hd.func
def axpy(x, w, scale=1.0, *, view="repeat_edge"):
    TRACES.append((x.shape, x.dtype, scale, view))
    v = hd.repeat_edge(x) if view == "repeat_edge" else hd.constant_exterior(x)
    return hd.compute(x.shape, lambda i: v[i - 1] * w[i] * scale + x[i])


def numpy_axpy(x, w, scale=1.0, view="repeat_edge"):
    left = np.concatenate([[x[0] if view == "repeat_edge" else 0.0], x[:-1]])
    return left * w * scale + x


def traces_of(fn) -> int:
    return len(api.as_function(fn)._traces)


def test_a_second_call_reuses_the_trace_and_gives_the_same_result(rng, monkeypatch):
    f = hd.func(axpy.fn)  # a Function of its own: no other test's calls in its caches
    x, w = rng.standard_normal(16), rng.standard_normal(16)
    TRACES.clear()
    first = f(x, w, 0.5, view="constant_exterior")
    np.testing.assert_allclose(first, numpy_axpy(x, w, 0.5, "constant_exterior"), rtol=1e-12)
    classified = []
    real = api.classify
    monkeypatch.setattr(api, "classify", lambda name, value: classified.append(name) or real(name, value))
    for _ in range(3):
        np.testing.assert_array_equal(f(x, w, 0.5, view="constant_exterior"), first)
    x2 = rng.standard_normal(16)  # new data, the same signature
    np.testing.assert_allclose(f(x2, w, 0.5, view="constant_exterior"),
                               numpy_axpy(x2, w, 0.5, "constant_exterior"), rtol=1e-12)
    assert len(TRACES) == 1 and classified == []


def test_new_shapes_dtypes_and_options_trace_again_and_old_ones_do_not(rng):
    TRACES.clear()
    calls = [((16,), np.float64, (), {}), ((16,), np.float32, (), {}), ((9,), np.float64, (), {}),
             ((16,), np.float64, (2.0,), {}), ((16,), np.float64, (2,), {}),  # int 2 is not float 2.0
             ((16,), np.float64, (), {"view": "constant_exterior"})]
    for _ in range(2):
        for shape, dtype, args, kwargs in calls:
            x, w = rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)
            out = axpy(x, w, *args, **kwargs)
            assert out.dtype == dtype and out.shape == shape
            np.testing.assert_allclose(out, numpy_axpy(x, w, *args, **kwargs), rtol=1e-5)
    assert len(TRACES) <= len(calls)  # each signature traced at most once, not once per call
    assert {(t[2], type(t[2])) for t in TRACES} <= {(1.0, float), (2.0, float), (2, int)}


def test_arrays_of_any_layout_and_byte_order_after_a_cached_call(rng):
    x, w = rng.standard_normal(16), rng.standard_normal(16)
    axpy(x, w)
    strided = rng.standard_normal(32)[::2]  # the cached signature's shape and dtype, not contiguous
    np.testing.assert_allclose(axpy(strided, w), numpy_axpy(strided, w), rtol=1e-12)
    swapped = x.astype(">f8")  # another byte order: swapped to native, every call
    for _ in range(2):
        np.testing.assert_allclose(axpy(swapped, w), numpy_axpy(x, w), rtol=1e-12)
    for _ in range(2):  # a numpy scalar and an array subclass are classified on every call
        np.testing.assert_allclose(axpy(x, w, np.float64(2.0)), numpy_axpy(x, w, 2.0), rtol=1e-12)
        np.testing.assert_allclose(axpy(x.view(Subclass), w), numpy_axpy(x, w), rtol=1e-12)


class Subclass(np.ndarray):
    pass


@hd.func
def parts(x, s, *, w):
    """A dict with a 0-d entry, an array keyword and a 0-d input: what a direct call rebuilds."""
    return {"scaled": x * s + w, "total": hd.sum(x) * s}


@hd.func
def product(a, b):
    """A BLAS contraction (from 16 x 16 up): a step that a direct call hands its buffers by name."""
    return ops.matmul(a, b)


def _direct(fn, *args, **kwargs):
    """The call's direct function, after enough calls to have made it (the first may run on the
    interpreter tier, whose kernels then settle)."""
    for _ in range(3):
        fn(*args, **kwargs)
        tiered.settle()
    first = (args[0].shape, args[0].dtype.name)
    (call,) = [c for c in api.as_function(fn)._calls.values()
               if (c.traced.program.inputs[0].shape, c.traced.program.inputs[0].dtype) == first]
    assert call.direct is not None
    return call.direct


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_direct_call_gives_the_first_calls_results_for_every_layout(rng, dtype):
    x, w = rng.standard_normal(7).astype(dtype), rng.standard_normal(7).astype(dtype)
    s = np.array(3.0, dtype)
    _direct(parts, x, s, w=w)
    strided = rng.standard_normal(14).astype(dtype)[::2]
    readonly = x.copy()
    readonly.flags.writeable = False
    for a in (x, strided, readonly):
        out = parts(a, s, w=w)
        assert set(out) == {"scaled", "total"} and out["total"].shape == () and out["scaled"].dtype == dtype
        np.testing.assert_allclose(out["scaled"], a * 3 + w, rtol=1e-6)
        np.testing.assert_allclose(out["total"], a.sum() * 3, rtol=1e-6)
    first, second = parts(x, s, w=w), parts(x, s, w=w)
    assert first["scaled"] is not second["scaled"]  # each call's outputs are its own arrays
    a, b = rng.standard_normal((16, 12)).astype(dtype), rng.standard_normal((12, 16)).astype(dtype)
    _direct(product, a, b)
    np.testing.assert_allclose(product(a, np.asfortranarray(b)), a @ b, rtol=1e-5, atol=1e-5)


BAD_CALLS = [
    ((np.ones(16),), {}),                                  # too few
    ((np.ones(16), np.ones(16), 1.0, 2.0), {}),            # too many
    ((np.ones(16), np.ones(16)), {"colour": "red"}),       # an unknown keyword
    ((np.ones(16, np.float16), np.ones(16)), {}),          # a dtype halide_ad does not take
    ((np.ones(0), np.ones(0)), {}),                        # no elements
    ((np.ones(16), np.ones(16), [1.0, np.ones(2)]), {}),   # neither data nor a static option
    ((np.ones(16), np.ones(16), object()), {}),
]


def _error(fn, args, kwargs) -> tuple[type, str]:
    with pytest.raises(hd.HalideADError) as e:
        fn(*args, **kwargs)
    return type(e.value), str(e.value)


@pytest.mark.parametrize("k", range(len(BAD_CALLS)))
def test_bad_arguments_after_a_cached_call_raise_what_they_raise_on_a_first_call(k):
    args, kwargs = BAD_CALLS[k]
    fresh = hd.func(axpy.fn)  # a Function that has seen no call
    expected = _error(fresh, args, kwargs)
    warm = hd.func(axpy.fn)
    warm(np.ones(16), np.ones(16))
    warm(np.ones(16), np.ones(16), 1.0, view="repeat_edge")
    assert _error(warm, args, kwargs) == expected
    assert _error(warm, args, kwargs) == expected  # and again: an error is never cached


def test_value_and_grad_reuses_its_plan_and_checks_new_signatures(rng):
    def loss(x, w):
        return hd.sum(x * w * w)

    vg = hd.value_and_grad(loss, argnums=(0, 1))
    x, w = rng.standard_normal(16), rng.standard_normal(16)
    for _ in range(3):
        value, (gx, gw) = vg(x, w)
        np.testing.assert_allclose(value, np.sum(x * w * w), rtol=1e-12)
        np.testing.assert_allclose(gx, w * w, rtol=1e-12)
        np.testing.assert_allclose(gw, 2 * x * w, rtol=1e-12)
    (traced,) = api.as_function(loss)._traces.values()
    assert len(traced.scalar_gradients) == 1
    x32, w32 = x.astype(np.float32), w.astype(np.float32)
    value, (gx, gw) = vg(x32, w32)
    assert gx.dtype == np.float32 and traces_of(loss) == 2
    np.testing.assert_allclose(gx, w32 * w32, rtol=1e-5)
    with pytest.raises(hd.NotDifferentiableError, match=r"argument 0 \('x'\) of loss is a int64 array"):
        vg(np.arange(16), w)
    with pytest.raises(hd.ShapeError, match=r"loss\(x, w\) was called with 1 positional"):
        vg(x)
    with pytest.raises(hd.NotDifferentiableError, match="argnums=2 but loss was called with 2"):
        hd.grad(loss, argnums=2)(x, w)
    with pytest.raises(hd.NotDifferentiableError, match="argnums must be an int or a tuple of ints"):
        hd.grad(loss, argnums=([0],))(x, w)
    with pytest.raises(hd.NotDifferentiableError, match=r"needs <lambda> to return one scalar"):
        hd.grad(lambda x: x * 2.0)(x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_direct_value_and_grad_gives_the_first_calls_results(rng, dtype):
    def loss(x, s, w):
        return hd.sum(x * w * s) + s

    x, w = rng.standard_normal(9).astype(dtype), rng.standard_normal(9).astype(dtype)
    s = np.array(2.0, dtype)
    both, one = hd.value_and_grad(loss, argnums=(1, 0)), hd.value_and_grad(loss, argnums=0)
    expected = both(x, s, w)
    for _ in range(3):
        tiered.settle()
        value, (gs, gx) = both(x, s, w)
        assert type(value) is type(expected[0]) and value.dtype == dtype and gs.shape == () and gx.dtype == dtype
        np.testing.assert_allclose(value, np.sum(x * w * 2) + 2, rtol=1e-5)
        np.testing.assert_allclose(gs, np.sum(x * w) + 1, rtol=1e-5)
        np.testing.assert_allclose(gx, 2 * w, rtol=1e-5)
        value, gx = one(x[::-1], s, w)
        np.testing.assert_allclose(gx, 2 * w, rtol=1e-5)
    (call,) = [c for c in api.as_function(loss)._calls.values() if c.traced.program.inputs[0].dtype == dtype.__name__]
    assert call.gradients[(1, 0)] and call.gradients[(0,)]
    assert both(x, s, w)[1][1] is not both(x, s, w)[1][1]  # each call's gradients are its own arrays


@hd.func
def gathered(x, idx, s):
    """A float, an integer (data) and a 0-d argument: the gradients a direct vjp returns."""
    return hd.compute(idx.shape, lambda i: x[hd.clamp(idx[i], 0, x.shape[0] - 1)] * s)


def test_a_direct_vjp_gives_the_first_calls_gradients_and_checks_other_cotangents(rng):
    x, idx, s = rng.standard_normal(6).astype(np.float32), np.array([0, 5, 5, 2]), np.array(2.0, np.float32)
    ct = rng.standard_normal(4).astype(np.float32)
    expected_gx = np.zeros(6, np.float32)
    np.add.at(expected_gx, idx, 2 * ct)
    _, f_vjp = hd.vjp(gathered, x, idx, s)
    for _ in range(3):
        f_vjp(ct)
        tiered.settle()
        _, f_vjp = hd.vjp(gathered, x, idx, s)
    for cotangent in (ct, ct.astype(np.float64), list(ct), ct):  # the first and last run written out
        gx, gidx, gs = f_vjp(cotangent)
        np.testing.assert_allclose(gx, expected_gx, rtol=1e-6)
        assert gidx is None and gs.shape == () and gx.dtype == np.float32
        np.testing.assert_allclose(gs, np.dot(x[idx], ct), rtol=1e-5)
    (call,) = api.as_function(gathered)._calls.values()
    assert callable(call.traced._written_vjp)
    assert f_vjp(ct)[0] is not f_vjp(ct)[0]
    with pytest.raises(hd.ShapeError, match=r"has shape \(3,\); it must be \(4,\)"):
        f_vjp(ct[:3])


def test_value_and_grad_of_a_0d_input_and_vjp_of_a_structured_result(rng):
    @hd.func
    def parts(x, s):
        return {"scaled": x * s, "total": hd.sum(x) * s}

    x, s = rng.standard_normal(6), np.array(3.0)
    vg = hd.value_and_grad(lambda x, s: hd.sum(x * x) * s, argnums=1)
    for _ in range(2):
        value, gs = vg(x, s)
        assert gs.shape == () and np.isclose(gs, np.sum(x * x)) and np.isclose(value, 3 * np.sum(x * x))
        out, f_vjp = hd.vjp(parts, x, s)
        assert out["total"].shape == () and np.isclose(out["total"], 3 * x.sum())
        gx, gs = f_vjp({"scaled": np.ones(6), "total": np.array(2.0)})
        np.testing.assert_allclose(gx, np.full(6, 3.0 + 6.0), rtol=1e-12)
        assert gs.shape == () and np.isclose(gs, x.sum() + 2 * x.sum())
        with pytest.raises(hd.ShapeError, match="the cotangent must have the structure of parts's outputs"):
            f_vjp({"scaled": np.ones(6)})
        with pytest.raises(hd.ShapeError, match=r"has shape \(5,\); it must be \(6,\)"):
            f_vjp({"scaled": np.ones(5), "total": np.array(2.0)})


def test_calls_from_threads_never_wait_for_another_signatures_compile(rng, monkeypatch):
    """Thread A compiles a new signature and is held inside the compile; calls of the compiled
    one, from other threads, finish meanwhile with the right results."""
    x, w = rng.standard_normal(16), rng.standard_normal(16)
    expected = numpy_axpy(x, w)
    axpy(x, w)
    entered, release = threading.Event(), threading.Event()
    real = api.compile_forward

    def held(program, **options):
        entered.set()
        release.wait(timeout=120)
        return real(program, **options)
    monkeypatch.setattr(api, "compile_forward", held)

    fresh = rng.standard_normal(11)  # a shape no test calls: compiled under `held`
    compiling = threading.Thread(target=lambda: axpy(fresh, fresh, 3.0))
    compiling.start()
    assert entered.wait(timeout=120)
    results, errors = [None] * 4, []

    def call(k):
        try:
            results[k] = [axpy(x, w) for _ in range(50)]
        except Exception as e:  # reported below
            errors.append(e)

    callers = [threading.Thread(target=call, args=(k,)) for k in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=120)
    finished = not any(t.is_alive() for t in callers)
    release.set()
    compiling.join(timeout=600)
    assert finished, "a call of a compiled signature waited for another signature's compile"
    assert not errors, errors
    for outs in results:
        for out in outs:
            np.testing.assert_allclose(out, expected, rtol=1e-12)


def test_a_16_element_program_never_wakes_the_thread_pool(rng, monkeypatch):
    def no_pool():
        raise AssertionError("a 16-element program handed work to the thread pool")
    monkeypatch.setattr(parallel, "_workers", no_pool)
    x, w = rng.standard_normal(16), rng.standard_normal(16)
    np.testing.assert_allclose(axpy(x, w), numpy_axpy(x, w), rtol=1e-12)
    value, (gx, gw) = hd.value_and_grad(lambda x, w: hd.sum(x * w), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(gx, w, rtol=1e-12)
