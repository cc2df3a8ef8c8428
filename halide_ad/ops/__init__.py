"""halide_ad.ops: an operator library whose every gradient is derived by halide_ad.

Each operator is written in the DSL only (`hd.compute`, `hd.rdom`, reductions, boundary views):
no hand-written gradient, no numpy in the backward pass. Each is an `@hd.func`, so it inlines
inside traced code and, called with numpy arrays, compiles and runs on its own:

    @hd.func
    def net(x, w, b):
        y = ops.relu(ops.conv2d(x, w, b, stride=2, padding=1))
        return ops.max_pool2d(y, 2)

`docs/operators.md` lists every operator with the form of each adjoint (gather or scatter).
"""
from halide_ad.ops.conv import conv1d, conv2d, conv2d_transpose, dense, matmul
from halide_ad.ops.elementwise import (
    abs,
    add,
    clip,
    divide,
    exp,
    leaky_relu,
    log,
    maximum,
    minimum,
    multiply,
    negative,
    power,
    prelu,
    relu,
    sigmoid,
    sqrt,
    subtract,
    tanh,
    where,
)
from halide_ad.ops.nn import (
    batch_norm,
    bias_add,
    cross_entropy,
    dropout,
    l2_normalize,
    layer_norm,
    log_softmax,
    lrn,
    mse_loss,
    nll_loss,
    softmax,
)
from halide_ad.ops.pool import (
    avg_pool2d,
    global_avg_pool2d,
    global_max_pool2d,
    max_pool2d,
    resize,
    upsampling,
)
from halide_ad.ops.reduce import max, mean, min, prod, sum
from halide_ad.ops.scatter import (
    bincount,
    cumprod,
    cumsum,
    embedding_bag,
    histogram,
    index_add,
    scatter_add,
    segment_sum,
)
from halide_ad.ops.shape import (
    broadcast_to,
    concatenate,
    expand_dims,
    flatten,
    pad,
    reshape,
    split,
    squeeze,
    strided_slice,
    take,
    transpose,
)

__all__ = [
                                       "abs",
                                       "add",
                                       "avg_pool2d",
                                       "batch_norm",
                                       "bias_add",
                                       "broadcast_to",
                                       "clip",
                                       "concatenate",
                                       "conv1d",
                                       "conv2d",
                                       "conv2d_transpose",
                                       "cross_entropy",
                                       # linear and convolution
                                       "dense",
                                       "divide",
                                       "dropout",
                                       "exp",
                                       "expand_dims",
                                       # shape and indexing
                                       "flatten",
                                       "global_avg_pool2d",
                                       "global_max_pool2d",
                                       "l2_normalize",
                                       "layer_norm",
                                       "leaky_relu",
                                       # elementwise and activations
                                       "log",
                                       "log_softmax",
                                       "lrn",
                                       "matmul",
                                       "max",
                                       # pooling and resampling
                                       "max_pool2d",
                                       "maximum",
                                       "mean",
                                       "min",
                                       "minimum",
                                       "mse_loss",
                                       "multiply",
                                       "negative",
                                       "nll_loss",
                                       "pad",
                                       "power",
                                       "prelu",
                                       "prod",
                                       "relu",
                                       "reshape",
                                       "resize",
                                       "sigmoid",
                                       # normalization and losses
                                       "softmax",
                                       "split",
                                       "sqrt",
                                       "squeeze",
                                       "strided_slice",
                                       "subtract",
                                       # reductions
                                       "sum",
                                       "take",
                                       "tanh",
                                       "transpose",
                                       "upsampling",
                                       "where",
                                       # scans and scatters (update definitions)
                                       "bincount",
                                       "cumprod",
                                       "cumsum",
                                       "embedding_bag",
                                       "histogram",
                                       "index_add",
                                       "scatter_add",
                                       "segment_sum",
]
