import os

import numpy as np
import pytest
from hypothesis import settings

# The fuzzers and property tests draw the same examples on every run, so that a CI failure
# reproduces; HALIDE_AD_FUZZ_RANDOM=1 explores new ones (add what it finds with @example).
settings.register_profile("halide_ad", derandomize=not os.environ.get("HALIDE_AD_FUZZ_RANDOM"))
settings.load_profile("halide_ad")

# The suite tests the kernels: a first call waits for them instead of running on the interpreter
# while they compile (halide_ad/tiered.py). tests/api/test_tiers.py turns the interpreter tier on.
os.environ.setdefault("HALIDE_AD_TIERED", "0")


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def jax_x64():
    """JAX in float64 for the test, as the comparisons in float64 need (the setting is global)."""
    jax = pytest.importorskip("jax")
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


@pytest.fixture(autouse=True)
def unshared_traces():
    """Each test starts without the traces that new lambdas of the same code share (they would
    keep kernels compiled under another test's settings)."""
    from halide_ad.api import forget_shared_traces
    forget_shared_traces()


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): one process per core, at most 4. Each process imports
    torch, jax and numba and holds its own compiled kernels; more would mostly duplicate compiles."""
    workers = min(len(os.sched_getaffinity(0)), 4)
    return workers if workers > 1 else 0
