"""halide_ad's first calls in a fresh process whose on-disk kernel cache is already filled: what a
returning user pays (tracing, solving, and loading the compiled kernels instead of compiling).

The main run compiles every case into a fresh cache directory (HALIDE_AD_CACHE_DIR) and then
starts `python -m benchmarks.warm_start` on the same cases with that directory.

    HALIDE_AD_CACHE_DIR=dir python -m benchmarks.warm_start --cases blur,dense --json out.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.cases import select
from benchmarks.timing import time_once

REPO_ROOT = Path(__file__).resolve().parent.parent


def measure_in_subprocess(case_names: Sequence[str], *, small: bool) -> dict[str, dict[str, float]]:
    """{case: {"forward": s, "backward": s}} from a fresh process sharing this one's cache dir."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "warm_start.json"
        command = [sys.executable, "-m", "benchmarks.warm_start", "--cases", ",".join(case_names),
                   "--json", str(out)] + (["--small"] if small else [])
        subprocess.run(command, cwd=REPO_ROOT, check=True)
        return json.loads(out.read_text())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.warm_start", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", required=True, help="comma-separated case names")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--json", required=True, type=Path, help="where to write the seconds")
    args = parser.parse_args(argv)

    import halide_ad as hd  # after argparse: --help needs no numba
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
