"""halide_ad's first calls in a fresh process whose on-disk kernel cache is already filled: what a
returning user pays (tracing, solving, and loading the compiled kernels instead of compiling).

The main run compiles every case into a fresh cache directory (HALIDE_AD_CACHE_DIR) and then
starts `python -m benchmarks.warm_start` on the same cases with that directory.

    HALIDE_AD_CACHE_DIR=dir python -m benchmarks.warm_start --cases blur,dense --json out.json

`--floor BYTES` measures, in a process of its own, numba's first call of a one-line function from
numba's own cache (numba loads its typing registries then, and imports scipy where it is
installed; halide_ad's kernels load without them, see `runtime.parallel._lean_cache`), and what
any process pays: the first write of a fresh array of BYTES (the OS maps its pages then).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numba
import numpy as np

from benchmarks.cases import select
from benchmarks.timing import time_once

REPO_ROOT = Path(__file__).resolve().parent.parent


@numba.njit(cache=True)
def _one_line(x: int) -> int:
    return x + 1


def measure_in_subprocess(case_names: Sequence[str], *, small: bool) -> dict[str, dict[str, float]]:
    """{case: {"forward": s, "backward": s}} from a fresh process sharing this one's cache dir."""
    return _run(["--cases", ",".join(case_names)] + (["--small"] if small else []))


def measure_floor(nbytes: int) -> dict[str, float]:
    """{"numba_first_call": s, "first_write": s} from a fresh process (see the module's doc); a
    first process fills numba's cache for `_one_line`."""
    _run(["--floor", str(nbytes)])
    return _run(["--floor", str(nbytes)])


def _run(arguments: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "warm_start.json"
        command = [sys.executable, "-m", "benchmarks.warm_start", *arguments, "--json", str(out)]
        subprocess.run(command, cwd=REPO_ROOT, check=True)
        return json.loads(out.read_text())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.warm_start", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--cases", help="comma-separated case names")
    which.add_argument("--floor", type=int, metavar="BYTES", help="numba's and the OS's share instead")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--json", required=True, type=Path, help="where to write the seconds")
    args = parser.parse_args(argv)

    import halide_ad as hd  # as a user's process would have
    if args.floor is not None:
        _, numba_first_call = time_once(lambda: _one_line(1))
        fresh = np.empty(args.floor // 4, np.float32)
        _, first_write = time_once(lambda: fresh.fill(1))
        args.json.write_text(json.dumps({"numba_first_call": numba_first_call, "first_write": first_write}))
        return
    results = {}
    for case in select(args.cases.split(",")):
        inputs = case.make_inputs(small=args.small)
        ct = case.cotangent(small=args.small)
        _, forward = time_once(lambda: case.halide_ad(*inputs))
        (_, vjp_fn), vjp = time_once(lambda: hd.vjp(case.halide_ad, *inputs))
        _, apply = time_once(lambda: vjp_fn(ct))
        results[case.name] = {"forward": forward, "backward": vjp + apply}
    args.json.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
