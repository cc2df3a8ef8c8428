"""Denoise and deblur an image by Newton's method, with Hessian-vector products from halide_ad.

The observed image is a clean synthetic image (discs and a ramp) through a 5-point blur, plus
noise. The estimate u minimizes

    E(u) = 0.5 * sum (blur(u) - observed)^2  +  lam * sum sqrt(|grad u|^2 + eps)

a data term through a blur with clamped edges plus a smoothed total variation. Newton's method
solves H p = -g at each step by conjugate gradients, where every product H v is

    hd.jvp(lambda u: grad_energy(u, observed), (u,), (v,))[1]

forward mode over the reverse-mode gradient, compiled once into one program (gathers only, no
atomics). It is compared with plain gradient descent (step 1/L) and, if scipy is installed, with
L-BFGS (scipy.optimize.minimize, the gradient from hd.value_and_grad), all stopping when the
gradient's norm falls below 1e-5 of its first value or at their iteration limit.

Run: python examples/newton_denoise.py                  # 256x256: iterations, time, energy, PSNR
     python examples/newton_denoise.py --quick          # 64x64, fewer iterations
     python examples/newton_denoise.py --plot out.png   # also plot the energy per iteration
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

import halide_ad as hd
from halide_ad import tiered

try:  # (imported here, outside the timings)
    from scipy.optimize import minimize
except ImportError:
    minimize = None

LAM, EPS = 0.05, 1e-3  # the weight of the total variation, and its smoothing
TOLERANCE = 1e-5  # stop when |gradient| <= TOLERANCE * |first gradient|


@hd.func
def energy(u, observed):
    c = hd.repeat_edge(u)
    blur = hd.compute(u.shape, lambda y, x: (c[y - 1, x] + c[y + 1, x] + c[y, x - 1] + c[y, x + 1]
                                             + 4 * c[y, x]) / 8, name="blur")
    tv = hd.compute(u.shape, lambda y, x: hd.sqrt((c[y, x + 1] - c[y, x]) ** 2 + (c[y + 1, x] - c[y, x]) ** 2
                                                  + EPS), name="tv")
    return 0.5 * hd.sum((blur - observed) ** 2) + LAM * hd.sum(tv)


value_and_grad = hd.value_and_grad(energy)
grad_energy = hd.grad(energy)


@hd.func
def hvp(u, observed, v):
    """The Hessian of the energy at u times v: forward mode over reverse mode."""
    return hd.jvp(lambda u: grad_energy(u, observed), (u,), (v,))[1]


def synthetic(size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(clean, observed): discs on a ramp, and the same blurred with noise added."""
    y, x = np.mgrid[:size, :size] / size
    clean = 0.3 * x
    for cy, cx, r, level in ((0.3, 0.3, 0.15, 0.8), (0.65, 0.6, 0.2, 0.5), (0.7, 0.25, 0.1, 1.0)):
        clean = np.where((y - cy) ** 2 + (x - cx) ** 2 < r * r, level, clean)
    p = np.pad(clean, 1, mode="edge")
    blurred = (p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] + 4 * p[1:-1, 1:-1]) / 8
    return clean, blurred + 0.05 * rng.standard_normal(clean.shape)


def psnr(u: np.ndarray, clean: np.ndarray) -> float:
    return float(10 * np.log10(1.0 / np.mean((u - clean) ** 2)))


def gradient_descent(u, observed, iterations: int) -> tuple[list[float], np.ndarray]:
    """Steps of 1/L, L bounding the Hessian: 1 for the data term (the blur's weights sum to 1),
    8 lam / sqrt(eps) for the total variation."""
    step = 1.0 / (1.0 + 8 * LAM / np.sqrt(EPS))
    energies, g0 = [], None
    for _ in range(iterations):
        e, g = value_and_grad(u, observed)
        energies.append(float(e))
        g0 = np.linalg.norm(g) if g0 is None else g0
        if np.linalg.norm(g) <= TOLERANCE * g0:
            break
        u = u - step * g
    return energies, u


def conjugate_gradients(apply: Callable[[np.ndarray], np.ndarray], b: np.ndarray, iterations: int,
                        tolerance: float) -> tuple[np.ndarray, int]:
    """An approximate solution of A x = b (A positive definite, given by its products), and the
    products it took."""
    x, r = np.zeros_like(b), b.copy()
    p, rr = r.copy(), np.vdot(r, r)
    for k in range(iterations):
        ap = apply(p)
        alpha = rr / np.vdot(p, ap)
        x += alpha * p
        r -= alpha * ap
        rr_new = np.vdot(r, r)
        if np.sqrt(rr_new) <= tolerance:
            return x, k + 1
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x, iterations


def newton_cg(u, observed, iterations: int, cg_iterations: int) -> tuple[list[float], np.ndarray, int]:
    """Newton steps, each solved by CG to a forcing tolerance min(0.5, sqrt|g|) |g| and damped by a
    backtracking line search. Returns the energies, the result and the number of Hessian-vector
    products."""
    energies, products, g0 = [], 0, None
    for _ in range(iterations):
        e, g = value_and_grad(u, observed)
        energies.append(float(e))
        norm = np.linalg.norm(g)
        g0 = norm if g0 is None else g0
        if norm <= TOLERANCE * g0:
            break
        p, used = conjugate_gradients(lambda v: hvp(u, observed, v), -g, cg_iterations,
                                      min(0.5, np.sqrt(norm)) * norm)
        products += used
        t, slope = 1.0, np.vdot(g, p)
        while float(energy(u + t * p, observed)) > e + 1e-4 * t * slope and t > 1e-8:
            t *= 0.5
        u = u + t * p
    return energies, u, products


def lbfgs(u, observed, iterations: int) -> tuple[list[float], np.ndarray] | None:
    """scipy's L-BFGS-B, stopped by the same test as the others (None without scipy)."""
    if minimize is None:
        return None
    last = {}  # the latest evaluation, which the callback reads rather than evaluating again

    def fun(flat):
        e, g = value_and_grad(flat.reshape(u.shape), observed)
        last.update(x=flat.copy(), e=float(e), norm=np.linalg.norm(g))
        return float(e), g.ravel()

    fun(u.ravel())
    energies, g0 = [last["e"]], last["norm"]

    def callback(xk):
        if not np.array_equal(xk, last["x"]):
            fun(xk)
        energies.append(last["e"])
        if last["norm"] <= TOLERANCE * g0:
            raise StopIteration

    result = minimize(fun, u.ravel(), jac=True, method="L-BFGS-B", callback=callback,
                      options={"maxiter": iterations, "gtol": 0.0, "ftol": 0.0})
    return energies, result.x.reshape(u.shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a 64x64 image and fewer iterations")
    parser.add_argument("--size", type=int, help="image side (default 256, 64 with --quick)")
    parser.add_argument("--plot", help="write a plot of the energy per iteration to this file (matplotlib)")
    args = parser.parse_args()
    size = args.size or (64 if args.quick else 256)
    limits = {"gradient descent": 300 if args.quick else 3000, "L-BFGS": 200 if args.quick else 1000,
              "Newton-CG": 30}
    clean, observed = synthetic(size, np.random.default_rng(0))
    u0 = observed.copy()
    # compile every program once, outside the timings, and wait until the kernels run (tiered
    # execution interprets small programs while their kernels compile in the background)
    value_and_grad(u0, observed), hvp(u0, observed, u0), energy(u0, observed)
    tiered.settle()

    runs: dict[str, list[float]] = {}
    print(f"{size}x{size} image, observed PSNR {psnr(observed, clean):.2f} dB; stopping at "
          f"|gradient| <= {TOLERANCE:g} |first gradient|")
    print(f"{'method':<18}{'iterations':>11}{'products':>10}{'time (s)':>10}{'energy':>14}{'PSNR (dB)':>11}")
    for name in limits:
        start = time.perf_counter()
        products = "–"
        if name == "gradient descent":
            energies, u = gradient_descent(u0, observed, limits[name])
        elif name == "L-BFGS":
            result = lbfgs(u0, observed, limits[name])
            if result is None:
                print(f"{name:<18} skipped: scipy is not installed")
                continue
            energies, u = result
        else:
            energies, u, count = newton_cg(u0, observed, limits[name], cg_iterations=50)
            products = str(count)
        seconds = time.perf_counter() - start
        runs[name] = energies
        print(f"{name:<18}{len(energies) - 1:>11}{products:>10}{seconds:>10.2f}{energies[-1]:>14.6f}"
              f"{psnr(u, clean):>11.2f}")
    best = min(min(e) for e in runs.values())
    print("energy above the lowest found, at the end: "
          + ", ".join(f"{name} {e[-1] - best:.2e}" for name, e in runs.items()))
    print("(products: Hessian-vector products of the Newton-CG inner solves)")
    if args.plot:
        plot(runs, best, args.plot)


def plot(runs: dict[str, list[float]], best: float, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib (pip install -e '.[examples]'): no plot written")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, energies in runs.items():
        ax.semilogy(np.maximum(np.array(energies) - best, 1e-12), label=name)
    ax.set_xlabel("iteration")
    ax.set_ylabel("energy - lowest energy found")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
