"""Recycled buffers: an array is handed out again only once nothing references it."""
import numpy as np
import pytest

import halide_ad as hd
from halide_ad.runtime.buffers import BufferPool
from tests import programs as P

SHAPE = (512, 512)  # 1 MiB of float32: big enough to be pooled


def test_only_unreferenced_arrays_are_handed_out_again():
    pool = BufferPool(1 << 30)
    a = pool.empty(SHAPE, np.float32)
    first = id(a)
    assert id(pool.empty(SHAPE, np.float32)) != first  # `a` is held
    view = a[3:]
    del a
    assert id(pool.empty(SHAPE, np.float32)) != first  # a view holds its base
    del view
    assert id(pool.empty(SHAPE, np.float32)) == first  # now free: recycled
    assert pool.empty(SHAPE, np.float64).dtype == np.float64  # another dtype: a new array
    assert pool.empty((512, 511), np.float32).shape == (512, 511)


def test_small_arrays_and_a_zero_budget_are_not_pooled():
    pool = BufferPool(1 << 30)
    pool.empty((8, 8), np.float32)
    assert pool.arrays == []
    off = BufferPool(0)
    off.empty(SHAPE, np.float32)
    assert off.arrays == []


def test_the_budget_forgets_the_least_recently_used():
    pool = BufferPool(3 * 512 * 512 * 4)
    held = [pool.empty(SHAPE, np.float32) for _ in range(5)]
    assert len(pool.arrays) == 3 and all(a is h for a, h in zip(pool.arrays, held[2:], strict=True))


def test_torch_tensors_sharing_memory_keep_it():
    torch = pytest.importorskip("torch")
    pool = BufferPool(1 << 30)
    a = pool.empty(SHAPE, np.float32)
    a[:] = 7
    t = torch.from_numpy(a)
    first = id(a)
    del a
    b = pool.empty(SHAPE, np.float32)
    b[:] = 0
    assert id(b) != first and float(t[0, 0]) == 7.0


def test_gradients_the_caller_keeps_are_not_overwritten_by_the_next_call():
    x = np.random.default_rng(0).standard_normal(SHAPE)
    out, f_vjp = hd.vjp(P.blur3, x, "repeat_edge")
    first = f_vjp(np.ones_like(out))[0]
    kept = first.copy()
    for k in range(3):
        again = f_vjp(np.full_like(out, k + 2.0))[0]
        np.testing.assert_array_equal(first, kept)
        np.testing.assert_allclose(again, (k + 2.0) * kept, rtol=1e-12)


_TEMPORARIES = """
import resource, sys
import numpy as np
from halide_ad.runtime import buffers
kept = sys.argv[1] == "1" and buffers.keep_freed_memory()
faults = []
for _ in range(6):  # four 6 MiB temporaries at a time, as the interpreter's pieces make them
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    arrays = [np.ones(3 << 19, np.float32) for _ in range(4)]
    del arrays
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(int(kept), sum(faults[2:]))
"""


def test_freed_temporaries_are_not_mapped_again():
    """keep_freed_memory: numpy's temporaries of a few MiB, freed and allocated again, reuse
    the memory malloc kept instead of faulting in fresh pages (a fresh process by default did)."""
    import subprocess
    import sys
    out = [subprocess.run([sys.executable, "-c", _TEMPORARIES, flag], capture_output=True, text=True, check=True,
                          timeout=120).stdout.split() for flag in ("0", "1")]
    if out[1][0] == "0":
        pytest.skip("malloc is not glibc's")
    assert int(out[1][1]) < 64 < int(out[0][1])


def test_zeros_are_zero_when_recycled_too():
    pool = BufferPool(1 << 30)
    a = pool.zeros(SHAPE, np.float32)
    assert not a.any()
    a[...] = np.nan
    first = id(a)
    del a
    b = pool.zeros(SHAPE, np.float32)
    assert id(b) == first and not b.any()
