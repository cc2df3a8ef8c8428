"""Runs the cases: each library's first calls on the same inputs, then their passes timed in
turns (`timing.measure_prepared`), then halide_ad's values checked against a peer's.

Within a case, halide_ad's first calls come first, so the first case's first call pays numba's
one-off parallel runtime start-up as a user's first call would; torch and jax are imported on
their first use. A library that raises on a case is recorded as an error for that case (with
its traceback on stderr) and the run goes on.
"""
from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from benchmarks import peers
from benchmarks.bounds import Cost, Shape, forward_cost
from benchmarks.cases import Case
from benchmarks.checks import Check, compare_arrays
from benchmarks.memory import Footprint
from benchmarks.ours import prepare_halide_ad
from benchmarks.timing import Measurement, Prepared, Timings, measure_prepared

PEERS = ("torch", "jax")


@dataclass(slots=True)
class CaseResult:
    """Everything the report needs about one case; the computed arrays are not kept."""

    name: str
    description: str
    input_shapes: tuple[Shape, ...]
    cost: Cost  # the backward pass's
    forward_cost: Cost
    backward: bool  # whether the backward pass was measured
    timings: dict[str, Timings] = field(default_factory=dict)  # library -> its best timings
    torch_variants: dict[str, Timings] = field(default_factory=dict)  # allocator -> timings
    checks: dict[str, Check] = field(default_factory=dict)  # "output", "gradients"
    reference: str | None = None  # the peer halide_ad was checked against
    errors: dict[str, str] = field(default_factory=dict)  # library -> exception
    warm_start_s: dict[str, float] = field(default_factory=dict)  # halide_ad's first calls, warm cache
    memory: dict[str, Footprint] = field(default_factory=dict)  # library -> backward's footprint

    def add_torch_variant(self, timings: Timings) -> None:
        """Record one allocator setting's timings; torch's entry becomes the faster backward (the
        faster forward, for a case measured forward only)."""
        self.torch_variants[timings.variant] = timings
        fastest = min(self.torch_variants.values(),
                      key=lambda t: (t.backward or t.forward).median_ms)
        self.timings["torch"] = fastest

    @property
    def mismatch(self) -> bool:
        """halide_ad's output or gradients differ from the reference peer's (False when no peer
        ran to check them)."""
        return any(not check.ok for check in self.checks.values())


@dataclass(slots=True)
class Row:
    """One line of the everyday table: one pass of one case, each library's median in seconds,
    and halide_ad's values checked against the `reference` peer's."""

    case: str
    phase: str  # "forward", "backward", "call", "value_and_grad", ...
    times_s: dict[str, float] = field(default_factory=dict)  # library -> median
    variants: dict[str, str] = field(default_factory=dict)  # library -> setting ("THP")
    reference: str | None = None
    check: Check | None = None
    errors: dict[str, str] = field(default_factory=dict)  # library -> exception
    bound_s: float | None = None  # the machine's lower bound, where the case has one
    first_call_s: float | None = None  # halide_ad's first call in this run, compile included
    warm_cache_s: float | None = None  # its first call in a second process, warm kernel cache
    parts_s: dict[str, dict[str, float]] = field(default_factory=dict)  # library -> its parts

    @property
    def mismatch(self) -> bool:
        return self.check is not None and not self.check.ok

    def record_error(self, library: str, error: Exception) -> None:
        """Keep `error` for the report and print its traceback to stderr; the run goes on."""
        print(f"[{self.case}] {library} failed:", file=sys.stderr)
        traceback.print_exception(error)
        self.errors[library] = f"{type(error).__name__}: {error}"

    def check_values(self, values: dict[str, list]) -> None:
        """halide_ad's values against the first peer in PEERS that gave some."""
        reference = next((p for p in PEERS if p in values), None)
        if "halide_ad" in values and reference is not None:
            self.reference = reference
            self.check = compare_arrays(values["halide_ad"], values[reference])


def available_peers() -> list[str]:
    return [name for name in PEERS if peers.is_installed(name)]


def _record(result: CaseResult, library: str, error: Exception) -> None:
    """Keep `error` in `result.errors` and print its traceback to stderr; the run goes on."""
    print(f"[{result.name}] {library} failed:", file=sys.stderr)
    traceback.print_exception(error)
    result.errors[library] = f"{type(error).__name__}: {error}"


def run_case(case: Case, *, small: bool, repeat: int, peer_names: Sequence[str]) -> CaseResult:
    """Measure `case` in halide_ad and each of `peer_names`, and check halide_ad's values against
    the first peer that ran."""
    shapes = case.input_shapes(small=small)
    out_shape = case.out_shape(*shapes)
    cost = case.cost(shapes, out_shape)
    result = CaseResult(case.name, case.description, shapes, cost,
                        forward_cost(shapes, out_shape, cost), case.backward)
    inputs = case.make_inputs(small=small)
    ct = case.cotangent(small=small)
    backward = case.backward
    prepares: dict[str, Callable[[], Prepared]] = {
        "halide_ad": lambda: prepare_halide_ad(case.halide_ad, inputs, ct, backward=backward),
        "torch": lambda: peers.prepare_torch(case.torch, inputs, ct, thp=False, backward=backward),
        "jax": lambda: peers.prepare_jax(case.jax, inputs, ct, backward=backward),
    }
    prepared: dict[str, Prepared] = {}
    for library in ("halide_ad", *peer_names):
        try:
            prepared[library] = prepares[library]()
        except Exception as error:  # noqa: BLE001 - one failing library must not end the run
            _record(result, library, error)
    measured, errors = measure_prepared(prepared, repeat)
    for library, error in errors.items():
        _record(result, library, error)
    for library, measurement in measured.items():
        if library == "torch":
            result.add_torch_variant(measurement.timings)
        else:
            result.timings[library] = measurement.timings
        timings = measurement.timings
        phase, timing = ("backward", timings.backward) if backward else ("forward", timings.forward)
        print(f"[{case.name}] {library}: {phase} {timing.median_ms:.3g} ms", file=sys.stderr)
    _check(result, measured, gradients=backward)
    return result


def _check(result: CaseResult, measured: dict[str, Measurement], *, gradients: bool) -> None:
    ours = measured.get("halide_ad")
    reference = next((name for name in PEERS if name in measured), None)
    if ours is None or reference is None:
        return
    ref = measured[reference]
    result.reference = reference
    result.checks["output"] = compare_arrays([ours.output], [ref.output])
    if gradients:
        result.checks["gradients"] = compare_arrays(ours.gradients, ref.gradients)
    for what, check in result.checks.items():
        if not check.ok:
            print(f"[{result.name}] mismatch in halide_ad's {what} vs {reference}: {check.detail}",
                  file=sys.stderr)
