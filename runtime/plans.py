"""The gradient's plan: per adjoint, its contributions (gathers, proven-safe scatters, or what an
engine computes), and the helpers the passes over plans share."""
from __future__ import annotations

from dataclasses import dataclass, replace

from halide_ad.ir import Adjoint, Expr, Load, Var
from halide_ad.solver import Fallback, Gather
from halide_ad.traverse import walk


@dataclass(frozen=True)
class AdjointPlan:
    """adj_<buffer>[new_vars] = cotangent + the sum of `contributions`, each inverted. An inlined
    adjoint is never stored: the plans that read it compute it in place."""
    adjoint: Adjoint
    new_vars: tuple[Var, ...]
    contributions: tuple[Gather | Fallback, ...]
    inlined: bool = False


def gather_vars(adj: Adjoint, avoid: frozenset[str] = frozenset()) -> tuple[Var, ...]:
    """j (or j0, j1, ...): one per dimension, never the name of a variable the scatters use (nor
    one in `avoid`)."""
    taken = {r.var.name for s in adj.scatters for r in s.domain} | avoid
    names = ["j"] if len(adj.shape) == 1 else [f"j{d}" for d in range(len(adj.shape))]
    out = []
    for n in names:
        while n in taken:
            n += "_"
        out.append(Var(n))
    return tuple(out)


def values(c) -> list[Expr]:
    """The values a contribution adds (each piece's, for a gather)."""
    if isinstance(c, Gather):
        return [p.value for p in c.pieces]
    return [c.scatter.value if isinstance(c, Fallback) else c.inverse.scatter.value]


def map_values(c, fn):
    """Contribution `c` with `fn` applied to the values it adds."""
    if isinstance(c, Gather):
        return replace(c, pieces=tuple(replace(p, value=fn(p.value)) for p in c.pieces))
    if isinstance(c, Fallback):
        return replace(c, scatter=replace(c.scatter, value=fn(c.scatter.value)))
    return c


def reads(e, name: str) -> bool:
    return any(isinstance(n, Load) and n.buffer == name for n in walk(e))

