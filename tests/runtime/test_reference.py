"""Compiled kernels against the numpy reference interpreter: forward values, and gradients against
the direct serial-scatter reference (which never uses the solver)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import halide_ad as hd
from halide_ad.api import as_function
from halide_ad.runtime.reference import evaluate
from tests.programs import scatter_adjoints
from tests import programs as P

CASES = {
    "blur2d_mirror": (P.blur2d, lambda rng: (rng.standard_normal((5, 6)), "mirror")),
    "conv2d": (P.conv2d, lambda rng: (rng.standard_normal((2, 2, 5, 6)), rng.standard_normal((3, 2, 2, 3)))),
    "maxpool2": (P.maxpool2, lambda rng: (rng.integers(0, 3, (1, 2, 4, 6)).astype(np.float64),)),
    "softmax": (P.softmax, lambda rng: (rng.standard_normal((3, 5)),)),
    "blur_pool": (P.blur_pool, lambda rng: (rng.standard_normal((6, 6)),)),
    "fan_out": (P.fan_out, lambda rng: (rng.standard_normal(5),)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_equals_reference(name, rng):
    fn, make = CASES[name]
    args = make(rng)
    traced, arrays = as_function(fn).trace(args, {})
    expect = evaluate(traced.program, arrays)
    got = traced.run(arrays)
    assert set(traced.program.outputs) <= got.keys()
    for f in traced.program.funcs:
        if f.name in got:  # (not the Funcs the forward computes where they are read)
            np.testing.assert_allclose(got[f.name].reshape(f.shape), expect[f.name], rtol=1e-12, atol=1e-12)
    out, f_vjp = hd.vjp(fn, *args)
    ct = rng.integers(-3, 4, np.shape(out)).astype(np.float64)
    wrt = tuple(n for n in traced.arg_names if n is not None)
    ref = scatter_adjoints(traced.program, wrt, arrays | expect, {traced.program.outputs[0]: ct})
    for name_, g in zip(traced.arg_names, f_vjp(ct), strict=True):
        if name_ is not None:
            np.testing.assert_allclose(g, ref[name_], rtol=1e-12, atol=1e-12)


def test_gather_gradients_are_bitwise_deterministic(rng):
    x, w = rng.standard_normal((2, 3, 8, 8)), rng.standard_normal((4, 3, 3, 3))
    _, f_vjp = hd.vjp(P.conv2d, x, w)
    ct = rng.standard_normal((2, 4, 6, 6))
    first = f_vjp(ct)
    for _ in range(3):
        again = f_vjp(ct)
        assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))


def _in_a_fresh_process(code: str, cache_dir) -> str:
    """What `code` prints, run by a new Python in the repository root with this cache dir."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "HALIDE_AD_CACHE_DIR": str(cache_dir)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                          cwd=root).stdout


def test_second_process_reuses_disk_cache(tmp_path):
    """A second process with the same program loads numba's cached machine code."""
    code = ("import numpy as np, time; from tests import programs as P; t = time.perf_counter(); "
            "P.blur3(np.ones((3, 4)), 'mirror'); print(time.perf_counter() - t)")
    _in_a_fresh_process(code, tmp_path)
    assert any(p.name.startswith("k_") for p in tmp_path.iterdir())
    index_files = {p.name for p in tmp_path.rglob("*.nbi")}
    assert index_files, "numba wrote no on-disk cache index"
    _in_a_fresh_process(code, tmp_path)
    assert {p.name for p in tmp_path.rglob("*.nbi")} == index_files


WARM_SCRIPT = """
import json, sys
import numpy as np
import halide_ad as hd
from halide_ad.runtime import compile as kernels
from tests import programs as P

rng = np.random.default_rng(0)
results = {}
for dtype in (np.float32, np.float64):
    x, w = rng.standard_normal((2, 3, 7, 6)).astype(dtype), rng.standard_normal((4, 3, 3, 2)).astype(dtype)
    img = rng.standard_normal((5, 6)).astype(dtype)[:, ::2]  # not contiguous
    for name, fn, args in (("conv2d", P.conv2d, (x, w)), ("blur3", P.blur3, (img, "repeat_edge"))):
        out, f_vjp = hd.vjp(fn, *args)
        grads = f_vjp(np.cos(out))
        results[f"{name}/{np.dtype(dtype)}"] = [np.asarray(a).tolist() for a in (out, *grads)]
dispatchers = [d for k in kernels._loaded.values() for d in k.dispatchers]
results["compiled"] = sum(sum(d._cache_misses.values()) for d in dispatchers)
results["loaded"] = sum(sum(d._cache_hits.values()) for d in dispatchers)
results["registries"] = "numba.np.arraymath" in sys.modules
print(json.dumps(results))
"""


def test_a_warm_process_loads_kernels_without_numbas_compiler_setup(tmp_path):
    """With the disk cache warm, a process loads every kernel's machine code and computes the
    same bits, without numba's typing and lowering registries (`parallel._lean_cache`: half a
    second, scipy's import included, in the first call of a process)."""
    cold, warm = (json.loads(_in_a_fresh_process(WARM_SCRIPT, tmp_path)) for _ in range(2))
    assert cold["compiled"] > 0 and cold["registries"]
    assert warm["compiled"] == 0 and warm["loaded"] == cold["compiled"]
    assert not warm["registries"]
    for case in ("conv2d/float32", "conv2d/float64", "blur3/float32", "blur3/float64"):
        assert warm[case] == cold[case], case
    x = np.asarray(cold["conv2d/float64"][0])
    assert x.shape == (2, 4, 5, 5) and np.isfinite(x).all()


def test_an_adjoint_is_let_go_after_its_last_reader():
    """adj_b of c = 2 b, b = 3 a, a = x + 1: read by adj_a's scatter, then free while adj_x's runs
    (a recycled buffer for it, on the interpreter); the gradients are kept."""
    import weakref
    from halide_ad.ad import reverse_mode
    from halide_ad.runtime import reference

    def chain(x):
        a = hd.compute(x.shape, lambda i: x[i] + 1, name="a")
        b = hd.compute(x.shape, lambda i: a[i] * 3, name="b")
        return hd.compute(x.shape, lambda i: b[i] * 2, name="c")
    traced, arrays = as_function(chain).trace((np.ones(4),), {})
    program = traced.program
    made, alive = [], {}
    def zeros(shape, dtype):
        made.append(weakref.ref(a := np.zeros(shape, dtype)))
        return a
    def scatters(group, adj, buffers):
        for s in group:
            alive[s.buffer] = [r() is not None for r in made]
            reference._scatter(s, adj, buffers)
    grads = reference.scatter_adjoints(program, reverse_mode(program, ("x",)), ("x",), arrays | evaluate(program, arrays),
                                       {"c": np.ones(4)}, scatters=scatters, zeros=zeros)
    # adj_b, adj_a, adj_x made in turn: adj_b is let go before adj_x's scatter runs
    assert alive == {"b": [True], "a": [True, True], "x": [False, True, True]}
    np.testing.assert_array_equal(grads["x"], np.full(4, 6.0))


def test_a_forward_keeps_what_it_is_asked_for_and_lets_the_rest_go():
    """c = 2 b, b = 3 a, a = x + 1, keeping c: a is let go once b is computed, before c."""
    import weakref
    from halide_ad.runtime import reference

    def chain(x):
        a = hd.compute(x.shape, lambda i: x[i] + 1, name="a")
        b = hd.compute(x.shape, lambda i: a[i] * 3, name="b")
        return hd.compute(x.shape, lambda i: b[i] * 2, name="c")
    traced, arrays = as_function(chain).trace((np.arange(4.0),), {})
    made, alive = {}, {}
    def func(f, buffers):
        alive[f.name] = sorted(name for name, r in made.items() if r() is not None)
        value, arg = reference._func(f, buffers)
        made[f.name] = weakref.ref(value)
        return value, arg
    out = evaluate(traced.program, arrays, func=func, keep={"c"})
    assert set(out) == {"c"} and alive == {"a": [], "b": ["a"], "c": ["b"]}
    np.testing.assert_array_equal(out["c"], evaluate(traced.program, arrays)["c"])
