"""Learn the 3x3 color transform in front of a bilateral grid (Chen et al. 2007; HDRNet's splat,
blur and slice), by gradient descent through the grid's splat, an update definition.

The pipeline: colors = M @ rgb; splat each pixel's colors (and a count) into a coarse grid
indexed by position and brightness, `grid[y // S, x // S, z(y, x), c] += value` (a
data-dependent index: a histogram); blur the grid; slice it with trilinear weights at each pixel
and divide by the count: an edge-aware smoothing of the transformed colors. The target was made by
the same pipeline with a transform we then forget. halide_ad differentiates the loss with respect
to M through the slice, the blur and the splat (whose adjoint is a gather: each pixel reads the
grid cell it was splatted into) - see `hd.explain(loss, img, M)`.

Run: python examples/bilateral_grid.py            # writes bilateral_*.ppm and bilateral_loss.csv
     python examples/bilateral_grid.py --quick    # a 32x32 image, 60 steps: loss 9e-3 -> 3e-6,
                                                  # M within 0.01 of the transform that made the target
The first step compiles the forward and gradient kernels (minutes on a busy machine); later
steps take milliseconds. No plotting library is needed: images are PPM, the loss curve is CSV.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import halide_ad as hd

S, D = 8, 8  # grid cell size in pixels, brightness bins


@hd.func
def bilateral(img, M):
    """img: (H, W, 3) in [0, 1], M: (3, 3) -> (H, W, 3), the grid-smoothed colors M @ img."""
    H, W, _ = img.shape
    GH, GW = -(-H // S), -(-W // S)
    k = hd.rdom(3)
    colors = hd.compute((H, W, 3), lambda y, x, c: hd.sum(M[c, k] * img[y, x, k]), name="colors")
    gray = hd.compute((H, W), lambda y, x: 0.299 * img[y, x, 0] + 0.587 * img[y, x, 1] + 0.114 * img[y, x, 2],
                      name="gray")
    grid = hd.zeros((GH, GW, D, 4), img.dtype)
    c = hd.var("c")
    y, x = hd.rdom(H, W)
    z = hd.clamp(hd.cast(hd.floor(gray[y, x] * (D - 1) + 0.5), "int64"), 0, D - 1)
    grid[y // S, x // S, z, c] += hd.where(c < 3, colors[y, x, hd.clamp(c, 0, 2)], 1.0)  # colors, count
    blurred = grid
    for axis in range(3):  # [1, 2, 1] / 4 along each grid axis, edges repeated
        edge = hd.repeat_edge(blurred)

        def tap(*i, axis=axis, edge=edge):
            at = lambda o: tuple(v + o if d == axis else v for d, v in enumerate(i))  # noqa: E731
            return 0.25 * edge[at(-1)] + 0.5 * edge[at(0)] + 0.25 * edge[at(1)]
        blurred = hd.compute(grid.shape, tap, name=f"blur{axis}")
    cells = hd.repeat_edge(blurred)

    def sliced(y, x, c):
        gy, gx = (y + 0.5) / S - 0.5, (x + 0.5) / S - 0.5
        gz = gray[y, x] * (D - 1)
        fy, fx, fz = hd.floor(gy), hd.floor(gx), hd.floor(gz)
        iy, ix, iz = hd.cast(fy, "int64"), hd.cast(fx, "int64"), hd.cast(fz, "int64")
        total = {0: 0.0, 1: 0.0}
        for dy in (0, 1):
            for dx in (0, 1):
                for dz in (0, 1):
                    weight = ((gy - fy if dy else 1 - (gy - fy)) * (gx - fx if dx else 1 - (gx - fx))
                              * (gz - fz if dz else 1 - (gz - fz)))
                    at = (iy + dy, ix + dx, iz + dz)
                    total[0] = total[0] + weight * cells[at + (c,)]
                    total[1] = total[1] + weight * cells[at + (3,)]
        return total[0] / hd.maximum(total[1], 1e-6)
    return hd.compute((H, W, 3), sliced, name="sliced")


@hd.func
def loss(img, M, target):
    return hd.mean((bilateral(img, M) - target) ** 2)


def make_image(n: int) -> np.ndarray:
    """A synthetic photo: soft color gradients, a few disks with sharp edges, a little noise."""
    rng = np.random.default_rng(1)
    y, x = np.mgrid[0:n, 0:n] / n
    img = np.stack([0.3 + 0.5 * x, 0.2 + 0.6 * y, 0.5 - 0.3 * x * y], axis=-1)
    for cy, cx, r, color in ((0.3, 0.3, 0.15, (0.9, 0.2, 0.1)), (0.7, 0.6, 0.2, (0.1, 0.3, 0.9)),
                             (0.35, 0.75, 0.1, (0.95, 0.9, 0.2))):
        img[(y - cy) ** 2 + (x - cx) ** 2 < r * r] = color
    return np.clip(img + 0.02 * rng.standard_normal(img.shape), 0, 1)


def save_ppm(path: str, img: np.ndarray) -> None:
    data = (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)
    with open(path, "wb") as fh:
        fh.write(f"P6 {data.shape[1]} {data.shape[0]} 255\n".encode() + data.tobytes())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n, steps = (32, 60) if args.quick else (96, 200)
    img = make_image(n)
    true_m = np.array([[1.1, 0.1, -0.05], [0.05, 0.9, 0.1], [-0.1, 0.2, 1.2]])  # a warm tone curve
    target = bilateral(img, true_m)
    m = np.eye(3)
    value_and_grad = hd.value_and_grad(loss, argnums=1)
    losses, velocity, start = [], np.zeros_like(m), time.perf_counter()
    for step in range(steps):
        value, g = value_and_grad(img, m, target)
        losses.append(float(value))
        velocity = 0.9 * velocity - 2.0 * g  # momentum gradient descent
        m = m + velocity
    print(f"{steps} steps in {time.perf_counter() - start:.1f} s: loss {losses[0]:.3g} -> {losses[-1]:.3g}, "
          f"max |M - M_true| = {np.max(np.abs(m - true_m)):.2g}")
    save_ppm("bilateral_input.ppm", img)
    save_ppm("bilateral_before.ppm", bilateral(img, np.eye(3)))
    save_ppm("bilateral_after.ppm", bilateral(img, m))
    save_ppm("bilateral_target.ppm", target)
    np.savetxt("bilateral_loss.csv", np.array(losses), header="loss per step", fmt="%.6g")
    print("wrote bilateral_{input,before,after,target}.ppm and bilateral_loss.csv")


if __name__ == "__main__":
    main()
