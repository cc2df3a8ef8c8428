"""Kernels' parallel loops: `parallel_for` runs every iteration once, in contiguous chunks, on
any thread count; generated kernels use it (not numba's prange pipeline) with noalias arrays."""
import itertools
import operator
import os
import pathlib
import platform
import subprocess
import sys
import threading

import numba
import numpy as np
import pytest
import threadpoolctl
from numba.core.caching import NullCache
from halide_ad.runtime import parallel, vmath
from halide_ad.runtime.parallel import (CHUNKS_PER_THREAD, COARSE, _call_types, _noalias, copy_all, kernel, matmul,
                                       parallel_for)

import halide_ad as hd
from halide_ad import ops
from halide_ad.api import as_function


@kernel
def _count(start, stop, hits):
    for i in range(start, stop):
        hits[i] += 1


# More threads than this machine's numba allows (NUMBA_NUM_THREADS) run in a child process that
# allows them: test_more_threads_than_the_pool_allows_here.
THREAD_COUNTS = [t for t in (1, 2, 3) if t <= numba.config.NUMBA_NUM_THREADS]


@pytest.fixture(params=THREAD_COUNTS, ids=lambda t: f"{t}threads")
def threads(request):
    before = numba.get_num_threads()
    numba.set_num_threads(request.param)
    yield request.param
    numba.set_num_threads(before)


def test_more_threads_than_the_pool_allows_here():
    """This file's 3-thread cases, in a child process whose pool has 4 threads, where this one's
    has fewer (NUMBA_NUM_THREADS may exceed the cores)."""
    if 3 in THREAD_COUNTS:
        pytest.skip("the 3-thread cases ran in this process")
    # (-n 0: in the child itself, not in the worker processes that pyproject's addopts would start)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", __file__, "-k",
                           "3threads"],
                          capture_output=True, text=True, timeout=600, check=False,
                          env=os.environ | {"NUMBA_NUM_THREADS": "4"}, cwd=pathlib.Path(__file__).parents[2])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-3000:]


@pytest.mark.parametrize("start, stop", [(0, 0), (0, 1), (3, 5), (0, 1000), (7, 7)])
def test_every_iteration_runs_once(start, stop, threads):
    hits = np.zeros(max(stop, 1), np.int64)
    parallel_for(_count, start, stop, hits)
    expected = np.zeros_like(hits)
    expected[start:stop] = 1
    np.testing.assert_array_equal(hits, expected)


def test_chunks_are_contiguous_and_cover_the_range(threads):
    chunks = []
    parallel_for(lambda lo, hi: chunks.append((lo, hi)), 10, 110)
    chunks.sort()
    assert chunks[0][0] == 10 and chunks[-1][1] == 110
    assert len(chunks) == (1 if threads == 1 else CHUNKS_PER_THREAD * threads)
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise(chunks))


def test_a_loop_in_a_chunk_runs_on_that_thread(threads):
    """A chunk's own parallel loop (a contraction image by image) runs on the chunk's thread:
    handing it to the busy pool could wait for ever."""
    import threading
    ran = []

    def outer(lo, hi):
        parallel_for(lambda a, b: ran.append((lo, a, b, threading.get_ident())), 0, 50)
        ran.append((lo, "outer", threading.get_ident()))

    parallel_for(outer, 0, 8)
    outers = {lo: ident for lo, tag, ident in (r for r in ran if r[1] == "outer")}
    inner = [r for r in ran if r[1] != "outer"]
    assert sorted(outers) == (list(range(8)) if threads > 1 else [0])  # 8 chunks of one, or one of all
    assert all((a, b) == (0, 50) and ident == outers[lo] for lo, a, b, ident in inner), inner


def test_an_error_in_any_chunk_is_raised(threads):
    def body(lo, hi):
        if hi == 100:  # the last chunk
            raise ValueError("chunk failed")

    with pytest.raises(ValueError, match="chunk failed"):
        parallel_for(body, 0, 100)


def test_kernels_mark_arrays_noalias():
    """Without the flag LLVM does not vectorize loops that store to one array and load another;
    a numba that moves it would make every kernel several times slower, silently."""
    assert _noalias() == {"noalias": True}


def test_kernels_compile_without_the_passes_they_never_need():
    """numba's rewrites and closure inlining find nothing in a generated loop and cost a large
    kernel's compile ~30%; a numba that moves what `_kernel_pipeline` builds on would bring them back."""
    passes = []

    class Passes(numba.core.event.Listener):
        def on_start(self, event):
            passes.append(event.data["name"].split(" [")[0])

        def on_end(self, event):
            pass

    @kernel
    def scaled(x, out):
        for i in range(x.shape[0]):
            out[i] = x[i] * 2.0 if x[i] > 0 else x[i]

    scaled._cache = NullCache()  # compiled here, not loaded from an earlier run's cache
    x, out = np.array([-1.0, 3.0]), np.zeros(2)
    with numba.core.event.install_listener("numba:run_pass", Passes()):
        scaled(x, out)
    assert "nopython_type_inference" in passes
    assert not {"inline_closure_likes", "generic_rewrites", "nopython_rewrites"} & set(passes), passes
    np.testing.assert_array_equal(out, [-1.0, 6.0])


def test_kernels_resolve_each_call_type_once():
    """A kernel's compile takes a `+` of types resolved before from `_call_types` (numba tries
    every template of operator.add again for each one); numba's own resolution is back after."""
    resolve = numba.core.types.Function.get_call_type

    @kernel
    def shifted(x, out):
        for i in range(x.shape[0]):
            out[i] = x[i] + 7

    shifted._cache = NullCache()
    _call_types.clear()
    x, out = np.arange(3), np.zeros(3, np.int64)
    shifted(x, out)
    assert any(fn.typing_key is operator.add for fn, *_ in _call_types)
    assert numba.core.types.Function.get_call_type is resolve
    np.testing.assert_array_equal(out, [7, 8, 9])


def test_generated_kernels_run_their_loops_through_parallel_for(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", str(2**14))

    @hd.func
    def blur(x):
        e = hd.repeat_edge(x)
        r = hd.rdom(3)
        return hd.compute(x.shape, lambda i, j: hd.sum(e[i, j + r - 1]) / 3)

    x = np.random.default_rng(0).standard_normal((200, 200))  # past the serial threshold of 2**14 points
    source = str(hd.explain(blur, x))
    assert "prange" not in source and "parallel=True" not in source
    assert source.count("parallel_for(") >= 2, source  # the forward's loop and the gradient's
    hd.check_grad(blur, x[:40, :50])
    out, vjp_fn = hd.vjp(blur, x)
    (g,) = vjp_fn(np.ones_like(out))
    expected = np.zeros_like(x)  # the scatter as written: each output adds 1/3 at its three taps
    for r in range(3):
        np.add.at(expected, (slice(None), np.clip(np.arange(200) + r - 1, 0, 199)), 1 / 3)
    np.testing.assert_allclose(g, expected, rtol=1e-12)


def test_large_iterations_are_called_from_python_and_the_loop_never_runs(threads):
    """An iteration that spans COARSE elements or more runs as a call from Python of the loop's
    body, so that numba never compiles the loop around it; a smaller one runs in the loop."""
    def loop(lo, hi, a):
        raise AssertionError("the loop function ran")

    calls = []
    parallel_for(loop, 0, 10, np.zeros(10 * COARSE, np.float32), iteration=lambda j, a: calls.append(j))
    assert sorted(calls) == list(range(10))
    hits = np.zeros(10 * COARSE - 1, np.int8)
    parallel_for(lambda lo, hi, a: a.__setitem__(slice(lo, hi), 1), 0, 10, hits, iteration=loop)
    assert hits[:10].tolist() == [1] * 10


def test_a_gradient_of_large_planes_compiles_no_loop_around_its_body(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "0")  # the planes in parallel at a test's size

    @hd.func
    def upsample(x):
        return hd.compute((2, 3, 2 * x.shape[2], 2 * x.shape[3]), lambda n, c, i, j: x[n, c, i // 2, j // 2])

    x = np.random.default_rng(0).standard_normal((2, 3, 128, 96)).astype(np.float32)
    out, vjp_fn = hd.vjp(upsample, x)
    ct = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    (g,) = vjp_fn(ct)
    np.testing.assert_allclose(g, ct.reshape(2, 3, 128, 2, 96, 2).sum(axis=(3, 5)), rtol=1e-5)
    traced, _ = as_function(upsample).trace((x,), {})
    kernel, _ = traced.gradient(("x",))
    (step,) = [s for s in kernel.steps if hasattr(s, "fn")]
    compiled = {d.py_func.__name__: len(d.overloads) for d in step.fn.dispatchers}
    assert compiled["backward0_b0"] == 1 and compiled["backward0_p1"] == 0, compiled


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("parallel_bytes", [0, 1 << 30])
def test_copy_all_copies_strided_windows_and_fills(threads, dtype, parallel_bytes, monkeypatch):
    """Image by image on the threads, or in one go: windows read at a stride into a stack, a
    fill, a 0-d copy and a small one, each exactly as np.copyto and fill would."""
    monkeypatch.setattr(parallel, "PARALLEL_COPY_BYTES", parallel_bytes)
    x = np.random.default_rng(0).standard_normal((5, 3, 64, 70)).astype(dtype)
    stack = np.full((5, 4, 3, 31, 34), np.nan, dtype)
    zeros = np.full((7, 300), np.nan, dtype)
    scalar, small = np.zeros((), dtype), np.zeros(3, dtype)
    windows = [(stack[:, 2 * r + s], x[:, :, r:r + 61:2, s:s + 67:2]) for r in range(2) for s in range(2)]
    copy_all(windows + [(zeros, None), (scalar, x[0, 0, 0, 0]), (small, x[1, 2, 3, :3])])
    for r in range(2):
        for s in range(2):
            np.testing.assert_array_equal(stack[:, 2 * r + s], x[:, :, r:r + 61:2, s:s + 67:2])
    assert not zeros.any() and scalar == x[0, 0, 0, 0]
    np.testing.assert_array_equal(small, x[1, 2, 3, :3])


@pytest.mark.parametrize("shapes", [((6, 40, 50), (6, 50, 30)), ((1, 40, 50), (6, 50, 30)),
                                    ((5, 40, 50), (1, 50, 30)), ((1, 300, 200), (1, 200, 150))])
def test_matmul_on_the_kernel_threads_equals_numpy(threads, shapes, monkeypatch):
    """Split by images, BLAS on one thread for each (a single product as numpy runs it); the
    BLAS thread count is restored afterwards."""
    monkeypatch.setattr(parallel, "SMALL_MATMUL", 0)
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(s) for s in shapes)
    b = b.transpose(0, 2, 1).copy().transpose(0, 2, 1)  # a strided operand, as contractions pass
    out = np.full((max(len(a), len(b)), a.shape[1], b.shape[2]), np.nan)
    before = _blas_threads()
    matmul(a, b, out)
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-12)
    assert _blas_threads() == before


def _blas_threads() -> list[int]:
    return [get() for get, _ in parallel._blas_libraries()]


def test_overlapping_products_restore_the_blas_thread_count():
    """Gradients on two user threads overlap: the second enters while the first holds BLAS at one
    thread, and the first leaves before the second. BLAS stays at one thread until the last one
    leaves, then has the count both found before."""
    if not parallel._blas_libraries():
        pytest.skip("threadpoolctl finds no BLAS library")
    before = _blas_threads()
    first, second = parallel.one_blas_thread(), parallel.one_blas_thread()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert _blas_threads() == [1] * len(before)
    second.__exit__(None, None, None)
    assert _blas_threads() == before


def test_a_thread_that_set_blas_threads_first_does_not_keep_the_calling_thread_from_it():
    """A tiered program's first gradient runs on the background compile thread, which lives on:
    threadpoolctl would obey only that thread afterwards. The calling thread's small products
    must still run BLAS on one thread."""
    if not parallel._blas_libraries():
        pytest.skip("threadpoolctl finds no BLAS library")
    before = _blas_threads()
    entered, leave = threading.Event(), threading.Event()

    def background():
        for lib in threadpoolctl.ThreadpoolController().lib_controllers:
            if lib.user_api == "blas":  # threadpoolctl's control (where it keeps one) goes to this thread
                clear = getattr(type(lib), "clear_controlling_thread", None)
                if clear is not None:
                    clear(force=True)
                lib.set_num_threads(lib.num_threads)
        entered.set()
        leave.wait(10)

    thread = threading.Thread(target=background)
    thread.start()
    try:
        entered.wait(10)
        with parallel.one_blas_thread():
            assert _blas_threads() == [1] * len(before)
        assert _blas_threads() == before
    finally:
        leave.set()
        thread.join()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_matmul_on_one_blas_thread_equals_numpy(dtype, monkeypatch):
    """A product below SMALL_MATMUL (the digits step's 256x64x32, its right operand transposed)
    runs with BLAS held to the calling thread, gives numpy's product, and leaves the count as
    it was."""
    counts = []
    real = np.matmul
    monkeypatch.setattr(parallel.np, "matmul", lambda *a, **k: counts.append(_blas_threads()) or real(*a, **k))
    rng = np.random.default_rng(3)
    a = rng.standard_normal((1, 256, 64)).astype(dtype)
    b = rng.standard_normal((32, 64)).astype(dtype).T[None]
    out = np.full((1, 256, 32), np.nan, dtype)
    before = _blas_threads()
    matmul(a, b, out)
    eps = np.finfo(dtype).eps  # one BLAS thread against numpy's: equal to rounding (64 terms)
    np.testing.assert_allclose(out, real(a, b), rtol=0, atol=64 * eps * np.abs(a).max() * np.abs(b).max())
    assert counts == [[1] * len(before)]
    assert _blas_threads() == before


FORKED = """
import multiprocessing, numpy as np
from halide_ad.runtime.parallel import parallel_for

def count(lo, hi, hits):
    hits[lo:hi] += 1

def in_child():
    hits = np.zeros(100, np.int64)
    parallel_for(count, 0, 100, hits)
    return hits.tolist()

if __name__ == "__main__":
    parallel_for(count, 0, 10, np.zeros(10, np.int64))  # the parent's pool is running
    with multiprocessing.get_context("fork").Pool(1) as children:
        print(sum(children.apply_async(in_child).get(timeout=60)))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_runs_parallel_loops(tmp_path):
    """A child forked after the pool started has none of its threads: it must start its own.
    (In a process of its own: this test session may hold other libraries' threads across a fork.)"""
    script = tmp_path / "forked.py"
    script.write_text(FORKED)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False,
                          env=os.environ | {"NUMBA_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "100"


def _chunk_cpus(threads: int) -> dict[int, set[int]]:
    """{native thread id: the CPUs its chunks ran on} for one parallel_for over `threads` chunks
    of a Python body whose first chunk on each thread waits until every thread has one."""
    met = threading.Barrier(threads)
    seen: dict[int, set[int]] = {}
    first = threading.local()

    def body(lo, hi):
        if not getattr(first, "done", False):
            first.done = True
            met.wait(timeout=30)
        seen.setdefault(threading.get_native_id(), set()).add(parallel._sched_getcpu())

    parallel_for(body, 0, threads * CHUNKS_PER_THREAD)
    return seen


needs_two_cpus = pytest.mark.skipif(parallel._sched_getcpu is None or len(os.sched_getaffinity(0)) < 2,
                                    reason="needs sched_getcpu and two CPUs")


@needs_two_cpus
def test_workers_run_off_the_calling_threads_cpu(threads, monkeypatch):
    """A loop's workers may use every CPU the caller may but the caller's own (where a worker woken
    after idling otherwise often started, sharing it), and run their chunks there."""
    if threads < 2:
        pytest.skip("no workers")
    monkeypatch.setenv("HALIDE_AD_PIN_WORKERS", "1")
    seen = _chunk_cpus(threads)
    caller_cpu, cpus = parallel._placement
    allowed = os.sched_getaffinity(0)
    assert cpus == allowed - {caller_cpu}
    workers = {tid: ran for tid, ran in seen.items() if tid != threading.get_native_id()}
    assert len(workers) == threads - 1
    for tid, ran in workers.items():
        assert os.sched_getaffinity(tid) == cpus
        assert caller_cpu not in ran


@needs_two_cpus
def test_workers_go_anywhere_again_once_pinning_is_off(monkeypatch):
    """HALIDE_AD_PIN_WORKERS=0 in a running process gives the workers back every CPU."""
    before = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        monkeypatch.setenv("HALIDE_AD_PIN_WORKERS", "1")
        _chunk_cpus(2)
        assert parallel._placement is not None
        monkeypatch.setenv("HALIDE_AD_PIN_WORKERS", "0")
        seen = _chunk_cpus(2)
    finally:
        numba.set_num_threads(before)
    assert parallel._placement is None
    workers = [tid for tid in seen if tid != threading.get_native_id()]
    assert workers and all(os.sched_getaffinity(tid) == os.sched_getaffinity(0) for tid in workers)


def _gelu(i, out, x):
    v = x[i]
    out[i] = np.float32(0.5) * v * (np.float32(1) + vmath.tanh_f32(np.float32(0.7978846) * (v + np.float32(0.044715) * v * v * v)))


_gelu_row = kernel(_gelu)  # as a generated kernel's row function, which its loop function calls
_gelu_row_plain = numba.njit(nogil=True, error_model="numpy")(_gelu)


def _gelu_loop(start, stop, out, x):
    for i in range(start, stop):
        _gelu_row(i, out, x)


def _gelu_loop_plain(start, stop, out, x):
    for i in range(start, stop):
        _gelu_row_plain(i, out, x)


def test_only_kernels_that_call_math_functions_compile_interleaved():
    assert parallel._calls_math(_gelu) and parallel._calls_math(_gelu_loop)  # the loop through its row function
    assert not parallel._calls_math(_count.py_func)
    # (parallel.py cannot import vmath, which imports it: its list of the functions is checked here)
    assert parallel._MATH == {name for name in dir(vmath) if name.endswith("_f32")}


def test_an_interleaved_math_loop_gives_the_bits_of_an_uninterleaved_one():
    """MATH_INTERLEAVE changes how many vectors an iteration takes, not any element's operations:
    the kernel's results equal numba's plain compile of the same loop, bit for bit, with the
    specials and lengths that leave remainders of several sizes."""
    x = np.concatenate([np.random.default_rng(3).standard_normal(1000, dtype=np.float32) * 4,
                        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 88.0, -88.0, 9.0, 1e30],
                                 np.float32)])
    plain, interleaved = numba.njit(nogil=True, error_model="numpy")(_gelu_loop_plain), kernel(_gelu_loop)
    for n in (len(x), 33, 31, 7, 0):
        expect, got = np.full(n, 7, np.float32), np.full(n, 7, np.float32)
        plain(0, n, expect, x)
        interleaved(0, n, got, x)
        assert got.tobytes() == expect.tobytes()
    if platform.machine() in ("x86_64", "AMD64"):  # a division per vector: (v)divps, one per interleaved vector
        assert interleaved.inspect_asm(interleaved.signatures[0]).count("divps") >= parallel.MATH_INTERLEAVE


def test_kernel_files_change_name_with_how_kernels_compile(tmp_path, monkeypatch):
    """numba's cache keys a kernel's machine code on its file's text alone; the compile pipeline
    and LLVM options live in runtime/parallel.py, so its source is in the files' names' salt (an
    upgrade that changes them must not load machine code compiled the old way)."""
    from halide_ad.runtime import compile as compiling
    before = compiling._version_salt()
    changed = tmp_path / "parallel.py"
    changed.write_text(pathlib.Path(parallel.__file__).read_text() + "\n# compiled otherwise\n")
    monkeypatch.setattr(parallel, "__file__", str(changed))
    compiling._version_salt.cache_clear()
    try:
        assert compiling._version_salt() != before
    finally:
        monkeypatch.undo()
        compiling._version_salt.cache_clear()
    assert compiling._version_salt() == before


def test_branchless_picks_as_a_conditional_does():
    """codegen writes a select of values already computed as one LLVM select (parallel.branchless)."""
    @numba.njit
    def pick(c, a, b):
        return parallel.branchless(c, a, b)

    assert pick(True, np.float32(1.5), np.float32(2.5)) == np.float32(1.5)
    assert pick(False, np.float32(1.5), np.float32(2.5)) == np.float32(2.5)
    assert pick(False, 1, 2.5) == 2.5 and pick(True, 1, 2.5) == 1.0  # int and float unify
    assert np.isnan(pick(True, np.nan, 0.0)) and pick(False, np.nan, 0.0) == 0.0


@hd.func
def two_dense_layers(x, w1, w2):
    return ops.dense(ops.relu(ops.dense(x, w1)), w2)


def _dense_gradient_switches(monkeypatch, x_shape, w1_shape, w2_shape) -> list[int]:
    """The BLAS thread counts set while two dense layers' compiled gradient runs, its values
    checked against numpy's."""
    rng = np.random.default_rng(2)
    x, w1, w2 = (rng.standard_normal(s) for s in (x_shape, w1_shape, w2_shape))
    out, vjp_fn = hd.vjp(two_dense_layers, x, w1, w2)
    ct = rng.standard_normal(out.shape)
    vjp_fn(ct)  # compiled
    switches = []
    libraries = [(get, lambda n, set_=set_: switches.append(n) or set_(n)) for get, set_ in parallel._blas_libraries()]
    monkeypatch.setattr(parallel, "_blas_libraries", lambda: libraries)
    gx, gw1, gw2 = vjp_fn(ct)
    h = np.maximum(x @ w1.T, 0)
    np.testing.assert_allclose(gw2, ct.T @ h, rtol=1e-10)
    np.testing.assert_allclose(gw1, ((ct @ w2) * (h > 0)).T @ x, rtol=1e-10)
    np.testing.assert_allclose(gx, ((ct @ w2) * (h > 0)) @ w1, rtol=1e-10)
    return switches


def test_a_kernel_of_small_products_holds_blas_on_one_thread_once(monkeypatch):
    """A gradient of small BLAS products (two dense layers': three products, one of 64 x 128 x
    64 multiply-adds, past OpenBLAS's own one-thread bound) holds BLAS on the calling thread
    once for the whole kernel, not once per product."""
    if not parallel._blas_libraries():
        pytest.skip("threadpoolctl finds no BLAS library")
    switches = _dense_gradient_switches(monkeypatch, (64, 128), (64, 128), (4, 64))
    n = len(parallel._blas_libraries())
    assert switches[:n] == [1] * n and len(switches) == 2 * n, switches


def test_products_that_openblas_keeps_on_the_calling_thread_switch_nothing(monkeypatch):
    """A gradient whose products are all within OPENBLAS_ONE_THREAD leaves BLAS's thread count
    alone: OpenBLAS runs them on the calling thread by itself."""
    if not parallel._openblas_only():
        pytest.skip("BLAS here is not OpenBLAS")
    assert _dense_gradient_switches(monkeypatch, (8, 32), (16, 32), (4, 16)) == []
