"""Shape and indexing operators against finite differences and PyTorch."""
import numpy as np
import pytest

import halide_ad as hd
from halide_ad import ops
from tests.ops.helpers import all_gathers, forms, matches_torch


@hd.func
def reshapes(x, x1, xb):
    return {"flatten": ops.flatten(x), "flatten_1": ops.flatten(x, 1), "reshape": ops.reshape(x, (4, -1)),
            "transpose": ops.transpose(x, (2, 0, 1)), "transpose_reversed": ops.transpose(x),
            "squeeze": ops.squeeze(x1), "squeeze_last": ops.squeeze(x1, axis=-1),
            "expand_dims": ops.expand_dims(x, 1, 2), "broadcast_to": ops.broadcast_to(xb, (2, 2, 3, 4))}


def torch_reshapes(x, x1, xb):
    return {"flatten": x.flatten(), "flatten_1": x.flatten(1), "reshape": x.reshape(4, -1),
            "transpose": x.permute(2, 0, 1), "transpose_reversed": x.permute(2, 1, 0), "squeeze": x1.squeeze(),
            "squeeze_last": x1.squeeze(-1), "expand_dims": x[:, None, None], "broadcast_to": xb.expand(2, 2, 3, 4)}


@hd.func
def pieces(x, y, z):
    return {"concatenate": ops.concatenate([x, y, z], axis=1), "split": ops.split(x, [1, 3], axis=2),
            "split_equal": ops.split(z, 2, axis=1),
            "strided_slice": ops.strided_slice(x, [1, 0], [3, 4], [1, 2], axes=[1, 2]),
            "strided_slice_reversed": ops.strided_slice(x, [-1], [0], [-2], axes=[2])}


@hd.func
def pads(x):
    return {"constant": ops.pad(x, ((0, 0), (1, 2), (2, 1)), "constant", 0.5),
            "edge": ops.pad(x, ((1, 0), (0, 0), (2, 1)), "edge"), "reflect": ops.pad(x, ((0, 0), (2, 1), (1, 3)), "reflect")}


def torch_pads(x):
    import torch.nn.functional as F
    return {"constant": F.pad(x, (2, 1, 1, 2), value=0.5), "edge": F.pad(x[None], (2, 1, 0, 0, 1, 0), mode="replicate")[0],
            "reflect": F.pad(x, (1, 3, 2, 1), mode="reflect")}


def torch_pieces(x, y, z):
    import torch
    return {"concatenate": torch.cat([x, y, z], 1), "split": torch.tensor_split(x, [1, 3], dim=2),
            "split_equal": torch.split(z, 1, dim=1), "strided_slice": x[:, 1:3, 0:4:2],
            "strided_slice_reversed": x.flip(2)[:, :, 0:3:2]}


@hd.func
def takes(x, idx, flat, clipped):
    return {"axis1": ops.take(x, idx, axis=1), "flat": ops.take(x, flat),
            "clip": ops.take(x, clipped, axis=2, mode="clip"), "wrap": ops.take(x, clipped, axis=2, mode="wrap"),
            "negative": ops.take(x, flat[:2] - 24, axis=None)}


def torch_takes(x, idx, flat, clipped):
    return {"axis1": x[:, idx], "flat": x.flatten()[flat], "clip": x[:, :, clipped.clamp(0, 3)],
            "wrap": x[:, :, clipped % 4], "negative": x.flatten()[flat[:2] - 24]}


def test_flatten_reshape_transpose_squeeze_expand_broadcast(rng):
    args = (rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 1, 3, 1)), rng.standard_normal((2, 1, 4)))
    hd.check_grad(reshapes, *args)
    matches_torch(reshapes, torch_reshapes, *args)
    assert all_gathers(reshapes, *args)


def test_concatenate_split_strided_slice(rng):
    args = (rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 1, 4)), rng.standard_normal((2, 2, 4)))
    hd.check_grad(pieces, *args)
    matches_torch(pieces, torch_pieces, *args)
    assert all_gathers(pieces, *args)


def test_pad_constant_edge_reflect(rng):
    x = rng.standard_normal((2, 3, 4))
    hd.check_grad(pads, x)
    matches_torch(pads, torch_pads, x)
    assert all_gathers(pads, x)


def test_take_gradient_is_a_scatter(rng):
    """Indices are data, so take's adjoint stays a scatter; repeated indices accumulate."""
    args = (rng.standard_normal((2, 3, 4)), np.array([[0, 2], [1, 1], [2, 0]]), np.array([0, 23, 5, 5]),
            np.array([-3, 1, 9]))
    hd.check_grad(takes, *args)
    matches_torch(takes, torch_takes, *args)
    fs = forms(takes, *args)
    assert set(fs["x"]) <= {"gather", "gather-window", "scatter-parallel", "scatter-serial"}
    assert any(f.startswith("scatter") for fs_ in fs.values() for f in fs_)


def test_take_out_of_range_raises(rng):
    args = (rng.standard_normal((2, 3, 4)), np.array([[0, 2], [1, 3], [2, 0]]), np.array([0, 23, 5, 5]),
            np.array([-3, 1, 9]))
    with pytest.raises(hd.BoundsError, match="was 3, outside dimension 1 of x"):
        takes(*args)


def test_pad_reflect_beyond_one_period_matches_numpy(rng):
    x = rng.standard_normal((3, 4))
    np.testing.assert_array_equal(ops.pad(x, (6, 7), "reflect"), np.pad(x, (6, 7), "reflect"))


def test_argument_checks():
    x = np.ones((2, 3))
    with pytest.raises(hd.ShapeError, match=r"cannot reshape x of shape \(2, 3\)"):
        ops.reshape(x, (4, -1))
    with pytest.raises(hd.ShapeError, match=r"ops.squeeze: axis 1 of x \(shape \(2, 3\)\) has size 3, not 1"):
        ops.squeeze(x, 1)
    with pytest.raises(hd.ShapeError, match=r"does not match tensors\[0\]'s \(2, 3\) outside axis 0"):
        hd.func(lambda a, b: ops.concatenate([a, b]))(x, np.ones((2, 2)))
    with pytest.raises(hd.ShapeError, match=r"cannot be split into 2 equal parts"):
        ops.split(x, 2, 1)
    with pytest.raises(hd.ShapeError, match="pad_width must be an int"):
        hd.func(lambda a: ops.pad(a, ((1, 2, 3),)))(x)
    with pytest.raises(hd.TraceError, match="mode='wrap'"):
        ops.pad(x, 1, "wrap")
    with pytest.raises(hd.ShapeError, match=r"cannot broadcast shape \(2, 3\) to \(3, 3\)"):
        ops.broadcast_to(x, (3, 3))
    with pytest.raises(hd.TraceError, match="indices must be an integer tensor"):
        ops.take(x, np.ones(2))
    with pytest.raises(hd.ShapeError, match="a stride cannot be 0"):
        ops.strided_slice(x, [0], [1], [0])
