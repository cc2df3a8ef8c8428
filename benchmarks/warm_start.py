"""First calls in a fresh process: halide_ad's with its on-disk kernel cache already filled, and
every library's with empty caches.

* Warm cache: what a returning user pays (tracing, solving, and loading the compiled kernels
  instead of compiling): a `Case`'s first forward and backward, a `CallCase`'s first call. The
  main run compiles every case into a fresh cache directory (HALIDE_AD_CACHE_DIR) and then starts
  `python -m benchmarks.warm_start` with that directory, once per case.

      HALIDE_AD_CACHE_DIR=dir python -m benchmarks.warm_start --cases blur,dense --json out.json

* Empty caches (`measure_cold`): what a new user's first call costs. One process per library
  (`--library`), each with a new, empty HALIDE_AD_CACHE_DIR and NUMBA_CACHE_DIR (halide_ad's own
  numba helpers are cached on disk too, in numba's cache), times the first forward and backward
  of one case after its imports, and saves the values it computed (`--arrays`) for the check.

`--floor BYTES` measures, in a process of its own, numba's first call of a one-line function from
numba's own cache (numba loads its typing registries then, and imports scipy where it is
installed; halide_ad's kernels load without them, see `runtime.parallel._lean_cache`), and what
any process pays: the first write of a fresh array of BYTES (the OS maps its pages then).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numba
import numpy as np

import halide_ad as hd  # imported before any timing, as a user's process would have
from benchmarks import peers
from benchmarks.calls import CallCase
from benchmarks.child import run_json
from benchmarks.cases import Case
from benchmarks.everyday import FirstCall
from benchmarks.runner import PEERS, Row
from benchmarks.selection import select
from benchmarks.timing import time_once


@numba.njit(cache=True)
def _one_line(x: int) -> int:
    return x + 1


def measure_in_subprocess(
    case_names: Sequence[str], *, small: bool
) -> dict[str, dict[str, float] | float]:
    """From a fresh process per case sharing this one's cache dir: {case: {"forward": s,
    "backward": s}} for a `Case` (no "backward" for one measured forward only), {case: s} for a
    `CallCase`. A process per case, as a returning user's: in one process for all, a case found
    the freed arrays of the cases before it in the buffer pool, and the first case to write a
    256 MiB output paid for the pages of every later one (at e31dca5 the nearest upsample's
    first forward took 0.29 s there, the bilinear resize's after it 0.05 s)."""
    times: dict[str, dict[str, float] | float] = {}
    for name in case_names:
        times.update(_run(["--cases", name] + (["--small"] if small else [])))
    return times


def measure_floor(nbytes: int) -> dict[str, float]:
    """{"numba_first_call": s, "first_write": s} from a fresh process (see the module's doc); a
    first process fills numba's cache for `_one_line`."""
    _run(["--floor", str(nbytes)])
    return _run(["--floor", str(nbytes)])


def measure_cold(first_call: FirstCall, *, small: bool, peer_names: Sequence[str]) -> Row:
    """The seconds of `first_call.case`'s first forward plus backward in halide_ad and each peer,
    each in a fresh process with empty caches, and halide_ad's values checked against a peer's."""
    case = first_call.case
    row = Row(first_call.name, "first fwd + bwd, empty caches")
    values: dict[str, list[np.ndarray]] = {}
    for library in ("halide_ad", *peer_names):
        with tempfile.TemporaryDirectory(prefix="halide_ad_cold_") as tmp:
            env = dict(os.environ, HALIDE_AD_CACHE_DIR=str(Path(tmp) / "halide_ad"),
                       NUMBA_CACHE_DIR=str(Path(tmp) / "numba"))
            env.pop("JAX_COMPILATION_CACHE_DIR", None)  # jax's persistent cache stays off
            arrays = Path(tmp) / "arrays.npz"
            arguments = ["--cases", case.name, "--library", library, "--arrays", str(arrays)]
            try:
                seconds = _run(arguments + (["--small"] if small else []), env=env)[case.name]
            except subprocess.CalledProcessError as error:
                row.record_error(library, error)
                continue
            with np.load(arrays) as saved:
                values[library] = [saved[f"arr_{k}"] for k in range(len(saved.files))]
        row.times_s[library] = sum(seconds.values())
        row.parts_s[library] = seconds
        print(f"[{first_call.name}] {library}: {row.times_s[library]:.3g} s", file=sys.stderr)
    row.check_values(values)
    return row


def _run(arguments: list[str], *, env: dict[str, str] | None = None) -> dict:
    return run_json("benchmarks.warm_start", arguments, env=env)


def _first_calls(library: str, case: Case, inputs: list[np.ndarray],
                 ct: np.ndarray) -> tuple[dict[str, float], list[np.ndarray]]:
    """The seconds of `library`'s first forward and backward calls of `case` (forward only for a
    case without a backward) and the arrays they computed: the output, then the gradients.

    halide_ad's are its first call, `hd.vjp` and `vjp_fn(ct)`, as `benchmarks.ours` times them.
    A peer's are the first calls that `benchmarks.peers` prepares its timed passes with."""
    if library == "halide_ad":
        out, forward = time_once(lambda: case.halide_ad(*inputs))
        if not case.backward:
            return {"forward": forward}, [np.asarray(out)]
        (_, vjp_fn), vjp = time_once(lambda: hd.vjp(case.halide_ad, *inputs))
        grads, apply = time_once(lambda: vjp_fn(ct))
        return {"forward": forward, "backward": vjp + apply}, [np.asarray(out), *grads]
    if library == "torch":
        prepared = peers.prepare_torch(case.torch, inputs, ct, thp=False, backward=case.backward)
    else:
        prepared = peers.prepare_jax(case.jax, inputs, ct, backward=case.backward)
    return prepared.first_call_s, [prepared.output, *prepared.gradients]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.warm_start", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--cases", help="comma-separated case names")
    which.add_argument("--floor", type=int, metavar="BYTES", help="numba's and the OS's share instead")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--library", choices=("halide_ad", *PEERS), default="halide_ad",
                        help="whose first calls to time (default halide_ad)")
    parser.add_argument("--arrays", type=Path, help="save the values computed here (.npz)")
    parser.add_argument("--json", required=True, type=Path, help="where to write the seconds")
    args = parser.parse_args(argv)

    if args.floor is not None:
        _, numba_first_call = time_once(lambda: _one_line(1))
        fresh = np.empty(args.floor // 4, np.float32)
        _, first_write = time_once(lambda: fresh.fill(1))
        args.json.write_text(json.dumps({"numba_first_call": numba_first_call, "first_write": first_write}))
        return
    results = {}
    arrays = []
    for case in select(args.cases.split(",")):
        if isinstance(case, CallCase) and args.library == "halide_ad":
            call = case.prepare["halide_ad"](case.make_inputs(args.small))
            _, results[case.name] = time_once(call)
        elif isinstance(case, Case):
            inputs = case.make_inputs(small=args.small)
            ct = case.cotangent(small=args.small)
            results[case.name], computed = _first_calls(args.library, case, inputs, ct)
            arrays += computed
    args.json.write_text(json.dumps(results))
    if args.arrays is not None:
        np.savez(args.arrays, *arrays)


if __name__ == "__main__":
    main()
