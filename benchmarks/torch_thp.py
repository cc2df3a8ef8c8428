"""torch with its huge-page allocator, measured in a subprocess.

torch reads THP_MEM_ALLOC_ENABLE when it is imported, so the main process (default allocator)
starts `python -m benchmarks.torch_thp` with the variable set, on the same cases, shapes, inputs
and repeat count, and the report keeps the faster of the two per case.

    THP_MEM_ALLOC_ENABLE=1 python -m benchmarks.torch_thp --cases blur,dense --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from benchmarks import peers
from benchmarks.child import run_json
from benchmarks.selection import select_vjp_cases
from benchmarks.timing import Timings


def measure_in_subprocess(
    case_names: Sequence[str], *, repeat: int, small: bool
) -> dict[str, Timings | str]:
    """Each case's torch timings with THP_MEM_ALLOC_ENABLE=1, or the error it raised."""
    arguments = ["--cases", ",".join(case_names), "--repeat", str(repeat)]
    raw = run_json("benchmarks.torch_thp", arguments + (["--small"] if small else []),
                   env=dict(os.environ, **{peers.THP_ENV: "1"}))
    return {name: value if isinstance(value, str) else Timings.from_dict(value)
            for name, value in raw.items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.torch_thp", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", required=True, help="comma-separated case names")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--json", required=True, type=Path, help="where to write the timings")
    args = parser.parse_args(argv)

    results: dict[str, dict | str] = {}
    for case in select_vjp_cases(args.cases.split(",")):
        inputs = case.make_inputs(small=args.small)
        ct = case.cotangent(small=args.small)
        try:
            timings = peers.measure_torch(case.torch, inputs, ct, args.repeat, thp=True,
                                          backward=case.backward).timings
        except Exception as error:  # noqa: BLE001 - reported by the parent, per case
            traceback.print_exc()
            results[case.name] = f"{type(error).__name__}: {error}"
        else:
            results[case.name] = asdict(timings)
            phase, timing = (("backward", timings.backward) if case.backward
                             else ("forward", timings.forward))
            print(f"[{case.name}] torch (THP): {phase} {timing.median_ms:.3g} ms", file=sys.stderr)
    args.json.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
