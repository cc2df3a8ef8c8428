"""BLAS contractions: `einsum_matmul` (engines/matmuls.py) against numpy's einsum on the layouts
contractions produce (transposed and strided views, size-1 and empty axes, stacked taps), and
convolution gradients whose taps go through im2col / col2im against finite differences."""
import itertools
import re

import numpy as np
import pytest
from halide_ad.runtime import parallel
from halide_ad.runtime.engines.blas import BlasPlan, _unwritten
from halide_ad.runtime.engines.blas_plan import Lazy, Plan, Shifted, stand_in
from halide_ad.runtime.engines.matmuls import SMALL_PRODUCT, einsum_matmul, matmul_plan

import halide_ad as hd
from halide_ad.runtime import route
from halide_ad.runtime.engines import blas, matmuls

CASES = [  # (a subscripts, b subscripts, out subscripts, sizes)
    ("ik", "kj", "ij", dict(i=5, j=7, k=3)),
    ("ik", "kj", "ji", dict(i=5, j=7, k=3)),
    ("nkij", "kc", "cnij", dict(n=3, k=4, i=5, j=6, c=2)),  # a convolution's input gradient
    ("nkij", "nrcij", "kcr", dict(n=3, k=4, i=5, j=6, c=2, r=3)),  # its weight gradient
    ("nrcij", "krc", "nkij", dict(n=3, k=4, i=5, j=6, c=2, r=3)),  # the forward
    ("nk", "k", "n", dict(n=4, k=9)),
    ("k", "k", "", dict(k=9)),
    ("nk", "kc", "nc", dict(n=1, k=1, c=1)),
    ("nk", "kc", "nc", dict(n=0, k=3, c=2)),
    ("nk", "nc", "nkc", dict(n=3, k=2, c=4)),  # a letter in all three: einsum
]


@pytest.mark.parametrize("sa, sb, out, sizes", CASES)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_matmul_equals_einsum(sa, sb, out, sizes, layout):
    rng = np.random.default_rng(0)

    def operand(subs):
        shape = [sizes[c] for c in subs]
        if layout == "contiguous":
            return rng.standard_normal(shape)
        if layout == "transposed":
            return rng.standard_normal(shape[::-1]).transpose()
        big = rng.standard_normal([2 * n + 1 for n in shape])
        return big[tuple(slice(1, 1 + 2 * n, 2) for n in shape)]

    va, vb = operand(sa), operand(sb)
    np.testing.assert_allclose(einsum_matmul(va, sa, vb, sb, out), np.einsum(f"{sa},{sb}->{out}", va, vb),
                               rtol=1e-12, atol=1e-12)



def test_matmul_reads_a_large_operand_in_place():
    """A weight gradient's cotangent is read where it lies, one product per image summed,
    rather than transposed into a copy (as it was, three times per step); only an operand
    of at most SMALL_PRODUCT elements is copied to save batching."""
    rng = np.random.default_rng(1)
    dy = rng.standard_normal((2, 8, 70, 70))  # n k i j
    xs = rng.standard_normal((2, 3, 4, 72, 70))[:, :, :, 1:71]  # n s c i j: a row tap's view of a stack
    assert dy.size > SMALL_PRODUCT
    plan = matmul_plan("nkij", dy.shape, dy.strides, "nscij", xs.shape, xs.strides, "ksc")
    assert not plan.a.copy and not plan.b.copy and plan.images == "summed"
    np.testing.assert_allclose(einsum_matmul(dy, "nkij", xs, "nscij", "ksc"), np.einsum("nkij,nscij->ksc", dy, xs),
                               rtol=1e-10, atol=1e-10)
    w = rng.standard_normal((8, 4, 3))  # k c s: small, so copied into the order one product needs
    plan = matmul_plan("kcs", w.shape, w.strides, "nscij", xs.shape, xs.strides, "nkij")
    assert plan.images == "batched" and (plan.a.copy or plan.b.copy)
    np.testing.assert_allclose(einsum_matmul(w, "kcs", xs, "nscij", "nkij"), np.einsum("kcs,nscij->nkij", w, xs),
                               rtol=1e-10, atol=1e-10)


@hd.func
def conv(x, w, stride):
    N, C, H, W = x.shape
    K, _, R, S = w.shape
    c, r, s = hd.rdom(C, R, S)
    return hd.compute((N, K, (H - R) // stride + 1, (W - S) // stride + 1),
                      lambda n, k, i, j: hd.sum(x[n, c, stride * i + r, stride * j + s] * w[k, c, r, s]))


@pytest.mark.parametrize("stride, shape", list(itertools.product([1, 2], [(2, 3, 9, 8), (1, 2, 11, 10)])))
def test_convolution_through_blas_matches_finite_differences(stride, shape):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape)
    w = rng.standard_normal((16, shape[1], 3, 3))  # 16 channels out: BLAS computes the input gradient too
    hd.check_grad(lambda x, w: conv(x, w, stride), x, w)
    explained = str(hd.explain(conv, x, w, stride))
    assert explained.count("[computed by BLAS]") == 2, explained  # the input's and the weight's gradients


@hd.func
def conv1d_shifted(x, w):
    """A 1-D convolution that reads one sample to the right: the window's index has a constant."""
    N, C, L = x.shape
    K, _, R = w.shape
    c, r = hd.rdom(C, R)
    return hd.compute((N, K, L - R), lambda n, k, i: hd.sum(x[n, c, i + r + 1] * w[k, c, r]))


@pytest.fixture
def fresh_plans(monkeypatch):
    """Every call plans its contraction anew: plans outlive a test with the kernels they belong
    to, and the spies below watch planning. Row taps loop around BLAS at any size."""
    real = BlasPlan.accumulate

    def accumulate(self, buffers, **kwargs):
        self.__dict__.pop("_plans", None)
        self.__dict__.pop("images", None)  # (cached, with MIN_IMAGE_WORK as it was)
        self.__dict__.pop("_stack_small", None)
        return real(self, buffers, **kwargs)

    monkeypatch.setattr(BlasPlan, "accumulate", accumulate)
    monkeypatch.setattr(BlasPlan, "SMALL_STACK", 0)  # the tests' small shapes plan as big ones do


@pytest.fixture
def correlations(monkeypatch, fresh_plans):
    """How many contractions took `_correlation` (one product per stride phase, no window sums)."""
    taken = []
    real = BlasPlan._correlation

    def spy(self, *args):
        parts = real(self, *args)
        taken.append(parts is not None)
        return parts

    monkeypatch.setattr(BlasPlan, "_correlation", spy)
    return taken


@pytest.mark.parametrize("stride, taps", [(1, (3, 3)), (2, (3, 3)), (3, (2, 3)), (2, (1, 4))])
@pytest.mark.parametrize("tap_products", [True, False])
@pytest.mark.parametrize("on_threads", [False, True])
def test_input_gradient_as_correlation_matches_torch(stride, taps, tap_products, on_threads, correlations,
                                                     monkeypatch):
    """Strided, the input's gradient is a product per tap and a gather (`_tap_product`); where
    those products would be too big, one correlation per stride phase. `on_threads`: every copy
    and product split over the threads, as big ones are."""
    torch = pytest.importorskip("torch")
    if on_threads:
        monkeypatch.setattr(parallel, "PARALLEL_COPY_BYTES", 0)
        monkeypatch.setattr(parallel, "SMALL_MATMUL", 0)
    if not tap_products:
        monkeypatch.setattr(route, "MAX_TAP_PRODUCT_BYTES", 0)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 10, 11))
    w = rng.standard_normal((16, 3) + taps)
    out, vjp_fn = hd.vjp(lambda x, w: conv(x, w, stride), x, w)
    ct = rng.standard_normal(out.shape)
    gx, gw = vjp_fn(ct)
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    torch.nn.functional.conv2d(tx, tw, stride=stride).backward(torch.from_numpy(ct))
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(gw, tw.grad.numpy(), rtol=1e-10, atol=1e-10)
    # the input's gradient, unless a gather adds its taps; the weight's has no shifted output
    assert correlations == [stride == 1 or not tap_products, False], correlations



@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, stride", [((2, 3, 11, 10), (2, 2)), ((1, 4, 9, 12), (3, 2)),
                                           ((1, 2, 8, 9), (2, 3))])
def test_strided_input_gradient_is_a_product_per_tap_and_a_gather(shape, stride, dtype):
    """BLAS writes adj_x_taps[n, c, r, s, i, j] = sum over k of ct[n, k, i, j] * w[k, c, r, s] in
    one call per image, and a gather adds each input pixel's taps: against finite differences
    (float64) and torch, with ragged edges (pixels that no tap reads)."""
    sy, sx = stride

    @hd.func
    def strided(x, w):
        N, C, H, W = x.shape
        K, _, R, S = w.shape
        c, r, s = hd.rdom(C, R, S)
        return hd.compute((N, K, (H - R) // sy + 1, (W - S) // sx + 1),
                          lambda n, k, i, j: hd.sum(x[n, c, sy * i + r, sx * j + s] * w[k, c, r, s]))

    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal((16, shape[1], 3, 3)).astype(dtype)  # 16 summed channels: BLAS
    report = hd.explain(strided, x, w)
    taps = [c for c in report.contributions if c.buffer == "x_taps"]
    assert len(taps) == 1 and "[computed by BLAS]" in taps[0].formula, str(report)
    assert report.forms("x") == ["gather-window"], str(report)
    out, vjp_fn = hd.vjp(strided, x, w)
    ct = rng.standard_normal(out.shape).astype(dtype)
    gx, gw = vjp_fn(ct)
    assert gx.dtype == dtype and gw.dtype == dtype
    if dtype == np.float64:
        hd.check_grad(strided, x, w)
    torch = pytest.importorskip("torch")
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    torch.nn.functional.conv2d(tx, tw, stride=stride).backward(torch.from_numpy(ct))
    tol = 1e-10 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(gw, tw.grad.numpy(), rtol=tol, atol=tol)


def test_copies_run_in_rounds_after_what_they_read():
    """The fills and copies into a temporary come before the copies that read it (a padded
    operand, then its stacked windows): each round runs in parallel."""
    plan = Plan("out")
    padded = plan.temporary((2, 6), np.float32)
    stacked = plan.temporary((2, 3, 4), np.float32)
    other = plan.temporary((2, 4), np.float32)
    x = Lazy("x", (), stand_in((2, 4), np.float32))
    plan.copy(padded[:, :1], None)
    plan.copy(padded[:, 5:], None)
    plan.copy(padded[:, 1:5], x)
    for t in range(3):
        plan.copy(stacked[:, t], padded[:, t:t + 4])
    plan.copy(other, x)
    rounds = [[(d.source, None if s is None else s.source) for d, s in r] for r in plan.rounds]
    assert rounds == [[(0, None), (0, None), (0, "x"), (2, "x")], [(1, 0)] * 3], rounds


@pytest.mark.parametrize("offset", [(0, -2, 1), (1, 3, -4), (-1, -1, -1), (0, 9, 0), (0, 0, 0)])
def test_a_shifted_window_copies_what_it_overlaps_and_zeroes_the_rest(offset):
    """A window of an operand zero-padded on every side (a convolution's input gradient stacks
    such windows of the cotangent) is copied without a padded copy: every element is written,
    inside the operand with its value, outside with 0, including a window wholly outside."""
    x = np.arange(1, 61, dtype=np.float32).reshape(2, 5, 6)
    shape = (3, 4, 7)
    plan = Plan("out")
    dst = plan.temporary(shape, np.float32)
    plan.copy_shifted(dst, Shifted(Lazy("x", (), stand_in(x.shape, x.dtype)), offset, shape))
    sources = {"x": x, 0: np.full(shape, np.nan, np.float32)}
    plan.run_copies(sources)
    padded = np.pad(x, 10)
    expected = padded[tuple(slice(10 + o, 10 + o + n) for o, n in zip(offset, shape))]
    np.testing.assert_array_equal(sources[0], expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("stride", [1, 2])
def test_a_big_convolution_runs_image_by_image(stride, dtype, fresh_plans, monkeypatch):
    """Above MIN_IMAGE_WORK, the forward and both gradients run one image at a time on the
    threads; the weight's gradient adds up the images' parts. Against torch, finite
    differences (float64), and the same call with one thread, bit for bit."""
    import numba
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(BlasPlan, "MIN_IMAGE_WORK", 0)
    images = []
    real = blas.each_image
    monkeypatch.setattr(blas, "each_image", lambda body, count: images.append(count) or real(body, count))
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 16, 9, 10)).astype(dtype)
    w = rng.standard_normal((16, 16, 3, 3)).astype(dtype)
    out, vjp_fn = hd.vjp(lambda x, w: conv(x, w, stride), x, w)
    ct = rng.standard_normal(out.shape).astype(dtype)
    gx, gw = vjp_fn(ct)
    # forward, the weight's gradient and (stride 1) the input's, each over the 3 images
    assert images == [3] * (3 if stride == 1 else 2), images
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    ty = torch.nn.functional.conv2d(tx, tw, stride=stride)
    ty.backward(torch.from_numpy(ct))
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for ours, theirs in ((out, ty), (gx, tx.grad), (gw, tw.grad)):
        np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=tol, atol=tol)
    if dtype == np.float64:
        hd.check_grad(lambda x, w: conv(x, w, stride), x, w)
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        gx1, gw1 = vjp_fn(ct)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(gx1, gx)
    np.testing.assert_array_equal(gw1, gw)


def test_an_array_read_twice_is_split_by_image_only_where_both_reads_allow_it(fresh_plans, monkeypatch):
    """out[n, k] = sum x[n, i + r] * x[k, r]: the first read of x has the image n first, but
    the second reads every image, so x cannot be split by image, and the contraction runs whole."""
    monkeypatch.setattr(BlasPlan, "MIN_IMAGE_WORK", 0)
    images = []
    real = blas.each_image
    monkeypatch.setattr(blas, "each_image", lambda body, count: images.append(count) or real(body, count))

    @hd.func
    def correlate(x):
        N, L = x.shape
        i, r = hd.rdom(L - 4, 4)
        return hd.compute((N, N), lambda n, k: hd.sum(x[n, i + r] * x[k, r]))

    x = np.random.default_rng(3).standard_normal((5, 40))
    L = x.shape[1]
    expected = np.einsum("nir,kr->nk", np.stack([x[:, r:r + L - 4] for r in range(4)], axis=-1), x[:, :4])
    np.testing.assert_allclose(correlate(x), expected, rtol=1e-12, atol=1e-12)
    assert images == [], images
    hd.check_grad(correlate, x)


def test_unwritten_parts_of_tiled_windows():
    even, odd = (slice(0, 63, 2), ...), (slice(1, 62, 2), ...)  # a stride-2 output's phases on 64 points
    assert _unwritten([even, odd], (64,)) == [([63],)]
    assert _unwritten([(0, slice(0, 4)), (1, slice(0, 4))], (3, 5)) == [([2],), (slice(None), [4])]
    assert _unwritten([(slice(0, 8),)], (8,)) == []
    assert _unwritten([(slice(0, 2), slice(0, 0)), (slice(2, 4), slice(0, 3))], (4, 3)) is None  # not a box


def test_strided_input_gradient_zeroes_what_it_does_not_write(monkeypatch):
    """The stride-2 input gradient as correlations (where products per tap would be too big)
    writes its phases' windows over whatever the buffer held and zeroes only what no window
    reaches (x's last row, which no output reads): a buffer recycled dirty still comes out right."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(route, "MAX_TAP_PRODUCT_BYTES", 0)
    seen = []
    real = BlasPlan.accumulate

    def spy(self, buffers, **kwargs):
        seen.append((self, {n: a.copy() for n, a in buffers.items()}))
        return real(self, buffers, **kwargs)

    monkeypatch.setattr(BlasPlan, "accumulate", spy)
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((2, 3, 10, 11)), rng.standard_normal((16, 3, 3, 3))
    out, vjp_fn = hd.vjp(lambda x, w: conv(x, w, 2), x, w)
    ct = rng.standard_normal(out.shape)
    vjp_fn(ct)
    (contraction, arrays), = [(c, a) for c, a in seen if a[c.out].size == x.size]  # the input's gradient
    arrays[contraction.out][...] = np.nan
    real(contraction, arrays, assign=True)
    gx = arrays[contraction.out].reshape(x.shape)
    tx = torch.from_numpy(x).requires_grad_()
    torch.nn.functional.conv2d(tx, torch.from_numpy(w), stride=2).backward(torch.from_numpy(ct))
    assert not gx[..., 9, :].any()
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-10, atol=1e-10)


def test_a_contraction_is_planned_once(monkeypatch):
    """The views, copies and products are worked out on the first call; later calls with new
    numbers run that plan, and get their own right answers."""
    torch = pytest.importorskip("torch")
    planned = []
    real = BlasPlan._plan

    def plan(self, *args):
        planned.append(self.out)
        return real(self, *args)

    monkeypatch.setattr(BlasPlan, "_plan", plan)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 3, 13, 12))  # a shape no other test traces: nothing is planned yet
    w = rng.standard_normal((16, 3, 3, 3))
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    ty = torch.nn.functional.conv2d(tx, tw, stride=2)
    out, vjp_fn = hd.vjp(lambda x, w: conv(x, w, 2), x, w)
    for step in range(3):
        ct = rng.standard_normal(out.shape)
        gx, gw = vjp_fn(ct)
        if step == 0:
            first = list(planned)
        tgx, tgw = torch.autograd.grad(ty, (tx, tw), torch.from_numpy(ct), retain_graph=True)
        np.testing.assert_allclose(gx, tgx.numpy(), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(gw, tgw.numpy(), rtol=1e-10, atol=1e-10)
    # the weight's gradient and the input's products per tap, each once
    assert sorted(first) == ["adj_w", "adj_x_taps"] and planned == first, planned

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_correlation_with_a_constant_offset(dtype, correlations):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 12)).astype(dtype)
    w = rng.standard_normal((16, 3, 4)).astype(dtype)
    hd.check_grad(conv1d_shifted, x, w)
    out, vjp_fn = hd.vjp(conv1d_shifted, x, w)
    ct = rng.standard_normal(out.shape).astype(dtype)
    gx, _ = vjp_fn(ct)
    expected = np.zeros_like(x)
    for r in range(4):  # the scatter as written: adj_x[n, c, i + r + 1] += ct[n, k, i] * w[k, c, r]
        expected[:, :, r + 1:r + 1 + out.shape[2]] += np.einsum("nki,kc->nci", ct, w[:, :, r])
    assert gx.dtype == dtype
    np.testing.assert_allclose(gx, expected, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5)
    assert True in correlations


@pytest.fixture
def stacked_copies(monkeypatch, fresh_plans):
    """How many windows each stacked copy (im2col) holds."""
    sizes = []
    real = blas._stacked

    def spy(windows, *args):
        sizes.append(len(windows))
        return real(windows, *args)

    monkeypatch.setattr(blas, "_stacked", spy)
    return sizes


@hd.func
def conv_nhwc(x, w):
    """A 2-D convolution with channels last: the column taps are no longer the last axis."""
    N, H, W, C = x.shape
    R, S, _, K = w.shape
    r, s, c = hd.rdom(R, S, C)
    return hd.compute((N, H - R + 1, W - S + 1, K), lambda n, i, j, k: hd.sum(x[n, i + r, j + s, c] * w[r, s, c, k]))


@hd.func
def conv3d(x, w):
    N, C, D, H, W = x.shape
    K, _, Q, R, S = w.shape
    c, q, r, s = hd.rdom(C, Q, R, S)
    return hd.compute((N, K, D - Q + 1, H - R + 1, W - S + 1),
                      lambda n, k, d, i, j: hd.sum(x[n, c, d + q, i + r, j + s] * w[k, c, q, r, s]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_row_taps_stack_only_the_lane(layout, dtype, stacked_copies):
    """A 3x3 convolution's operands are stacked once per column tap: the row taps are views of
    that copy. The forward and both gradients match torch in either layout."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 16, 9, 8)).astype(dtype)  # 16 channels each way: all three go to BLAS
    w = rng.standard_normal((16, 16, 3, 3)).astype(dtype)
    ct = rng.standard_normal((2, 16, 7, 6)).astype(dtype)
    if layout == "nchw":
        out, vjp_fn = hd.vjp(lambda x, w: conv(x, w, 1), x, w)
        gx, gw = vjp_fn(ct)
    else:  # the same numbers, channels last
        out, vjp_fn = hd.vjp(conv_nhwc, x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0))
        gx, gw = vjp_fn(ct.transpose(0, 2, 3, 1))
        out, gx, gw = out.transpose(0, 3, 1, 2), gx.transpose(0, 3, 1, 2), gw.transpose(3, 2, 0, 1)
    assert stacked_copies == [3, 3, 3], stacked_copies  # the forward's x, adj_x's cotangent, adj_w's x
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    ty = torch.nn.functional.conv2d(tx, tw)
    ty.backward(torch.from_numpy(ct))
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(out, ty.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(gw, tw.grad.numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_taps_of_an_input_gradient_are_rows_of_one_product(dtype, fresh_plans, monkeypatch):
    """A stride-1 input gradient runs one product whose rows are (channel, row tap) pairs, 96 for
    32 channels and 3 row taps, over the stacked cotangent's padded rows, then sums its row taps'
    slices shifted: BLAS runs one product of 96 rows faster than three of 32. The weight gradient
    keeps one product per row tap (its row taps shift an operand, not the output)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 16, 10, 9)).astype(dtype)
    w = rng.standard_normal((16, 16, 3, 3)).astype(dtype)
    out, vjp_fn = hd.vjp(lambda x, w: conv(x, w, 1), x, w)
    ct = rng.standard_normal(out.shape).astype(dtype)
    rows = []
    real = matmuls.einsum_matmul
    monkeypatch.setattr(matmuls, "einsum_matmul", lambda va, sa, vb, sb, so, into=None: rows.append(len(so)) or
                        real(va, sa, vb, sb, so, into))
    gx, gw = vjp_fn(ct)
    assert sorted(rows) == [3, 3, 3, 5], rows  # adj_w: 3 products (k, c, s); adj_x: 1 (n, c, r, i, j)
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    torch.nn.functional.conv2d(tx, tw).backward(torch.from_numpy(ct))
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(gw, tw.grad.numpy(), rtol=tol, atol=tol)


def test_row_taps_of_a_3d_convolution(stacked_copies):
    """Two row taps (depth and rows) loop over views of one copy stacked per column tap."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 16, 5, 6, 7))
    w = rng.standard_normal((16, 16, 2, 3, 2))
    hd.check_grad(conv3d, x, w)
    stacked_copies.clear()
    out, vjp_fn = hd.vjp(conv3d, x, w)
    ct = rng.standard_normal(out.shape)
    gx, gw = vjp_fn(ct)
    assert stacked_copies == [2, 2, 2], stacked_copies
    expected_gx, expected_gw = np.zeros_like(x), np.zeros_like(w)
    for q, r, s in itertools.product(range(2), range(3), range(2)):  # the scatter as written
        window = (slice(None), slice(None), slice(q, q + out.shape[2]), slice(r, r + out.shape[3]),
                  slice(s, s + out.shape[4]))
        expected_gx[window] += np.einsum("nkdij,kc->ncdij", ct, w[:, :, q, r, s])
        expected_gw[:, :, q, r, s] = np.einsum("nkdij,ncdij->kc", ct, x[window])
    np.testing.assert_allclose(gx, expected_gx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gw, expected_gw, rtol=1e-12, atol=1e-12)


@hd.func
def conv_relu_pool(x, w):
    p, q = hd.rdom(2, 2)
    y = hd.relu(conv(x, w, 1))
    return hd.compute(y.shape[:2] + (y.shape[2] // 2, y.shape[3] // 2),
                      lambda n, k, i, j: hd.max(y[n, k, 2 * i + p, 2 * j + q]))


def test_a_gradient_that_blas_reads_is_stored():
    """The pooling gradient (through the relu) is read by the convolution's two BLAS products: it
    is stored whole, not handed over a plane at a time, and both gradients match torch's."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((2, 16, 9, 8)), rng.standard_normal((16, 16, 3, 3))
    explained = hd.explain(conv_relu_pool, x, w)
    assert not re.search(r"\bstage\d+\b", explained.backward_source)
    assert str(explained).count("[computed by BLAS]") == 2
    out, vjp_fn = hd.vjp(conv_relu_pool, x, w)
    ct = rng.standard_normal(out.shape)
    gx, gw = vjp_fn(ct)
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    ty = torch.nn.functional.max_pool2d(torch.relu(torch.nn.functional.conv2d(tx, tw)), 2)
    ty.backward(torch.from_numpy(ct))
    np.testing.assert_allclose(out, ty.detach().numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(gw, tw.grad.numpy(), rtol=1e-10, atol=1e-10)


@hd.func
def shifted_by_half_a_bias(x, b):
    """y[n, k, i] = x[n, k, i] + 0.5 * b[k]: b's gradient sums the cotangent over n and i."""
    return hd.compute(x.shape, lambda n, k, i: x[n, k, i] + 0.5 * b[k])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_sum_of_one_operand_is_a_numpy_sum(dtype):
    """A bias's gradient sums one operand (adj_b[j] += adj_y[i, j], over the leading axis or the
    outer and inner ones) by numpy, along memory, instead of a gather that walks each output's
    window across rows; the sum before the bias gets the cotangent itself, not a copy: against
    the definition, finite differences (float64) and torch."""
    from halide_ad import ops
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    x, w, b = (rng.standard_normal(s).astype(dtype) for s in ((40, 6), (16, 6), (16,)))
    report = hd.explain(ops.dense, x, w, b)
    (bias,) = [c for c in report.contributions if c.buffer == "b"]
    assert "[computed by numpy]" in bias.formula, str(report)
    # adj_dense_sum[i, j] = adj_dense[i, j] is not copied: the BLAS products read the cotangent
    (copy,) = [c for c in report.contributions if c.buffer == "dense_sum"]
    products = [c.formula for c in report.contributions if "[computed by BLAS]" in c.formula]
    assert "[not stored" in copy.formula and len(products) == 2, str(report)
    assert all("adj_dense[" in f and "adj_dense_sum" not in f for f in products), str(report)
    out, vjp_fn = hd.vjp(ops.dense, x, w, b)
    ct = rng.standard_normal(out.shape).astype(dtype)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    gx, gw, gb = vjp_fn(ct)
    np.testing.assert_allclose(gb, ct.sum(axis=0), rtol=tol, atol=tol)
    tx, tw, tb = (torch.from_numpy(a).requires_grad_() for a in (x, w, b))
    torch.nn.functional.linear(tx, tw, tb).backward(torch.from_numpy(ct))
    for ours, theirs in zip((gx, gw, gb), (tx, tw, tb), strict=True):
        np.testing.assert_allclose(ours, theirs.grad.numpy(), rtol=tol, atol=tol)

    x3, b3 = rng.standard_normal((3, 4, 7)).astype(dtype), rng.standard_normal(4).astype(dtype)
    report = hd.explain(shifted_by_half_a_bias, x3, b3)
    assert ["[computed by numpy]" in c.formula for c in report.contributions if c.buffer == "b"] == [True]
    out, vjp_fn = hd.vjp(shifted_by_half_a_bias, x3, b3)
    ct = rng.standard_normal(out.shape).astype(dtype)
    np.testing.assert_allclose(vjp_fn(ct)[1], 0.5 * ct.sum(axis=(0, 2)), rtol=tol, atol=tol)
    if dtype == np.float64:
        hd.check_grad(ops.dense, x, w, b)
        hd.check_grad(shifted_by_half_a_bias, x3, b3)


def test_dot_products_are_no_contraction():
    """s[i] = sum_j a[i, j] * b[i, j] and t = sum_ij a[i, j] * b[i, j] read each element once (no
    reuse for BLAS): loop nests, which a row group can join and which add a long float32 sum in
    float64 (BLAS's sdot adds in float32). A dense product's operands keep theirs."""
    from halide_ad.ir import Bin, Load, Op, Range, Var
    from halide_ad.runtime.contract import contraction
    i, j, k = Var("i"), Var("j"), Var("k")
    shapes = {"a": (64, 32), "b": (64, 32), "w": (32, 16), "s": (64,), "t": (), "y": (64, 16)}
    dot = Bin(Op.MUL, Load("a", (i, j), "float32"), Load("b", (i, j), "float32"))
    assert contraction("s", (i,), dot, (Range(i, 0, 64), Range(j, 0, 32)), None, shapes) is None
    assert contraction("t", (), dot, (Range(i, 0, 64), Range(j, 0, 32)), None, shapes) is None
    product = Bin(Op.MUL, Load("a", (i, k), "float32"), Load("w", (k, j), "float32"))
    assert contraction("y", (i, j), product, (Range(i, 0, 64), Range(j, 0, 16), Range(k, 0, 32)), None,
                       shapes) is not None
