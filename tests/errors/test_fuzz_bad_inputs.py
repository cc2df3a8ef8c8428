"""Fuzzed bad input: wrong shapes, ranks, dtypes, argument counts, non-arrays, NaNs, out-of-range
index data, huge or negative sizes, given to the shared test programs. Only HalideADError
subclasses may come out (NaN and Inf are data, not errors), and nothing may hang.

The in-process fuzzer runs kernels as plain Python (HALIDE_AD_JIT=0), where nothing can crash;
the cases that could crash a compiled kernel (out-of-range indices, huge sizes, NaN) run with real
numba in a subprocess. HALIDE_AD_FUZZ_EXAMPLES raises the example count (CI: 300).
"""
import contextlib
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import halide_ad as hd
from tests import programs as P

EXAMPLES = int(os.environ.get("HALIDE_AD_FUZZ_EXAMPLES", "300"))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@hd.func
def gather(t, idx):
    """A data-dependent read: checked at run time."""
    return hd.compute(idx.shape, lambda i: t[idx[i]] * 2.0, name="gather")


@hd.func
def tile(x, n):
    """A static size: the output has n elements."""
    return hd.compute((n,), lambda i: x[i % x.shape[0]], name="tile")


# (function, a good value for each argument; arrays are fuzzed, the rest is kept)
TARGETS = {
    "blur3": (P.blur3, lambda rng: [rng.standard_normal((3, 4)), "mirror"]),
    "conv2d": (P.conv2d, lambda rng: [rng.standard_normal((1, 2, 4, 4)), rng.standard_normal((2, 2, 2, 2))]),
    "maxpool2": (P.maxpool2, lambda rng: [rng.standard_normal((1, 1, 4, 4))]),
    "dense": (P.dense, lambda rng: [rng.standard_normal((2, 3)), rng.standard_normal((3, 2)),
                                    rng.standard_normal(2)]),
    "softmax": (P.softmax, lambda rng: [rng.standard_normal((2, 3))]),
    "fan_out": (P.fan_out, lambda rng: [rng.standard_normal(4)]),
    "blur1d": (P.blur1d, lambda rng: [rng.standard_normal(5), "constant_exterior"]),
    "gather": (gather, lambda rng: [rng.standard_normal(4), np.array([0, 3, 1])]),
    "tile": (tile, lambda rng: [rng.standard_normal(3), 5]),
}
DTYPES = ["float64", "float32", "int64", "int32", "uint8", "bool", "complex128", "float16", ">f8",
          "<U2", "datetime64[s]", "object"]
NON_ARRAYS = [None, 3, 2.5, "abc", [1.0, 2.0], (1, 2), {}, np.float64(1.0), object(), np.ma.masked]
BAD_SIZES = [0, -3, 2.5, None, "n", 2**40, 10**20, -(2**63)]


@st.composite
def corruptions(draw):
    """(target name, [(argument position, corruption)], operation)."""
    name = draw(st.sampled_from(sorted(TARGETS)))
    kinds = st.sampled_from(["shape", "dtype", "nan", "non_array", "index", "size", "count"])
    changes = [(draw(st.integers(0, 3)), draw(kinds)) for _ in range(draw(st.integers(1, 2)))]
    details = [draw(_detail(kind)) for _, kind in changes]
    return name, [(pos, kind, d) for (pos, kind), d in zip(changes, details, strict=True)], \
        draw(st.sampled_from(["call", "vjp", "grad"]))


@st.composite
def _detail(draw, kind):
    if kind == "shape":
        return tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=5)))
    if kind == "dtype":
        return draw(st.sampled_from(DTYPES))
    if kind == "nan":
        return draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    if kind == "non_array":
        return draw(st.integers(0, len(NON_ARRAYS) - 1))
    if kind == "index":
        return draw(st.sampled_from([-1, 4, 10**9, -(2**40), 2**62]))
    if kind == "size":
        return draw(st.sampled_from(BAD_SIZES))
    return draw(st.sampled_from(["drop", "extra"]))


def corrupt(args: list, changes, rng) -> tuple[list, bool]:
    """The corrupted arguments, and whether only data values (NaN, Inf) changed."""
    args = list(args)
    only_values = True
    for pos, kind, detail in changes:
        if kind == "count":
            args = args[:-1] if detail == "drop" else args + [np.ones(2)]
            only_values = False
            continue
        if not args:
            continue
        pos %= len(args)
        a = args[pos]
        if kind == "size":
            if isinstance(a, int):
                args[pos] = detail
                only_values = False
            continue
        if not isinstance(a, np.ndarray):
            continue  # static options (view names) stay: a bad one is the user's own KeyError
        only_values &= kind == "nan"
        if kind == "shape":
            args[pos] = rng.standard_normal(detail).astype(a.dtype)
        elif kind == "dtype":
            try:
                args[pos] = a.astype(detail) if detail != "datetime64[s]" else a.astype(np.int64).astype(detail)
            except (TypeError, ValueError, RuntimeError):  # e.g. strings to ints: keep the array
                pass
        elif kind == "nan" and a.dtype.kind == "f" and a.size:
            a = np.array(a)  # a plain, writable copy
            a.reshape(-1)[rng.integers(0, a.size)] = detail
            args[pos] = a
        elif kind == "non_array":
            args[pos] = NON_ARRAYS[detail]
        elif kind == "index" and a.dtype == np.int64 and a.size:
            a = np.array(a)  # a plain, writable copy
            a[rng.integers(0, a.size)] = detail
            args[pos] = a
    return args, only_values


@contextlib.contextmanager
def no_hang(seconds: float):
    """Fail, instead of waiting forever, if the block runs longer than `seconds`."""
    def alarm(*_):
        raise TimeoutError(f"hung for more than {seconds} s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run(fn, args, op):
    if op == "call":
        return fn(*args)
    if op == "vjp":
        out, f_vjp = hd.vjp(fn, *args)
        return f_vjp(np.ones_like(out))
    return hd.grad(lambda *a: hd.sum(fn(*a)))(*args)


@pytest.fixture(autouse=True)
def _interpreted(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_JIT", "0")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=corruptions(), seed=st.integers(0, 2**16))
def test_bad_input_raises_only_halide_ad_errors(case, seed):
    name, changes, op = case
    fn, good = TARGETS[name]
    rng = np.random.default_rng(seed)
    with np.errstate(all="ignore"):
        args, only_values = corrupt(good(rng), changes, rng)
    try:
        with np.errstate(all="ignore"), no_hang(20):
            run(fn, args, op)
    except hd.HalideADError:
        assert not only_values, "NaN and Inf are data, not errors"
    except Exception as e:  # anything else is a bug: say which input caused it
        raise AssertionError(f"{name}{tuple(_describe(a) for a in args)} via {op} raised "
                             f"{type(e).__name__}: {e}") from e


def _describe(a):
    return f"array{a.shape}:{a.dtype}" if isinstance(a, np.ndarray) else repr(a)


def test_bad_input_to_compiled_kernels_in_a_subprocess(tmp_path):
    """Real numba kernels, where a wrong index would read or write out of bounds: out-of-range
    index data (forward and gradient), NaN and Inf, huge sizes. The child must exit cleanly."""
    script = textwrap.dedent("""
        import numpy as np
        import halide_ad as hd
        from tests.errors.test_fuzz_bad_inputs import gather, tile
        from tests import programs as P

        t = np.arange(4.0)
        for bad in (-1, 4, 10**9, -(2**40), 2**62, np.iinfo(np.int64).min):
            for attempt in (lambda: gather(t, np.array([0, bad, 1])),
                            lambda: hd.vjp(gather, t, np.array([bad, 0, 1]))[1](np.ones(3))):
                try:
                    attempt()
                    raise SystemExit(f"index {bad} was not caught")
                except hd.BoundsError as e:
                    assert f"was {bad}, outside dimension 0 of t" in str(e), e
        out = gather(t, np.array([3, 0, 2]))
        assert out.tolist() == [6.0, 0.0, 4.0], out        # the kernel is still healthy
        for size in (2**40, 2**50, 10**20, -3, 0):
            try:
                tile(t, size)
                raise SystemExit(f"size {size} was not refused")
            except hd.ShapeError:
                pass
        x = np.arange(8.0)
        x[[1, 6]] = np.nan, np.inf
        np.testing.assert_array_equal(P.fan_out(x)[[2, 4, 7]], P.fan_out(np.arange(8.0))[[2, 4, 7]])
        print("ok")
    """)
    env = {**os.environ, "HALIDE_AD_JIT": "1", "HALIDE_AD_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
