"""Random chunkings (uneven, chunks of 1, misaligned with the pooling's stride): the chunked
forward and input gradient of a three-stage pipeline equal the whole array's, bit for bit."""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

da = pytest.importorskip("dask.array")

import halide_ad as hd  # noqa: E402
import halide_ad.dask as hdd  # noqa: E402
from tests.dask import programs as P  # noqa: E402

SHAPE = (15, 13)
X = np.random.default_rng(3).standard_normal(SHAPE)
CT = np.random.default_rng(4).standard_normal((SHAPE[0] // 2, SHAPE[1] // 2))


@pytest.fixture(scope="module")
def whole():
    """The output and the input gradient on the whole array."""
    out, vjp_fn = hd.vjp(P.blur_pool_blur, X)
    return out, vjp_fn(CT)[0]


def chunks(n: int):
    """Chunk lengths that add up to n."""
    return st.lists(st.integers(1, n), min_size=1, max_size=n).map(lambda c: _fit(c, n))


def _fit(lengths, n):
    out = []
    for c in lengths:
        if sum(out) + c >= n:
            break
        out.append(c)
    return tuple(out) + (n - sum(out),)


@settings(max_examples=6, deadline=None)
@given(rows=chunks(SHAPE[0]), cols=chunks(SHAPE[1]))
def test_any_chunking_gives_the_same_bits(whole, rows, cols):
    x = da.from_array(X, chunks=(rows, cols))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hd.HalideADWarning)  # odd chunks are realigned to the stride
        out, vjp_fn = hdd.vjp(P.blur_pool_blur, x)
    np.testing.assert_array_equal(out.compute(scheduler="sync"), whole[0])
    np.testing.assert_array_equal(vjp_fn(CT)[0].compute(scheduler="sync"), whole[1])
