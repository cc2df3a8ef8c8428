"""The float32 math of generated kernels (runtime/vmath.py): accuracy in ulp against float64,
IEEE special values, vectorized loops, and its use by the code generator."""
import itertools
import math
import re

import numpy as np
import pytest
from numba import njit

import halide_ad as hd
from halide_ad.runtime import vmath
from halide_ad.runtime.vmath import nonneg

MAX_ULP = 3.0
TINY = np.float32(1.17549435e-38)  # below it results are subnormal: judged in absolute terms
SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, TINY, -TINY, 3.4028235e38,
                    -3.4028235e38, 1, -1, 0.5, -0.5, 0.625, -0.625, 1e-20, -1e-20, 88.72, 88.73, -87.3,
                    -103.9, -104, -200, 200, 119.99, 120, -120, 3.92, 1e10], np.float32)

_erf = np.vectorize(math.erf, otypes=[np.float64])
REFERENCES = {"exp": np.exp, "log": np.log, "log1p": np.log1p, "tanh": np.tanh,
              "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "sin": np.sin, "cos": np.cos, "erf": _erf}


def _loop(fn):
    @njit(nogil=True, error_model="numpy")
    def loop(out, x):
        for i in range(x.size):
            out[nonneg(i)] = fn(x[nonneg(i)])
    return loop


_LOOPS = {name: _loop(getattr(vmath, f"{name}_f32")) for name in REFERENCES}


@njit(nogil=True, error_model="numpy")
def _pow_loop(out, x, y):
    for i in range(x.size):
        out[nonneg(i)] = vmath.pow_f32(x[nonneg(i)], y[nonneg(i)])


def _random_floats(count: int, seed: int) -> np.ndarray:
    """Uniform bit patterns: every exponent equally likely, so the whole float32 range."""
    bits = np.random.default_rng(seed).integers(0, 2**32, count, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    return x[np.isfinite(x)]


def _sweep(name: str) -> np.ndarray:
    near = {"exp": (-110, 95), "log": (0, 4), "log1p": (-1, 2), "tanh": (-12, 12), "erf": (-5, 5),
            "sigmoid": (-110, 40),
            "sin": (-1000, 1000), "cos": (-1000, 1000)}[name]
    x = np.concatenate([np.linspace(*near, 200_001, dtype=np.float32), _random_floats(100_000, 1)])
    return np.abs(x) if name == "log" else x


def _compare(value: np.ndarray, exact: np.ndarray, x: np.ndarray, what: str) -> None:
    """Within MAX_ULP where the result is a normal float; the same special value otherwise;
    within 2 of the smallest subnormals where it underflows."""
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = exact.astype(np.float32)
    normal = np.isfinite(rounded) & (np.abs(rounded) >= TINY)
    ulp = np.abs(value[normal] - exact[normal]) / np.spacing(np.abs(rounded[normal])).astype(np.float64)
    worst = int(np.argmax(ulp)) if ulp.size else None
    assert ulp.size == 0 or ulp[worst] <= MAX_ULP, \
        f"{what}: {ulp[worst]:.2f} ulp at x = {x[normal][worst]!r}"
    rest = ~normal
    same = (value[rest] == rounded[rest]) | (np.isnan(value[rest]) & np.isnan(rounded[rest]))
    subnormal = np.isfinite(rounded[rest]) & (np.abs(value[rest] - exact[rest]) <= 3e-45)
    ok = same | subnormal
    assert ok.all(), f"{what}: at x = {x[rest][~ok][:5]} gave {value[rest][~ok][:5]}, not {rounded[rest][~ok][:5]}"
    signs = np.signbit(value[rest]) == np.signbit(rounded[rest])
    assert (signs | np.isnan(rounded[rest])).all(), f"{what}: wrong sign at x = {x[rest][~signs][:5]}"


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_accuracy_over_the_float32_range(name):
    x = _sweep(name)
    out = np.empty_like(x)
    _LOOPS[name](out, x)
    with np.errstate(all="ignore"):
        _compare(out, REFERENCES[name](x.astype(np.float64)), x, name)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_special_values(name):
    out = np.empty_like(SPECIAL)
    _LOOPS[name](out, SPECIAL)
    with np.errstate(all="ignore"):
        _compare(out, REFERENCES[name](SPECIAL.astype(np.float64)), SPECIAL, name)


def test_pow_accuracy_and_special_values():
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.uniform(0, 10, 100_000), rng.uniform(-10, 10, 100_000)]).astype(np.float32)
    y = np.concatenate([rng.uniform(-30, 30, 100_000), np.round(rng.uniform(-20, 20, 100_000))]).astype(np.float32)
    grid = np.array([0, -0.0, 1, -1, 0.5, -0.5, 2, -2, 3, -3, 2.5, -2.5, np.inf, -np.inf, np.nan, 1e-45,
                     3e38, 1e10], np.float32)
    sx, sy = (np.array(v, np.float32) for v in zip(*itertools.product(grid, grid)))
    for a, b in ((x, y), (sx, sy)):
        out = np.empty_like(a)
        _pow_loop(out, a, b)
        with np.errstate(all="ignore"):
            _compare(out, np.power(a.astype(np.float64), b.astype(np.float64)), np.stack([a, b], 1), "pow")


@njit(nogil=True, error_model="numpy")
def _sigmoid_through_exp(out, x):
    for i in range(x.size):
        e = vmath.exp_f32(-np.abs(x[nonneg(i)]))
        out[nonneg(i)] = (np.float32(1) if x[nonneg(i)] >= 0 else e) / (np.float32(1) + e)


def test_sigmoid_gives_the_bits_of_its_formula_through_exp():
    """sigmoid forms exp(-|x|) scaled by 2**65 (a normal float where the result underflows):
    the same bits as e = exp(-|x|), e / (1 + e), subnormal results and special values too."""
    x = np.concatenate([_sweep("sigmoid"), np.linspace(-104.5, -86, 100_001, dtype=np.float32), SPECIAL])
    got, want = np.empty_like(x), np.empty_like(x)
    _LOOPS["sigmoid"](got, x)
    _sigmoid_through_exp(want, x)
    np.testing.assert_array_equal(got.view(np.int32)[~np.isnan(x)], want.view(np.int32)[~np.isnan(x)])
    assert np.isnan(got[np.isnan(x)]).all()


@pytest.mark.parametrize("name", ["exp", "tanh", "log", "erf", "sigmoid"])
def test_loops_vectorize(name):
    """A loop over the function becomes vector instructions, with contiguous loads (no gathers),
    and the fused multiply-adds of exp, tanh and erf stay fused in vectors."""
    loop = _LOOPS[name]
    x = np.ones(8, np.float32)
    loop(np.empty_like(x), x)  # compiled here too: under xdist the accuracy tests may run elsewhere
    llvm = loop.inspect_llvm(loop.signatures[0])
    assert re.search(r"<\d+ x float>", llvm), f"{name}'s loop did not vectorize"
    assert "gather" not in llvm
    if name != "log":
        assert re.search(r"@llvm\.fma\.v\d+f32", llvm), f"{name}'s fma did not vectorize"


def test_inverse_pi_table_matches_the_known_digits():
    # ARM optimized-routines' __inv_pio4 opens 0xa2, 0xa2f9, 0xa2f983, 0xa2f9836e, 0xf9836e4e
    assert [int(v) for v in vmath._INV_PIO4[:5]] == [0xA2, 0xA2F9, 0xA2F983, 0xA2F9836E, 0xF9836E4E]


# ---- through the compiler ------------------------------------------------------------------------

@hd.func
def _everyday(x):
    return hd.compute(x.shape, lambda i: hd.tanh(x[i]) + hd.exp(x[i] * 0.5) + hd.log1p(x[i] * x[i])
                      + hd.sin(x[i]) * hd.cos(x[i]) + hd.erf(x[i]) + hd.sigmoid(x[i])
                      + hd.pow(hd.abs(x[i]) + 1, x[i]) + x[i] ** 3)


def _everyday_numpy(x):
    a = np.abs(x) + 1
    return (np.tanh(x) + np.exp(x * 0.5) + np.log1p(x * x) + np.sin(x) * np.cos(x) + _erf(x)
            + 1 / (1 + np.exp(-x)) + a ** x + x ** 3)


@pytest.mark.parametrize("dtype, rtol", [("float32", 3e-6), ("float64", 1e-13)])
def test_programs_agree_with_numpy(dtype, rtol):
    x = np.linspace(-4, 4, 2001).astype(dtype)
    got = _everyday(x)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, _everyday_numpy(x.astype(np.float64)), rtol=rtol, atol=rtol)


def test_float32_kernels_call_vmath_and_float64_ones_numpy():
    x32 = np.linspace(-1, 1, 16).astype(np.float32)
    source32 = hd.explain(_everyday, x32).forward_source
    for fn in ("tanh", "exp", "log1p", "sin", "cos", "erf", "sigmoid", "pow"):
        assert f"vmath.{fn}_f32(" in source32
    source64 = hd.explain(_everyday, x32.astype(np.float64)).forward_source
    assert not re.search(r"\bvmath\.\w+\(", source64) and "np.tanh(" in source64


def test_gradients_through_vectorized_math():
    x = np.linspace(-2, 2, 7)
    hd.check_grad(_everyday, x)
    x32 = x.astype(np.float32)
    g = hd.grad(lambda v: hd.sum(_everyday(v)))(x32)
    g64 = hd.grad(lambda v: hd.sum(_everyday(v)))(x)
    np.testing.assert_allclose(g, g64, rtol=2e-5, atol=2e-5)
