"""Pooling and resampling against finite differences and torch.nn.functional."""
import numpy as np
import pytest

import halide_ad as hd
from halide_ad import ops
from tests.ops.helpers import all_gathers, matches_torch


@hd.func
def max_pools(x):
    return {"k2": ops.max_pool2d(x, 2),
            "k3_s2_p1_ceil": ops.max_pool2d(x, 3, 2, 1, 1, True),
            "dilated": ops.max_pool2d(x, (3, 2), (2, 1), 0, (1, 2)),
            "global": ops.global_max_pool2d(x)}


def torch_max_pools(x):
    import torch.nn.functional as F
    return {"k2": F.max_pool2d(x, 2), "k3_s2_p1_ceil": F.max_pool2d(x, 3, 2, 1, 1, True),
            "dilated": F.max_pool2d(x, (3, 2), (2, 1), 0, (1, 2)), "global": F.adaptive_max_pool2d(x, 1)}


@hd.func
def avg_pools(x):
    return {"k3_s2_p1": ops.avg_pool2d(x, 3, 2, 1),
            "exclude_pad_ceil": ops.avg_pool2d(x, 3, 2, 1, True, False),
            "divisor": ops.avg_pool2d(x, (2, 3), None, 0, False, True, 5),
            "global": ops.global_avg_pool2d(x)}


def torch_avg_pools(x):
    import torch.nn.functional as F
    return {"k3_s2_p1": F.avg_pool2d(x, 3, 2, 1), "exclude_pad_ceil": F.avg_pool2d(x, 3, 2, 1, True, False),
            "divisor": F.avg_pool2d(x, (2, 3), divisor_override=5), "global": F.adaptive_avg_pool2d(x, 1)}


@hd.func
def nearest(x):
    return {"upsampling_2": ops.upsampling(x, 2), "upsampling_3x2": ops.upsampling(x, (3, 2)),
            "resize": ops.resize(x, (8, 3), "nearest")}


def torch_nearest(x):
    import torch.nn.functional as F
    return {"upsampling_2": F.interpolate(x, scale_factor=2), "upsampling_3x2": F.interpolate(x, scale_factor=(3, 2)),
            "resize": F.interpolate(x, size=(8, 3), mode="nearest")}


# Bilinear resampling, one program each: a gather over four taps with clamped edges is a long
# kernel, and numba's compile time grows faster than linearly with a kernel's length.
BILINEAR = {  # (operator, arguments after x, torch.nn.functional.interpolate's keywords)
    "upsampling_x2": (ops.upsampling, (2, "bilinear"), {"scale_factor": 2, "align_corners": False}),
    "upsampling_2x3_corners": (ops.upsampling, ((2, 3), "bilinear", True),
                               {"scale_factor": (2, 3), "align_corners": True}),
    "resize_up": (ops.resize, ((7, 9),), {"size": (7, 9), "align_corners": False}),
    "resize_down": (ops.resize, ((3, 2),), {"size": (3, 2), "align_corners": False}),
    "resize_mixed_corners": (ops.resize, ((3, 8), "bilinear", True), {"size": (3, 8), "align_corners": True}),
}


def test_max_pool2d_and_global_max(rng):
    x = rng.standard_normal((2, 3, 7, 6))
    hd.check_grad(max_pools, x)
    matches_torch(max_pools, torch_max_pools, x)
    assert all_gathers(max_pools, x)


def test_max_pool_ties_go_to_the_first_element():
    _, f_vjp = hd.vjp(max_pools, np.ones((2, 3, 7, 6)))
    cts = {k: np.zeros(v.shape) for k, v in max_pools(np.ones((2, 3, 7, 6))).items()}
    cts["k2"][0, 0, 0, 0] = 1.0
    (g,) = f_vjp(cts)
    assert g[0, 0, 0, 0] == 1.0 and g.sum() == 1.0


def test_avg_pool2d_and_global_avg(rng):
    x = rng.standard_normal((2, 3, 7, 6))
    hd.check_grad(avg_pools, x)
    matches_torch(avg_pools, torch_avg_pools, x)
    assert all_gathers(avg_pools, x)


def test_nearest_upsampling_and_resize(rng):
    x = rng.standard_normal((1, 2, 4, 5))
    hd.check_grad(nearest, x)
    matches_torch(nearest, torch_nearest, x)
    assert all_gathers(nearest, x)


@pytest.mark.parametrize("case", list(BILINEAR))
def test_bilinear_upsampling_and_resize(case, rng):
    torch = pytest.importorskip("torch")
    op, rest, kw = BILINEAR[case]
    x = rng.standard_normal((1, 2, 4, 5))
    hd.check_grad(op, x, *rest)
    matches_torch(op, lambda t, *_: torch.nn.functional.interpolate(t, mode="bilinear", **kw), x, *rest)
    assert all_gathers(op, x, *rest)


def test_argument_checks():
    x = np.ones((1, 1, 4, 4))
    with pytest.raises(hd.ShapeError, match=r"padding=\(2, 2\) must be at most half of kernel_size=\(3, 3\)"):
        ops.max_pool2d(x, 3, 1, 2)
    with pytest.raises(hd.ShapeError, match=r"ops.avg_pool2d: x must be 4-d"):
        ops.avg_pool2d(np.ones((4, 4)), 2)
    with pytest.raises(hd.ShapeError, match=r"the output would have shape \(1, 1, 0, 0\)"):
        ops.max_pool2d(x, 5)
    with pytest.raises(hd.TraceError, match="method='bicubic'"):
        ops.resize(x, (8, 8), "bicubic")
    with pytest.raises(hd.TraceError, match="align_corners applies to method='bilinear' only"):
        ops.upsampling(x, 2, "nearest", True)
    with pytest.raises(hd.ShapeError, match="scale_factor must be an int or a sequence of 2 ints"):
        ops.upsampling(x, 1.5)
