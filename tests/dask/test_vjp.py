"""halide_ad.dask.vjp: chunked gradients against hd.vjp on the whole arrays (bit for bit for the
chunked inputs, to rounding for summed weights), and against finite differences."""
import dask
import numpy as np
import pytest

da = pytest.importorskip("dask.array")

import halide_ad as hd  # noqa: E402
import halide_ad.dask as hdd  # noqa: E402
from halide_ad import blocks  # noqa: E402
from tests.dask import programs as P  # noqa: E402


def _grads(vjp_fn, ct, scheduler="threads"):
    grads = vjp_fn(ct)
    computed = iter(dask.compute(*[g for g in grads if g is not None], scheduler=scheduler))
    return [None if g is None else next(computed) for g in grads]


@pytest.mark.parametrize("view", P.VIEWS)
def test_input_gradients_equal_the_whole_arrays_bit_for_bit(view, rng):
    x = rng.standard_normal((13, 11))
    ct = rng.standard_normal(x.shape)
    out, vjp_fn = hdd.vjp(P.blur, da.from_array(x, chunks=(4, 3)), view)
    np.testing.assert_array_equal(out.compute(), P.blur(x, view))
    (gx, none) = _grads(vjp_fn, ct)
    assert none is None  # the static view has no gradient
    np.testing.assert_array_equal(gx, hd.vjp(P.blur, x, view)[1](ct)[0])


def test_a_pipeline_gradient_in_float32(rng):
    x = rng.standard_normal((26, 22)).astype("float32")
    ct = rng.standard_normal((13, 11)).astype("float32")
    _, vjp_fn = hdd.vjp(P.blur_pool_blur, da.from_array(x, chunks=(8, 6)))
    (gx,) = _grads(vjp_fn, da.from_array(ct, chunks=5))  # a cotangent in other chunks is rechunked
    assert gx.dtype == np.float32
    np.testing.assert_array_equal(gx, hd.vjp(P.blur_pool_blur, x)[1](ct)[0])


@pytest.mark.parametrize("fn", [P.conv_valid, P.conv_strided, P.conv_full])
def test_weight_gradients_sum_over_chunks(fn, rng):
    x, w = rng.standard_normal((18, 16)), rng.standard_normal((3, 2))
    ref_out, ref_vjp = hd.vjp(fn, x, w)
    ct = rng.standard_normal(ref_out.shape)
    gx_ref, gw_ref = ref_vjp(ct)
    _, vjp_fn = hdd.vjp(fn, da.from_array(x, chunks=(6, 4)), w)
    gx, gw = _grads(vjp_fn, ct)
    np.testing.assert_array_equal(gx, gx_ref)
    np.testing.assert_allclose(gw, gw_ref, rtol=1e-12, atol=1e-12)


def test_weight_gradient_bits_do_not_depend_on_the_scheduler(rng):
    x, w = rng.standard_normal((20, 18)), rng.standard_normal((3, 3))
    ct = rng.standard_normal((18, 16))
    _, vjp_fn = hdd.vjp(P.conv_valid, da.from_array(x, chunks=(4, 5)), w)
    runs = [_grads(vjp_fn, ct, scheduler)[1] for scheduler in ("threads", "sync", "threads")]
    for gw in runs[1:]:
        np.testing.assert_array_equal(gw, runs[0])
    # another chunking sums in another order: equal to rounding
    _, other = hdd.vjp(P.conv_valid, da.from_array(x, chunks=(7, 9)), w)
    np.testing.assert_allclose(_grads(other, ct)[1], runs[0], rtol=1e-12, atol=1e-12)


def test_a_mirror_that_folds_twice(rng):
    x, ct = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    _, vjp_fn = hdd.vjp(P.wide_mirror, da.from_array(x, chunks=(1, 2)))
    np.testing.assert_array_equal(_grads(vjp_fn, ct)[0], hd.vjp(P.wide_mirror, x)[1](ct)[0])


def test_an_ops_layer_on_nchw_images(rng):
    x, w, b = rng.standard_normal((2, 2, 12, 10)), rng.standard_normal((3, 2, 3, 3)), rng.standard_normal(3)
    out, vjp_fn = hdd.vjp(P.conv_relu_pool, da.from_array(x, chunks=(2, 2, 4, 4)), w, b)
    assert out.chunks == ((2,), (3,), (2, 2, 2), (2, 2, 1))
    np.testing.assert_array_equal(out.compute(), P.conv_relu_pool(x, w, b))
    ct = rng.standard_normal((2, 3, 6, 5))
    gx, gw, gb = _grads(vjp_fn, ct)
    rx, rw, rb = hd.vjp(P.conv_relu_pool, x, w, b)[1](ct)
    np.testing.assert_array_equal(gx, rx)
    np.testing.assert_allclose(gw, rw, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gb, rb, rtol=1e-12, atol=1e-12)


def test_two_chunked_inputs_and_a_weight(rng):
    x, t, k = rng.standard_normal((12, 10)), rng.standard_normal((12, 10)), rng.standard_normal((3, 3))
    ct = rng.standard_normal(x.shape)
    refs = hd.vjp(P.deconv_loss, x, k, t)[1](ct)
    _, vjp_fn = hdd.vjp(P.deconv_loss, da.from_array(x, chunks=(5, 4)), k, da.from_array(t, chunks=(5, 4)))
    gx, gk, gt = _grads(vjp_fn, ct)
    np.testing.assert_array_equal(gx, refs[0])
    np.testing.assert_array_equal(gt, refs[2])
    np.testing.assert_allclose(gk, refs[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_one_gradient_pass_where_each_chunk_is_read_by_its_own_outputs_alone(dtype, rng, monkeypatch):
    """Non-overlapping patches: the outputs that read an input chunk are the chunk's own, so its
    task seeds the input's and the weights' gradients alike, and runs one pass for both."""
    x, w = rng.standard_normal((12, 16)).astype(dtype), rng.standard_normal((2, 2)).astype(dtype)
    ct = rng.standard_normal((6, 8)).astype(dtype)
    rx, rw = hd.vjp(P.patches, x, w)[1](ct)
    ran = []
    kernels = blocks.kernels
    monkeypatch.setattr(blocks, "kernels", lambda block, kind: ran.append(kind) or kernels(block, kind))
    _, vjp_fn = hdd.vjp(P.patches, da.from_array(x, chunks=(4, 6)), w)  # (edge chunks of 4 columns)
    gx, gw = _grads(vjp_fn, ct)
    assert set(ran) == {"both"}
    np.testing.assert_array_equal(gx, rx)
    np.testing.assert_allclose(gw, rw, rtol=0, atol=50 * np.finfo(dtype).eps * np.abs(rw).max())
    ran.clear()  # with a halo, the seeds differ: two passes (but in the first chunk, which has none)
    ct = rng.standard_normal((11, 15)).astype(dtype)
    gx, _ = _grads(hdd.vjp(P.conv_valid, da.from_array(x, chunks=(4, 6)), w)[1], ct)
    assert {"inputs", "weights", "both"} == set(ran)
    np.testing.assert_array_equal(gx, hd.vjp(P.conv_valid, x, w)[1](ct)[0])


def test_chunked_gradients_match_finite_differences(rng):
    """<grad, v> against the central difference of the chunked forward, in float64."""
    x, w = rng.standard_normal((7, 6)), rng.standard_normal((3, 3))
    ct = rng.standard_normal((4, 3))
    xd = da.from_array(x, chunks=(2, 2))
    conv = hdd.function(P.conv_strided)
    _, vjp_fn = hdd.vjp(P.conv_strided, xd, w)
    gx, gw = _grads(vjp_fn, ct)
    eps = 1e-6
    for _ in range(3):
        vx, vw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
        plus = conv(da.from_array(x + eps * vx, chunks=(2, 2)), w + eps * vw).compute()
        minus = conv(da.from_array(x - eps * vx, chunks=(2, 2)), w - eps * vw).compute()
        numeric = np.sum((plus - minus) / (2 * eps) * ct)
        np.testing.assert_allclose(np.sum(gx * vx) + np.sum(gw * vw), numeric, rtol=1e-7, atol=1e-9)


def test_a_cotangent_of_the_wrong_shape_says_which(rng):
    x = rng.standard_normal((8, 8))
    _, vjp_fn = hdd.vjp(P.blur, da.from_array(x, chunks=4), "mirror")
    with pytest.raises(hd.ShapeError,
                       match=r"cotangent for output .* has shape \(8, 7\); it must be \(8, 8\)"):
        vjp_fn(np.zeros((8, 7)))


def test_a_gradient_task_runs_the_forward_only_where_the_gradient_reads_it(rng):
    """blur's gradients read the inputs and the cotangent alone; a max pool's reads its argmax."""
    from halide_ad.blocks import Block, reads_forward
    x = da.from_array(rng.standard_normal((26, 22)), chunks=(8, 6))
    for fn, args, reads in [(P.blur, ("mirror",), False), (P.blur_pool_blur, (), True)]:
        out, vjp_fn = hdd.vjp(fn, x, *args)
        (gx, *_) = vjp_fn(np.ones(out.shape))
        (block,) = {v for layer in gx.dask.layers.values() for v in layer.values() if isinstance(v, Block)}
        assert reads_forward(block, ("inputs",)) is reads
        np.testing.assert_array_equal(gx.compute(), hd.vjp(fn, x.compute(), *args)[1](np.ones(out.shape))[0])


def test_an_array_read_from_a_global_goes_whole_to_every_task(rng):
    x, ct = rng.standard_normal((26, 22)), rng.standard_normal((26, 22))
    out, vjp_fn = hdd.vjp(P.sharpened, da.from_array(x, chunks=(8, 6)))
    np.testing.assert_array_equal(out.compute(), P.sharpened(x))
    (gx,) = _grads(vjp_fn, ct)  # a captured array has no gradient, as in hd.vjp
    np.testing.assert_array_equal(gx, hd.vjp(P.sharpened, x)[1](ct)[0])
    before = P.SHARPEN.copy()
    try:
        P.SHARPEN *= 2  # read afresh at each call, as unchunked calls read it
        np.testing.assert_array_equal(hdd.function(P.sharpened)(da.from_array(x, chunks=(8, 6))).compute(),
                                      P.sharpened(x))
    finally:
        P.SHARPEN[...] = before
