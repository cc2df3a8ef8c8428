"""dense, matmul and convolutions: finite differences and torch.nn.functional over strides,
padding (zeros, 'same', reflect, replicate, circular), dilation, groups and odd sizes."""
import numpy as np
import pytest

import halide_ad as hd
from halide_ad import ops
from tests.ops.helpers import all_gathers, forms, matches_torch


@hd.func
def linear(x, w, b, x3, a, bb, v):
    return {"dense": ops.dense(x, w, b), "dense_3d": ops.dense(x3, w), "matmul": ops.matmul(x, w.T),
            "matmul_batched": ops.matmul(a, bb), "matmul_vector": ops.matmul(v, bb)}


def torch_linear(x, w, b, x3, a, bb, v):
    import torch
    import torch.nn.functional as F
    return {"dense": F.linear(x, w, b), "dense_3d": F.linear(x3, w), "matmul": x @ w.T,
            "matmul_batched": torch.matmul(a, bb), "matmul_vector": torch.matmul(v, bb)}


def test_dense_and_matmul(rng):
    args = (rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal(5),
            rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 1, 3, 4)), rng.standard_normal((3, 4, 2)),
            rng.standard_normal(4))
    hd.check_grad(linear, *args)
    matches_torch(linear, torch_linear, *args)
    assert all_gathers(linear, *args)


# (x shape, w shape, stride, padding, dilation, groups, padding_mode)
CONV2D = {
    "stride2_pad1_bias": ((2, 3, 7, 6), (4, 3, 3, 2), 2, 1, 1, 1, "zeros"),
    "groups2_dilated": ((1, 4, 6, 7), (6, 2, 2, 3), (2, 1), (1, 2), (1, 2), 2, "zeros"),
    "depthwise_same_reflect": ((2, 3, 5, 6), (3, 1, 3, 3), 1, "same", 2, 3, "reflect"),
    "odd_stride3": ((1, 2, 7, 5), (2, 2, 3, 3), 3, 2, 1, 1, "zeros"),
}


def torch_conv(x, w, b, stride, padding, dilation, groups, mode):
    """torch.nn.functional.conv1d/conv2d; other padding modes pad first, as torch.nn.ConvNd does."""
    import torch.nn.functional as F
    conv = F.conv1d if x.ndim == 3 else F.conv2d
    if mode == "zeros":
        return conv(x, w, b, stride, padding, dilation, groups)
    nd = x.ndim - 2
    dil = (dilation,) * nd if isinstance(dilation, int) else dilation
    if padding == "same":
        pads = [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for d, k in zip(dil, w.shape[2:])]
    else:
        pads = [(p, p) for p in ((padding,) * nd if isinstance(padding, int) else padding)]
    return conv(F.pad(x, [p for lo_hi in reversed(pads) for p in lo_hi], mode=mode), w, b, stride, 0, dilation, groups)


@pytest.mark.parametrize("case", list(CONV2D))
def test_conv2d(case, rng):
    xs, ws, *cfg = CONV2D[case]
    args = (rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0]), *cfg)
    hd.check_grad(ops.conv2d, *args)
    matches_torch(ops.conv2d, torch_conv, *args)
    found = forms(ops.conv2d, *args)
    assert found["w"] == found["b"] == ["gather-window"] and all_gathers(ops.conv2d, *args)
    # the taps' window is over x, or over its padded copy, whose gradient x's own crops (zeros)
    # or folds back at the edges (reflect)
    padding, mode = cfg[1], cfg[4]
    cropped = padding not in (0, "valid") and mode == "zeros"
    assert found["x"] == (["gather"] if cropped else ["gather-window"])


@pytest.mark.parametrize("stride", [1, 2])
def test_a_padded_convolution_runs_on_blas(stride, rng):
    """Zero padding reads a padded copy of x, so the convolution is a contraction: its forward
    and both gradients go to BLAS (read through a zero view they ran as loop nests, 20-30x
    slower at 8x32x64x64)."""
    args = (rng.standard_normal((2, 16, 9, 8)), rng.standard_normal((16, 16, 3, 3)), None, stride, 1, 1, 1,
            "zeros")
    report = hd.explain(ops.conv2d, *args)
    assert "conv2d by BLAS" in report.forward_source, report.forward_source
    blas = {c.buffer for c in report.contributions if "[computed by BLAS]" in c.formula}
    assert blas == {"w", "conv2d_zeros_pad" if stride == 1 else "conv2d_zeros_pad_taps"}, str(report)
    matches_torch(ops.conv2d, torch_conv, *args)


CONV1D = {
    "strided_dilated_circular": ((2, 3, 11), (4, 3, 3), 2, 2, 2, 1, "circular"),
    "grouped_same_replicate": ((1, 4, 6), (6, 2, 4), 1, "same", 1, 2, "replicate"),
}


@pytest.mark.parametrize("case", list(CONV1D))
def test_conv1d(case, rng):
    xs, ws, *cfg = CONV1D[case]
    args = (rng.standard_normal(xs), rng.standard_normal(ws), None, *cfg)
    hd.check_grad(ops.conv1d, *args)
    matches_torch(ops.conv1d, torch_conv, *args)
    assert all_gathers(ops.conv1d, *args)


# (x shape, w shape, stride, padding, output_padding, groups, dilation)
CONV2D_T = {
    "plain": ((2, 3, 4, 3), (3, 2, 3, 3), 1, 0, 0, 1, 1),
    "stride2_pad1_output_padding": ((1, 2, 3, 4), (2, 3, 3, 2), (2, 3), (1, 0), (1, 2), 1, 1),
    "groups2_dilated_stride3": ((1, 4, 3, 3), (4, 2, 2, 3), 3, 1, 1, 2, (2, 1)),
}


@pytest.mark.parametrize("case", list(CONV2D_T))
def test_conv2d_transpose(case, rng):
    pytest.importorskip("torch")
    import torch.nn.functional as F
    xs, ws, *cfg = CONV2D_T[case]
    args = (rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[1] * cfg[3]), *cfg)
    hd.check_grad(ops.conv2d_transpose, *args)
    matches_torch(ops.conv2d_transpose, F.conv_transpose2d, *args)
    assert all_gathers(ops.conv2d_transpose, *args)


def test_argument_checks():
    x, w = np.ones((1, 4, 5, 5)), np.ones((2, 4, 3, 3))
    with pytest.raises(hd.ShapeError, match=r"ops.conv2d: with groups=3, x's 4 channels"):
        ops.conv2d(x, w, None, 1, 0, 1, 3)
    with pytest.raises(hd.ShapeError, match=r"ops.conv2d: x must be 4-d, got shape \(4, 5, 5\)"):
        ops.conv2d(x[0], w)
    with pytest.raises(hd.ShapeError, match=r"stride must be an int or a sequence of 2 ints, got \(1, 2, 3\)"):
        ops.conv2d(x, w, None, (1, 2, 3))
    with pytest.raises(hd.ShapeError, match="padding='same' needs stride 1"):
        ops.conv2d(x, w, None, 2, "same")
    with pytest.raises(hd.ShapeError, match=r"the output would have shape \(1, 2, 0, 0\)"):
        ops.conv2d(x, np.ones((2, 4, 6, 6)))
    with pytest.raises(hd.TraceError, match="padding_mode='wrap'"):
        ops.conv2d(x, w, None, 1, 1, 1, 1, "wrap")
    with pytest.raises(hd.ShapeError, match=r"b has shape \(3,\); it must be \(2,\)"):
        ops.conv2d(x, w, np.ones(3))
    with pytest.raises(hd.ShapeError, match="output_padding=.* must be smaller than stride"):
        ops.conv2d_transpose(x, np.ones((4, 2, 3, 3)), None, 1, 0, 1)
    with pytest.raises(hd.ShapeError, match=r"ops.dense: x of shape \(3, 4\) needs w of shape"):
        ops.dense(np.ones((3, 4)), np.ones((4, 5)))
    with pytest.raises(hd.ShapeError, match="inner dimensions differ"):
        ops.matmul(np.ones((3, 4)), np.ones((3, 4)))
