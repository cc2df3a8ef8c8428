"""A scan's adjoint (`ir.ReverseScan`, halide_ad/update_ad.py) written back into a trace as update
definitions, for gradients taken while tracing (halide_ad/retrace.py), so that they can be
differentiated again (a Hessian-vector product through a linear recurrence).

For an update u that z3 proved reversible (one-to-one writes; a read of another element sees its
final value), running u backwards at each point q, last to first, does: g = A[e(q)] (the adjoint
of the value q wrote), A[e(q)] = 0, then A[e_k(q)] += term_k(g) for each read of the tensor. Since
no point before q reads e(q), nothing adds to A[e(q)] after q, so with the zeroing left out:

* V, an update of adj_<u> run over u's rdom reversed: at q, for each read k of another element,
  V[e_k(q)] += term_k(V[e(q)]) (one rdom step per read, in order);
* the adjoint of the value q wrote is then V[e(q)], read by the gradients of the other buffers;
* adj_<prev>, an update of V at the written elements only (one write each, in parallel):
  Z[e(q)] = the terms of the read of the element itself (an overwritten value gets none).

A taped update (colliding writes, reads of elements written later) rolls the tensor back point by
point from a record the forward pass keeps; that record has no form as a Func, so it is refused.
"""
from __future__ import annotations

from collections.abc import Callable

from halide_ad import ir
from halide_ad.errors import NotDifferentiableError
from halide_ad.ir import Bin, Expr, Load, Op, Range, ReverseScan, Select, Update, Var
from halide_ad.update_ad import is_own_read
from halide_ad.updates import finished
from halide_ad.traverse import conjunction, rewrite, substitute


def scan_as_updates(state, scan: ReverseScan, start: str, rename: Callable[[Expr], Expr],
                    fn_name: str) -> tuple[str, Update]:
    """(V's name, Z) for `scan`, added to `state`; `start` holds adj_<u>, and `rename` maps the
    other adjoints the terms read to the trace's Funcs."""
    u = scan.update
    if scan.state is not None:
        raise NotDifferentiableError(
            f"the gradient of {fn_name} is used while tracing (inside a traced function, or "
            f"differentiated again), and it runs the update of {u.prev} backwards from a record of "
            "what each point overwrote (its writes may collide, or it reads elements that later "
            "points write: an in-place max or product into shared elements, a Horner loop), which "
            "has no form as a traced program yet. Take this gradient at the top level (hd.grad or "
            "hd.vjp on arrays), or use forward mode for the second derivative: hd.jvp goes through "
            "every update, and hd.jacfwd and hd.check_grad(..., modes=('fwd',)) build on it.", u.loc)
    own = [t for t in scan.terms if is_own_read(u, Load(u.name, t.index, u.dtype))]
    others = [t for t in scan.terms if t not in own]
    v = state.fresh_name(f"d_{u.prev}_scan") if others else start
    written = Load(v, u.index, u.dtype)  # the adjoint of the value a point wrote, once V is done

    def local(e: Expr | None) -> Expr | None:
        return None if e is None else rename(rewrite(
            e, lambda n: written if isinstance(n, Load) and n.buffer == ir.adjoint_name(scan.writes) else None))

    if others:
        _backward_run(state, u, v, start, [(tuple(map(local, t.index)), local(t.value), local(t.where))
                                            for t in others])
    value = ir.const(0, u.dtype)
    for t in own:
        term = local(t.value) if t.where is None else Select(local(t.where), local(t.value), ir.const(0, u.dtype))
        value = Bin(Op.ADD, value, term)
    z = finished(Update(state.fresh_name(f"d_{u.prev}"), v, u.shape, u.dtype, u.pure, u.pure_dims, u.rdom,
                        u.index, ir.cast(u.dtype, value), u.where, u.loc))
    state.funcs.append(z)
    return v, z


def _backward_run(state, u: Update, name: str, start: str, terms: list[tuple]) -> Update:
    """V = start, then over u's rdom in reverse, for each term in turn: V[index] += value."""
    flip = {r.var: Bin(Op.SUB, ir.const(r.lo + r.hi - 1), r.var) for r in u.rdom}
    rdom, step = u.rdom, None
    if len(terms) > 1:
        step = Var(state.fresh_name("k", loop_var=True))
        rdom += (Range(step, 0, len(terms)),)

    def pick(parts: list[Expr]) -> Expr:  # the part of the current step
        out = parts[-1]
        for k in range(len(parts) - 2, -1, -1):
            out = Select(Bin(Op.EQ, step, ir.const(k)), parts[k], out)
        return out

    index = tuple(pick([t[0][d] for t in terms]) for d in range(len(u.shape)))
    value = Bin(Op.ADD, Load(name, index, u.dtype), pick([ir.cast(u.dtype, t[1]) for t in terms]))
    where = [t[2] if t[2] is not None else ir.const(True) for t in terms]
    where = conjunction([pick(where)]) if any(t[2] is not None for t in terms) else None
    def flipped(e: Expr | None) -> Expr | None:
        return None if e is None else substitute(e, flip)

    run = finished(Update(name, start, u.shape, u.dtype, u.pure, u.pure_dims, rdom, tuple(map(flipped, index)),
                          flipped(value), flipped(where), u.loc))
    state.funcs.append(run)
    return run
