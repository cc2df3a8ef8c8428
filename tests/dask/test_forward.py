"""halide_ad.dask.function: chunked results equal the whole-array function's, bit for bit."""
import warnings

import dask
import numpy as np
import pytest

da = pytest.importorskip("dask.array")

import halide_ad as hd  # noqa: E402
import halide_ad.dask as hdd  # noqa: E402
from halide_ad import blocks  # noqa: E402
from halide_ad.blocks import Block  # noqa: E402
from halide_ad.runtime.engines import direct_conv  # noqa: E402
from tests.dask import programs as P  # noqa: E402


def _chunked(x, chunks):
    return da.from_array(x, chunks=chunks)


def _program_keys(arr) -> set:
    return {name for name in arr.dask.layers if "-program-" in name}


def _engines(arr) -> list[str]:
    """The engines of the contractions of `arr`'s one block program."""
    (block,) = {v for layer in arr.dask.layers.values() for v in layer.values() if isinstance(v, Block)}
    return [engine for _, _, engine in block.engines]


@pytest.mark.parametrize("view", P.VIEWS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_every_boundary_view_matches_the_whole_array(view, dtype, rng):
    x = rng.standard_normal((13, 11)).astype(dtype)
    got = hdd.function(P.blur)(_chunked(x, (4, 3)), view)
    assert got.chunks == ((4, 4, 4, 1), (3, 3, 3, 2))
    np.testing.assert_array_equal(got.compute(scheduler="threads"), P.blur(x, view))


def test_chunks_of_one_and_a_single_row(rng):
    x = rng.standard_normal((9, 7))
    np.testing.assert_array_equal(hdd.function(P.blur)(_chunked(x, (1, 2)), "mirror").compute(),
                                  P.blur(x, "mirror"))
    row = rng.standard_normal((1, 12))  # axis 0 has one element: only axis 1 is chunked
    np.testing.assert_array_equal(hdd.function(P.blur)(_chunked(row, (1, 5)), "repeat_edge").compute(),
                                  P.blur(row, "repeat_edge"))


def test_a_non_contiguous_array(rng):
    x = rng.standard_normal((10, 16))[:, ::2]
    np.testing.assert_array_equal(hdd.function(P.blur)(_chunked(x, (3, 3)), "constant_exterior").compute(),
                                  P.blur(np.ascontiguousarray(x), "constant_exterior"))


def test_uniform_chunks_share_one_block_program(rng):
    x = rng.standard_normal((24, 20))
    got = hdd.function(P.blur)(_chunked(x, (6, 5)), "mirror")
    assert len(_program_keys(got)) == 1  # one kernel for 16 chunks, edge chunks included
    np.testing.assert_array_equal(got.compute(), P.blur(x, "mirror"))


def test_halos_are_the_exact_reach_of_each_axis(rng):
    x = _chunked(rng.standard_normal((24, 20)), (6, 6))
    assert hdd.halo(P.blur, x, "repeat_edge") == {0: (1, 1), 1: (1, 1)}
    # blur (rows -1..+1, columns 0..+2), pool 2x2 at stride 2, then blur of the pooled image
    # (rows -2..+1, columns -1..+1): rows 2*(p-2)-1 .. 2*(p+1)+1+1, in the input
    assert hdd.halo(P.blur_pool_blur, x) == {0: (5, 3), 1: (2, 4)}
    assert hdd.halo(P.conv_valid, x, np.ones((3, 2))) == {0: (0, 2), 1: (0, 1)}
    assert hdd.halo(P.conv_strided, x, np.ones((3, 3))) == {0: (1, 0), 1: (1, 0)}


def test_a_pipeline_with_views_on_intermediate_buffers(rng):
    x = rng.standard_normal((26, 22))
    got = hdd.function(P.blur_pool_blur)(_chunked(x, (8, 6)))
    assert got.chunks == ((4, 4, 4, 1), (3, 3, 3, 2))
    np.testing.assert_array_equal(got.compute(scheduler="threads"), P.blur_pool_blur(x))


def test_strides_realign_the_chunks_and_say_so(rng):
    x = rng.standard_normal((21, 18)).astype("float32")
    w = rng.standard_normal((3, 3)).astype("float32")
    with pytest.warns(hd.HalideADWarning, match=r"axis 0 to chunks \(6, 6, 6, 3\).*stride 2"):
        got = hdd.function(P.conv_strided)(_chunked(x, (5, 6)), w)
    assert got.chunks == ((3, 3, 3, 2), (3, 3, 3))
    np.testing.assert_array_equal(got.compute(), P.conv_strided(x, w))


def test_weights_go_whole_to_every_task(rng):
    x, w = rng.standard_normal((19, 15)), rng.standard_normal((4, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the chunks fit: no rechunking
        got = hdd.function(P.conv_valid)(_chunked(x, (5, 4)), w)
    weight_keys = [k for k in got.__dask_graph__() if isinstance(k, tuple) and str(k[0]).endswith("-w")]
    assert len(weight_keys) == 1  # one copy of the weights in the graph, read by every task
    assert got.chunks == ((5, 5, 5, 1), (4, 4, 4, 1))
    np.testing.assert_array_equal(got.compute(), P.conv_valid(x, w))


def test_an_output_chunk_that_would_be_empty_merges_and_says_so(rng):
    x, w = rng.standard_normal((17, 8)), rng.standard_normal((4, 3))
    with pytest.warns(hd.HalideADWarning,
                      match=r"axis 0 to chunks \(5, 5, 7\): every output chunk must be non-empty"):
        got = hdd.function(P.conv_valid)(_chunked(x, (5, 8)), w)
    assert got.chunks == ((5, 5, 4), (6,))
    np.testing.assert_array_equal(got.compute(), P.conv_valid(x, w))


def test_an_output_longer_than_its_input(rng):
    x, w = rng.standard_normal((11, 9)), rng.standard_normal((3, 2))
    got = hdd.function(P.conv_full)(_chunked(x, (4, 3)), w)
    assert got.chunks == ((4, 4, 5), (3, 3, 4))  # the last chunk holds the two extra rows
    np.testing.assert_array_equal(got.compute(), P.conv_full(x, w))


@pytest.mark.parametrize("shape, chunks", [((3, 4), (1, 2)), ((8, 4), (3, 4))])
def test_a_mirror_wider_than_the_chunks_or_the_axis(shape, chunks, rng):
    x = rng.standard_normal(shape)  # on an axis of 3, a reach of 3 reflects twice
    got = hdd.function(P.wide_mirror)(_chunked(x, chunks)).compute()
    np.testing.assert_array_equal(got, P.wide_mirror(x))


def test_a_lookup_in_a_small_table_by_chunked_data(rng):
    levels, table = rng.integers(-2, 12, (9, 8)), rng.standard_normal(10)
    got = hdd.function(P.tone_curve)(_chunked(levels, (4, 3)), table)
    np.testing.assert_array_equal(got.compute(), P.tone_curve(levels, table))
    _, vjp_fn = hdd.vjp(P.tone_curve, _chunked(levels, (4, 3)), table)
    ct = rng.standard_normal((9, 8))
    none, g_table = vjp_fn(ct)
    assert none is None  # integer data has no gradient
    np.testing.assert_allclose(g_table.compute(), hd.vjp(P.tone_curve, levels, table)[1](ct)[1], rtol=1e-12)


def test_a_convolution_whose_blocks_are_too_small_for_its_kernels_takes_them_anyway(rng):
    """The whole image's 16-channel convolution is big enough for the direct convolution kernels,
    a 32x32 chunk's block is not (direct_conv.MIN_WORK): the blocks take them all the same, as
    the whole program chose, so forward and input gradient are bit for bit the whole array's."""
    x, w = rng.standard_normal((1, 16, 128, 128)), rng.standard_normal((16, 16, 3, 3))
    assert 16 * 16 * 34 * 34 * 9 < direct_conv.MIN_WORK <= 16 * 16 * 128 * 128 * 9
    xd = _chunked(x, (1, 16, 32, 32))
    out, vjp_fn = hdd.vjp(P.conv_only, xd, w)
    assert _engines(out) == ["direct_conv"]
    np.testing.assert_array_equal(out.compute(), P.conv_only(x, w))
    ct = rng.standard_normal(x.shape)
    grads = vjp_fn(ct)
    assert _engines(grads[0]) == ["direct_conv"] * 3  # the forward, the input and the weight gradients
    gx, gw = dask.compute(*grads)
    rx, rw = hd.vjp(P.conv_only, x, w)[1](ct)
    np.testing.assert_array_equal(gx, rx)
    np.testing.assert_allclose(gw, rw, rtol=1e-12, atol=1e-12)  # summed over chunks: to rounding


def test_two_chunked_inputs_with_different_chunks(rng):
    x, t = rng.standard_normal((12, 10)), rng.standard_normal((12, 10))
    k = rng.standard_normal((3, 3))
    got = hdd.function(P.deconv_loss)(_chunked(x, (5, 4)), k, _chunked(t, (3, 10)))
    np.testing.assert_array_equal(got.compute(), P.deconv_loss(x, k, t))


def test_results_come_from_the_buffer_pool_and_are_never_shared(rng):
    x = rng.standard_normal((1024, 200))  # a result big enough for the pool (runtime/buffers.py)
    y = hdd.function(P.blur)(_chunked(x, (256, 100)), "mirror")
    a, b = y.compute(), y.compute()
    assert not np.shares_memory(a, b)  # held results are never handed out again
    np.testing.assert_array_equal(a, P.blur(x, "mirror"))
    np.testing.assert_array_equal(b, a)
    address = a.ctypes.data
    del a
    assert y.compute().ctypes.data == address  # a result let go is reused, as unchunked ones are
    assert type(y + 1) is da.Array  # arrays derived from it are dask's own


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("scheduler", ["threads", "sync"])
def test_a_compute_has_the_tasks_copy_their_chunks_into_the_result(scheduler, dtype, rng, monkeypatch):
    """Each task in this process copies its chunk into the result (edge chunks included), and
    no copy of the whole array follows; a result handed out is never written again."""
    x = rng.standard_normal((26, 20)).astype(dtype)[::2, 1:]  # non-contiguous, uneven edge chunks
    want = P.blur(np.ascontiguousarray(x), "repeat_edge")
    assembled, assemble = [], blocks.assemble

    def spied(*args):
        out = assemble(*args)
        assembled.append(out.shape)
        return out
    monkeypatch.setattr(blocks, "assemble", spied)
    y = hdd.function(P.blur)(_chunked(x, (4, 5)), "repeat_edge")
    for got in (y.compute(scheduler=scheduler), dask.compute(y, y + 1, scheduler=scheduler)[0]):
        assert got.dtype == dtype and got.flags.c_contiguous and got.base is None
        np.testing.assert_array_equal(got, want)
        got[...] = 0
    assert x.shape not in assembled  # (the tasks assembled their blocks, no more)
    assert not blocks._destinations
    np.testing.assert_array_equal((y * 2).compute(scheduler=scheduler), 2 * want)  # chunks returned whole
    assert not got.any()  # (a later compute did not write into a result held)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_convolution_on_blas_equals_the_whole_arrays_to_rounding(dtype, rng):
    """A block's BLAS product sums an element otherwise than the whole array's can (OpenBLAS's
    bits depend on the product's extents, strides and the CPU: runtime/parallel.py `matmul`),
    so the forward and input gradient of a convolution on BLAS equal the whole array's to
    rounding of its 48 terms."""
    x = rng.standard_normal((2, 16, 2048)).astype(dtype)
    w = rng.standard_normal((16, 16, 3)).astype(dtype)
    out, vjp_fn = hdd.vjp(P.conv1d_channels, _chunked(x, (2, 16, 512)), w)
    assert _engines(out) == ["blas"]
    eps = np.finfo(dtype).eps
    want = P.conv1d_channels(x, w)
    np.testing.assert_allclose(out.compute(), want, rtol=0, atol=48 * eps * np.abs(want).max())
    ct = rng.standard_normal(out.shape).astype(dtype)
    gx, gw = dask.compute(*vjp_fn(ct))
    rx, rw = hd.vjp(P.conv1d_channels, x, w)[1](ct)
    np.testing.assert_allclose(gx, rx, rtol=0, atol=48 * eps * np.abs(rx).max())
    np.testing.assert_allclose(gw, rw, rtol=0, atol=100 * eps * np.abs(rw).max())  # summed over chunks
