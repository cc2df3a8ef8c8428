"""halide_ad.dask on a dask.distributed LocalCluster of two worker processes: the workers get the
block programs in the graph and load their kernels from the on-disk cache."""
import os

import dask
import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import halide_ad as hd  # noqa: E402
import halide_ad.dask as hdd  # noqa: E402
from tests.dask import programs as P  # noqa: E402


def _block_runs():
    import halide_ad.blocks
    return os.getpid(), len(halide_ad.blocks.runs)


def _share_in_a_task():
    import numba

    from halide_ad.blocks import task_threads
    with task_threads() as share:
        return share, numba.get_num_threads()


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as c:
        yield c


def test_forward_on_worker_processes(client, rng):
    x = rng.standard_normal((26, 22))
    got = hdd.function(P.blur_pool_blur)(da.from_array(x, chunks=(8, 6)))
    result = client.compute(got).result()
    np.testing.assert_array_equal(result, P.blur_pool_blur(x))
    ran = client.run(_block_runs)  # worker address -> (pid, kernels it built or loaded)
    assert all(pid != os.getpid() for pid, _ in ran.values())
    assert sum(count for _, count in ran.values()) >= 1


def test_gradients_on_worker_processes_repeat_the_threaded_bits(client, rng):
    x, w = rng.standard_normal((20, 18)), rng.standard_normal((3, 3))
    ct = rng.standard_normal((18, 16))
    _, vjp_fn = hdd.vjp(P.conv_valid, da.from_array(x, chunks=(4, 5)), w)
    gx, gw = vjp_fn(ct)
    threaded = dask.compute(gx, gw, scheduler="threads")
    on_workers = client.compute([gx, gw], sync=True)
    np.testing.assert_array_equal(on_workers[0], threaded[0])
    np.testing.assert_array_equal(on_workers[1], threaded[1])  # the same additions in the same order
    gx_ref, gw_ref = hd.vjp(P.conv_valid, x, w)[1](ct)
    np.testing.assert_array_equal(on_workers[0], gx_ref)
    np.testing.assert_allclose(on_workers[1], gw_ref, rtol=1e-12, atol=1e-12)


def test_a_task_takes_its_workers_share_of_the_cores(client):
    """A worker of one thread runs one task at a time, on one core: its kernels take one thread
    (numba's default is every core of the machine, which two workers then oversubscribe)."""
    assert client.submit(_share_in_a_task, pure=False).result() == (1, 1)
