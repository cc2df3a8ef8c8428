"""python -m benchmarks: halide_ad's forward and backward passes side by side with PyTorch and JAX.

Prints markdown tables, writes JSON (--json), and exits with status 1 when a library raised or
halide_ad's values differ from a peer's. `--small` runs tiny shapes: a smoke test of the runner
and of halide_ad's correctness on every case, not a measurement.

The kernel and update cases' backward passes also get their peak memory, each library in a fresh
process per case (`benchmarks.memory`: 27 processes of 4-15 s for the nine kernel cases at full
size; `--no-memory` skips the step, and `--small` runs it on the first kernel case only, and on
every update case at its tiny shapes).

`--cases` takes case names and group names: `kernels` (the stencil, convolution, pooling,
resampling and dense gradients), `everyday` (elementwise math, softmax, layer norm, a small
layer, dispatch, a training step, the first call on empty caches), `checkpoint` (the peak memory
of a deep pipeline's gradient with and without `hd.checkpoint`, in the notes), `chunked` (a
blur on a dask array, chunked, against the whole array and dask-image: `benchmarks.chunked`) and
`hvp` (the Hessian-vector product of a clamped-stencil energy against one gradient, halide_ad,
JAX and PyTorch: `benchmarks.hvp`) and `updates` (a histogram, a linear recurrence and a
bilateral-grid splat, update definitions, in the everyday table, their backward's peak memory in
the notes: `benchmarks.updates`) and `first_calls` (each kernel case's first forward and backward on
empty caches, a fresh process per library), e.g.

    python -m benchmarks --cases everyday
    python -m benchmarks --cases chunked --no-memory --repeat 3
    python -m benchmarks --cases hvp --repeat 5
    python -m benchmarks --cases tanh,softmax,dispatch --repeat 3
    python -m benchmarks --cases first_calls --no-memory
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks import checkpoint, memory, peers, warm_start
from benchmarks.bounds import measure_machine
from benchmarks.calls import CallCase, run_call_case
from benchmarks.cases import Case
from benchmarks.checkpoint import CheckpointCase
from benchmarks.chunked import ChunkedCase, ChunkedRow, chunked_table, run_chunked
from benchmarks.everyday import FirstCall
from benchmarks.hvp import HvpCase, hvp_table, run_hvp
from benchmarks.report import PEER_TITLES, case_rows, to_json, to_markdown
from benchmarks.runner import PEERS, CaseResult, Row, available_peers, run_case
from benchmarks.selection import ALL, GROUPS, select
from benchmarks.torch_thp import measure_in_subprocess, on_main_scale
from benchmarks.updates import UpdateCase, memory_note, run_update_case

DEFAULT_JSON = Path(__file__).resolve().parent / "results.json"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", help="comma-separated groups or cases: "
                        + ", ".join(GROUPS) + "; " + ", ".join(case.name for case in ALL)
                        + " (default: all)")
    parser.add_argument("--repeat", type=int, default=7, help="timed runs per median (default 7)")
    parser.add_argument("--small", action="store_true", help="tiny shapes, for a smoke run")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help=f"where to write the results (default {DEFAULT_JSON})")
    parser.add_argument("--markdown", type=Path, help="also write the markdown table here")
    parser.add_argument("--no-memory", dest="memory", action="store_false",
                        help="skip the kernel and update cases' backward peak memory (a fresh process per "
                        "case and library)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    try:
        args.cases = select(args.cases.split(",") if args.cases else None)
    except ValueError as error:
        parser.error(str(error))
    return args


def add_thp_timings(results: Sequence[CaseResult], *, repeat: int, small: bool) -> str | None:
    """Measure torch again with THP_MEM_ALLOC_ENABLE=1 in a subprocess, in turns with halide_ad,
    on this run's scale (`torch_thp.on_main_scale`), and keep, per case, the faster backward.
    Returns a note for the report when the subprocess failed."""
    try:
        thp = measure_in_subprocess([r.name for r in results], repeat=repeat, small=small)
    except subprocess.CalledProcessError as error:
        return (f"The THP_MEM_ALLOC_ENABLE=1 torch run failed ({error}); PyTorch ran with the "
                "default allocator only.")
    for result in results:
        value = thp[result.name]
        if isinstance(value, str):
            result.errors["torch (THP)"] = value
        elif "halide_ad" in result.timings:
            result.add_torch_variant(on_main_scale(value["torch"], value["halide_ad"], result.timings["halide_ad"]))
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cases = [c for c in args.cases if isinstance(c, Case)]
    load_at_start = os.getloadavg()[0]
    peer_names = available_peers()
    notes = [f"{PEER_TITLES[p]} is not installed: its columns are skipped."
             for p in PEERS if p not in peer_names]

    # first calls compile from scratch: a fresh kernel cache, which a second process then reuses
    os.environ.setdefault("HALIDE_AD_CACHE_DIR", tempfile.mkdtemp(prefix="halide_ad_bench_"))
    results = [run_case(case, small=args.small, repeat=args.repeat, peer_names=peer_names)
               for case in cases]
    call_rows = {case.name: run_call_case(case, small=args.small, repeat=args.repeat,
                                          peer_names=peer_names)
                 for case in args.cases if isinstance(case, CallCase)}
    floor = add_warm_start(results, call_rows, cases, small=args.small, notes=notes)
    if cases and "torch" in peer_names:
        failure = add_thp_timings(results, repeat=args.repeat, small=args.small)
        notes += [failure] if failure else []
    if args.memory:
        kernel_names = {case.name for case in GROUPS["kernels"]}
        add_memory([r for r in results if r.name in kernel_names], peer_names, small=args.small,
                   notes=notes)
    cold_rows = {case.name: warm_start.measure_cold(case, small=args.small, peer_names=peer_names)
                 for case in args.cases if isinstance(case, FirstCall)}
    checkpoint_agrees = True
    if any(isinstance(case, CheckpointCase) for case in args.cases):
        checkpoint_notes, checkpoint_agrees = checkpoint.report(small=args.small)
        notes += checkpoint_notes
    other_rows: dict[str, Row] = {**call_rows, **cold_rows}
    update_cases = [case for case in args.cases if isinstance(case, UpdateCase)]
    update_rows = [row for case in update_cases for row in run_update_case(
        case, small=args.small, repeat=args.repeat, peer_names=peer_names)]
    if args.memory and memory.supported():
        notes += [memory_note(case, peer_names, small=args.small) for case in update_cases]
    chunked = [row for case in args.cases if isinstance(case, ChunkedCase)
               for row in run_chunked_case(case, small=args.small, repeat=args.repeat, notes=notes)]
    hvp = [row for case in args.cases if isinstance(case, HvpCase)
           for row in run_hvp(small=args.small, repeat=args.repeat, peer_names=peer_names)]
    torch_module = peers.load_torch(thp=False) if "torch" in peer_names else None
    bounds = measure_machine(args.repeat, small=args.small, torch_module=torch_module)
    load = (load_at_start, os.getloadavg()[0])
    notes.append(f"Load average (1 min): {load[0]:.1f} at the start, {load[1]:.1f} at the end, on "
                 f"{os.cpu_count()} CPUs. Other processes' load skews every number here.")
    if args.small:
        notes.append("--small: tiny shapes and small bound problems; the times mean nothing.")

    kernels = {case.name for case in GROUPS["kernels"]}
    by_name = {r.name: r for r in results}
    kernel_results = [r for r in results if r.name in kernels]
    everyday = [row for case in args.cases if case.name not in kernels
                and not isinstance(case, (CheckpointCase, ChunkedCase, HvpCase, UpdateCase))
                for row in (case_rows(by_name[case.name], bounds) if case.name in by_name
                            else [other_rows[case.name]])] + update_rows
    descriptions = [_description(case, small=args.small) for case in args.cases
                    if case.name not in kernels]
    threads = peers.thread_count()
    markdown = to_markdown(kernel_results, bounds, repeat=args.repeat, threads=threads,
                           peer_names=peer_names, notes=notes, everyday=everyday,
                           descriptions=descriptions,
                           chunked=chunked_table(chunked) if chunked else (),
                           hvp=hvp_table(hvp) if hvp else ())
    print(markdown)
    settings = {"cases": [c.name for c in args.cases], "repeat": args.repeat, "small": args.small,
                "memory": args.memory,
                "threads": threads, "peers": peer_names, "load_average_1min": load,
                "warm_cache_floor_s": floor}
    args.json.write_text(json.dumps(to_json(results, bounds, settings=settings, notes=notes,
                                            everyday=everyday, chunked=chunked, hvp=hvp), indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown)
    failed = any(r.errors or r.mismatch for r in results)
    failed |= any(row.errors or row.mismatch
                  for row in (*other_rows.values(), *chunked, *update_rows))
    failed |= any(row.error or row.mismatch for row in hvp)
    failed |= not checkpoint_agrees
    return 1 if failed else 0


def run_chunked_case(case: ChunkedCase, *, small: bool, repeat: int, notes: list[str]) -> list[ChunkedRow]:
    """The chunked case's rows (`benchmarks.chunked`), or none, with a note, without dask."""
    if not peers.is_installed("distributed"):
        notes.append(f"dask and distributed (the dask extra) are not installed: {case.name} is skipped.")
        return []
    if not peers.is_installed("dask_image"):
        notes.append(f"dask-image (the bench extra) is not installed: {case.name} has no peer column.")
    return run_chunked(case, small=small, repeat=repeat)


def add_warm_start(results: Sequence[CaseResult], call_rows: dict[str, Row],
                   cases: Sequence[Case], *, small: bool, notes: list[str]) -> dict[str, float]:
    """halide_ad's first calls in a second process with this run's kernel cache, into `results`
    and `call_rows`; returns the floor that no kernel of halide_ad's sets (see
    `benchmarks.warm_start`), measured where `cases` are."""
    names = [r.name for r in results] + list(call_rows)
    if not names:
        return {}
    try:
        warm = warm_start.measure_in_subprocess(names, small=small)
        for result in results:
            result.warm_start_s = warm[result.name]
        for name, row in call_rows.items():
            row.warm_cache_s = warm[name]
        if not cases:
            return {}
        largest = max(4 * math.prod(c.out_shape(*c.input_shapes(small=small))) for c in cases)
        floor = warm_start.measure_floor(largest)
        notes.append(
            f"Measured in a fresh process of its own: numba's first call of a function from its own "
            f"cache, {floor['numba_first_call']:.2f} s (numba's compiler set-up, which halide_ad's kernels "
            f"skip when they load); the first write of a fresh {largest / 2**20:.0f} MiB array (the "
            f"largest output), {floor['first_write']:.2f} s, which any process pays.")
        return floor
    except subprocess.CalledProcessError as error:
        notes.append(f"The warm-cache first-call run failed ({error}).")
        return {}


def add_memory(results: Sequence[CaseResult], peer_names: Sequence[str], *, small: bool,
               notes: list[str]) -> None:
    """Each library's backward footprint on each of `results` (on the first only, under --small),
    each from a fresh process (see `benchmarks.memory`), into `result.memory`."""
    if not memory.supported():
        notes.append("This system does not let a process reset its peak RSS (/proc/self/clear_refs, "
                     "Linux 4.0 and later): the backward's memory was not measured.")
        return
    measured = [r for r in results if r.backward][:1 if small else None]
    if small and measured:
        notes.append(f"--small: the backward's memory was measured on {measured[0].name} only, at "
                     "its tiny shape: a smoke test of that step.")
    for result in measured:
        for library in ("halide_ad", *peer_names):
            if library in result.errors:
                continue
            try:
                footprint = memory.measure_in_subprocess(result.name, library, small=small)
            except subprocess.CalledProcessError as error:
                result.errors[f"{library} (memory)"] = str(error)
                continue
            result.memory[library] = footprint
            print(f"[{result.name}] {library}: backward peak memory {footprint.peak:.3g} MiB",
                  file=sys.stderr)


def _description(case: Case | CallCase | FirstCall, *, small: bool) -> str:
    if isinstance(case, Case):
        shapes = ", ".join(map(str, case.input_shapes(small=small)))
        return f"{case.name}: {case.description}; inputs {shapes}"
    return f"{case.name}: {case.description}"


if __name__ == "__main__":
    sys.exit(main())
