"""Each halide_ad.dask task runs its kernels on its share of the cores (blocks.task_threads):
the cores over the tasks running at once in the process, restored afterwards."""
import threading

import numba
import pytest

pytest.importorskip("dask.array")

from halide_ad import blocks  # noqa: E402
from halide_ad.runtime import parallel  # noqa: E402


def test_tasks_running_at_once_share_the_cores():
    cores, before = numba.config.NUMBA_NUM_THREADS, numba.get_num_threads()
    seen = []

    def second_task():
        with blocks.task_threads() as share:
            seen.append((share, numba.get_num_threads()))

    with blocks.task_threads() as share:
        assert share == numba.get_num_threads() == cores  # alone in the process: every core
        thread = threading.Thread(target=second_task)
        thread.start()
        thread.join()
        assert numba.get_num_threads() == cores  # (numba's count is the calling thread's)
    assert seen == [(max(1, cores // 2), max(1, cores // 2))]
    assert numba.get_num_threads() == before


def test_a_task_on_one_core_runs_blas_on_one_thread(monkeypatch):
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 1)
    counts = [get() for get, _ in parallel._blas_libraries()]
    with blocks.task_threads() as share:
        assert share == 1
        assert all(get() == 1 for get, _ in parallel._blas_libraries())
    assert [get() for get, _ in parallel._blas_libraries()] == counts
