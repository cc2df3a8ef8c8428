"""The benchmark cases: each program written in halide_ad, PyTorch and JAX, with its cost model.

Every case is float32 and differentiates with respect to all of its inputs. The three versions of
a case compute the same function (the runner checks halide_ad's output and gradients against a
peer's), each written the way a user of that library would write it.

torch and jax are reached through `LazyModule`s, so importing this module imports neither: torch
must see THP_MEM_ALLOC_ENABLE before it is imported (see `benchmarks.peers`), and either may be
missing.
"""
from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import halide_ad as hd
from benchmarks.bounds import CostModel, Shape, contraction, memory_bound


class LazyModule:
    """A module imported on its first attribute access."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


F = LazyModule("torch.nn.functional")
jax = LazyModule("jax")
jnp = LazyModule("jax.numpy")
lax = LazyModule("jax.lax")


# --- halide_ad programs ---------------------------------------------------------------------------


@hd.func
def blur3x3(img):
    """3x3 box blur of an image, repeating the edge pixels at the border."""
    c = hd.repeat_edge(img)
    r, s = hd.rdom(3, 3)
    return hd.compute(img.shape, lambda y, x: hd.sum(c[y + r - 1, x + s - 1]) / 9, name="blur3x3")


@hd.func
def blur3x3_nchw(x):
    """`blur3x3` applied to every (n, c) plane of an NCHW batch."""
    e = hd.repeat_edge(x)
    r, s = hd.rdom(3, 3)
    return hd.compute(
        x.shape, lambda n, c, i, j: hd.sum(e[n, c, i + r - 1, j + s - 1]) / 9, name="blur3x3_nchw"
    )


def conv2d(stride: int) -> Callable[..., Any]:
    """Valid 2-D convolution (cross-correlation, as in torch) of x (N, C, H, W) with
    w (K, C, R, S) at the given stride."""

    @hd.func
    def conv(x, w):
        N, C, H, W = x.shape
        K, _, R, S = w.shape
        c, r, s = hd.rdom(C, R, S)
        return hd.compute(
            (N, K, (H - R) // stride + 1, (W - S) // stride + 1),
            lambda n, k, i, j: hd.sum(x[n, c, stride * i + r, stride * j + s] * w[k, c, r, s]),
            name=f"conv2d_stride{stride}",
        )

    return conv


@hd.func
def maxpool2x2(x):
    """Max over 2x2 windows at stride 2."""
    N, C, H, W = x.shape
    r, s = hd.rdom(2, 2)
    return hd.compute(
        (N, C, H // 2, W // 2),
        lambda n, c, i, j: hd.max(x[n, c, 2 * i + r, 2 * j + s]),
        name="maxpool2x2",
    )


@hd.func
def avgpool3x3s2(x):
    """Mean over 3x3 windows at stride 2, no padding."""
    N, C, H, W = x.shape
    r, s = hd.rdom(3, 3)
    return hd.compute(
        (N, C, (H - 3) // 2 + 1, (W - 3) // 2 + 1),
        lambda n, c, i, j: hd.sum(x[n, c, 2 * i + r, 2 * j + s]) / 9,
        name="avgpool3x3s2",
    )


@hd.func
def upsample_nearest2x(x):
    """Nearest-neighbour 2x upsampling: every pixel becomes a 2x2 block."""
    N, C, H, W = x.shape
    return hd.compute(
        (N, C, 2 * H, 2 * W), lambda n, c, i, j: x[n, c, i // 2, j // 2], name="upsample_nearest2x"
    )


def _bilinear_taps(i):
    """The two source rows of output row i of a 2x bilinear upsampling with half-pixel centres
    (align_corners=False), with their weights.

    Output i samples the source at i/2 - 1/4: for i = 2m that is 1/4 of row m-1 and 3/4 of row m,
    for i = 2m+1, 3/4 of row m and 1/4 of row m+1. Rows -1 and H are clamped (repeat_edge), which
    is exactly torch's clamping of the sample position at the border.
    """
    w_lo = hd.where(i % 2 == 0, 0.25, 0.75)
    return ((i - 1) // 2, w_lo), ((i + 1) // 2, 1 - w_lo)


@hd.func
def resize_bilinear2x(x):
    """Bilinear 2x upsampling, align_corners=False (torch's default, jax.image.resize's)."""
    N, C, H, W = x.shape
    e = hd.repeat_edge(x)

    def pixel(n, c, i, j):
        (y0, wy0), (y1, wy1) = _bilinear_taps(i)
        (x0, wx0), (x1, wx1) = _bilinear_taps(j)
        return (wy0 * (wx0 * e[n, c, y0, x0] + wx1 * e[n, c, y0, x1])
                + wy1 * (wx0 * e[n, c, y1, x0] + wx1 * e[n, c, y1, x1]))

    return hd.compute((N, C, 2 * H, 2 * W), pixel, name="resize_bilinear2x")


@hd.func
def dense(x, w):
    """Matrix product x @ w."""
    M, K = x.shape
    _, N = w.shape
    k = hd.rdom(K)
    return hd.compute((M, N), lambda i, j: hd.sum(x[i, k] * w[k, j]), name="dense")


@hd.func
def blur_relu_maxpool(x):
    """A three-stage pipeline: 3x3 repeat-edge blur, ReLU, 2x2 max pooling."""
    return maxpool2x2(hd.relu(blur3x3_nchw(x)))


# --- PyTorch programs -----------------------------------------------------------------------------
# A box blur is torch's avg_pool2d at stride 1 on a replicate-padded input; it ran faster on the
# development machine than conv2d with a 3x3 kernel of ninths.


def torch_blur3x3_nchw(x):
    return F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), 3, stride=1)


def torch_blur3x3(img):
    return torch_blur3x3_nchw(img[None, None])[0, 0]


def torch_conv2d(stride: int) -> Callable[..., Any]:
    return lambda x, w: F.conv2d(x, w, stride=stride)


def torch_maxpool2x2(x):
    return F.max_pool2d(x, 2)


def torch_avgpool3x3s2(x):
    return F.avg_pool2d(x, 3, stride=2)


def torch_upsample_nearest2x(x):
    return F.interpolate(x, scale_factor=2, mode="nearest")


def torch_resize_bilinear2x(x):
    return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)


def torch_dense(x, w):
    return x @ w


def torch_blur_relu_maxpool(x):
    return F.max_pool2d(F.relu(torch_blur3x3_nchw(x)), 2)


# --- JAX programs ---------------------------------------------------------------------------------


def _jax_window(x, init: float, op: Callable, window: tuple[int, int], stride: tuple[int, int]):
    """reduce_window over the last two axes of x, valid padding."""
    lead = (1,) * (x.ndim - 2)
    return lax.reduce_window(x, init, op, lead + window, lead + stride, "VALID")


def jax_blur3x3(x):
    """Edge-padded 3x3 window sum over the last two axes (reduce_window beat nine shifted
    slices by 2x on the development machine)."""
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(1, 1), (1, 1)], mode="edge")
    return _jax_window(padded, 0.0, lax.add, (3, 3), (1, 1)) / 9


def jax_conv2d(stride: int) -> Callable[..., Any]:
    return lambda x, w: lax.conv_general_dilated(
        x, w, (stride, stride), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW")
    )


def jax_maxpool2x2(x):
    return _jax_window(x, -np.inf, lax.max, (2, 2), (2, 2))


def jax_avgpool3x3s2(x):
    return _jax_window(x, 0.0, lax.add, (3, 3), (2, 2)) / 9


def jax_upsample_nearest2x(x):
    return jnp.repeat(jnp.repeat(x, 2, axis=2), 2, axis=3)


def jax_resize_bilinear2x(x):
    N, C, H, W = x.shape
    return jax.image.resize(x, (N, C, 2 * H, 2 * W), "bilinear")


def jax_dense(x, w):
    return x @ w


def jax_blur_relu_maxpool(x):
    return jax_maxpool2x2(jax.nn.relu(jax_blur3x3(x)))


# --- the cases ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Case:
    """One benchmark: a program in three libraries, its input shapes and its cost model (of the
    backward pass; `backward=False` measures the forward pass only)."""

    name: str
    description: str
    shapes: tuple[Shape, ...]
    small_shapes: tuple[Shape, ...]  # for --small: a quick smoke run, odd sizes on purpose
    out_shape: Callable[..., Shape]  # from the input shapes
    halide_ad: Callable[..., Any]
    torch: Callable[..., Any]
    jax: Callable[..., Any]
    cost: CostModel
    backward: bool = True

    def input_shapes(self, *, small: bool) -> tuple[Shape, ...]:
        return self.small_shapes if small else self.shapes

    def make_inputs(self, *, small: bool, seed: int = 0) -> list[np.ndarray]:
        """Standard normal float32 inputs, the same for a given seed in every process."""
        rng = np.random.default_rng(seed)
        return [rng.standard_normal(s, dtype=np.float32) for s in self.input_shapes(small=small)]

    def cotangent(self, *, small: bool, seed: int = 1) -> np.ndarray:
        """A standard normal float32 cotangent shaped like the output."""
        shape = self.out_shape(*self.input_shapes(small=small))
        return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _conv_out(x: Shape, w: Shape, stride: int) -> Shape:
    (n, _, h, wd), (k, _, r, s) = x, w
    return (n, k, (h - r) // stride + 1, (wd - s) // stride + 1)


def _conv_case(stride: int) -> Case:
    def flops(shapes: Sequence[Shape], out: Shape) -> int:
        _, c, r, s = shapes[1]
        return 2 * math.prod(out) * c * r * s

    return Case(
        name="conv2d" if stride == 1 else f"conv2d_s{stride}",
        description=f"conv2d (8,32,64,64)x(32,32,3,3), stride {stride}, valid",
        shapes=((8, 32, 64, 64), (32, 32, 3, 3)),
        small_shapes=((2, 3, 9, 11), (4, 3, 3, 3)),
        out_shape=lambda x, w: _conv_out(x, w, stride),
        halide_ad=conv2d(stride),
        torch=torch_conv2d(stride),
        jax=jax_conv2d(stride),
        cost=contraction(flops),
    )


_NCHW = (16, 64, 128, 128)
_SMALL_NCHW = (2, 3, 10, 14)


def _pool_out(x: Shape, window: int, stride: int) -> Shape:
    n, c, h, w = x
    return (n, c, (h - window) // stride + 1, (w - window) // stride + 1)


def _upsampled(x: Shape) -> Shape:
    n, c, h, w = x
    return (n, c, 2 * h, 2 * w)


CASES: tuple[Case, ...] = (
    Case(
        name="blur",
        description="3x3 blur, repeat_edge, 4096x4096",
        shapes=((4096, 4096),),
        small_shapes=((13, 17),),
        out_shape=lambda x: x,
        halide_ad=blur3x3,
        torch=torch_blur3x3,
        jax=jax_blur3x3,
        cost=memory_bound(),
    ),
    _conv_case(1),
    _conv_case(2),
    Case(
        name="maxpool",
        description="maxpool 2x2/2 on (16,64,128,128)",
        shapes=(_NCHW,),
        small_shapes=(_SMALL_NCHW,),
        out_shape=lambda x: _pool_out(x, 2, 2),
        halide_ad=maxpool2x2,
        torch=torch_maxpool2x2,
        jax=jax_maxpool2x2,
        cost=memory_bound(needed=(0,)),
    ),
    Case(
        name="avgpool",
        description="avgpool 3x3/2 on (16,64,128,128)",
        shapes=(_NCHW,),
        small_shapes=(_SMALL_NCHW,),
        out_shape=lambda x: _pool_out(x, 3, 2),
        halide_ad=avgpool3x3s2,
        torch=torch_avgpool3x3s2,
        jax=jax_avgpool3x3s2,
        cost=memory_bound(),
    ),
    Case(
        name="upsample",
        description="nearest 2x upsample of (16,64,128,128)",
        shapes=(_NCHW,),
        small_shapes=(_SMALL_NCHW,),
        out_shape=_upsampled,
        halide_ad=upsample_nearest2x,
        torch=torch_upsample_nearest2x,
        jax=jax_upsample_nearest2x,
        cost=memory_bound(),
    ),
    Case(
        name="bilinear",
        description="bilinear 2x resize (align_corners=False) of (16,64,128,128)",
        shapes=(_NCHW,),
        small_shapes=(_SMALL_NCHW,),
        out_shape=_upsampled,
        halide_ad=resize_bilinear2x,
        torch=torch_resize_bilinear2x,
        jax=jax_resize_bilinear2x,
        cost=memory_bound(),
    ),
    Case(
        name="dense",
        description="dense (512,1024)x(1024,1024)",
        shapes=((512, 1024), (1024, 1024)),
        small_shapes=((5, 7), (7, 6)),
        out_shape=lambda x, w: (x[0], w[1]),
        halide_ad=dense,
        torch=torch_dense,
        jax=jax_dense,
        cost=contraction(lambda shapes, out: 2 * math.prod(out) * shapes[0][1]),
    ),
    Case(
        name="pipeline",
        description="blur 3x3 (repeat_edge) -> relu -> maxpool 2x2/2 on (16,64,128,128)",
        shapes=(_NCHW,),
        small_shapes=(_SMALL_NCHW,),
        out_shape=lambda x: _pool_out(x, 2, 2),
        halide_ad=blur_relu_maxpool,
        torch=torch_blur_relu_maxpool,
        jax=jax_blur_relu_maxpool,
        cost=memory_bound(needed=(0,)),
    ),
)
