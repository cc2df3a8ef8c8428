"""halide_ad in one page: the three programs of the spec, their gradients, and what was generated.

Run: python examples/quickstart.py
"""
import time

import numpy as np

import halide_ad as hd


@hd.func
def blur3(img):
    c = hd.repeat_edge(img)  # boundary view: any integer index is legal
    return hd.compute(img.shape, lambda y, x: (c[y, x - 1] + c[y, x] + c[y, x + 1]) / 3, name="blur3")


@hd.func
def conv2d(x, w):  # x: (N, C, H, W), w: (K, C, R, S)
    N, C, H, W = x.shape
    K, _, R, S = w.shape
    c, r, s = hd.rdom(C, R, S)  # reduction variables over [0,C)x[0,R)x[0,S)
    return hd.compute((N, K, H - R + 1, W - S + 1), lambda n, k, i, j:
                      hd.sum(x[n, c, i + r, j + s] * w[k, c, r, s]))


@hd.func
def maxpool2(x):
    N, C, H, W = x.shape
    r, s = hd.rdom(2, 2)
    return hd.compute((N, C, H // 2, W // 2), lambda n, c, i, j: hd.max(x[n, c, 2 * i + r, 2 * j + s]))


def main() -> None:
    rng = np.random.default_rng(0)
    img = rng.random((512, 512), dtype=np.float32)

    start = time.perf_counter()
    out = blur3(img)  # numpy in, numpy out; compiled on the first call
    print(f"blur3: {out.shape} {out.dtype}, first call {time.perf_counter() - start:.2f} s")

    loss = lambda im: hd.sum(blur3(im) ** 2)  # noqa: E731  hd funcs compose inside traced code
    value, g = hd.value_and_grad(loss)(img)
    print(f"loss = {value:.3f}, |grad| = {np.linalg.norm(g):.3f}, grad dtype {g.dtype}")

    x = rng.standard_normal((2, 3, 16, 16))
    w = rng.standard_normal((4, 3, 3, 3))
    y, f_vjp = hd.vjp(conv2d, x, w)
    dx, dw = f_vjp(np.ones_like(y))
    print(f"conv2d: y {y.shape}, dx {dx.shape}, dw {dw.shape}")
    hd.check_grad(conv2d, x, w)  # finite differences along random directions, float64
    hd.check_grad(maxpool2, x)
    print("check_grad: conv2d and maxpool2 agree with finite differences")

    report = hd.explain(conv2d, x, w)
    print("\nadjoint forms of conv2d:", report.forms())
    print(str(report).split("-- forward kernel")[0])


if __name__ == "__main__":
    main()
