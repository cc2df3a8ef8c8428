"""Determinism and concurrency, with real numba kernels: gather gradients are bitwise identical
across runs and thread counts; one @hd.func called from several threads traces and compiles once;
processes that fill one disk cache at the same time leave it intact; and a corrupted or stale
cache entry is detected and rebuilt, never trusted.

Few distinct programs are compiled (numba takes seconds each): the shared ones in tests/programs.py,
at shapes the other tests use, so most come from the disk cache.
"""
import hashlib
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np

import halide_ad as hd
from halide_ad import api
from halide_ad.runtime import compile as C
from halide_ad.trace import current
from tests import programs as P

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _python(script: str, *, env: dict | None = None, timeout: int = 600, wait: bool = True):
    """Run `script` in a fresh interpreter at the repository root."""
    args = [sys.executable, "-c", textwrap.dedent(script)]
    full_env = {**os.environ, "HALIDE_AD_JIT": "1", **(env or {})}
    if not wait:
        return subprocess.Popen(args, cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    proc = subprocess.run(args, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


# The gradients that the determinism checks hash, in this process and in children.
GRADIENTS = """
import hashlib
import numpy as np
import halide_ad as hd
from tests import programs as P

def gradient_digest():
    '''A hash of gradients, at the shapes tests/runtime/test_reference.py compiles too.'''
    rng = np.random.default_rng(7)
    h = hashlib.sha256()
    for fn, args in ((P.conv2d, (rng.standard_normal((2, 3, 8, 8)), rng.standard_normal((4, 3, 3, 3)))),
                     (P.blur_pool, (rng.standard_normal((6, 6)),)),
                     (P.blur2d, (rng.standard_normal((5, 6)), "mirror"))):
        out, f_vjp = hd.vjp(fn, *args)
        for g in f_vjp(rng.standard_normal(out.shape)):
            h.update(b"" if g is None else g.tobytes())
    return h.hexdigest()
"""


def test_gather_gradients_are_bitwise_identical_across_runs_and_thread_counts():
    namespace: dict = {}
    exec(GRADIENTS, namespace)
    for fn, args in ((P.conv2d, (np.ones((2, 3, 8, 8)), np.ones((4, 3, 3, 3)))), (P.blur_pool, (np.ones((6, 6)),)),
                     (P.blur2d, (np.ones((5, 6)), "mirror"))):
        forms = hd.explain(fn, *args).forms()
        assert set(forms) <= {"gather", "gather-window"}, (fn, forms)
    digests = {namespace["gradient_digest"]() for _ in range(10)}
    assert len(digests) == 1, "gradients differ between runs"
    (digest,) = digests
    for threads in ("1", "2"):
        # Small loop nests run serially by default; the children run every one in parallel.
        child = _python(GRADIENTS + "\nprint(gradient_digest())",
                        env={"NUMBA_NUM_THREADS": threads, "HALIDE_AD_PARALLEL_MIN_POINTS": "0"})
        assert child.strip() == digest, f"NUMBA_NUM_THREADS={threads} gives other bits"


@hd.func
def threaded(x, w):
    """Traced in test_one_func_from_four_threads_traces_and_compiles_once."""
    _TRACES.append(current().name)  # the trace it runs in: its own, or a caller's it inlines into
    return P.blur3(x, "mirror") * w[0]


_TRACES: list = []


def test_one_func_from_four_threads_traces_and_compiles_once(monkeypatch):
    from halide_ad import compiler
    compiled = []
    real = compiler.compile_kernel

    def counting(source, entry, title, shapes=None):
        compiled.append((title, entry, hashlib.sha256(source.encode()).hexdigest()))
        return real(source, entry, title, shapes)
    monkeypatch.setattr(compiler, "compile_kernel", counting)
    real_trace = api.Function._trace

    def slow_trace(self, *args):
        time.sleep(0.2)  # the other threads reach the trace lock while the first one traces
        return real_trace(self, *args)
    monkeypatch.setattr(api.Function, "_trace", slow_trace)

    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((5, 7)), np.array([0.5, 2.0])
    loss = lambda a, b: hd.sum(threaded(a, b) ** 2)
    barrier = threading.Barrier(4)
    results, errors = [None] * 4, []

    def work(k):
        try:
            barrier.wait()
            out = threaded(x, w)
            g = hd.grad(loss, argnums=(0, 1))(x, w)
            results[k] = (out, *g)
        except Exception as e:  # reported below, with the thread that saw it
            errors.append((k, e))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    assert sorted(_TRACES) == ["<lambda>", "threaded"], f"traced more than once: {_TRACES}"
    blurred = P.numpy_blur3(x, "mirror")
    for out, gx, gw in results:
        np.testing.assert_allclose(out, 0.5 * blurred, rtol=1e-12)
        assert np.array_equal(gx, results[0][1]) and np.array_equal(gw, results[0][2])
    np.testing.assert_allclose(gw, [np.vdot(2 * 0.5 * blurred, blurred), 0.0], rtol=1e-12)
    assert compiled and len(compiled) == len(set(compiled)), f"compiled more than once: {compiled}"


FILL_CACHE = """
import numpy as np
import halide_ad as hd
from tests import programs as P

img = np.random.default_rng(11).standard_normal((7, 9))
out, f_vjp = hd.vjp(P.blur3, img, "mirror")
np.testing.assert_allclose(out, P.numpy_blur3(img, "mirror"), rtol=1e-12)
ct = np.zeros_like(out)
ct[3, 4] = 3.0                                  # blur3[3, 4] reads img[3, 3:6], each / 3
expect = np.zeros_like(img)
expect[3, 3:6] = 1.0
np.testing.assert_allclose(f_vjp(ct)[0], expect, rtol=1e-12)
print("ok")
"""


def _cache_events(output: str) -> tuple[int, int]:
    """(loads, saves) of numba cache data that NUMBA_DEBUG_CACHE=1 reported."""
    return output.count("[cache] data loaded"), output.count("[cache] data saved")


def test_two_processes_filling_one_disk_cache_leave_it_intact(tmp_path):
    env = {"HALIDE_AD_CACHE_DIR": str(tmp_path)}
    procs = [_python(FILL_CACHE, env=env, wait=False) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0 and out.strip() == "ok", out + err
    third = _python(FILL_CACHE, env={**env, "NUMBA_DEBUG_CACHE": "1"})
    loads, saves = _cache_events(third)
    assert third.strip().endswith("ok")
    assert loads >= 2 and saves == 0, third  # every kernel came from the cache, none was rebuilt
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name], "half-written files were left"


CORRUPTIONS = """
import glob, os, sys
import numpy as np
import halide_ad as hd
from halide_ad.api import as_function
from halide_ad.compiler import compile_forward
from halide_ad.runtime.execute import run_forward
from halide_ad.runtime import compile as C
from tests import programs as P

img = np.arange(20.0).reshape(4, 5) ** 1.5
expect = P.numpy_blur3(img, "mirror")
traced, arrays = as_function(P.blur3).trace((img, "mirror"), {})
cache = os.environ["HALIDE_AD_CACHE_DIR"]

def run_fresh():
    '''Forget every kernel this process loaded, compile afresh, run: (result, cache hits, misses).'''
    C._loaded.clear()
    for name in [m for m in sys.modules if m.startswith("k_")]:
        del sys.modules[name]
    kernel = compile_forward(traced.program)
    out = run_forward(traced.program, kernel, arrays)[traced.program.outputs[0]]
    hits = sum(sum(d.stats.cache_hits.values()) for k in C._loaded.values() for d in k.dispatchers)
    misses = sum(sum(d.stats.cache_misses.values()) for k in C._loaded.values() for d in k.dispatchers)
    return out, hits, misses

def files(pattern):
    found = glob.glob(os.path.join(cache, "**", pattern), recursive=True)
    assert found, pattern
    return found

def edit(path, old, new):
    text = open(path).read()
    assert old in text
    open(path, "w").write(text.replace(old, new))

def garble(path, at=None, count=64):
    data = bytearray(open(path, "rb").read())
    start = len(data) // 2 if at is None else at
    for k in range(start, min(start + count, len(data))):
        data[k] ^= 0xA5
    open(path, "wb").write(bytes(data))

out, hits, misses = run_fresh()
np.testing.assert_allclose(out, expect, rtol=1e-12)
out, hits, misses = run_fresh()
assert (hits, misses) == (1, 0), ("a clean entry is reused", hits, misses)

cases = {
    "garbled index": lambda: [garble(p, at=0) for p in files("k_*.nbi")],
    "truncated data": lambda: [os.truncate(p, 100) for p in files("k_*.nbc")],
    "garbled machine code": lambda: [garble(p) for p in files("k_*.nbc")],
    "missing checksums": lambda: [os.remove(p) for p in files("k_*.sha256")],
    "truncated source": lambda: [os.truncate(p, 40) for p in files("k_*.py")],
    "wrong answer in source": lambda: [edit(p, " / 3.0)", " / 4.0)") for p in files("k_*.py")],
}
for name, corrupt in cases.items():
    corrupt()
    out, hits, misses = run_fresh()
    np.testing.assert_allclose(out, expect, rtol=1e-12, err_msg=name)
    assert (hits, misses) == (0, 1), (name, "must be rebuilt, not trusted", hits, misses)
    out, hits, misses = run_fresh()
    assert (hits, misses) == (1, 0), (name, "the rebuilt entry is reused", hits, misses)
print("ok")
"""


def test_corrupted_or_stale_cache_entries_are_rebuilt_not_trusted(tmp_path):
    out = _python(CORRUPTIONS, env={"HALIDE_AD_CACHE_DIR": str(tmp_path)})
    assert out.strip() == "ok", out


def test_generated_source_is_the_same_under_any_hash_seed():
    """A kernel's on-disk cache entry is found by a hash of its source: source that followed
    Python's per-process string hashing (iterating a set of expressions) would be compiled
    again by every new process."""
    script = """
    import hashlib
    import numpy as np
    import halide_ad as hd
    from tests import programs as P
    from tests.runtime.test_schedule import bilinear2x_planes

    rng = np.random.default_rng(0)
    h = hashlib.sha256()
    for fn, args in ((bilinear2x_planes, (rng.standard_normal((2, 3, 6, 8)),)),
                     (P.blur2d, (rng.standard_normal((5, 6)), "mirror")),
                     (P.blur_pool, (rng.standard_normal((6, 6)),)),
                     (P.conv2d, (rng.standard_normal((2, 3, 8, 8)), rng.standard_normal((4, 3, 3, 3))))):
        report = hd.explain(fn, *args)
        h.update((report.forward_source + report.backward_source).encode())
    print(h.hexdigest())
    """
    digests = {_python(script, env={"HALIDE_AD_JIT": "0", "PYTHONHASHSEED": seed}).strip()
               for seed in ("1", "2", "3")}
    assert len(digests) == 1, digests


def test_a_garbled_data_file_after_a_missing_one_is_not_trusted(tmp_path, monkeypatch):
    """A kernel's cache files are named from numba's numbering (data files 1, 2, ... as overloads
    are added), not listed; a file after a gap in it is still checked, from the checksums."""
    monkeypatch.setenv("HALIDE_AD_CACHE_DIR", str(tmp_path))
    kernel = C.compile_kernel("@kernel\ndef twice_after_gap(x, out):\n    out[0] = x[0] * 2\n", "twice_after_gap", "test")
    kernel(np.ones(1), np.zeros(1))
    kernel(np.ones(1, np.int64), np.zeros(1, np.int64))  # a second overload: a second data file
    folder, files = kernel.machine_code()
    first, second = sorted(f for f in files if f.endswith(".nbc"))
    os.remove(os.path.join(folder, first))
    with open(os.path.join(folder, second), "r+b") as fh:
        fh.seek(100)
        fh.write(b"\xa5" * 64)
    C._discard_untrusted_machine_code(kernel, forget=False)
    assert not os.path.exists(os.path.join(folder, second))
