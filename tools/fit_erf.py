"""Fit the coefficients of runtime/vmath.py's erf_f32 (needs scipy): prints them and the largest
error, in float32 ulp, of the polynomials evaluated in float32.

    erf(x) = x * P(x**2)                     for |x| < 1, P of degree 6
    erf(x) = 1 - exp(-x**2) * Q(1 / x)       for 1 <= |x|, Q of degree 8 (fitted on [1, 3.95];
                                             above 3.92 erf rounds to 1 in float32)

Least squares on 4000 Chebyshev nodes, weighted by 1 / |f|: close to minimax at these degrees.
"""
import numpy as np
from scipy.special import erf, erfcx


def fit(f, lo: float, hi: float, degree: int, variable):
    k = np.arange(4000)
    x = (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (k + 0.5) / len(k))
    y = f(x)
    basis = np.vander(variable(x), degree + 1)
    coefficients, *_ = np.linalg.lstsq(basis / np.abs(y)[:, None], np.sign(y), rcond=None)
    return coefficients.astype(np.float32)


def horner(coefficients, t):
    p = coefficients[0]
    for c in coefficients[1:]:
        p = p * t + c
    return p


def ulps(value, x):
    exact = erf(x.astype(np.float64))
    return np.max(np.abs(value - exact) / np.spacing(exact.astype(np.float32)))


small = fit(lambda x: erf(x) / x, 1e-6, 1, 6, lambda x: x * x)
large = fit(erfcx, 1, 3.95, 8, lambda x: 1 / x)
x = np.linspace(1e-4, 1, 200001, dtype=np.float32)
print("P:", [float(c) for c in small], f"max {ulps(x * horner(small, x * x), x):.2f} ulp")
x = np.linspace(1, 3.95, 200001, dtype=np.float32)
print("Q:", [float(c) for c in large],
      f"max {ulps(np.float32(1) - np.exp(-x * x) * horner(large, np.float32(1) / x), x):.2f} ulp")
