"""`@hd.func` objects pickle by reference to their module-level name, as functions do."""
import multiprocessing
import pickle

import numpy as np
import pytest

import halide_ad as hd


@hd.func
def scaled(x, k):
    return hd.compute(x.shape, lambda i: x[i] * k)


def _apply(payload):
    fn, x = pickle.loads(payload)
    return fn(x, 3.0)


def test_a_func_pickles_by_reference():
    scaled(np.ones(3), 2.0)  # traced and compiled: its locks and caches must not travel
    assert pickle.loads(pickle.dumps(scaled)) is scaled


def test_a_func_runs_in_another_process():
    payload = pickle.dumps((scaled, np.arange(4.0)))
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        np.testing.assert_array_equal(pool.apply(_apply, (payload,)), np.arange(4.0) * 3)


def test_a_func_not_at_module_level_says_why():
    local = hd.func(lambda x: x)
    with pytest.raises((pickle.PicklingError, AttributeError)):
        pickle.dumps(local)
