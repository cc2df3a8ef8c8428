"""`hd.explain`: the forward IR, every adjoint contribution with its form, and the kernel sources."""
from __future__ import annotations

from dataclasses import dataclass, field

from halide_ad import config, ir
from halide_ad.ad import clamps_into_extrema
from halide_ad.api import CALL, FORWARD, as_function
from halide_ad.show import show_func, show_scatter
from halide_ad.runtime.contract import Contraction
from halide_ad.errors import NotDifferentiableError
from halide_ad.solver import Fallback
from halide_ad.solver.updates import schedule as update_schedule


@dataclass(frozen=True)
class Contribution:
    """One term of an adjoint: `adj_<buffer>[index] += value`, and how it is computed."""
    buffer: str
    form: str  # gather, gather-window, scatter-parallel or scatter-serial
    formula: str
    reason: str | None  # why a scatter was kept
    loc: str | None


@dataclass(frozen=True)
class Explanation:
    program: ir.Program
    contributions: tuple[Contribution, ...]
    forward_source: str
    backward_source: str
    fused: tuple[str, ...] = ()  # Funcs the forward computes where they are read, not stored
    through: dict[str, str] = field(default_factory=dict)  # clamps differentiated inside a max or min
    tiers: tuple[str, ...] = ()  # which tier ran each pass (halide_ad/tiered.py)
    rungs: dict[str, str] = field(default_factory=dict)  # update definitions: how each runs, and why
    refused: str | None = None  # why no gradient exists (NotDifferentiableError's message)
    forward_extents: tuple[str, ...] | None = None  # what a kernel shared across sizes reads (Kernel.extents)
    backward_extents: tuple[str, ...] | None = None

    def forms(self, buffer: str | None = None) -> list[str]:
        return [c.form for c in self.contributions if buffer is None or c.buffer == buffer]

    def __str__(self) -> str:
        lines = [f"== halide_ad: {self.program.name}", "", "-- forward IR"]
        lines += [f"  {b.name}: input {b.dtype}{list(b.shape)}" for b in self.program.inputs]
        fused = "  [not stored: computed where it is read]"
        through = "  [no adjoint: differentiated inside {}, whose output its test reads]"
        lines += [f"  {show_func(f)}" + (fused if f.name in self.fused else "")
                  + (through.format(self.through[f.name]) if f.name in self.through else "")
                  + (f"\n      runs at rung {self.rungs[f.name]}" if f.name in self.rungs else "")
                  for f in self.program.funcs]
        lines += [f"  outputs: {', '.join(self.program.outputs)}", "", "-- adjoint contributions"]
        if self.refused:
            lines.append(f"  no gradient: {self.refused}")
        for c in self.contributions:
            lines.append(f"  [{c.form}] {c.formula}" + (f"   ({c.loc})" if c.loc else ""))
            if c.reason:
                lines.append(f"      kept as a scatter: {c.reason}")
        lines += ["", "-- tiers", *(f"  {t}" for t in self.tiers)]
        lines += ["", "-- forward kernel" + _shared(self.forward_extents), self.forward_source,
                  "-- gradient kernel" + _shared(self.backward_extents), self.backward_source]
        return "\n".join(lines)

    __repr__ = __str__


def _shared(reads: tuple[str, ...] | None) -> str:
    return "" if reads is None else f" (shared with other sizes of this program: reads {', '.join(reads)} at run time)"


def explain(fn, *args, **kwargs) -> Explanation:
    """Trace and compile `fn` for these arguments; report what was generated (gradients with
    respect to every float array argument)."""
    traced, _ = as_function(fn).trace(args, kwargs)
    wrt = tuple(n for n in traced.arg_names if n is not None and ir.is_float(traced.program.buffer(n).dtype))
    tiers = _tiers(traced, wrt)
    forward = traced.forward_kernel()
    rungs = {f.name: f"{s.rung}: {s.reason}" for f in traced.program.funcs if isinstance(f, ir.Update)
             for s in [update_schedule(f)]}
    try:
        kernel, plans = traced.gradient(wrt)
    except NotDifferentiableError as e:
        if not rungs:
            raise
        return Explanation(traced.program, (), forward.source, "", rungs=rungs, refused=e.bare_message,
                           forward_extents=forward.extents())
    contributions = []
    stored = kernel.buffers()
    for plan in plans:
        if plan.adjoint.scan is not None:
            u = plan.adjoint.scan.update
            order = ", ".join(f"{r.var.name} from {r.hi - 1} down to {r.lo}" for r in u.rdom)
            contributions.append(Contribution(u.prev, "reverse-scan", f"adj_{u.prev}, adj_{plan.adjoint.buffer}: "
                                              f"the update of {u.prev} run backwards ({order})", None,
                                              str(u.loc) if u.loc else None))
        staged = not plan.inlined and ir.adjoint_name(plan.adjoint.buffer) not in stored
        for c in plan.contributions:
            routed = ""
            if isinstance(c, Contraction):
                routed, c = f"  [computed by {c.engine}]", c.inverse
            s = c.scatter
            formula = show_scatter(s) + routed
            if plan.inlined:
                formula += "  [not stored: computed where it is read]"
            elif staged:
                formula += "  [not stored: handed to its reader a plane at a time]"
            contributions.append(Contribution(s.buffer, c.form, formula,
                                              c.reason if isinstance(c, Fallback) else None,
                                              str(s.loc) if s.loc else None))
    fused = tuple(f.name for f in traced.program.funcs if f.name not in forward.buffers())
    through = clamps_into_extrema(traced.program)[1]
    return Explanation(traced.program, tuple(contributions), forward.source, kernel.source, fused, through, tiers,
                       rungs, forward_extents=forward.extents(), backward_extents=kernel.extents())


def _tiers(traced, wrt: tuple[str, ...]) -> tuple[str, ...]:
    """A line per pass called so far: how many calls the interpreter ran, and whether the
    kernels have taken over."""
    if not config.tiered_enabled():
        return ("every call runs the compiled kernels (HALIDE_AD_TIERED=0, or HALIDE_AD_JIT=0)",)
    passes = [(CALL, "forward (a call)"), (FORWARD, "forward (for gradients)")] + [
        (key, f"gradient by {', '.join(key)}") for key in traced._jobs if key not in (CALL, FORWARD)]
    lines = []
    for key, title in passes:
        calls = traced.interpreted.get(key, 0)
        now = "its kernels since" if key in traced._compiled else "its kernels still compiling"
        if calls:
            lines.append(f"{title}: {calls} call(s) on the numpy interpreter (runtime/vectorized.py), {now}")
        elif key in traced._compiled:
            lines.append(f"{title}: compiled kernels")
    if not any(key not in (CALL, FORWARD) for key, _ in passes) and wrt not in traced._compiled:
        lines.append("gradient: not run yet (explain compiles its kernels below)")
    return tuple(lines) or ("not run yet",)
