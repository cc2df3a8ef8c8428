"""The everyday cases of issue 26: what a user meets first, written in halide_ad, PyTorch and JAX.

Elementwise math on 4M float32 elements, softmax and layer norm over the rows of (4096, 1024), and
a small layer (conv 3x3 with bias, relu, 2x2 max pool), each a `Case` like the kernel cases. The
halide_ad programs use `halide_ad.ops` where it has the operator; where it has none (tanh-GELU,
x * sigmoid(x)), they are written in the DSL as a user would write them. The peers use their own
fused operators (F.gelu, jax.nn.silu, ...), their best.

The dispatch cases, the training step and the first call on empty caches are timed differently
(whole calls, fresh processes): see `benchmarks.calls` and `benchmarks.warm_start`.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import halide_ad as hd
from benchmarks.bounds import CostModel, Shape, contraction, memory_bound
from benchmarks.cases import Case, F, jax, jnp, lax
from halide_ad import ops

ELEMENTS = 4 * 2**20
SMALL_ELEMENTS = 1001
ROWS = (4096, 1024)
SMALL_ROWS = (7, 13)
GELU_C = math.sqrt(2 / math.pi)
LAYER_SHAPES = ((4, 3, 16, 16), (8, 3, 3, 3), (8,))
SMALL_LAYER_SHAPES = ((2, 3, 6, 6), (4, 3, 3, 3), (4,))


# --- halide_ad programs ---------------------------------------------------------------------------


@hd.func
def tanh(x):
    return ops.tanh(x)


@hd.func
def gelu_tanh(x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): no op in halide_ad.ops, so written in the
    DSL, the cube as the formula reads."""
    return hd.compute(
        x.shape,
        lambda *i: 0.5 * x[i] * (1 + hd.tanh(GELU_C * (x[i] + 0.044715 * x[i] ** 3))),
        name="gelu_tanh",
    )


@hd.func
def silu(x):
    """x * sigmoid(x) (no op in halide_ad.ops): one Func, as a user writes it in the DSL."""
    return hd.compute(x.shape, lambda *i: x[i] * hd.sigmoid(x[i]), name="silu")


@hd.func
def affine(x, w):
    """x * w + x with the Tensor operators."""
    return x * w + x


@hd.func
def softmax(x):
    return ops.softmax(x, axis=-1)


@hd.func
def layer_norm(x, gamma, beta):
    return ops.layer_norm(x, gamma, beta, axis=-1)


@hd.func
def small_layer(x, w, b):
    """conv 3x3, zero padding 1, with bias -> relu -> 2x2 max pool."""
    return ops.max_pool2d(ops.relu(ops.conv2d(x, w, b, padding=1)), 2)


# --- PyTorch programs -----------------------------------------------------------------------------


def torch_tanh(x):
    return x.tanh()


def torch_gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def torch_silu(x):
    return F.silu(x)


def torch_affine(x, w):
    return x * w + x


def torch_softmax(x):
    return F.softmax(x, dim=-1)


def torch_layer_norm(x, gamma, beta):
    return F.layer_norm(x, x.shape[-1:], gamma, beta)


def torch_small_layer(x, w, b):
    return F.max_pool2d(F.relu(F.conv2d(x, w, b, padding=1)), 2)


# --- JAX programs ---------------------------------------------------------------------------------


def jax_tanh(x):
    return jnp.tanh(x)


def jax_gelu_tanh(x):
    return jax.nn.gelu(x, approximate=True)


def jax_silu(x):
    return jax.nn.silu(x)


def jax_affine(x, w):
    return x * w + x


def jax_softmax(x):
    return jax.nn.softmax(x, axis=-1)


def jax_layer_norm(x, gamma, beta, eps=1e-5):
    """jax has no layer norm of its own (flax's is this): biased variance, as torch's."""
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * gamma + beta


def jax_small_layer(x, w, b):
    y = lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)),
                                 dimension_numbers=("NCHW", "OIHW", "NCHW"))
    y = jax.nn.relu(y + b[None, :, None, None])
    return lax.reduce_window(y, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")


# --- the cases ------------------------------------------------------------------------------------


def _elementwise(name: str, description: str, hd_fn, torch_fn, jax_fn, *, backward: bool,
                 cost: CostModel | None = None) -> Case:
    return Case(
        name=name,
        description=f"{description}, {ELEMENTS // 2**20}M float32",
        shapes=((ELEMENTS,),),
        small_shapes=((SMALL_ELEMENTS,),),
        out_shape=lambda x: x,
        halide_ad=hd_fn,
        torch=torch_fn,
        jax=jax_fn,
        cost=cost or memory_bound(needed=(0,)),
        backward=backward,
    )


def _layer_flops(shapes: Sequence[Shape], out: Shape) -> int:
    """The convolution's FLOPs (the pool's output is a quarter of the convolution's)."""
    (n, _, h, w), (k, c, r, s) = shapes[0], shapes[1]
    return 2 * n * k * h * w * c * r * s


LAYER = Case(
    name="layer",
    description="conv2d 3x3 pad 1 with bias -> relu -> maxpool 2x2 (ops.conv2d, ops.relu, "
    "ops.max_pool2d)",
    shapes=LAYER_SHAPES,
    small_shapes=SMALL_LAYER_SHAPES,
    out_shape=lambda x, w, b: (x[0], w[0], x[2] // 2, x[3] // 2),
    halide_ad=small_layer,
    torch=torch_small_layer,
    jax=jax_small_layer,
    cost=contraction(_layer_flops),
)

EVERYDAY_CASES: tuple[Case, ...] = (
    _elementwise("tanh", "tanh (ops.tanh)", tanh, torch_tanh, jax_tanh, backward=False),
    _elementwise("gelu", "tanh-GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))",
                 gelu_tanh, torch_gelu_tanh, jax_gelu_tanh, backward=False),
    _elementwise("silu", "x * sigmoid(x)", silu, torch_silu, jax_silu, backward=True),
    Case(
        name="affine",
        description="x * w + x, 64K float32",
        shapes=((2**16,), (2**16,)),
        small_shapes=((SMALL_ELEMENTS,), (SMALL_ELEMENTS,)),
        out_shape=lambda x, w: x,
        halide_ad=affine,
        torch=torch_affine,
        jax=jax_affine,
        cost=memory_bound(needed=(0, 1)),
        backward=False,
    ),
    Case(
        name="softmax",
        description=f"softmax over the rows of {ROWS} (ops.softmax)",
        shapes=(ROWS,),
        small_shapes=(SMALL_ROWS,),
        out_shape=lambda x: x,
        halide_ad=softmax,
        torch=torch_softmax,
        jax=jax_softmax,
        cost=memory_bound(needed=(0,)),  # the output, in a peer's form, is as big as x
    ),
    Case(
        name="layer_norm",
        description=f"layer norm over the rows of {ROWS} with gamma and beta (ops.layer_norm)",
        shapes=(ROWS, ROWS[1:], ROWS[1:]),
        small_shapes=(SMALL_ROWS, SMALL_ROWS[1:], SMALL_ROWS[1:]),
        out_shape=lambda x, gamma, beta: x,
        halide_ad=layer_norm,
        torch=torch_layer_norm,
        jax=jax_layer_norm,
        cost=memory_bound(needed=(0, 1)),
    ),
    LAYER,
)


@dataclass(frozen=True, slots=True)
class FirstCall:
    """The first forward and backward of `case` in each library, each in a fresh process with
    empty caches (`benchmarks.warm_start.measure_cold`): what a user's first minute costs."""

    name: str
    description: str
    case: Case


FIRST_CALL = FirstCall(
    name="first_call",
    description="the first forward + backward of `layer`, in a fresh process per library with empty "
    "halide_ad and numba caches (imports not counted; torch eager, JAX's first jit + vjp)",
    case=LAYER,
)
