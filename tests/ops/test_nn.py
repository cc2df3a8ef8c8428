"""Softmax, normalizations and losses against finite differences and torch.nn.functional."""
import numpy as np
import pytest

import halide_ad as hd
from halide_ad import ops
from tests.ops.helpers import all_gathers, matches_torch


@hd.func
def softmaxes(x):
    return {"softmax_1": ops.softmax(x, axis=1), "log_softmax": ops.log_softmax(x),
            "l2_normalize": ops.l2_normalize(x, axis=1)}


def torch_softmaxes(x):
    import torch.nn.functional as F
    return {"softmax_1": F.softmax(x, 1), "log_softmax": F.log_softmax(x, -1),
            "l2_normalize": F.normalize(x, dim=1)}


# Several small programs rather than one large one: numba's compile time grows faster than
# linearly with the length of a kernel, and every adjoint of x here gathers from many terms.
@hd.func
def batch_norms(x, gamma, beta, x2, bias):
    return {"batch_norm": ops.batch_norm(x, gamma, beta), "batch_norm_2d": ops.batch_norm(x2, eps=1e-3),
            "bias_add": ops.bias_add(x, bias)}


def torch_batch_norms(x, gamma, beta, x2, bias):
    import torch.nn.functional as F
    return {"batch_norm": F.batch_norm(x, None, None, gamma, beta, training=True),
            "batch_norm_2d": F.batch_norm(x2, None, None, training=True, eps=1e-3), "bias_add": x + bias[:, None, None]}


@hd.func
def layer_norms(x, gamma, beta, x2):
    return {"layer_norm": ops.layer_norm(x, gamma, beta, axis=(-2, -1)), "layer_norm_1": ops.layer_norm(x2)}


def torch_layer_norms(x, gamma, beta, x2):
    import torch.nn.functional as F
    return {"layer_norm": F.layer_norm(x, (4, 5), gamma, beta), "layer_norm_1": F.layer_norm(x2, (3,))}


@hd.func
def lrns(x, x2):
    return {"lrn": ops.lrn(x, size=3, alpha=0.1, beta=0.75, k=1.5), "lrn_even": ops.lrn(x2, size=2, alpha=0.5, beta=0.6, k=2.0)}


def torch_lrns(x, x2):
    import torch.nn.functional as F
    return {"lrn": F.local_response_norm(x, 3, 0.1, 0.75, 1.5),
            "lrn_even": F.local_response_norm(x2[:, :, None], 2, 0.5, 0.6, 2.0)[:, :, 0]}


@hd.func
def class_losses(logits, target, weight, target_ignored, logits4, target4):
    logp = ops.log_softmax(logits, axis=1)
    return {
        "cross_entropy": ops.cross_entropy(logits, target),
        "cross_entropy_weighted": ops.cross_entropy(logits, target_ignored, weight),
        "cross_entropy_4d": ops.cross_entropy(logits4, target4, reduction="none"),
        "nll_loss_sum_ignore": ops.nll_loss(logp, target, reduction="sum", ignore_index=2),
    }


def torch_class_losses(logits, target, weight, target_ignored, logits4, target4):
    import torch.nn.functional as F
    w = weight.detach()  # torch has no gradient for the class weights of integer targets
    return {
        "cross_entropy": F.cross_entropy(logits, target),
        "cross_entropy_weighted": F.cross_entropy(logits, target_ignored, w),
        "cross_entropy_4d": F.cross_entropy(logits4, target4, reduction="none"),
        "nll_loss_sum_ignore": F.nll_loss(F.log_softmax(logits, 1), target, reduction="sum", ignore_index=2),
    }


@hd.func
def other_losses(logits, probs, weight, pred, truth, mask):
    return {"cross_entropy_probs": ops.cross_entropy(logits, probs, weight),
            "mse_loss": ops.mse_loss(pred, truth), "mse_loss_none": ops.mse_loss(pred, truth, "none"),
            "dropout": ops.dropout(pred, mask, 0.25)}


def torch_other_losses(logits, probs, weight, pred, truth, mask):
    import torch.nn.functional as F
    return {"cross_entropy_probs": F.cross_entropy(logits, probs, weight),
            "mse_loss": F.mse_loss(pred, truth), "mse_loss_none": F.mse_loss(pred, truth, reduction="none"),
            "dropout": pred * mask / 0.75}


def batch_norm_args(rng):
    return (rng.standard_normal((2, 3, 4, 5)), rng.standard_normal(3), rng.standard_normal(3),
            rng.standard_normal((5, 3)), rng.standard_normal(3))


def layer_norm_args(rng):
    return rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((4, 5)), rng.standard_normal((4, 5)), rng.standard_normal((5, 3))


def class_loss_args(rng):
    target = rng.integers(0, 4, 5)
    ignored = target.copy()
    ignored[[1, 3]] = -100
    return (rng.standard_normal((5, 4)), target, rng.random(4) + 0.5, ignored, rng.standard_normal((2, 4, 3, 2)),
            rng.integers(0, 4, (2, 3, 2)))


def other_loss_args(rng):
    probs = rng.random((5, 4))
    probs /= probs.sum(axis=1, keepdims=True)
    return (rng.standard_normal((5, 4)), probs, rng.random(4) + 0.5, rng.standard_normal((2, 3)),
            rng.standard_normal((2, 3)), rng.random((2, 3)) > 0.3)


PROGRAMS = {  # name: (program, torch version, arguments)
    "batch_norm_bias_add": (batch_norms, torch_batch_norms, batch_norm_args),
    "layer_norm": (layer_norms, torch_layer_norms, layer_norm_args),
    "lrn": (lrns, torch_lrns, lambda rng: (rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((5, 3)))),
    "softmax_log_softmax_l2_normalize": (softmaxes, torch_softmaxes, lambda rng: (rng.standard_normal((2, 3, 4)),)),
    "class_losses": (class_losses, torch_class_losses, class_loss_args),
    "other_losses_dropout": (other_losses, torch_other_losses, other_loss_args),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_gradients_and_torch(name, rng):
    program, torch_program, make_args = PROGRAMS[name]
    args = make_args(rng)
    hd.check_grad(program, *args)
    matches_torch(program, torch_program, *args)
    assert all_gathers(program, *args)


def test_bad_class_target_raises_at_run_time(rng):
    args = list(class_loss_args(rng))
    args[1] = args[1].copy()
    args[1][2] = 4
    with pytest.raises(hd.BoundsError, match="was 4, outside dimension 0 of classes"):
        class_losses(*args)


def test_argument_checks():
    x = np.ones((2, 3))
    with pytest.raises(hd.ShapeError, match=r"ops.nll_loss: input \(N, C, ...\) of shape \(2, 3\) needs target "
                                            r"of shape \(2,\), got \(3,\)"):
        ops.nll_loss(x, np.zeros(3, np.int64))
    with pytest.raises(hd.TraceError, match="target must be an integer tensor"):
        ops.nll_loss(x, np.zeros(2))
    with pytest.raises(hd.TraceError, match="reduction='avg'; expected one of 'mean', 'sum', 'none'"):
        ops.mse_loss(x, x, "avg")
    with pytest.raises(hd.TraceError, match=r"p=1.0 is outside \[0, 1\)"):
        ops.dropout(x, x, 1.0)
    with pytest.raises(hd.ShapeError, match=r"gamma has shape \(2,\); it must be \(3,\)"):
        ops.batch_norm(x, np.ones(2))
    with pytest.raises(hd.ShapeError, match="bias has 2 entries but axis 1"):
        ops.bias_add(x, np.ones(2))
    with pytest.raises(hd.ShapeError, match=r"ops.lrn: x must be \(N, C, ...\)"):
        ops.lrn(np.ones(3))
