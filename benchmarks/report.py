"""The results as a markdown table for people and as JSON for tools.

Ratios (computed once, in `ratios`, for both):
* `peer_speedup` = the best peer's backward / halide_ad's backward (above 1: halide_ad is faster);
* `over_bound` = halide_ad's backward / the case's lower bound (at least 1);
* `backward_over_forward` = halide_ad's backward / its forward.

A halide_ad time whose output or gradients did not match the reference peer is withheld from the
table (marked ✗), and its ratios with it: the table never shows a wrong kernel's speed. The JSON
keeps every number, with `verified` saying whether to trust it.
"""
from __future__ import annotations

import math
import platform
from collections.abc import Sequence
from dataclasses import asdict
from importlib import metadata

from benchmarks.bounds import MachineBounds, Rate
from benchmarks.runner import PEERS, CaseResult

PEER_TITLES = {"torch": "PyTorch", "jax": "JAX"}


def ratios(result: CaseResult, bounds: MachineBounds) -> dict[str, float | None]:
    ours = result.timings.get("halide_ad")
    if ours is None:
        return {"peer_speedup": None, "over_bound": None, "backward_over_forward": None}
    backward = ours.backward.median_ms
    peer_backwards = [result.timings[p].backward.median_ms for p in PEERS if p in result.timings]
    return {
        "peer_speedup": min(peer_backwards) / backward if peer_backwards else None,
        "over_bound": backward / bounds.lower_bound_ms(result.cost),
        "backward_over_forward": backward / ours.forward.median_ms,
    }


def _versions() -> dict[str, str | None]:
    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    packages = ("halide_ad", "numpy", "numba", "torch", "jax", "jaxlib")
    return {"python": platform.python_version(), **{p: version(p) for p in packages}}


def to_json(results: Sequence[CaseResult], bounds: MachineBounds, *, settings: dict,
            notes: Sequence[str]) -> dict:
    return {
        "settings": settings,
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "versions": _versions()},
        "bounds": {"copy_bandwidth_bytes_per_s": asdict(bounds.copy_bandwidth),
                   "sgemm_flop_per_s": asdict(bounds.sgemm)},
        "cases": [
            {
                "name": r.name,
                "description": r.description,
                "input_shapes": r.input_shapes,
                "cost": asdict(r.cost),
                "lower_bound_ms": bounds.lower_bound_ms(r.cost),
                "timings_ms": {library: asdict(t) for library, t in r.timings.items()},
                "torch_variants_ms": {name: asdict(t) for name, t in r.torch_variants.items()},
                "reference": r.reference,
                "checks": {what: asdict(check) for what, check in r.checks.items()},
                "verified": r.verified,
                "ratios": ratios(r, bounds),
                "errors": r.errors,
            }
            for r in results
        ],
        "notes": list(notes),
    }


def _ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.0f}" if value >= 1000 else f"{value:.3g}"


def _ratio(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:.0f}×" if value >= 100 else f"{value:.2g}×"


def _check_cell(result: CaseResult) -> str:
    if "halide_ad" in result.errors:
        return "error"
    if not result.checks:
        return "unchecked"
    failed = [what for what, check in result.checks.items() if not check.ok]
    return f"✗ {', '.join(failed)} vs {result.reference}" if failed else f"ok vs {result.reference}"


def _peer_cell(result: CaseResult, peer: str, *, backward: bool) -> str:
    timings = result.timings.get(peer)
    if timings is None:
        return "error" if peer in result.errors else "–"
    cell = _ms((timings.backward if backward else timings.forward).median_ms)
    return f"{cell} (THP)" if timings.variant == "THP" else cell


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _backward_table(results: Sequence[CaseResult], bounds: MachineBounds,
                    peer_names: Sequence[str]) -> list[str]:
    header = ["case", "lower bound", "halide_ad", *(PEER_TITLES[p] for p in peer_names),
              "best peer / halide_ad", "halide_ad / bound", "bwd / fwd", "check"]
    rows = []
    for r in results:
        ours = r.timings.get("halide_ad")
        shown = ours is not None and r.verified
        ratio = ratios(r, bounds) if shown else {}
        ours_cell = _ms(ours.backward.median_ms) if shown else ("✗" if ours else "error")
        rows.append([
            r.name, _ms(bounds.lower_bound_ms(r.cost)), ours_cell,
            *(_peer_cell(r, p, backward=True) for p in peer_names),
            _ratio(ratio.get("peer_speedup")), _ratio(ratio.get("over_bound")),
            _ratio(ratio.get("backward_over_forward")), _check_cell(r),
        ])
    return _table(header, rows)


def _forward_table(results: Sequence[CaseResult], peer_names: Sequence[str]) -> list[str]:
    header = ["case", "halide_ad fwd", *(f"{PEER_TITLES[p]} fwd" for p in peer_names),
              "halide_ad first fwd (s)", "halide_ad first bwd (s)"]
    if "jax" in peer_names:
        header += ["JAX first fwd (s)", "JAX first bwd (s)"]
    rows = []
    for r in results:
        ours = r.timings.get("halide_ad")
        shown = ours is not None and r.verified
        row = [r.name, _ms(ours.forward.median_ms) if shown else ("✗" if ours else "error"),
               *(_peer_cell(r, p, backward=False) for p in peer_names)]
        row += [f"{ours.first_call_s[k]:.2f}" if ours else "–" for k in ("forward", "backward")]
        if "jax" in peer_names:
            jax = r.timings.get("jax")
            row += [f"{jax.first_call_s[k]:.2f}" if jax else "–" for k in ("forward", "backward")]
        rows.append(row)
    return _table(header, rows)


def to_markdown(results: Sequence[CaseResult], bounds: MachineBounds, *, repeat: int,
                threads: int, peer_names: Sequence[str], notes: Sequence[str]) -> str:
    lines = [
        f"Backward pass, ms: medians of {repeat} runs after a warm-up, float32, {threads} threads.",
        "",
        *_backward_table(results, bounds, peer_names),
        "",
        "Forward pass, ms (same medians), and first calls, s (trace and compile included):",
        "",
        *_forward_table(results, peer_names),
        "",
        "Cases:",
        *(f"* {r.name}: {r.description}; inputs {', '.join(map(str, r.input_shapes))}"
          for r in results),
        "",
        "Notes:",
        "* Lower bounds, measured in this run: copy bandwidth "
        f"{_rate(bounds.copy_bandwidth, 'GB/s')}, SGEMM {_rate(bounds.sgemm, 'GFLOP/s')}. "
        "Memory-bound cases: read the cotangent and the inputs the gradient needs, write the "
        "gradients; conv2d and dense: FLOPs / SGEMM rate.",
        "* best peer / halide_ad above 1 means halide_ad's backward is faster; ✗ marks a halide_ad "
        "result that differs from the reference peer's, whose time is withheld.",
        *(f"* {note}" for note in notes),
    ]
    for r in results:
        lines += [f"* {r.name}: {library} raised {error}" for library, error in r.errors.items()]
        lines += [f"* {r.name}: halide_ad's {what} differ from {r.reference}'s ({check.detail})"
                  for what, check in r.checks.items() if not check.ok]
    return "\n".join(lines) + "\n"


def _rate(rate: Rate, unit: str) -> str:
    """'31.9 GB/s (numba prange; numpy 17.0)' for a rate in `unit`s of 1e9 per second."""
    others = "".join(f"; {name} {value / 1e9:.1f}" for name, value in rate.by_method.items()
                     if name != rate.method)
    return f"{rate.value / 1e9:.1f} {unit} ({rate.method}{others})"
