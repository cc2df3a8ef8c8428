"""torch with its huge-page allocator, measured in a subprocess.

torch reads THP_MEM_ALLOC_ENABLE when it is imported, so the main process (default allocator)
starts `python -m benchmarks.torch_thp` with the variable set, on the same cases, shapes, inputs
and repeat count, and the report keeps the faster of the two per case. There torch takes turns
with halide_ad (`timing.measure_turns`, with the main run's kernel cache), and its times are
put on the main run's scale (`on_main_scale`): multiplied by halide_ad's time in the main run
over its time here, pass by pass, so that torch's ratio to halide_ad is the one measured in turns
in either process, however the machine's speed moved between the two.

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
from benchmarks.ours import prepare_halide_ad
from benchmarks.timing import Timing, Timings, measure_prepared


def measure_in_subprocess(
    case_names: Sequence[str], *, repeat: int, small: bool
) -> dict[str, dict[str, Timings] | str]:
    """Each case's {"torch": timings with THP_MEM_ALLOC_ENABLE=1, "halide_ad": its timings in
    turns with them}, or the error it raised."""
    arguments = ["--cases", ",".join(case_names), "--repeat", str(repeat)]
    raw = run_json("benchmarks.torch_thp", arguments + (["--small"] if small else []),
                   env=dict(os.environ, **{peers.THP_ENV: "1"}))
    return {name: value if isinstance(value, str) else {k: Timings.from_dict(v) for k, v in value.items()}
            for name, value in raw.items()}


def on_main_scale(torch: Timings, ours_here: Timings, ours_main: Timings) -> Timings:
    """`torch`'s timings times ours_main / ours_here, pass by pass (see the module's doc)."""
    def scaled(t: Timing | None, here: Timing | None, main: Timing | None) -> Timing | None:
        if t is None or here is None or main is None:
            return t
        k = main.median_ms / here.median_ms
        return Timing(t.median_ms * k, t.min_ms * k, tuple(x * k for x in t.samples_ms))
    return Timings(scaled(torch.forward, ours_here.forward, ours_main.forward),
                   scaled(torch.backward, ours_here.backward, ours_main.backward), torch.first_call_s,
                   torch.variant)


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
            prepared = {"halide_ad": prepare_halide_ad(case.halide_ad, inputs, ct, backward=case.backward),
                        "torch": peers.prepare_torch(case.torch, inputs, ct, thp=True, backward=case.backward)}
            measured, errors = measure_prepared(prepared, args.repeat)
            if errors:
                raise next(iter(errors.values()))
            timings = measured["torch"].timings
        except Exception as error:  # noqa: BLE001 - reported by the parent, per case
            traceback.print_exc()
            results[case.name] = f"{type(error).__name__}: {error}"
        else:
            results[case.name] = {name: asdict(m.timings) for name, m in measured.items()}
            phase, timing = (("backward", timings.backward) if case.backward
                             else ("forward", timings.forward))
            print(f"[{case.name}] torch (THP): {phase} {timing.median_ms:.3g} ms", file=sys.stderr)
    args.json.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
