"""Every HALIDE_AD_* setting, in one place.

Each is read from the environment when it is asked for, so that a test or a user can change it in a
running process (the compiled kernels key on the settings that shape them).

| variable | default | effect |
|---|---|---|
| HALIDE_AD_CACHE_DIR | `$XDG_CACHE_HOME/halide_ad` or `~/.cache/halide_ad` | compiled kernels, solver results and generated code |
| HALIDE_AD_JIT | 1 | 0 runs the generated Python as plain Python (slow; to debug kernels) |
| HALIDE_AD_TIERED | 1 | 0 turns off running a program's first calls on the interpreter while its kernels compile |
| HALIDE_AD_INTERPRET_MAX | 2**30 | the most element operations of a first forward, and of its gradient (`runtime/vectorized_cost.py`'s estimate of each pass), that the interpreter takes: about a second of numpy, less than numba's compile of a pass's kernels in a fresh process; a program with a larger pass compiles first |
| HALIDE_AD_MAX_POINTS | 2**36 | the most points of a Func's domain that a trace accepts |
| HALIDE_AD_PARALLEL_MIN_POINTS | 2**17 | the fewest points of a loop nest that run on the thread pool |
| HALIDE_AD_PIN_WORKERS | 1 | 0 leaves the kernel threads on whatever CPU the OS gives them, where 1 keeps them off the CPU of the thread that starts a loop (`runtime/parallel.py` says why) |
| HALIDE_AD_POOL_BYTES | 2**30 | bytes of freed buffers kept for reuse (read at import) |
| HALIDE_AD_Z3_TIMEOUT_MS | 2000 | z3's time limit per query (read at import) |
| HALIDE_AD_DUMP | (none) | stages to print while compiling, comma-separated: `ad`, `invert`, `route`, `inline`, any schedule pass (`choose_parallel`, ...: the nest it returns), any schedule decision (`interior`, `loads_to_hoist`, ...: what it decided, a line per call), `updates` (each update's loop nest), `source`; while it names any, generated code is emitted afresh, not read from the disk cache, so that the stages print |
| HALIDE_AD_KERNEL_SNAPSHOT | (none) | a folder that keeps every generated kernel's source (tools/kernel_snapshot.py) |
| HALIDE_AD_SNAPSHOT_CONTEXT | (the running test) | what the snapshot's index says generated each kernel |
| HALIDE_AD_SKIP | (none) | optional passes to leave out, comma-separated: `route` (engines), `inline` (adjoints), `fuse` (forward), any schedule pass, `interior` (no box, regions or phases around gather nests), `separable_window` (and the pass `separable`), `tabled_points` (corners from tables), `taps_by_rows` (a box's windows a row at a time), `read_box` (a staged plane computed only where read), `rows_at_once` (a folded sum over the rows added a row at a time) |
"""
from __future__ import annotations

import os


def _int(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))


def cache_dir() -> str:
    path = os.environ.get("HALIDE_AD_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "halide_ad")
    os.makedirs(path, exist_ok=True)
    return path


def jit_enabled() -> bool:
    return os.environ.get("HALIDE_AD_JIT", "1") != "0"


def tiered_enabled() -> bool:
    return os.environ.get("HALIDE_AD_TIERED", "1") != "0" and jit_enabled()


INTERPRET_MAX = 1 << 30
MAX_POINTS = 1 << 36
PARALLEL_MIN_POINTS = 1 << 19  # runtime/schedule/parallel.py says why
POOL_BYTES = 1 << 30
Z3_TIMEOUT_MS = 2000


def interpret_max() -> int:
    return _int("HALIDE_AD_INTERPRET_MAX", INTERPRET_MAX)


def max_points() -> int:
    return _int("HALIDE_AD_MAX_POINTS", MAX_POINTS)


def parallel_min_points() -> int:
    return _int("HALIDE_AD_PARALLEL_MIN_POINTS", PARALLEL_MIN_POINTS)


def pin_workers() -> bool:
    return os.environ.get("HALIDE_AD_PIN_WORKERS", "1") != "0"


def pool_bytes() -> int:
    return _int("HALIDE_AD_POOL_BYTES", POOL_BYTES)


def z3_timeout_ms() -> int:
    return _int("HALIDE_AD_Z3_TIMEOUT_MS", Z3_TIMEOUT_MS)


def dumped(stage: str) -> bool:
    return stage in dumped_stages()


def dumped_stages() -> tuple[str, ...]:
    return tuple(filter(None, os.environ.get("HALIDE_AD_DUMP", "").split(",")))


def compile_settings() -> tuple:
    """The settings that change what a program compiles to: traces share kernels only under the same."""
    return parallel_min_points(), skipped_passes(), jit_enabled()


def kernel_snapshot() -> str | None:
    return os.environ.get("HALIDE_AD_KERNEL_SNAPSHOT") or None


def snapshot_context() -> str | None:
    return os.environ.get("HALIDE_AD_SNAPSHOT_CONTEXT") or None


def skipped(name: str) -> bool:
    return name in skipped_passes()


def skipped_passes() -> tuple[str, ...]:
    return tuple(sorted(filter(None, os.environ.get("HALIDE_AD_SKIP", "").split(","))))
