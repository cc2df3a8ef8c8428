"""Running a kernel's parallel loop on threads.

Each parallel loop of a generated kernel is a numba function that releases the GIL and runs the
iterations [start, stop) of its outer loop; `parallel_for` splits the loop into contiguous chunks
and runs them on a shared thread pool and the calling thread (a chunk of large iterations calls
the loop's body once per iteration instead). Not numba's `parallel=True`: its passes compile
several times slower, re-optimize the whole loop body a second time, and its OpenMP threads spin
after every loop, which halves the speed of a BLAS call that follows on a small machine.

Every element has one writer, so the result is the same bits for any number of threads.
`numba.set_num_threads` (or NUMBA_NUM_THREADS) sets how many chunks run at once. The pool's
threads are kept off the CPU of the thread that starts a loop (`_keep_workers_off_caller`;
HALIDE_AD_PIN_WORKERS=0 leaves them to the OS).

`kernel` compiles a generated loop function as numba compiles a prange loop's body: it releases
the GIL, its arrays are marked as not aliasing one another (every buffer a kernel writes is its
own allocation), and division follows numpy (x / 0 is inf or nan, not an exception). Without
noalias LLVM must assume a store may change what the next load reads: a 3x3 blur's loop ran 4x
slower, unvectorized; the error checks of Python's division cost the bilinear gradient ~10%.
It also skips what of numba's a generated loop function never uses, with the machine code
unchanged: numba's IR rewrites (array expressions, constant raises and getitems; each rewrite
pass re-derives every variable's lifetime, a cost that grows faster than the function), the pass
that inlines closures, and the C-callable wrapper that only first-class function values need.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import llvmlite.binding as llvm
import numba
import numpy as np
import threadpoolctl
from numba import njit
from numba.extending import intrinsic

from halide_ad import config

try:  # numba's internals, for the additions below (`_noalias`, `_lean_cache`, `_kernel_pipeline`)
    from numba.core import cpu, options
    from numba.core.caching import FunctionCache
    from numba.core.codegen import CPUCodeLibrary
    from numba.core.typing import typeof as numba_typeof
    from numba.core.compiler import CompilerBase, DefaultPassBuilder
    from numba.core.compiler_machinery import PassManager
    from numba.core.runtime import nrt
    from numba.core.untyped_passes import InlineClosureLikes
    # what `_while_a_kernel_compiles` replaces
    numba.core.types.Function.get_call_type, CPUCodeLibrary._optimize_functions  # noqa: B018
    numba.core.errors._termcolor_inst, numba_typeof._termcolor  # noqa: B018
except (ImportError, AttributeError):  # a later numba moved them: kernels stay correct, and lose those additions
    cpu = options = FunctionCache = nrt = CompilerBase = CPUCodeLibrary = numba_typeof = None

CHUNKS_PER_THREAD = 4
COARSE = 1 << 16  # elements of the arguments per iteration from which a call from Python costs < 5%
PARALLEL_COPY_BYTES = 1 << 20  # copies and sums smaller in all run on the calling thread
SMALL_MATMUL = 1 << 22  # multiply-adds, below which BLAS is called as is: a thread costs ~50 us
# OpenBLAS runs a product of at most this many multiply-adds on the calling thread by itself
# (interface/gemm.c: m * n * k <= SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD = 65536 * 4)
OPENBLAS_ONE_THREAD = 1 << 18
_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_chunk = threading.local()  # .running: this thread runs a chunk, where a nested loop runs serially


def _forget_pool() -> None:
    """In a forked child the pool's threads do not exist: work handed to it would never run."""
    global _pool, _placement
    _pool, _placement = None, None
    _worker_ids.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _workers() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(1, numba.config.NUMBA_NUM_THREADS - 1), thread_name_prefix="halide_ad")
        return _pool


try:  # glibc's; reads the CPU from the vDSO, no system call
    _sched_getcpu = ctypes.CDLL(None).sched_getcpu
    _sched_getcpu.restype, _sched_getcpu.argtypes = ctypes.c_int, []
except (OSError, AttributeError):
    _sched_getcpu = None
_worker_ids: set[int] = set()  # the native thread ids of the pool's threads
_placement: tuple[int, frozenset[int]] | None = None  # (the CPU the workers are kept off, the CPUs they may use)


def _keep_workers_off_caller() -> frozenset[int] | None:
    """The CPUs the pool's workers may run on for this loop: those the calling thread may, but
    the one it runs on; None to leave them where the OS puts them (HALIDE_AD_PIN_WORKERS=0,
    one CPU, no sched_getcpu). Workers seen before are restricted to them here, and a worker not
    yet seen restricts itself (`_place_worker`). The affinities are set again only when the
    caller's CPU changes.

    Woken by a caller that had slept 10 ms or more, a worker often started on the caller's own
    CPU, and the two shared it until the OS moved one: in a 2-vCPU VM, the loop ran at one
    thread's speed for milliseconds. Layer norm's forward over (4096, 1024), the call after an
    untimed one after each sleep (60 alternating rounds at 7ecbc03): 3.87 ms after 10 ms sleeps
    (4.04 after 20, 4.12 after 50) with the workers left alone, 2.37 (2.51, 2.51) with them kept
    off the caller's CPU; tanh over 4M 3.65 against 2.17 ms; back to back, no change."""
    global _placement
    cpu = _sched_getcpu() if _sched_getcpu is not None and config.pin_workers() else -1
    if _placement is not None and _placement[0] == cpu:
        return _placement[1]
    if _placement is None and cpu < 0:
        return None
    allowed = frozenset(os.sched_getaffinity(0))
    if cpu not in allowed or len(allowed) < 2:  # off, or nothing to keep them off
        if _placement is not None:
            _placement = None
            _set_worker_affinity(allowed)
        return None
    _placement = cpu, allowed - {cpu}
    _set_worker_affinity(_placement[1])
    return _placement[1]


def _set_worker_affinity(cpus: frozenset[int]) -> None:
    for tid in list(_worker_ids):
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:  # the thread is gone, or the OS refuses: it stays as it is
            _worker_ids.discard(tid)


def _place_worker(cpus: frozenset[int] | None) -> None:
    """On a pool thread: seen for the first time, it registers and takes `cpus` itself."""
    tid = threading.get_native_id()
    if tid in _worker_ids:
        return
    _worker_ids.add(tid)
    if cpus is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)


def parallel_for(body, start: int, stop: int, *args, iteration=None) -> None:
    """body(lo, hi, *args) for contiguous chunks [lo, hi) covering [start, stop), in parallel.
    CHUNKS_PER_THREAD chunks per thread, taken in order by whichever thread is free: a thread
    that another process slows down holds up the loop by one small chunk, not by half of it.

    `iteration(j, *args)`, if given, is the loop's body for one index (`body` runs it for each
    j in [lo, hi)). Where one iteration spans at least COARSE elements of the arrays, a chunk
    calls it from Python instead, and `body` is never called, so never compiled: numba
    compiles a loop around a function by optimizing the function's code again with it (0.4 s
    of bilinear's gradient), and a call from Python costs about a microsecond.

    Called from a chunk (a loop in a loop), it runs the whole range on that thread."""
    if iteration is not None and stop > start and sum(
            a.size for a in args if isinstance(a, np.ndarray)) >= COARSE * (stop - start):
        body = functools.partial(_each, iteration)
    threads = min(numba.get_num_threads(), stop - start)
    if threads <= 1 or getattr(_chunk, "running", False):  # inside a chunk, the threads are busy
        body(start, stop, *args)
        return
    pieces = min(stop - start, CHUNKS_PER_THREAD * threads)
    chunks = itertools.pairwise([start + (stop - start) * k // pieces for k in range(pieces + 1)])
    taking = threading.Lock()

    def work(cpus=None, on_worker=False) -> None:
        if on_worker:
            _place_worker(cpus)
        _chunk.running = True
        try:
            while True:
                with taking:
                    chunk = next(chunks, None)
                if chunk is None:
                    return
                body(*chunk, *args)
        finally:
            _chunk.running = False

    pool, futures = _workers(), []
    cpus = _keep_workers_off_caller()
    try:
        for _ in range(threads - 1):
            futures.append(pool.submit(work, cpus, True))
    except RuntimeError:  # the interpreter is exiting (and finishing a background compile first,
        pass              # halide_ad/tiered.py): this thread takes the chunks no other thread took
    try:
        work()
    finally:
        for f in futures:
            f.result()  # waits, and raises what a chunk raised


def copy_all(copies: list[tuple[np.ndarray, np.ndarray | None]]) -> None:
    """np.copyto(dst, src) for each pair, or dst.fill(0) where src is None, on the threads:
    numpy copies on one thread, and a convolution's stacked windows, read at a stride, came to
    2-4 ms of its 10-ms gradient. The destinations must not overlap one another or any source.
    Work goes out image by image (along each destination's first axis), every pair's image n
    before any pair's image n + 1, so that the windows copied from one image find it in cache;
    numpy lets go of the GIL while it copies."""
    if sum(d.nbytes for d, _ in copies) < PARALLEL_COPY_BYTES or numba.get_num_threads() <= 1:
        _copy(copies, 0, len(copies))
        return
    images = [len(d) if d.ndim > 1 and (s is None or s.shape == d.shape) else 0 for d, s in copies]
    order = sorted((n, k) for k, count in enumerate(images) for n in range(max(count, 1)))
    split = [(d[n], s if s is None else s[n]) if images[k] else (d, s) for n, k in order for d, s in [copies[k]]]
    parallel_for(functools.partial(_copy, split), 0, len(split))


def by_rows(body, rows: int, nbytes: int) -> None:
    """body(lo, hi) for chunks [lo, hi) of range(rows) on the threads, where the arrays it
    touches come to nbytes in all, enough to gain from them (numpy lets go of the GIL)."""
    if nbytes < PARALLEL_COPY_BYTES:
        body(0, rows)
    else:
        parallel_for(body, 0, rows)


def _copy(copies, lo: int, hi: int) -> None:
    for dst, src in copies[lo:hi]:
        if src is None:
            dst.fill(0)
        else:
            np.copyto(dst, src)


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """np.matmul(a, b, out=out) for (batch, rows, columns) operands, a batch of one
    broadcasting. Several images run on the kernel threads, each a BLAS call on one thread:
    OpenBLAS's own threads spin for up to ~0.1 s after a product, holding the second core that
    the next kernel's threads need (conv2d stride 2's gradient: its copies after BLAS took 4.3
    ms instead of 2.5). A single product stays with BLAS's threads, which share its packed
    operands: split by rows on ours, dense's gradient ran 13.4-16.5 ms against 12.7.

    A small product (below SMALL_MATMUL multiply-adds, tens of microseconds) runs on the calling
    thread alone: OpenBLAS splits even a 256x64x32 product over its threads, and on a busy
    machine the hand-off waits for a time slice of another core. That product took 7-8 ms
    instead of 0.012 in some processes, and was most of the digits training step.

    BLAS's bits for an element depend on more than its row and column of the operands: on
    the product's extents, its layout, the operands' strides and the CPU (OpenBLAS's Haswell
    kernels on an AMD EPYC summed a float32 column otherwise at another offset in a product
    of the same shape). So a dask block's product equals the whole array's to rounding, not
    bit for bit (docs/dask.md)."""
    if out.size * a.shape[2] < SMALL_MATMUL:
        if blas_on_calling_thread(out.size * a.shape[2]):
            np.matmul(a, b, out=out)
            return
        with one_blas_thread():
            np.matmul(a, b, out=out)
        return
    if len(out) <= 1 or numba.get_num_threads() <= 1:
        np.matmul(a, b, out=out)
        return

    def images(lo: int, hi: int) -> None:
        np.matmul(a if len(a) == 1 else a[lo:hi], b if len(b) == 1 else b[lo:hi], out=out[lo:hi])

    with one_blas_thread():
        parallel_for(images, 0, len(out))


def each_image(body, count: int) -> None:
    """body(j) for j in range(count) on the threads, BLAS on one thread in each (see `matmul`);
    what body runs in parallel runs on its thread."""
    def images(lo: int, hi: int) -> None:
        for j in range(lo, hi):
            body(j)

    with one_blas_thread():
        parallel_for(images, 0, count)


def blas_on_calling_thread(macs: int) -> bool:
    """Whether BLAS runs products of up to `macs` multiply-adds on the calling thread without
    being told to: every BLAS library here is OpenBLAS, and `macs` is at most OPENBLAS_ONE_THREAD.
    Holding BLAS on one thread (`one_blas_thread`) costs two calls into it and ~3-7 us, as much
    as such a product (a small conv layer's weight gradient: 8 x 1024 x 27)."""
    return macs <= OPENBLAS_ONE_THREAD and _openblas_only()


@functools.cache
def _openblas_only() -> bool:
    apis = [lib.internal_api for lib in threadpoolctl.ThreadpoolController().lib_controllers
            if lib.user_api == "blas"]
    return bool(apis) and all(api == "openblas" for api in apis)


class one_blas_thread:
    """BLAS on the calling thread only, for the duration (threadpoolctl finds numpy's BLAS).
    Gradients running at once on several user threads share one setting: the first to enter
    saves the counts, the last to leave restores them. A kernel of small products holds it
    around all of its steps (`execute.Kernel`), so that the products' own entries only count."""

    def __enter__(self) -> None:
        global _blas_users, _blas_before
        with _blas_lock:
            if _blas_users == 0:
                _blas_before = [get() for get, _ in _blas_libraries()]
                for _, set_ in _blas_libraries():
                    set_(1)
            _blas_users += 1

    def __exit__(self, *exc) -> None:
        global _blas_users
        with _blas_lock:
            _blas_users -= 1
            if _blas_users == 0:
                for (_, set_), n in zip(_blas_libraries(), _blas_before, strict=True):
                    set_(n)


_blas_lock = threading.Lock()
_blas_users = 0
_blas_before: list[int] = []


@functools.cache
def _blas_libraries() -> list[tuple]:
    """(get, set) of each BLAS library's thread count. OpenBLAS's `set_num_threads` in
    threadpoolctl obeys only the first Python thread that called it while that thread lives,
    and does nothing for any other: a tiered program's first gradient runs on the background
    compile thread (halide_ad/tiered.py), which then held that right, and the calling thread's
    small products ran on BLAS's threads after all (7-8 ms for 0.012). The count is the whole
    process's either way; `_blas_users` keeps our own threads from fighting over it. OpenBLAS's
    own functions on pthreads are resolved once: threadpoolctl looks them up by name on every
    call, 3-6 us of each small product's switch."""
    libraries = threadpoolctl.ThreadpoolController().lib_controllers
    out = []
    for lib in libraries:
        if lib.user_api != "blas":
            continue
        get, set_ = lib.get_num_threads, getattr(lib, "_real_set_num_threads", lib.set_num_threads)
        if lib.internal_api == "openblas" and getattr(lib, "threading_layer", None) == "pthreads":
            symbol = getattr(lib, "_get_symbol", lambda name: None)
            get = symbol("openblas_get_num_threads") or get
            set_ = symbol("openblas_set_num_threads") or set_
        out.append((get, set_))
    return out


def _each(iteration, lo: int, hi: int, *args) -> None:
    for j in range(lo, hi):
        iteration(j, *args)


def _noalias() -> dict[str, bool]:
    """numba has the flag but no decorator option for it (only its prange loops set it): add one.
    If a later numba moves it, kernels stay correct and run slower."""
    if cpu is None:
        return {}
    try:
        if not hasattr(cpu.CPUTargetOptions, "noalias"):
            cpu.CPUTargetOptions.noalias = options._mapping("noalias")
        return {"noalias": True}
    except AttributeError:
        return {}


def _lean_cache():
    """numba's on-disk cache minus the typing and lowering registries that numba loads before a
    process's first cache hit: 0.3 s, and 0.2 s more where scipy is installed (jax brings it),
    since `numba.np.arraymath` imports `scipy.linalg` to look for BLAS. Loading machine code
    needs only numba's runtime, whose symbols the code links against; compiling needs the
    registries, and numba's compiler loads them itself. If a later numba moves what this
    subclasses, kernels keep numba's own cache and the first one loaded takes the 0.5 s."""
    if FunctionCache is None:
        return None
    needed = ("_load_overload", "_guard_against_spurious_io_errors")
    if not all(hasattr(FunctionCache, name) for name in needed):
        return None

    class LeanCache(FunctionCache):
        def load_overload(self, sig, target_context):
            nrt.rtsys.initialize(target_context)
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)

    return LeanCache


_call_types: dict = {}  # (function type, typing context, argument types) -> (signature, impl key)


def _remembered_call_types(resolve):
    """numba's `Function.get_call_type`, answered from the signature resolved before, in this
    kernel or an earlier one: numba resolves `a + b` by trying each of operator.add's templates
    in turn (the one for arrays runs numpy's ufunc loop search on two ints and turns the result
    down), formatting an error message for each that does not match, and does it again for
    every `+` in the function, at every round of its type propagation and once more as it lowers
    the `+`. A template's answer depends on the argument types alone, and the function type is
    interned: the same templates give the same signature and implementation, so the machine code
    is the same (the assembly of every kernel of tests/ops/test_pool.py compared equal at
    bc05f9b)."""
    def remembered(fn, context, args, kws):
        try:
            key = (fn, context, tuple(args), tuple(sorted(kws.items())))
            known = _call_types.get(key)
        except TypeError:  # an unhashable argument type: resolved as numba does
            return resolve(fn, context, args, kws)
        if known is None:
            sig = resolve(fn, context, args, kws)
            if sig is None:
                return None
            known = _call_types[key] = (sig, fn.get_impl_key(sig))
        fn._impl_keys[known[0].args] = known[1]  # what `resolve` records for lowering
        return known[0]

    return remembered


def _wrappers_optimized_once(optimize):
    """numba's `CPUCodeLibrary._optimize_functions`, skipped for the module of a kernel's CPython
    wrapper (the function that unboxes the arguments a call from Python passes, then calls the
    kernel): the library's module passes run the same pipeline over it again when the library
    is finalized, so it ran twice; the kernel's own functions keep both. The kernels' machine
    code is the same (36 of 36 functions of a conv layer, softmax, layer norm, tanh*sigmoid and
    avg pool, forward and gradient, at (4096, 1024)); only a wrapper's instructions may come out
    in another order. Wrappers took a fifth of the compile time of
    tests/updates/test_update_higher_order.py, ~30 ms each."""
    def once(library, module):
        if module.name != "wrapper":  # (numba's name for it: cpu.CPUContext.create_cpython_wrapper)
            return optimize(library, module)
        module.data_layout = library._codegen._data_layout

    return once


class _PlainText:
    """numba's error highlighting, without colours or terminal set-up (its colour scheme's API).
    numba builds an error message for every global whose type it cannot tell (`np`, `lanes`:
    modules) and every overload it tries and drops, and catches them all; where colorama is
    installed, each highlighted message first re-initialised colorama's terminal wrappers (an
    `isatty` per stream): 2.6% of the test suite's CPU time on a machine with colorama. A message
    that reaches the user is the same, uncoloured."""

    def code(self, msg):
        return msg

    errmsg = filename = indicate = highlight = reset = code


@contextlib.contextmanager
def _while_a_kernel_compiles():
    """numba's internals that a kernel's compile replaces, each restored after it (numba compiles
    under one lock, so only kernels' compiles see them): call types resolved once
    (`_remembered_call_types`), wrappers optimized once (`_wrappers_optimized_once`), and plain
    error text (`_PlainText`)."""
    plain = _PlainText()
    patches = [(numba.core.types.Function, "get_call_type", _remembered_call_types),
               (CPUCodeLibrary, "_optimize_functions", _wrappers_optimized_once),
               (numba.core.errors, "_termcolor_inst", lambda _: plain),
               (numba_typeof, "_termcolor", lambda _: plain)]
    before = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for (owner, name, value), (_, _, replace) in zip(before, patches):
            setattr(owner, name, replace(value))
        yield
    finally:
        for owner, name, value in reversed(before):
            setattr(owner, name, value)


MATH_INTERLEAVE = 4  # vectors of a loop over math functions that LLVM works on at once
_MATH = frozenset(("cos_f32", "erf_f32", "exp_f32", "log1p_f32", "log_f32", "pow_f32", "sigmoid_f32", "sin_f32",
                   "tanh_f32"))  # runtime/vmath.py's float32 functions (vmath imports this module)


def _calls_math(fn, depth: int = 3) -> bool:
    """Whether `fn`, or a kernel it calls (a nest's loop calls its row function), calls a
    runtime/vmath.py float32 function."""
    names = getattr(getattr(fn, "__code__", None), "co_names", ())
    if _MATH & set(names):
        return True
    spaces = getattr(fn, "__globals__", {})
    return depth > 0 and any(_calls_math(getattr(spaces.get(n), "py_func", None), depth - 1) for n in names)


@contextlib.contextmanager
def _interleaved(on: bool):
    """LLVM's loop vectorizer working on MATH_INTERLEAVE vectors an iteration while a kernel
    that calls math functions compiles. Left to its cost model, it takes one vector an iteration
    of such a loop (tanh-GELU's: ~30 dependent operations, its constants partly spilled to the
    stack), and each vector's operations wait on one another; four independent chains keep the
    FP units busy. Medians of ten alternating rounds in one process (two copies of each program,
    compiled with and without), at 14fdd34: over 64K float32 in cache, on one thread, tanh 48.7
    -> 33.7 us, tanh-GELU 58.8 -> 47.6, x * sigmoid(x) 45.3 -> 38.5; over 4M on two threads 1.97
    -> 1.82, 2.59 -> 2.31 and 2.13 -> 2.02 ms; softmax over (1024, 256) 411 -> 385 us. Each
    element gets the same operations: the same bits. A compile holds numba's global lock, so
    the option changes for that compile alone."""
    global _interleaving
    if not on:
        yield
        return
    if _interleaving == 0:
        llvm.set_option("", f"-force-vector-interleave={MATH_INTERLEAVE}")
    _interleaving += 1
    try:
        yield
    finally:
        _interleaving -= 1
        if _interleaving == 0:  # (a loop's compile compiles its row function inside it)
            llvm.set_option("", "-force-vector-interleave=0")


_interleaving = 0  # math kernels compiling now, one inside another


def _kernel_pipeline() -> dict:
    """numba's nopython pipeline less the pass that inlines closures, which a generated kernel
    never defines: the pass's scope fix-up costs time that grows with the square of a function's
    size (~10% of a small conv layer's 340-line gradient). Its passes run
    `_while_a_kernel_compiles`."""
    if CompilerBase is None:
        return {}

    class KernelCompiler(CompilerBase):
        def define_pipelines(self):
            lean = PassManager("halide_ad kernel")
            for pass_class, description in DefaultPassBuilder.define_nopython_pipeline(self.state).passes:
                if pass_class is not InlineClosureLikes:
                    lean.add_pass(pass_class, description)
            lean.finalize()
            return [lean]

        def _compile_core(self):
            with _while_a_kernel_compiles(), _interleaved(_calls_math(self.state.func_id.func)):
                return super()._compile_core()

    return {"pipeline_class": KernelCompiler}


_compile = njit(cache=True, nogil=True, error_model="numpy", no_rewrites=True, no_cfunc_wrapper=True,
                **_noalias(), **_kernel_pipeline())
_LeanCache = _lean_cache()


def kernel(fn):
    """`fn` compiled as the module's doc says, its machine code cached on disk (`_lean_cache`)."""
    dispatcher = _compile(fn)
    if _LeanCache is not None and hasattr(dispatcher, "_cache"):  # (not with NUMBA_DISABLE_JIT)
        dispatcher._cache = _LeanCache(fn)
    return dispatcher


@intrinsic
def branchless(typingctx, cond, a, b):
    """`a if cond else b` as one LLVM select, for kernels whose two values are safe to compute
    either way (codegen decides): numba turns a conditional expression into branches, and nested
    ones (a max pool's argmax test around a leaky relu's) stayed branches that mispredict and
    keep LLVM from vectorizing: that gradient ran 27 ms, against 4 with selects."""
    out = typingctx.unify_types(a, b)
    if out is None:
        return None

    def codegen(context, builder, sig, args):
        c, x, y = (context.cast(builder, v, t, to)
                   for v, t, to in zip(args, sig.args, (numba.types.boolean, out, out), strict=True))
        return builder.select(c, x, y)

    return out(cond, a, b), codegen
