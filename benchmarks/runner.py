"""Runs the cases: each library in turn on the same inputs, then checks halide_ad against a peer.

Within a case, halide_ad runs first, so the first case's first call pays numba's one-off parallel
runtime start-up as a user's first call would; torch and jax are imported on their first use.
A library that raises on a case is recorded as an error for that case (with its traceback on
stderr) and the run goes on.
"""
from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from benchmarks import peers
from benchmarks.bounds import Cost, Shape
from benchmarks.cases import Case
from benchmarks.checks import Check, compare_arrays
from benchmarks.ours import measure_halide_ad
from benchmarks.timing import Measurement, Timings

PEERS = ("torch", "jax")


@dataclass(slots=True)
class CaseResult:
    """Everything the report needs about one case; the computed arrays are not kept."""

    name: str
    description: str
    input_shapes: tuple[Shape, ...]
    cost: Cost
    timings: dict[str, Timings] = field(default_factory=dict)  # library -> its best timings
    torch_variants: dict[str, Timings] = field(default_factory=dict)  # allocator -> timings
    checks: dict[str, Check] = field(default_factory=dict)  # "output", "gradients"
    reference: str | None = None  # the peer halide_ad was checked against
    errors: dict[str, str] = field(default_factory=dict)  # library -> exception
    warm_start_s: dict[str, float] = field(default_factory=dict)  # halide_ad's first calls, warm cache

    def add_torch_variant(self, timings: Timings) -> None:
        """Record one allocator setting's timings; torch's entry becomes the faster backward."""
        self.torch_variants[timings.variant] = timings
        fastest = min(self.torch_variants.values(), key=lambda t: t.backward.median_ms)
        self.timings["torch"] = fastest

    @property
    def mismatch(self) -> bool:
        """halide_ad's output or gradients differ from the reference peer's (False when no peer
        ran to check them)."""
        return any(not check.ok for check in self.checks.values())


def available_peers() -> list[str]:
    return [name for name in PEERS if peers.is_installed(name)]


def _guarded(
    result: CaseResult, library: str, run: Callable[[], Measurement]
) -> Measurement | None:
    """`run()`, or None with the exception recorded in `result.errors` and printed to stderr."""
    try:
        return run()
    except Exception as error:  # noqa: BLE001 - one failing library must not end the run
        print(f"[{result.name}] {library} failed:", file=sys.stderr)
        traceback.print_exc()
        result.errors[library] = f"{type(error).__name__}: {error}"
        return None


def run_case(case: Case, *, small: bool, repeat: int, peer_names: Sequence[str]) -> CaseResult:
    """Measure `case` in halide_ad and each of `peer_names`, and check halide_ad's values against
    the first peer that ran."""
    shapes = case.input_shapes(small=small)
    result = CaseResult(
        case.name, case.description, shapes, case.cost(shapes, case.out_shape(*shapes))
    )
    inputs = case.make_inputs(small=small)
    ct = case.cotangent(small=small)
    runs: dict[str, Callable[[], Measurement]] = {
        "halide_ad": lambda: measure_halide_ad(case.halide_ad, inputs, ct, repeat),
        "torch": lambda: peers.measure_torch(case.torch, inputs, ct, repeat, thp=False),
        "jax": lambda: peers.measure_jax(case.jax, inputs, ct, repeat),
    }
    measured: dict[str, Measurement] = {}
    for library in ("halide_ad", *peer_names):
        measurement = _guarded(result, library, runs[library])
        if measurement is None:
            continue
        measured[library] = measurement
        if library == "torch":
            result.add_torch_variant(measurement.timings)
        else:
            result.timings[library] = measurement.timings
        print(f"[{case.name}] {library}: backward {measurement.timings.backward.median_ms:.3g} ms",
              file=sys.stderr)
    _check(result, measured)
    return result


def _check(result: CaseResult, measured: dict[str, Measurement]) -> None:
    ours = measured.get("halide_ad")
    reference = next((name for name in PEERS if name in measured), None)
    if ours is None or reference is None:
        return
    ref = measured[reference]
    result.reference = reference
    result.checks["output"] = compare_arrays([ours.output], [ref.output])
    result.checks["gradients"] = compare_arrays(ours.gradients, ref.gradients)
    for what, check in result.checks.items():
        if not check.ok:
            print(f"[{result.name}] mismatch in halide_ad's {what} vs {reference}: {check.detail}",
                  file=sys.stderr)
