"""`show(e)`: an expression as a person would write it, e.g. `2 * (j - 1) + 1`."""
from __future__ import annotations

from halide_ad.ir import Bin, Call, Cast, Const, Expr, Func, Load, Op, Reduce, Scatter, Select, Update, Var

_PRECEDENCE = {Op.OR: 1, Op.AND: 2, Op.EQ: 3, Op.NE: 3, Op.LT: 3, Op.LE: 3, Op.GT: 3, Op.GE: 3,
               Op.ADD: 4, Op.SUB: 4, Op.MUL: 5, Op.DIV: 5, Op.FLOORDIV: 5, Op.MOD: 5, Op.POW: 7}
_ATOM = 9


def show(e: Expr) -> str:
    return _show(e)[0]


def _show(e: Expr) -> tuple[str, int]:
    match e:
        case Const(v, dtype):
            text = repr(v) if dtype != "float32" else repr(float(v))
            return text, (_ATOM if not (isinstance(v, (int, float)) and v < 0) else 6)
        case Var(name):
            return name, _ATOM
        case Load(buffer, index, _):
            return f"{buffer}[{', '.join(show(i) for i in index)}]", _ATOM
        case Bin(Op.MIN | Op.MAX as op, a, b):
            return f"{op.value}({show(a)}, {show(b)})", _ATOM
        case Bin(op, a, b):
            p = _PRECEDENCE[op]
            right_assoc = op is Op.POW
            left = _paren(a, p + (1 if right_assoc else 0))
            right = _paren(b, p + (0 if right_assoc else 1))
            return f"{left} {op.value} {right}", p
        case Call("neg", (a,)):
            return f"-{_paren(a, 6)}", 6
        case Call("not", (a,)):
            return f"~{_paren(a, 6)}", 6
        case Call(fn, args):
            return f"{fn}({', '.join(show(a) for a in args)})", _ATOM
        case Select(c, t, f):
            return f"select({show(c)}, {show(t)}, {show(f)})", _ATOM
        case Cast(dtype, v):
            return f"{dtype}({show(v)})", _ATOM
        case Reduce(op, body, rvars, where):
            doms = ", ".join(f"{r.var.name} in [{r.lo}, {r.hi})" for r in rvars)
            cond = f" if {show(where)}" if where is not None else ""
            return f"{op}({show(body)} for {doms}{cond})", _ATOM
    return repr(e), _ATOM


def _paren(e: Expr, min_precedence: int) -> str:
    text, p = _show(e)
    return f"({text})" if p < min_precedence else text


def show_scatter(s: Scatter) -> str:
    """`adj_x[i + r] += g[i] * w[r]  for i in [0, 8), r in [0, 3) if ...`"""
    text = f"adj_{s.buffer}[{', '.join(map(show, s.index))}] += {show(s.value)}"
    text += "  for " + ", ".join(f"{r.var.name} in [{r.lo}, {r.hi})" for r in s.domain)
    return text + (f" if {show(s.where)}" if s.where is not None else "")


def show_func(f: Func | Update) -> str:
    if isinstance(f, Update):
        loops = ", ".join(f"{r.var.name} in [{r.lo}, {r.hi})" for r in f.pure + f.rdom)
        return (f"{f.name}[{', '.join(map(show, f.index))}] = {show(f.value)}    # update of {f.prev}, {f.dtype}"
                + (f", for {loops}" if loops else "") + (f" if {show(f.where)}" if f.where is not None else ""))
    lhs = f"{f.name}[{', '.join(v.name for v in f.vars)}]"
    dom = " for " + ", ".join(f"{v.name} < {n}" for v, n in zip(f.vars, f.shape, strict=True)) if f.vars else ""
    return f"{lhs} = {show(f.body)}    # {f.dtype}{dom}"
