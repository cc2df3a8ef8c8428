"""`hd.checkpoint` on a deep pipeline: the peak memory of one gradient step with and without it.

The pipeline is `DEPTH` blocks of two clamped stencils each (a tanh of a 4-neighbour stencil,
then a mix with the block's input), then a sum of squares. Each variant runs in a fresh process
(`python -m benchmarks.checkpoint --variant plain|checkpointed`), which

1. builds the input and runs `hd.value_and_grad` twice: compilation happens here;
2. hands back free memory as `benchmarks.memory` does and reads the resident set size (RSS);
3. runs `hd.value_and_grad` once more, and reports its peak RSS over the baseline (VmHWM,
   reset just before) and its wall time.

The runner (`python -m benchmarks --cases checkpoint`) adds a line per variant to the report's
notes, then computes both gradients in its own process and fails if they differ.
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import halide_ad as hd
from benchmarks.child import run_json
from benchmarks.memory import _hand_back_free_memory, _reset_peak, _status_mib
from halide_ad import tiered

DEPTH = 8
SIZE, SMALL_SIZE = 1024, 64


@dataclass(frozen=True)
class CheckpointCase:
    name: str = "checkpoint"
    description: str = (f"hd.checkpoint: the peak memory of one hd.value_and_grad step of a {DEPTH}-block "
                        "stencil pipeline, with its blocks checkpointed and without")


CHECKPOINT = CheckpointCase()


def block(u):
    c = hd.repeat_edge(u)
    a = hd.compute(u.shape, lambda y, x: hd.tanh(c[y - 1, x] + c[y + 1, x] + c[y, x - 1] + c[y, x + 1]
                                                 - 4 * c[y, x]), name="a")
    ca = hd.repeat_edge(a)
    return hd.compute(u.shape, lambda y, x: 0.5 * u[y, x] + 0.25 * (ca[y, x - 1] + ca[y, x + 1]), name="b")


checkpointed_block = hd.checkpoint(block)


def plain(u):
    for _ in range(DEPTH):
        u = block(u)
    return hd.sum(u * u)


def checkpointed(u):
    for _ in range(DEPTH):
        u = checkpointed_block(u)
    return hd.sum(u * u)


VARIANTS = {"plain": plain, "checkpointed": checkpointed}


def _image(small: bool) -> np.ndarray:
    size = SMALL_SIZE if small else SIZE
    return np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)


def measure(variant: str, *, small: bool) -> dict[str, float]:
    """One variant's step, in this process (see the module's doc)."""
    u = _image(small)
    step = hd.value_and_grad(VARIANTS[variant])
    for _ in range(2):  # compile; under tiered execution, until the compiled kernels have run
        step(u)
        tiered.settle()
    _hand_back_free_memory()
    baseline = _status_mib("VmRSS")
    _reset_peak()
    start = time.perf_counter()
    step(u)
    seconds = time.perf_counter() - start
    return {"peak_mib": _status_mib("VmHWM") - baseline, "seconds": seconds}


def report(*, small: bool) -> tuple[list[str], bool]:
    """The notes for the runner's report, and whether the two variants' gradients agree (checked
    in this process, after the measurements)."""
    results = {v: run_json("benchmarks.checkpoint", ["--variant", v] + (["--small"] if small else []))
               for v in VARIANTS}
    u = _image(small)
    gradients = {v: hd.grad(fn)(u) for v, fn in VARIANTS.items()}
    notes = [f"checkpoint, {v}: one value_and_grad step of {DEPTH} stencil blocks on a {u.shape[0]}x"
             f"{u.shape[1]} float32 image peaks at {r['peak_mib']:.1f} MiB over its baseline, in "
             f"{r['seconds'] * 1e3:.1f} ms" for v, r in results.items()]
    plain_g, checkpointed_g = gradients["plain"], gradients["checkpointed"]
    difference = np.abs(plain_g - checkpointed_g).max() / np.abs(plain_g).max()
    same = bool(difference <= 1e-5)
    ratio = results["checkpointed"]["peak_mib"] / results["plain"]["peak_mib"]
    notes.append(f"checkpoint: the checkpointed step's peak memory is {ratio:.2f}x the plain one's; the "
                 f"gradients {'agree' if same else 'DIFFER'} (largest difference {difference:.2g} of the "
                 "largest entry)")
    return notes, same


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.checkpoint", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", required=True, choices=list(VARIANTS))
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--json", required=True, type=Path, help="where to write the results")
    args = parser.parse_args(argv)
    args.json.write_text(json.dumps(measure(args.variant, small=args.small)))


if __name__ == "__main__":
    main()
