"""Recover an unknown 5x5 blur kernel from pairs of sharp and blurred images, by gradient descent.

The blurred images were made with a kernel we then forget (an anisotropic Gaussian smeared by a
short diagonal motion), plus a little noise. The model blurs the sharp images with a kernel
estimate `k`; halide_ad differentiates the squared error with respect to `k`. Its adjoint reads

    adj_k[r, s] = sum over (b, i, j) of adj_out[b, i, j] * img[b, i + r, j + s]

which the index inverter finds as a gather over the images (no scatter into the 25 taps).

Run: python examples/deconvolution.py            # relative kernel error well under 1%
     python examples/deconvolution.py --quick    # fewer, smaller images and steps
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import halide_ad as hd


@hd.func
def blur(img, k):
    """img: (B, H, W), k: (R, S) -> (B, H - R + 1, W - S + 1), a 'valid' correlation."""
    B, H, W = img.shape
    R, S = k.shape
    r, s = hd.rdom(R, S)
    return hd.compute((B, H - R + 1, W - S + 1), lambda b, i, j: hd.sum(img[b, i + r, j + s] * k[r, s]),
                      name="blurred")


@hd.func
def loss(k, img, target):
    """Mean squared error between blur(img, k) and the observed blurred images."""
    diff = blur(img, k) - target
    return hd.mean(diff * diff)


def true_kernel(size: int = 5) -> np.ndarray:
    y, x = np.mgrid[:size, :size] - size // 2
    gauss = np.exp(-(x ** 2 / 2.0 + y ** 2 / 0.6) / 2)   # wider than tall
    motion = np.zeros((size, size))
    np.fill_diagonal(motion, 1.0)                          # a diagonal streak
    k = gauss + 0.5 * motion * gauss.max()
    return k / k.sum()


def synthetic_images(rng: np.random.Generator, count: int, size: int) -> np.ndarray:
    """Piecewise-constant shapes (edges carry the kernel's signature) plus fine texture."""
    yy, xx = np.mgrid[:size, :size]
    images = np.zeros((count, size, size))
    for img in images:
        for _ in range(8):
            cy, cx, rad = rng.uniform(0, size, 2).tolist() + [rng.uniform(3, size / 4)]
            if rng.random() < 0.5:
                img[(yy - cy) ** 2 + (xx - cx) ** 2 < rad ** 2] += rng.uniform(-1, 1)
            else:
                img[(abs(yy - cy) < rad) & (abs(xx - cx) < rad / 2)] += rng.uniform(-1, 1)
        img += 0.2 * rng.standard_normal((size, size))
    return images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--noise", type=float, default=0.01, help="std of noise on the blurred images")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 images of 32x32, 100 steps")
    args = parser.parse_args()
    if args.quick:
        args.images, args.size, args.steps = 2, 32, 100

    rng = np.random.default_rng(0)
    k_true = true_kernel()
    sharp = synthetic_images(rng, args.images, args.size)
    observed = blur(sharp, k_true) + args.noise * rng.standard_normal(
        (args.images, args.size - 4, args.size - 4))

    k = np.full((5, 5), 1 / 25)  # start from a box blur
    loss_and_grad = hd.value_and_grad(loss)  # with respect to k (argnums=0)
    # Adam with a decaying step: the 25 taps are badly scaled against each other (neighbouring
    # pixels are correlated), which plain gradient descent handles slowly.
    m, v, lr = np.zeros_like(k), np.zeros_like(k), 0.01
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        value, g = loss_and_grad(k, sharp, observed)
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        step_size = lr * (0.99 ** step + 0.01)
        k -= step_size * (m / (1 - 0.9 ** step)) / (np.sqrt(v / (1 - 0.999 ** step)) + 1e-12)
        if step == 1 or step % (args.steps // 10) == 0:
            err = np.linalg.norm(k - k_true) / np.linalg.norm(k_true)
            print(f"step {step:4d}  loss {value:.3e}  kernel error {100 * err:6.2f}%")
    elapsed = time.perf_counter() - start

    err = np.linalg.norm(k - k_true) / np.linalg.norm(k_true)
    print(f"\nrelative kernel error {100 * err:.2f}% after {args.steps} steps ({elapsed:.1f} s, "
          f"compile included); max tap error {np.abs(k - k_true).max():.2e}")
    # The noise sets a floor: the least-squares kernel (numpy, from all 5x5 patches) is the best
    # any method can do with these images, and gradient descent should reach it.
    patches = np.lib.stride_tricks.sliding_window_view(sharp, (5, 5), axis=(1, 2)).reshape(-1, 25)
    k_ls = np.linalg.lstsq(patches, observed.reshape(-1), rcond=None)[0].reshape(5, 5)
    norm = np.linalg.norm(k_true)
    print(f"least-squares optimum: kernel error {100 * np.linalg.norm(k_ls - k_true) / norm:.2f}%; "
          f"gradient descent is {100 * np.linalg.norm(k - k_ls) / norm:.3f}% away from it")
    np.set_printoptions(precision=3, suppress=True)
    print("true kernel:\n", k_true, "\nrecovered:\n", k)


if __name__ == "__main__":
    main()
