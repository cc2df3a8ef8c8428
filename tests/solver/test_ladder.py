"""The index inverter's ladder (issue 3): every listed index form becomes a gather, and the rest a
deterministic scatter.

Each case is one `@hd.func` program (defined once, at module level, so each signature compiles once)
with small inputs. Every case gets a structural test (every adjoint contribution is a `gather` or a
`gather-window`) and a finite-difference test in float64; where PyTorch has the op, its forward
result and gradient are compared with PyTorch's as well.
"""
import re

import numpy as np
import pytest

import halide_ad as hd
from tests import programs as P

GATHER_FORMS = {"gather", "gather-window"}


# ---- programs: convolution and pooling ----------------------------------------------------------

@hd.func
def conv(x, w, stride=1, dilation=1, groups=1):
    """NCHW convolution with stride, dilation and groups; w is (K, C // groups, R, S)."""
    N, _, H, W = x.shape
    K, Cg, R, S = w.shape
    Kg = K // groups
    Ho = (H - dilation * (R - 1) - 1) // stride + 1
    Wo = (W - dilation * (S - 1) - 1) // stride + 1
    c, r, s = hd.rdom(Cg, R, S)
    return hd.compute((N, K, Ho, Wo), lambda n, k, i, j: hd.sum(
        x[n, (k // Kg) * Cg + c, stride * i + dilation * r, stride * j + dilation * s] * w[k, c, r, s]),
        name="conv")


@hd.func
def pool(x, k, s, op):
    """k x k pooling with stride s, no padding; op is 'max' or 'avg'."""
    N, C, H, W = x.shape
    r, q = hd.rdom(k, k)
    shape = (N, C, (H - k) // s + 1, (W - k) // s + 1)
    if op == "max":
        return hd.compute(shape, lambda n, c, i, j: hd.max(x[n, c, s * i + r, s * j + q]), name="maxpool")
    return hd.compute(shape, lambda n, c, i, j: hd.sum(x[n, c, s * i + r, s * j + q]) / (k * k),
                      name="avgpool")


@hd.func
def conv_transpose2d(x, w, stride):
    """Transposed convolution written as a gather over (i - r): x[(i - r) // stride] where stride
    divides i - r, under a constant_exterior view; w is (C, K, R, S) as in PyTorch."""
    N, C, H, W = x.shape
    _, K, R, S = w.shape
    xc = hd.constant_exterior(x)
    c, r, s = hd.rdom(C, R, S)
    return hd.compute((N, K, (H - 1) * stride + R, (W - 1) * stride + S), lambda n, k, i, j: hd.sum(
        hd.where(((i - r) % stride == 0) & ((j - s) % stride == 0),
                 xc[n, c, (i - r) // stride, (j - s) // stride], 0.0) * w[c, k, r, s]),
        name="conv_transpose2d")


@hd.func
def conv_transpose1d(x, w, stride):
    """Transposed convolution with the divisibility condition in an rdom's where= predicate."""
    N, C, H = x.shape
    _, K, R = w.shape

    def body(n, k, i):
        c, r = hd.rdom(C, R, where=lambda c, r: ((i - r) % stride == 0) & (i - r >= 0) & (i - r < stride * H))
        return hd.sum(x[n, c, (i - r) // stride] * w[c, k, r])

    return hd.compute((N, K, (H - 1) * stride + R), body, name="conv_transpose1d")


# ---- programs: resampling, div/mod, permutations ------------------------------------------------

@hd.func
def upsample(x, k):
    """Nearest-neighbour upsampling by an integer factor: x[i // k, j // k]."""
    N, C, H, W = x.shape
    return hd.compute((N, C, H * k, W * k), lambda n, c, i, j: x[n, c, i // k, j // k], name="upsample")


@hd.func
def subsample(x, offset):
    """Every other element: x[2*i + offset]."""
    return hd.compute(((x.shape[0] - offset) // 2,), lambda i: x[2 * i + offset], name="subsample")


@hd.func
def pixel_shuffle(x, r, order):
    """(N, C*r*r, H, W) -> (N, C, H*r, W*r). order 'CRD' is PyTorch's pixel_shuffle; 'DCR' is
    depth_to_space (TensorFlow's), with the sub-pixel index outermost in the channel."""
    N, Cin, H, W = x.shape
    C = Cin // (r * r)

    def body(n, c, i, j):
        sub = (i % r) * r + j % r
        return x[n, c * r * r + sub if order == "CRD" else sub * C + c, i // r, j // r]

    return hd.compute((N, C, H * r, W * r), body, name="pixel_shuffle")


@hd.func
def pixel_unshuffle(x, r):
    """Space-to-depth, PyTorch's pixel_unshuffle: (N, C, H*r, W*r) -> (N, C*r*r, H, W)."""
    N, C, H, W = x.shape
    return hd.compute((N, C * r * r, H // r, W // r), lambda n, c, i, j:
                      x[n, c // (r * r), i * r + (c % (r * r)) // r, j * r + c % r], name="pixel_unshuffle")


@hd.func
def flatten(x):
    """(H, W) -> (H*W,), written as x[k // W, k % W]."""
    H, W = x.shape
    return hd.compute((H * W,), lambda k: x[k // W, k % W], name="flatten")


@hd.func
def unflatten(x, W):
    """(H*W,) -> (H, W), written as x[i * W + j]."""
    return hd.compute((x.shape[0] // W, W), lambda i, j: x[i * W + j], name="unflatten")


@hd.func
def reshape(x, shape):
    """Tensor.reshape: nested div/mod of a flat index."""
    return x.reshape(shape)


@hd.func
def flip(x):
    """Both axes reversed: x[H - 1 - i, W - 1 - j]."""
    H, W = x.shape
    return hd.compute(x.shape, lambda i, j: x[H - 1 - i, W - 1 - j], name="flip")


@hd.func
def permute(x, axes):
    """out[idx] = x[idx permuted back], as numpy's transpose(x, axes)."""
    def body(*idx):
        old = [None] * x.ndim
        for d, a in enumerate(axes):
            old[a] = idx[d]
        return x[tuple(old)]
    return hd.compute(tuple(x.shape[a] for a in axes), body, name="permute")


@hd.func
def diagonal(x, offset):
    """x[i, i + offset]."""
    H, W = x.shape
    return hd.compute((min(H, W - offset),), lambda i: x[i, i + offset], name="diagonal")


# ---- programs: broadcasts, concatenation, padding ------------------------------------------------

@hd.func
def row_broadcast(a, b):
    """b[j] read by every row i of a[i, j]: b's adjoint is a reduction over i."""
    return hd.compute(a.shape, lambda i, j: a[i, j] * b[j] + b[j], name="row_broadcast")


@hd.func
def channel_affine(x, g, b):
    """Per-channel scale and shift of NCHW data: g[c] and b[c] reduce over n, h, w."""
    return hd.compute(x.shape, lambda n, c, h, w: x[n, c, h, w] * g[c] + b[c], name="channel_affine")


@hd.func
def concat(a, b):
    """Concatenation along axis 0, written with hd.where."""
    Ha, W = a.shape
    return hd.compute((Ha + b.shape[0], W), lambda i, j: hd.where(i < Ha, a[i, j], b[i - Ha, j]),
                      name="concat")


@hd.func
def pad(x, p):
    """Zero padding by p on every side of the last two axes, written with hd.where."""
    H, W = x.shape
    return hd.compute((H + 2 * p, W + 2 * p), lambda i, j: hd.where(
        (i >= p) & (i < H + p) & (j >= p) & (j < W + p), x[i - p, j - p], 0.0), name="pad")


# ---- programs: the fallback ---------------------------------------------------------------------

@hd.func
def embed(table, idx):
    """Embedding lookup: a data-dependent row index."""
    return hd.compute((idx.shape[0], table.shape[1]), lambda i, f: table[idx[i], f], name="embed")


@hd.func
def square_index(x):
    """A non-linear index: x[i*i % n]."""
    n = x.shape[0]
    return hd.compute((n,), lambda i: x[(i * i) % n], name="square_index")


# ---- cases --------------------------------------------------------------------------------------

def _r(*shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


X4 = _r(2, 4, 9, 8, seed=1)    # NCHW input for convolution
XP = _r(1, 2, 7, 8, seed=2)    # NCHW input for pooling

# id -> (program, args, the float inputs whose contributions must all be gathers)
CASES = {
    "conv-stride2": (conv, (X4, _r(3, 4, 3, 3, seed=3), 2), ("x", "w")),
    "conv-stride3": (conv, (X4, _r(3, 4, 3, 3, seed=3), 3), ("x", "w")),
    "conv-dilation2": (conv, (X4, _r(3, 4, 3, 3, seed=3), 1, 2), ("x", "w")),
    "conv-groups2": (conv, (X4, _r(4, 2, 3, 3, seed=4), 1, 1, 2), ("x", "w")),
    "conv-stride2-dilation2-groups2": (conv, (X4, _r(4, 2, 2, 2, seed=5), 2, 2, 2), ("x", "w")),
    **{f"{op}pool-k{k}-s{s}": (pool, (XP, k, s, op), ("x",))
       for op in ("max", "avg") for k, s in ((2, 2), (3, 2), (3, 1), (2, 1))},
    "upsample-2": (upsample, (_r(1, 2, 3, 4, seed=6), 2), ("x",)),
    "upsample-3": (upsample, (_r(1, 2, 3, 2, seed=6), 3), ("x",)),
    "subsample-even": (subsample, (_r(9, seed=7), 0), ("x",)),
    "subsample-odd": (subsample, (_r(9, seed=7), 1), ("x",)),
    "conv-transpose2d-where": (conv_transpose2d, (_r(1, 2, 3, 4, seed=8), _r(2, 3, 3, 2, seed=9), 2),
                               ("x", "w")),
    "conv-transpose1d-rdom-where": (conv_transpose1d, (_r(2, 2, 5, seed=10), _r(2, 3, 3, seed=11), 2),
                                    ("x", "w")),
    "pixel-shuffle": (pixel_shuffle, (_r(1, 8, 3, 2, seed=12), 2, "CRD"), ("x",)),
    "depth-to-space": (pixel_shuffle, (_r(1, 8, 3, 2, seed=12), 2, "DCR"), ("x",)),
    "pixel-unshuffle": (pixel_unshuffle, (_r(1, 2, 6, 4, seed=13), 2), ("x",)),
    "flatten": (flatten, (_r(3, 5, seed=14),), ("x",)),
    "unflatten": (unflatten, (_r(15, seed=15), 5), ("x",)),
    "reshape-4d-to-2d": (reshape, (_r(2, 3, 2, 5, seed=16), (6, 10)), ("x",)),
    "flip": (flip, (_r(5, 6, seed=17),), ("x",)),
    "permute-nhwc": (permute, (_r(2, 3, 4, 5, seed=18), (0, 2, 3, 1)), ("x",)),
    "permute-reverse": (permute, (_r(2, 3, 4, 5, seed=18), (3, 2, 1, 0)), ("x",)),
    "diagonal": (diagonal, (_r(5, 6, seed=19), 0), ("x",)),
    "superdiagonal": (diagonal, (_r(5, 6, seed=19), 1), ("x",)),
    **{f"view1d-{v}": (P.blur1d, (_r(7, seed=20), v), ("x",)) for v in P.VIEWS},
    **{f"view2d-{v}": (P.blur2d, (_r(5, 6, seed=21), v), ("img",)) for v in P.VIEWS},
    "broadcast-row": (row_broadcast, (_r(4, 5, seed=22), _r(5, seed=23)), ("a", "b")),
    "broadcast-channel": (channel_affine, (_r(2, 3, 4, 5, seed=24), _r(3, seed=25), _r(3, seed=26)),
                          ("x", "g", "b")),
    "concat": (concat, (_r(2, 5, seed=27), _r(3, 5, seed=28)), ("a", "b")),
    "pad": (pad, (_r(4, 5, seed=29), 2), ("x",)),
}
CASE_PARAMS = [pytest.param(*case, id=k) for k, case in CASES.items()]


@pytest.mark.parametrize("fn, args, inputs", CASE_PARAMS)
def test_every_contribution_is_a_gather(fn, args, inputs):
    """Each named input gets at least one contribution, and no adjoint in the program is a scatter."""
    ex = hd.explain(fn, *args)
    for name in inputs:
        forms = ex.forms(name)
        assert forms, f"no adjoint contribution to {name}\n{ex}"
        assert set(forms) <= GATHER_FORMS, f"{name}: {forms}\n{ex}"
    assert set(ex.forms()) <= GATHER_FORMS, f"an intermediate's adjoint is a scatter\n{ex}"


@pytest.mark.parametrize("fn, args, inputs", CASE_PARAMS)
def test_finite_differences(fn, args, inputs):
    """The gradient with respect to every float argument, against central differences (float64)."""
    hd.check_grad(fn, *args)


# ---- against PyTorch ----------------------------------------------------------------------------

def _F(name, **kwargs):
    """A torch.nn.functional op with fixed keyword arguments, taking (torch, *tensors)."""
    return lambda torch, *tensors: getattr(torch.nn.functional, name)(*tensors, **kwargs)


def _torch_box3(torch, x, mode):
    """A 3x3 mean of a 2-D tensor padded by one pixel with torch's `mode`."""
    F = torch.nn.functional
    return F.avg_pool2d(F.pad(x[None, None], (1, 1, 1, 1), mode=mode), 3, 1)[0, 0]


# case id -> the PyTorch op, as a function of (torch, the case's float arrays as tensors, in order)
TORCH_OPS = {
    "conv-stride2": _F("conv2d", stride=2),
    "conv-stride3": _F("conv2d", stride=3),
    "conv-dilation2": _F("conv2d", dilation=2),
    "conv-groups2": _F("conv2d", groups=2),
    "conv-stride2-dilation2-groups2": _F("conv2d", stride=2, dilation=2, groups=2),
    **{f"{op}pool-k{k}-s{s}": _F(f"{op}_pool2d", kernel_size=k, stride=s)
       for op in ("max", "avg") for k, s in ((2, 2), (3, 2), (3, 1), (2, 1))},
    "upsample-2": _F("interpolate", scale_factor=2, mode="nearest"),
    "upsample-3": _F("interpolate", scale_factor=3, mode="nearest"),
    "conv-transpose2d-where": _F("conv_transpose2d", stride=2),
    "conv-transpose1d-rdom-where": _F("conv_transpose1d", stride=2),
    "pixel-shuffle": _F("pixel_shuffle", upscale_factor=2),
    "depth-to-space": lambda torch, x: (x.reshape(1, 2, 2, 2, 3, 2).permute(0, 3, 4, 1, 5, 2)
                                        .reshape(1, 2, 6, 4)),
    "pixel-unshuffle": _F("pixel_unshuffle", downscale_factor=2),
    "flip": lambda torch, x: torch.flip(x, (0, 1)),
    "permute-nhwc": lambda torch, x: x.permute(0, 2, 3, 1),
    "permute-reverse": lambda torch, x: x.permute(3, 2, 1, 0),
    "diagonal": lambda torch, x: torch.diagonal(x, 0),
    "superdiagonal": lambda torch, x: torch.diagonal(x, 1),
    "view2d-repeat_edge": lambda torch, x: _torch_box3(torch, x, "replicate"),
    "view2d-mirror": lambda torch, x: _torch_box3(torch, x, "reflect"),
    "view2d-constant_exterior": lambda torch, x: _torch_box3(torch, x, "constant"),
    "concat": lambda torch, a, b: torch.cat([a, b], 0),
    "pad": _F("pad", pad=(2, 2, 2, 2)),
}


@pytest.mark.parametrize("case", list(TORCH_OPS))
def test_matches_pytorch(case):
    """Forward values and the vjp of a random cotangent, against PyTorch in float64."""
    torch = pytest.importorskip("torch")
    fn, args, _ = CASES[case]
    out, vjp_fn = hd.vjp(fn, *args)
    cotangent = np.random.default_rng(0).standard_normal(out.shape)
    grads = vjp_fn(cotangent)
    floats = [k for k, a in enumerate(args) if isinstance(a, np.ndarray)]
    leaves = [torch.tensor(args[k], requires_grad=True) for k in floats]
    expected = TORCH_OPS[case](torch, *leaves)
    np.testing.assert_allclose(out, expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    expected.backward(torch.tensor(cotangent))
    for k, leaf in zip(floats, leaves, strict=True):
        np.testing.assert_allclose(grads[k], leaf.grad.numpy(), rtol=1e-12, atol=1e-12)


# ---- exact values -------------------------------------------------------------------------------

@pytest.mark.parametrize("offset", [0, 1])
def test_diagonal_gradient_has_no_smearing(offset):
    """x[i, i + offset]: each cotangent lands on exactly one element (Halide's issue #7385)."""
    x = CASES["diagonal"][1][0]
    out, vjp_fn = hd.vjp(diagonal, x, offset)
    np.testing.assert_array_equal(out, np.diagonal(x, offset))
    np.testing.assert_array_equal(vjp_fn(np.ones_like(out))[0], np.eye(*x.shape, k=offset))
    c = np.arange(1.0, out.size + 1)
    expected = np.zeros_like(x)
    expected[np.arange(out.size), np.arange(out.size) + offset] = c
    np.testing.assert_array_equal(vjp_fn(c)[0], expected)


@pytest.mark.parametrize("offset", [0, 1])
def test_subsample_gradient_is_the_indicator(offset):
    """x[2*i + offset]: the gradient of the sum is 1 on the elements read and 0 elsewhere."""
    x = CASES["subsample-even"][1][0]
    out, vjp_fn = hd.vjp(subsample, x, offset)
    np.testing.assert_array_equal(out, x[offset:offset + 2 * out.size:2])
    expected = np.zeros_like(x)
    expected[offset:offset + 2 * out.size:2] = 1.0
    np.testing.assert_array_equal(vjp_fn(np.ones_like(out))[0], expected)


@pytest.mark.parametrize("case", ["flatten", "unflatten", "reshape-4d-to-2d"])
def test_reshape_gradient_is_the_inverse_reshape(case):
    """Reshapes move values without arithmetic: the vjp is the cotangent reshaped back, exactly."""
    fn, args, _ = CASES[case]
    x = args[0]
    out, vjp_fn = hd.vjp(fn, *args)
    np.testing.assert_array_equal(out.reshape(-1), x.reshape(-1))
    c = np.arange(float(out.size)).reshape(out.shape)
    np.testing.assert_array_equal(vjp_fn(c)[0], c.reshape(x.shape))


@pytest.mark.parametrize("view", list(P.VIEWS))
def test_1d_views_match_numpy_padding(view):
    """The 1-D boundary views against the adjoint of numpy's padding, boundary pixels included."""
    x = CASES[f"view1d-{view}"][1][0]
    n = x.size
    out, vjp_fn = hd.vjp(P.blur1d, x, view)
    c = np.random.default_rng(1).standard_normal(n)
    # blur1d is linear: its Jacobian's column k is blur1d applied to the unit vector e_k.
    jac = np.stack([P.blur1d(np.eye(n)[k], view) for k in range(n)], axis=1)
    np.testing.assert_allclose(out, jac @ x, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(vjp_fn(c)[0], jac.T @ c, rtol=1e-12, atol=1e-12)
    p = np.pad(x, 1, mode=P.NUMPY_PAD[view])
    np.testing.assert_allclose(out, (p[:-2] + 2 * p[1:-1] + p[2:]) / 4, rtol=1e-12)


@pytest.mark.parametrize("view", ["repeat_edge", "constant_exterior", "mirror"])
def test_boundary_view_gradient_has_a_branch_free_interior(view):
    """Issue 3, item 7: the adjoint of a 3x3 stencil under a boundary view loops over an interior
    box with no per-element branch (a constant 3x3 window, maybe written out or in two passes),
    plus boundary strips. The box starts one
    pixel in; for mirror two, where the reflection's period quotient has settled."""
    x = CASES[f"view2d-{view}"][1][0]
    H, W = x.shape
    source = hd.explain(P.blur2d, x, view).backward_source
    m = 2 if view == "mirror" else 1
    # the box's row loop, then (after the edge columns of that row) its loop along the row
    head = re.search(rf"for \w+ in p?range\({m}, {H - m}\):\n(?:.*\n)*?"
                     rf"\s+for \w+ in p?range\({m}, {W - m}\):\n", source)
    assert head, source
    interior = re.split(r"\n\s*adj_img\[", source[head.end():])[0]
    interior = "\n".join(line for line in interior.split("\n") if not line.strip().startswith("#"))
    windows = "for r in range(-1, 2):" in interior and "for r_1 in range(-1, 2):" in interior
    # the window, written out, or in two passes through a temporary (which a separable window may
    # take; a 3x3 box does not, as too few terms are saved): 3 rows of the temporary
    reads = len(re.findall(r"\badj_blur2d\[", interior))
    two_passes = ("# separable window: 3 rows x 3 columns" in source
                  and len(re.findall(r"\bwindow\d+\[", interior)) == 3)
    assert windows or reads == 9 or two_passes, interior
    assert not re.search(r"\bif\b|//|%|min\(|max\(", interior), interior


# ---- the fallback -------------------------------------------------------------------------------

TABLE = _r(6, 4, seed=30)
IDX = np.array([3, 0, 3, 5, 3, 1, 0, 3], dtype=np.int64)   # repeated rows: writes collide


def test_embedding_falls_back_to_a_parallel_scatter():
    """table[idx[i], f]: kept as a scatter (with a reason), parallel over the feature dimension."""
    ex = hd.explain(embed, TABLE, IDX)
    assert ex.forms("table") == ["scatter-parallel"], str(ex)
    assert all(c.reason for c in ex.contributions if c.buffer == "table")
    assert "idx" not in {c.buffer for c in ex.contributions}


def test_embedding_gradient_matches_add_at_and_is_deterministic():
    """Repeated indices accumulate as np.add.at does, with the same bits on every run."""
    out, vjp_fn = hd.vjp(embed, TABLE, IDX)
    np.testing.assert_array_equal(out, TABLE[IDX])
    c = np.random.default_rng(2).standard_normal(out.shape)
    expected = np.zeros_like(TABLE)
    np.add.at(expected, IDX, c)
    runs = [vjp_fn(c) for _ in range(3)]
    assert all(r[1] is None for r in runs)
    np.testing.assert_allclose(runs[0][0], expected, rtol=1e-14, atol=0)
    for r in runs[1:]:
        assert r[0].tobytes() == runs[0][0].tobytes()
    hd.check_grad(embed, TABLE, IDX)


def test_embedding_gradient_is_the_same_for_any_thread_count():
    """No atomics: the scatter's result does not depend on the number of threads."""
    numba = pytest.importorskip("numba")
    _, vjp_fn = hd.vjp(embed, TABLE, IDX)
    c = np.random.default_rng(3).standard_normal((IDX.size, TABLE.shape[1]))
    before = numba.get_num_threads()
    try:
        results = []
        for threads in sorted({1, before}):
            numba.set_num_threads(threads)
            results.append(vjp_fn(c)[0].tobytes())
    finally:
        numba.set_num_threads(before)
    assert len(set(results)) == 1


def test_nonlinear_index_falls_back_to_a_scatter():
    """x[i*i % n] is not affine: a scatter with a reason, exact against np.add.at."""
    x = _r(7, seed=31)
    ex = hd.explain(square_index, x)
    forms = ex.forms("x")
    assert forms and set(forms) <= {"scatter-parallel", "scatter-serial"}, str(ex)
    assert all(c.reason for c in ex.contributions if c.buffer == "x")
    out, vjp_fn = hd.vjp(square_index, x)
    i = np.arange(x.size)
    np.testing.assert_array_equal(out, x[i * i % x.size])
    c = np.random.default_rng(4).standard_normal(x.size)
    expected = np.zeros_like(x)
    np.add.at(expected, i * i % x.size, c)
    np.testing.assert_allclose(vjp_fn(c)[0], expected, rtol=1e-14, atol=0)
    hd.check_grad(square_index, x)
