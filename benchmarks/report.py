"""The results as a markdown table for people and as JSON for tools.

Ratios (computed once, in `ratios`, for both):
* `peer_speedup` = the best peer's backward / halide_ad's backward (above 1: halide_ad is faster);
* `over_bound` = halide_ad's backward / the case's lower bound (at least 1);
* `backward_over_forward` = halide_ad's backward / its forward;
* `memory_over_torch` = halide_ad's backward peak memory / PyTorch's (at most 1: halide_ad needs no
  more memory than PyTorch).

The everyday cases get a table of their own, one row per pass (`Row`): forward, backward, a whole
call, a training step, a first call on empty caches; each with `best peer / halide_ad` and, where
the case has one, halide_ad / its lower bound.

A halide_ad time whose output or gradients did not match the reference peer is withheld from the
table (marked ✗), and its ratios with it: the table never shows a wrong kernel's speed. The JSON
keeps every number, with `mismatch` saying not to trust it. Without a peer to check against, times
are shown but marked unchecked.
"""
from __future__ import annotations

import math
import platform
from collections.abc import Sequence
from dataclasses import asdict
from importlib import metadata
from typing import Literal

from benchmarks.bounds import MachineBounds, Rate
from benchmarks.runner import PEERS, CaseResult, Row

PEER_TITLES = {"torch": "PyTorch", "jax": "JAX"}
TITLES = {"halide_ad": "halide_ad", **PEER_TITLES}
Phase = Literal["forward", "backward"]
PHASES: tuple[Phase, ...] = ("forward", "backward")
SHORT = {"forward": "fwd", "backward": "bwd"}
METHODS = {
    "halide_ad": "halide_ad: `vjp_fn(ct)` after `out, vjp_fn = hd.vjp(f, *inputs)`, allocating "
    "gradients from its buffer pool (runtime/buffers.py: a big array is reused once nothing "
    "references it, as in a training loop that drops last step's gradients); first calls include "
    "tracing and numba compilation into a fresh kernel cache, and the first case's also numba's "
    "thread start-up; the warm-cache columns are a second process's first calls with that cache.",
    "torch": "PyTorch: `torch.autograd.grad(y, inputs, ct, retain_graph=True)` on a graph built "
    "once; forward under no_grad; the faster of the default allocator and THP_MEM_ALLOC_ENABLE=1 "
    "(marked THP: run in a subprocess, in turns with halide_ad there, its times multiplied by "
    "halide_ad's time here over its time there, so that its ratio is the one measured in turns).",
    "jax": "JAX: `jax.jit` of the vjp function applied to residuals from a jitted `jax.vjp`; "
    "XLA sizes its own thread pool.",
}

MEMORY_METHOD = (
    "Backward peak memory (benchmarks/memory.py): one fresh process per case and library builds "
    "the inputs and cotangent, runs the forward with residuals and the backward twice to compile "
    "and warm up, and drops them; runs the forward with residuals again and keeps them "
    "(halide_ad: `out, vjp_fn = hd.vjp(f, *inputs)`; PyTorch, default allocator: the graph "
    "built with requires_grad; JAX: the jitted `jax.vjp`'s output and residuals); hands back free "
    "memory (gc, halide_ad's buffer pool emptied of the arrays it keeps for reuse, glibc "
    "malloc_trim) and reads the resident set size (RSS) as the baseline; then calls the backward "
    "twice, dropping each result. The figure is the peak RSS over those two calls minus the "
    "baseline: the gradients, the backward's temporaries, and what it keeps between calls "
    "(halide_ad's pool, an allocator's free lists), as in a training loop that drops each "
    "step's gradients. The peak is the kernel's high-water mark (VmHWM, reset through "
    "/proc/self/clear_refs), not sampled; Linux sums its per-CPU page counts lazily, so a "
    "figure written by several threads may be off by a few hundred KiB here (the counters' batch "
    "times the CPU count), and a ratio within 1% of 1 is a tie. The JSON splits the figure into "
    "held (kept between the two calls) and transient (added by the second call on top)."
)


def ratios(result: CaseResult, bounds: MachineBounds) -> dict[str, float | None]:
    ours = result.timings.get("halide_ad")
    if ours is None or ours.backward is None:  # failed, or a case measured forward only
        return {"peer_speedup": None, "over_bound": None, "backward_over_forward": None,
                "memory_over_torch": None}
    backward = ours.backward.median_ms
    peer_backwards = [result.timings[p].backward.median_ms for p in PEERS
                      if p in result.timings and result.timings[p].backward is not None]
    return {
        "peer_speedup": min(peer_backwards) / backward if peer_backwards else None,
        "over_bound": backward / bounds.lower_bound_ms(result.cost),
        "backward_over_forward": backward / ours.forward.median_ms,
        "memory_over_torch": _memory_ratio(result),
    }


def _memory_ratio(result: CaseResult) -> float | None:
    ours, torch = result.memory.get("halide_ad"), result.memory.get("torch")
    if ours is None or torch is None or torch.peak <= 0:
        return None
    return ours.peak / torch.peak


def _versions() -> dict[str, str | None]:
    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    packages = ("halide_ad", "numpy", "numba", "torch", "jax", "jaxlib", "dask", "distributed", "dask-image")
    return {"python": platform.python_version(), **{p: version(p) for p in packages}}


def _cpu_model() -> str:
    """The CPU's model name on Linux, else whatever `platform` knows."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def to_json(results: Sequence[CaseResult], bounds: MachineBounds, *, settings: dict,
            notes: Sequence[str], everyday: Sequence[Row] = (), chunked: Sequence = (),
            hvp: Sequence = ()) -> dict:
    return {
        "settings": settings,
        "machine": {"platform": platform.platform(), "cpu": _cpu_model(), "versions": _versions()},
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
                "mismatch": r.mismatch,
                "ratios": ratios(r, bounds),
                "errors": r.errors,
                "halide_ad_warm_cache_first_call_s": r.warm_start_s,
                "backward_memory_mib": {library: asdict(m) for library, m in r.memory.items()},
            }
            for r in results
        ],
        "everyday": [row_to_json(row) for row in everyday],
        "chunked": [asdict(row) for row in chunked],  # benchmarks.chunked's rows
        "hvp": [asdict(row) for row in hvp],  # benchmarks.hvp's rows
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
        return "unchecked (no peer)"
    failed = [what for what, check in result.checks.items() if not check.ok]
    return f"✗ {', '.join(failed)} vs {result.reference}" if failed else f"ok vs {result.reference}"


def _median_cell(result: CaseResult, library: str, phase: Phase) -> str:
    """A library's median for `phase`; halide_ad's is withheld (✗) when its values mismatch."""
    timings = result.timings.get(library)
    if timings is None:
        return "error" if library in result.errors else "–"
    if library == "halide_ad" and result.mismatch:
        return "✗"
    cell = _ms(getattr(timings, phase).median_ms)
    return f"{cell} (THP)" if timings.variant == "THP" else cell


def _first_call_cells(result: CaseResult, library: str) -> list[str]:
    timings = result.timings.get(library)
    return [f"{timings.first_call_s[phase]:.2f}" if timings else "–" for phase in PHASES]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _backward_table(results: Sequence[CaseResult], bounds: MachineBounds,
                    peer_names: Sequence[str]) -> list[str]:
    header = ["case", "lower bound", "halide_ad", *(PEER_TITLES[p] for p in peer_names),
              "best peer / halide_ad", "halide_ad / bound", "bwd / fwd", "check"]
    rows = []
    for r in results:
        ratio = {} if r.mismatch else ratios(r, bounds)
        rows.append([
            r.name, _ms(bounds.lower_bound_ms(r.cost)),
            *(_median_cell(r, library, "backward") for library in ("halide_ad", *peer_names)),
            *(_ratio(ratio.get(key)) for key in ("peer_speedup", "over_bound",
                                                 "backward_over_forward")),
            _check_cell(r),
        ])
    return _table(header, rows)


def _memory_table(results: Sequence[CaseResult], peer_names: Sequence[str]) -> list[str]:
    header = ["case", "gradients", "halide_ad", *(PEER_TITLES[p] for p in peer_names),
              *(["halide_ad / PyTorch"] if "torch" in peer_names else [])]
    rows = []
    for r in results:
        if not r.memory:
            continue
        gradients = next(iter(r.memory.values())).gradients
        cells = [_mib(r.memory[library].peak) if library in r.memory else
                 "error" if f"{library} (memory)" in r.errors else "–"
                 for library in ("halide_ad", *peer_names)]
        if r.mismatch and "halide_ad" in r.memory:
            cells[0] = "✗"
        ratio = [] if "torch" not in peer_names else [
            "–" if r.mismatch else _ratio(_memory_ratio(r))]
        rows.append([r.name, _mib(gradients), *cells, *ratio])
    return _table(header, rows)


def _mib(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _forward_table(results: Sequence[CaseResult], peer_names: Sequence[str]) -> list[str]:
    compiled = ["halide_ad", *(p for p in peer_names if p == "jax")]  # torch compiles nothing
    header = ["case", "halide_ad fwd", *(f"{PEER_TITLES[p]} fwd" for p in peer_names),
              *(f"{TITLES[library]} first {SHORT[phase]} (s)" for library in compiled
                for phase in PHASES),
              *(f"halide_ad first {SHORT[phase]}, warm cache (s)" for phase in PHASES)]
    rows = [
        [r.name, *(_median_cell(r, library, "forward") for library in ("halide_ad", *peer_names)),
         *(cell for library in compiled for cell in _first_call_cells(r, library)),
         *(f"{r.warm_start_s[phase]:.2f}" if phase in r.warm_start_s else "–" for phase in PHASES)]
        for r in results
    ]
    return _table(header, rows)


def to_markdown(results: Sequence[CaseResult], bounds: MachineBounds, *, repeat: int,
                threads: int, peer_names: Sequence[str], notes: Sequence[str],
                everyday: Sequence[Row] = (), descriptions: Sequence[str] = (),
                chunked: Sequence[str] = (), hvp: Sequence[str] = ()) -> str:
    """The kernel cases' tables (`results`), then the everyday table (`everyday`), then the
    chunked case's (`chunked`: its lines, `benchmarks.chunked`) and the HVP case's (`hvp`: its
    lines, `benchmarks.hvp`), then each case's description
    (`descriptions`: one line per case outside the kernel tables) and the notes."""
    lines = []
    if results:
        lines += [
            f"Backward pass, ms: medians of {repeat} runs after 3 warm-up calls, the libraries "
            f"taking turns (each run one call of each, after an untimed one of its own, in "
            f"rotating order), float32, {threads} threads.",
            "",
            *_backward_table(results, bounds, peer_names),
            "",
            "Forward pass, ms (same medians), and first calls, s (trace and compile included):",
            "",
            *_forward_table(results, peer_names),
            "",
        ]
    if any(r.memory for r in results):
        lines += [
            "Backward pass, peak memory, MiB: what one backward call adds to the resident memory "
            "of a process holding its inputs and residuals, steady state, gradients included "
            "(gradients: their size); a fresh process per case and library (see the notes).",
            "",
            *_memory_table(results, peer_names),
            "",
        ]
    if everyday:
        lines += [
            f"Everyday programs: medians of {repeat} runs after warm-up, the libraries taking "
            f"turns, float32, {threads} threads; best peer / halide_ad above 1 means halide_ad is "
            "faster.",
            "",
            *everyday_table(everyday, peer_names),
            "",
        ]
    if chunked:
        lines += [f"Chunked, halide_ad.dask: medians of {repeat} runs after one warm-up run, float32.", "",
                  *chunked, ""]
    if hvp:
        lines += [f"Hessian-vector products: medians of {repeat} runs after 3 warm-up calls, whole calls "
                  "from arrays to arrays, float32.", "", *hvp, ""]
    lines += [
        "Cases:",
        *(f"* {r.name}: {r.description}; inputs {', '.join(map(str, r.input_shapes))}"
          for r in results),
        *(f"* {line}" for line in descriptions),
        "",
        "Notes:",
        "* Lower bounds, measured in this run: copy bandwidth "
        f"{_rate(bounds.copy_bandwidth, 'GB/s')}, SGEMM {_rate(bounds.sgemm, 'GFLOP/s')}. "
        "Memory-bound cases: read the cotangent and the inputs the gradient needs, write the "
        "gradients (a forward pass: read the inputs, write the output); conv2d, dense and the "
        "layer: FLOPs / SGEMM rate.",
        "* best peer / halide_ad above 1 means halide_ad is faster; ✗ marks a halide_ad "
        "result that differs from the reference peer's, whose time is withheld.",
        *(f"* {METHODS[library]}" for library in ("halide_ad", *peer_names)),
        *([f"* {MEMORY_METHOD}"] if any(r.memory for r in results) else []),
        *(f"* {method}" for method in (EVERYDAY_METHODS if everyday else ())),
        *(f"* {note}" for note in notes),
    ]
    for r in results:
        lines += [f"* {r.name}: {library} raised {error}" for library, error in r.errors.items()]
        lines += [f"* {r.name}: mismatch in halide_ad's {what} vs {r.reference}: {check.detail}"
                  for what, check in r.checks.items() if not check.ok]
    for row in everyday:
        lines += [f"* {row.case} {row.phase}: {library} raised {error}"
                  for library, error in row.errors.items()]
        if row.mismatch:
            lines.append(f"* {row.case} {row.phase}: mismatch in halide_ad's values vs "
                         f"{row.reference}: {row.check.detail}")
    return "\n".join(lines) + "\n"


def _rate(rate: Rate, unit: str) -> str:
    """'31.9 GB/s (numba prange; numpy 17.0)' for a rate in `unit`s of 1e9 per second."""
    others = "".join(f"; {name} {value / 1e9:.1f}" for name, value in rate.by_method.items()
                     if name != rate.method)
    return f"{rate.value / 1e9:.1f} {unit} ({rate.method}{others})"


# --- the everyday cases ---------------------------------------------------------------------------

EVERYDAY_METHODS = (
    "Everyday table: forward and backward are timed as in the kernel tables, PyTorch at the faster "
    "of its two allocators for each pass (THP marks the huge-page one). call, value_and_grad and "
    "training step rows time a whole call as a user makes it, with the inputs ready in each "
    "library's arrays (benchmarks/calls.py; PyTorch eager, default allocator). The empty-caches row "
    "is one fresh process per library, imports not counted.",
    "halide_ad first call: this run's first call of the pass (tracing and compiling included, "
    "into this run's kernel cache); warm cache: a second process's first call with that cache.",
)


def case_rows(result: CaseResult, bounds: MachineBounds) -> list[Row]:
    """A `Case`'s forward and, where measured, backward as everyday rows."""
    rows = []
    for phase in PHASES if result.backward else ("forward",):
        row = Row(result.name, phase, reference=result.reference,
                  check=result.checks.get("output" if phase == "forward" else "gradients"),
                  errors=dict(result.errors))
        cost = result.forward_cost if phase == "forward" else result.cost
        row.bound_s = bounds.lower_bound_ms(cost) * 1e-3
        for library, timings in result.timings.items():
            if library == "torch":  # the faster allocator for this pass
                timings = min(result.torch_variants.values(),
                              key=lambda t: getattr(t, phase).median_ms)
                if timings.variant == "THP":
                    row.variants[library] = "THP"
            row.times_s[library] = getattr(timings, phase).median_ms * 1e-3
        ours = result.timings.get("halide_ad")
        row.first_call_s = ours.first_call_s.get(phase) if ours else None
        row.warm_cache_s = result.warm_start_s.get(phase)
        rows.append(row)
    return rows


def row_ratios(row: Row) -> dict[str, float | None]:
    """`peer_speedup` = the best peer's median / halide_ad's; `over_bound` = halide_ad's median /
    the lower bound."""
    ours = row.times_s.get("halide_ad")
    peer_times = [row.times_s[p] for p in PEERS if p in row.times_s]
    return {
        "peer_speedup": min(peer_times) / ours if ours and peer_times else None,
        "over_bound": ours / row.bound_s if ours and row.bound_s else None,
    }


def row_to_json(row: Row) -> dict:
    return {**asdict(row), "mismatch": row.mismatch, "ratios": row_ratios(row)}


def _duration(seconds: float | None) -> str:
    """A time with the unit that suits it: 12.3 µs, 4.56 ms, 7.89 s."""
    if seconds is None:
        return "–"
    if seconds >= 1:
        return f"{seconds:.3g} s"
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} µs"


def _row_time(row: Row, library: str) -> str:
    if library not in row.times_s:
        return "error" if library in row.errors else "–"
    if library == "halide_ad" and row.mismatch:
        return "✗"
    cell = _duration(row.times_s[library])
    return f"{cell} ({row.variants[library]})" if library in row.variants else cell


def _row_check(row: Row) -> str:
    if "halide_ad" in row.errors:
        return "error"
    if row.check is None:
        return "unchecked (no peer)"
    return f"ok vs {row.reference}" if row.check.ok else f"✗ vs {row.reference}"


def everyday_table(rows: Sequence[Row], peer_names: Sequence[str]) -> list[str]:
    header = ["case", "pass", "lower bound", "halide_ad", *(PEER_TITLES[p] for p in peer_names),
              "best peer / halide_ad", "halide_ad / bound", "halide_ad first call",
              "halide_ad first call, warm cache", "check"]
    table = []
    for row in rows:
        ratio = {} if row.mismatch else row_ratios(row)
        table.append([
            row.case, row.phase, _duration(row.bound_s),
            *(_row_time(row, library) for library in ("halide_ad", *peer_names)),
            _ratio(ratio.get("peer_speedup")), _ratio(ratio.get("over_bound")),
            _duration(row.first_call_s), _duration(row.warm_cache_s), _row_check(row),
        ])
    return _table(header, table)
