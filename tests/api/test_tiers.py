"""Tiered execution (halide_ad/tiered.py): first calls on the numpy interpreter while the
kernels compile in the background, then the kernels; both tiers agree to rounding."""
import json
import sys
import threading

import numpy as np
import pytest

import halide_ad as hd
from halide_ad import ops, tiered
from halide_ad.api import CALL
from tests.runtime.test_concurrency import _python


@pytest.fixture(autouse=True)
def tiers_on(monkeypatch):
    """The interpreter tier on, and no pass marked built by an earlier run on this machine (the
    kernel cache outlives the run): a new Function's first call here interprets. A second
    process that finds them marked is test_a_second_process_runs_the_kernels_from_its_first_call."""
    monkeypatch.setenv("HALIDE_AD_TIERED", "1")
    monkeypatch.setattr(tiered, "built_before", lambda program, key: False)


def _layer(x, w, b):
    return ops.max_pool2d(ops.relu(ops.conv2d(x, w, b, stride=1, padding=1)), 2)


def _blur(img):
    c = hd.repeat_edge(img)
    return hd.compute(img.shape, lambda y, x: (c[y - 1, x] + c[y, x - 1] + c[y, x] + c[y, x + 1]) / 4)


def _bilinear(x):
    from benchmarks.cases import resize_bilinear2x
    return resize_bilinear2x.fn(x)


def _softmax_loss(x, w):
    return hd.sum(ops.softmax(x * w) * x)


def _wait(traced):
    for job in list(traced._jobs.values()):
        job.result(timeout=600)


TOLERANCE = {np.float32: 1e-5, np.float64: 1e-12}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fn, shapes", [(_layer, [(2, 3, 8, 8), (4, 3, 3, 3), (4,)]),
                                        (_blur, [(9, 7)]),
                                        (_softmax_loss, [(5, 16), (5, 16)])])
def test_the_interpreter_then_the_kernels_agree(fn, shapes, dtype, layout=None):
    f = hd.func(fn)  # a new Function: nothing compiled in this process for it yet
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(s).astype(dtype) for s in shapes]
    if layout is not None:
        args = [layout(a) for a in args]
    traced, _ = f.trace(tuple(args), {})
    first, vjp_first = hd.vjp(f, *args)
    ct = rng.standard_normal(np.shape(first)).astype(dtype)
    grads_first = vjp_first(ct)
    assert traced.interpreted[traced.float_args] >= 1
    _wait(traced)
    second, vjp_second = hd.vjp(f, *args)
    grads_second = vjp_second(ct)
    assert traced.interpreted["forward"] == 1 and traced.interpreted[traced.float_args] == 1
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(first, second, rtol=tol, atol=tol)
    for a, b in zip(grads_first, grads_second, strict=True):
        assert a.dtype == b.dtype == dtype
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fn, shapes, layout", [
    (_blur, [(1, 1)], None),                                    # one pixel: every tap clamps to it
    (_layer, [(1, 3, 2, 2), (1, 3, 3, 3), (1,)], None),         # a 1x1 pooled output
    (_blur, [(7, 9)], lambda a: a.T),                           # a transposed view
    (_layer, [(2, 3, 8, 16), (4, 3, 3, 3), (4,)], lambda a: a[..., ::2] if a.ndim == 4 else a),
    (_bilinear, [(1, 1, 1, 1)], None),                          # both taps of every row clamp to the pixel
    (_bilinear, [(1, 2, 3, 10)], lambda a: a[..., 1::2]),       # clamped at both ends, a strided view
])
def test_the_tiers_agree_at_the_edges(fn, shapes, layout, dtype):
    """Size 1 and arguments that are views, not C-contiguous arrays; the bilinear resize's
    gradient scatters through indices clamped at both ends."""
    test_the_interpreter_then_the_kernels_agree(fn, shapes, dtype, layout)


def test_value_and_grad_runs_both_passes_on_one_tier():
    f = hd.func(_softmax_loss)
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((3, 8)), rng.standard_normal((3, 8))
    vg = hd.value_and_grad(f, argnums=(0, 1))
    value, (gx, gw) = vg(x, w)
    traced, _ = f.trace((x, w), {})
    _wait(traced)
    value2, (gx2, gw2) = vg(x, w)
    np.testing.assert_allclose(value, value2, rtol=1e-12)
    np.testing.assert_allclose(gx, gx2, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gw, gw2, rtol=1e-12, atol=1e-12)
    hd.check_grad(f, x, w)


def test_data_dependent_reads_never_run_on_the_interpreter():
    @hd.func
    def take(x, idx):
        return hd.compute(idx.shape, lambda i: x[idx[i]])

    x = np.arange(5.0)
    assert not tiered.interpretable(take.trace((x, np.array([0, 1])), {})[0].program)
    with pytest.raises(hd.BoundsError):
        take(x, np.array([0, 7]))


def test_big_programs_compile_first(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_INTERPRET_MAX", "100")
    f = hd.func(_blur)
    x = np.ones((16, 16))
    f(x)
    traced, _ = f.trace((x,), {})
    assert traced.interpreted == {} and CALL in traced._compiled


def test_tiers_off_waits_for_the_kernels(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_TIERED", "0")
    f = hd.func(_blur)
    x = np.ones((6, 6))
    hd.grad(lambda v: hd.sum(f(v)))(x)
    traced, _ = f.trace((x,), {})
    assert traced.interpreted == {}


def test_explain_says_which_tier_ran():
    f = hd.func(_blur)
    x = np.arange(12.0).reshape(3, 4)
    f(x)
    traced, _ = f.trace((x,), {})
    report = str(hd.explain(f, x))
    assert "-- tiers" in report
    if traced.interpreted:
        assert "interpreter" in report


def test_threads_share_the_tiers():
    f = hd.func(_blur)
    x = np.random.default_rng(3).standard_normal((10, 10))
    want = np.asarray(f(x))
    results, errors = [], []

    def call():
        try:
            for _ in range(20):
                results.append(np.asarray(f(x)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for r in results:
        np.testing.assert_allclose(r, want, rtol=1e-12)


def test_a_vjp_made_on_the_interpreter_runs_kernels_once_they_are_ready(monkeypatch):
    # a benchmark or a training loop may keep calling the vjp closure of its first call
    f = hd.func(_blur)
    img = np.random.default_rng(3).standard_normal((9, 7))
    traced, _ = f.trace((img,), {})
    out, vjp = hd.vjp(f, img)
    ct = np.ones_like(out)
    first = vjp(ct)[0]
    assert traced.interpreted.get("forward", 0) >= 1
    _wait(traced)
    hd.vjp(f, img)[1](ct)  # (compiles the gradient's kernels)
    _wait(traced)

    def interpreter_called(*args):
        raise AssertionError("the interpreter ran after the kernels were ready")

    monkeypatch.setattr(tiered, "backward", interpreter_called)
    monkeypatch.setattr(tiered, "forward", interpreter_called)
    for _ in range(2):
        np.testing.assert_allclose(vjp(ct)[0], first, rtol=1e-12, atol=1e-12)


def test_compiles_wait_while_the_interpreter_runs(monkeypatch):
    """A compile asked for by an interpreter call starts once no interpreter call has run for
    QUIET_S: a user's first calls, one after another, run without it. The GIL's switch interval
    is short while they run, and restored after."""
    monkeypatch.setattr(tiered, "QUIET_S", 0.05)
    before = sys.getswitchinterval()
    started = threading.Event()
    with tiered.interpreting():
        assert sys.getswitchinterval() <= tiered.SWITCH_S
        job = tiered.in_background(started.set)
        assert not started.wait(0.3)  # held back while the interpreter runs
    job.result(timeout=600)
    assert started.is_set() and sys.getswitchinterval() == before


def test_the_interpreter_leaves_the_arguments_and_cotangents_alone():
    # its seeds are the cotangents themselves (a copy of a big one cost a first call ~0.1 s)
    # where nothing scatters into them: here `y` is an output that `z` reads as well
    @hd.func
    def two(x):
        y = hd.compute(x.shape, lambda i: x[i] * 2)
        return y, hd.compute(x.shape, lambda i: y[i] * y[i])

    x = np.arange(1.0, 6.0)
    cts = (np.ones(5), np.full(5, 3.0))
    kept = [a.copy() for a in (x, *cts)]
    (y, z), vjp = hd.vjp(two, x)
    (gx,) = vjp(cts)
    for a, b in zip((x, *cts), kept, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(gx, 2 * cts[0] + 8 * x * cts[1], rtol=1e-12)


def test_a_compile_runs_on_stand_ins_not_the_callers_arrays(monkeypatch):
    f = hd.func(_blur)
    x = np.random.default_rng(4).standard_normal((6, 5))
    seen = []
    forward_run = type(f.trace((x,), {})[0]).forward_run

    def spy(self, key="forward"):
        run = forward_run(self, key)
        return lambda inputs: seen.append({k: np.array(v) for k, v in inputs.items()}) or run(inputs)

    monkeypatch.setattr(type(f.trace((x,), {})[0]), "forward_run", spy)
    traced, _ = f.trace((x,), {})
    out = f(x)
    _wait(traced)
    assert traced.interpreted.get(CALL, 0) >= 1
    assert seen and all(not a.any() for inputs in seen for a in inputs.values())
    np.testing.assert_allclose(f(x), out, rtol=1e-12)


def test_a_pass_run_again_on_the_interpreter_starts_the_compiles(monkeypatch):
    """A loop of calls gets its kernels from its second call on, not after DEFER_MAX_S: the
    compile of a first call is held back only for the first calls of a user's program."""
    monkeypatch.setattr(tiered, "QUIET_S", 1e9)
    monkeypatch.setattr(tiered, "DEFER_MAX_S", 1e9)
    started = threading.Event()
    with tiered.interpreting():
        job = tiered.in_background(started.set)
        assert not started.wait(0.3)
        tiered.repeated()
        job.result(timeout=600)
    assert started.is_set()


def test_a_second_interpreted_call_says_so(monkeypatch):
    calls = []
    monkeypatch.setattr(tiered, "repeated", lambda: calls.append(1))
    monkeypatch.setattr(tiered, "DEFER_MAX_S", 1e9)
    monkeypatch.setattr(tiered, "QUIET_S", 1e9)
    f = hd.func(_blur)
    x = np.ones((5, 6))
    f(x)
    traced, _ = f.trace((x,), {})
    assert traced.interpreted.get(CALL, 0) >= 1
    assert calls == []
    f(x)
    assert calls == [1]
    monkeypatch.undo()
    tiered.repeated()  # (the compile this test held back)
    _wait(traced)


def test_interpreter_calls_make_their_arrays_without_huge_pages():
    """numpy's madvise for huge pages is off while an interpreter call runs (a first touch cost
    4x the system time with it where the OS compacts memory on the spot), and back after."""
    before = tiered._set_hugepages(True)
    try:
        with tiered.interpreting():
            with tiered.interpreting():  # (nested and concurrent calls: the last one out restores)
                assert tiered._set_hugepages(False) is False
            assert tiered._set_hugepages(False) is False
        assert tiered._set_hugepages(True) is True
    finally:
        tiered._set_hugepages(before)


def test_the_interpreter_keeps_what_the_kernels_forward_stores():
    """A plain call's interpreted forward keeps its outputs alone, a gradient's what gradients read
    (the other buffers go back to the pool for later Funcs and adjoints); the gradient is right."""
    from benchmarks.cases import blur_relu_maxpool
    from halide_ad.ad import read_by_gradients
    from halide_ad.api import FORWARD
    x = np.random.default_rng(11).standard_normal((1, 2, 6, 6))
    traced, arrays = blur_relu_maxpool.trace((x,), {})
    def made(key):
        buffers = traced.run(arrays, key)
        assert tiered.INTERPRETED in buffers
        return set(buffers) - set(arrays) - {tiered.INTERPRETED}
    assert made(CALL) == {"maxpool2x2"}
    assert made(FORWARD) == {"maxpool2x2", "arg_maxpool2x2"} == read_by_gradients(traced.program) & made(FORWARD)
    out, vjp = hd.vjp(blur_relu_maxpool, x)
    ct = np.random.default_rng(12).standard_normal(out.shape)
    np.testing.assert_allclose(vjp(ct)[0], hd.vjp(blur_relu_maxpool.fn, x)[1](ct)[0], rtol=1e-12)


SECOND_PROCESS = """
import json, numpy as np, halide_ad as hd
from tests.api.test_tiers import _blur
f = hd.func(_blur)
x = np.arange(63, dtype=np.float32).reshape(9, 7)
traced, _ = f.trace((x,), {})
out, vjp_fn = hd.vjp(f, x)
grad = vjp_fn(np.ones_like(out))[0]
print(json.dumps({"interpreted": {str(k): v for k, v in traced.interpreted.items()},
                  "sums": [float(out.sum()), float(grad.sum())]}))
"""


def test_a_second_process_runs_the_kernels_from_its_first_call(tmp_path):
    """The first process's first forward and backward run on the interpreter, and their kernels
    compile in the background, finishing before it exits (a backward's parallel loops on the
    calling thread then: the pool takes no work at exit) and marking the passes built on disk
    (`tiered.mark_built`). A second process with that cache builds them from the disk at once:
    no interpreter call, the same values to rounding."""
    env = {"HALIDE_AD_CACHE_DIR": str(tmp_path), "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
           "HALIDE_AD_TIERED": "1", "HALIDE_AD_PARALLEL_MIN_POINTS": "0"}  # (parallel loops: the pool at exit)
    first = json.loads(_python(SECOND_PROCESS, env=env).splitlines()[-1])
    second = json.loads(_python(SECOND_PROCESS, env=env).splitlines()[-1])
    assert first["interpreted"] and all(n == 1 for n in first["interpreted"].values())
    assert second["interpreted"] == {}
    np.testing.assert_allclose(second["sums"], first["sums"], rtol=1e-5)
