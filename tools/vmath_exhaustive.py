"""Every float32 in a range through one of runtime/vmath.py's functions, against the C library's
float64 function: prints the largest error in float32 ulp and where (about a minute per 2**30
inputs on one core). tests/runtime/test_vmath.py samples; this checks every input.

    python tools/vmath_exhaustive.py tanh 0 10.5      # tanh is odd by construction, 1 above 10
    python tools/vmath_exhaustive.py exp -104 89
    python tools/vmath_exhaustive.py --sigmoid-bits   # sigmoid against its formula through exp

`--sigmoid-bits` checks that vmath.sigmoid_f32 gives, for every float32 but NaNs, the bits of
e / (1 + e) (1 / (1 + e) at x >= 0) with e = vmath.exp_f32(-|x|), which its own scaling reproduces.

The ulp is that of the float64 result rounded to float32; where that rounds below the smallest
normal float, the error counts in steps of the smallest subnormal, as test_vmath judges it.
"""
import argparse
import math

import numpy as np
from numba import njit

from halide_ad.runtime import vmath

REFERENCES = {"tanh": lambda x: math.tanh(x), "exp": lambda x: math.exp(x),
              "erf": lambda x: math.erf(x), "sigmoid": lambda x: 1 / (1 + math.exp(-x))}
SMALLEST_NORMAL = np.float32(1.17549435e-38)


def sweep(fn, reference):
    @njit(nogil=True, error_model="numpy")
    def run(first, last):
        """Inputs whose bits run from `first` to `last`, both included (int64: they may be
        negative floats, whose bits as int32 are negative)."""
        worst, where = 0.0, np.float32(0)
        for b in range(first, last + 1):
            x = vmath.float32_of(np.int32(b if b < 2**31 else b - 2**32))
            exact = reference(np.float64(x))
            rounded = abs(np.float32(exact))
            step = np.spacing(rounded) if rounded >= SMALLEST_NORMAL else np.float32(1e-45)
            error = abs(np.float64(fn(x)) - exact) / np.float64(step)
            if error > worst:
                worst, where = error, x
        return worst, where
    return run


@njit(nogil=True, error_model="numpy")
def sigmoid_mismatches(first, last):
    """(how many, the last) inputs with bits in [first, last) whose sigmoid_f32 differs from its
    formula through exp_f32; NaNs skipped (their payloads may differ)."""
    count, where = 0, np.float32(0)
    for b in range(first, last):
        x = vmath.float32_of(np.int32(b if b < 2**31 else b - 2**32))
        if x != x:
            continue
        e = vmath.exp_f32(-np.abs(x))
        formula = (np.float32(1) if x >= 0 else e) / (np.float32(1) + e)
        if vmath.bits32(vmath.sigmoid_f32(x)) != vmath.bits32(formula):
            count, where = count + 1, x
    return count, where


def bit_range(lo: float, hi: float) -> list[tuple[int, int]]:
    """[lo, hi] as runs of float32 bit patterns (as unsigned integers), each increasing."""
    def bits(v: float) -> int:
        return int(np.array(v, np.float32).view(np.uint32))
    if lo >= 0:
        return [(bits(lo), bits(hi))]
    negative = (bits(min(hi, -0.0)), bits(lo))  # bits grow with a negative float's magnitude
    return [negative] if hi < 0 else [negative, (bits(0.0), bits(hi))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("function", nargs="?", choices=sorted(REFERENCES))
    parser.add_argument("lo", nargs="?", type=float)
    parser.add_argument("hi", nargs="?", type=float)
    parser.add_argument("--sigmoid-bits", action="store_true", help="sigmoid_f32 against its formula through exp_f32")
    args = parser.parse_args()
    if args.sigmoid_bits:
        count, where = sigmoid_mismatches(0, 2**32)
        print(f"sigmoid against e / (1 + e) through exp, every float32 but NaNs: {count} differ"
              + (f" (the last at x = {where!r})" if count else ""))
        return
    if args.hi is None:
        parser.error("give a function and a range, or --sigmoid-bits")
    run = sweep(getattr(vmath, f"{args.function}_f32"), njit(REFERENCES[args.function]))
    worst, where = max(run(first, last) for first, last in bit_range(args.lo, args.hi))
    print(f"{args.function} over every float32 in [{args.lo}, {args.hi}]: "
          f"largest error {worst:.3f} ulp, at x = {where!r}")


if __name__ == "__main__":
    main()
