"""Integer affine forms `sum(c_v * v) + c` and the linearizer that turns index IR into them.

Div and mod by a positive constant become auxiliary variables: `e // k` is q and `e % k` is t,
with the equation `e - k*q - t == 0` and `0 <= t < k`, so they stay linear.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from halide_ad.ir import RUN_TIME_CHECKED, Bin, Call, Cast, Const, Expr, Op, Var, const, is_float

Interval = tuple[int, int]  # inclusive bounds of an integer expression


@dataclass(frozen=True)
class Affine:
    coeffs: tuple[tuple[Var, int], ...]  # sorted by name, no zeros
    const: int = 0

    @staticmethod
    def of(coeffs: dict[Var, int], c: int = 0) -> Affine:
        return Affine(tuple(sorted(((v, k) for v, k in coeffs.items() if k), key=lambda p: p[0].name)), c)

    @staticmethod
    def var(v: Var) -> Affine:
        return Affine(((v, 1),))

    def as_dict(self) -> dict[Var, int]:
        return dict(self.coeffs)

    def coeff(self, v: Var) -> int:
        return self.as_dict().get(v, 0)

    @property
    def vars(self) -> set[Var]:
        return {v for v, _ in self.coeffs}

    def __add__(self, o: Affine) -> Affine:
        d = self.as_dict()
        for v, k in o.coeffs:
            d[v] = d.get(v, 0) + k
        return Affine.of(d, self.const + o.const)

    def scale(self, k: int) -> Affine:
        return Affine.of({v: c * k for v, c in self.coeffs}, self.const * k)

    def __sub__(self, o: Affine) -> Affine:
        return self + o.scale(-1)

    def substitute(self, v: Var, num: Affine, den: int) -> Affine:
        """den * self with v := num / den (exact when num is divisible by den)."""
        k = self.coeff(v)
        if not k:
            return self
        rest = Affine.of({u: c for u, c in self.coeffs if u != v}, self.const)
        return rest.scale(den) + num.scale(k)

    def bounds(self, ranges: dict[Var, Interval]) -> Interval:
        lo = hi = self.const
        for v, k in self.coeffs:
            a, b = ranges[v]
            lo += min(k * a, k * b)
            hi += max(k * a, k * b)
        return lo, hi

    def to_expr(self) -> Expr:
        terms: list[Expr] = []
        for v, k in self.coeffs:
            terms.append(v if k == 1 else Bin(Op.MUL, const(k), v) if k != -1 else Call("neg", (v,)))
        if not terms:
            return const(self.const)
        out = terms[0]
        for t in terms[1:]:
            out = Bin(Op.SUB, out, t.args[0]) if isinstance(t, Call) else Bin(Op.ADD, out, t)
        if self.const > 0:
            out = Bin(Op.ADD, out, const(self.const))
        elif self.const < 0:
            out = Bin(Op.SUB, out, const(-self.const))
        return out


@dataclass(frozen=True)
class Constraint:
    """`aff >= 0` ('ge'), `aff == 0` ('eq'), or `aff % modulus == 0` ('mod')."""
    kind: str
    aff: Affine
    modulus: int = 0

    def to_expr(self) -> Expr:
        e = self.aff.to_expr()
        if self.kind == "ge":
            return Bin(Op.GE, e, const(0))
        if self.kind == "eq":
            flip = self.aff.coeffs and self.aff.coeffs[0][1] < 0
            return Bin(Op.EQ, (self.aff.scale(-1) if flip else self.aff).to_expr(), const(0))
        return Bin(Op.EQ, Bin(Op.MOD, e, const(self.modulus)), const(0))


@dataclass
class Linearizer:
    """Affine forms over the domain's Vars plus auxiliary div/mod Vars (with their ranges)."""
    ranges: dict[Var, Interval]
    equations: list[Affine] = field(default_factory=list)
    aux: dict[tuple[Affine, int], tuple[Var, Var]] = field(default_factory=dict)
    definitions: dict[Var, Expr] = field(default_factory=dict)  # aux var -> its IR meaning

    def affine(self, e: Expr) -> Affine | None:
        match e:
            case Const(v, dtype) if dtype != "bool" and not dtype.startswith("float"):
                return Affine.of({}, int(v))
            case Var() if e in self.ranges:
                return Affine.var(e)
            case Cast(dtype, v) if not dtype.startswith("float"):
                return self.affine(v)
            case Call(fn, (v,)) if fn == RUN_TIME_CHECKED:
                return self.affine(v)
            case Call("neg", (a,)):
                la = self.affine(a)
                return None if la is None else la.scale(-1)
            case Bin(Op.ADD | Op.SUB as op, a, b):
                la, lb = self.affine(a), self.affine(b)
                if la is None or lb is None:
                    return None
                return la + lb if op is Op.ADD else la - lb
            case Bin(Op.MUL, a, b):
                la, lb = self.affine(a), self.affine(b)
                if la is None or lb is None:
                    return None
                if not la.coeffs:
                    return lb.scale(la.const)
                if not lb.coeffs:
                    return la.scale(lb.const)
                return None
            case Bin(Op.FLOORDIV | Op.MOD as op, a, Const(k)) if isinstance(k, int) and k > 0:
                la = self.affine(a)
                if la is None:
                    return None
                if not la.coeffs:
                    return Affine.of({}, la.const // k if op is Op.FLOORDIV else la.const % k)
                q, t = self._divmod(la, k, a)
                return Affine.var(q if op is Op.FLOORDIV else t)
        return None

    def _divmod(self, la: Affine, k: int, source: Expr) -> tuple[Var, Var]:
        key = (la, k)
        if key not in self.aux:
            n = len(self.aux)
            q, t = Var(f"q{n}"), Var(f"t{n}")
            lo, hi = la.bounds(self.ranges)
            self.ranges[q] = (lo // k, hi // k)
            self.ranges[t] = (0, k - 1)
            self.equations.append(la - Affine.var(q).scale(k) - Affine.var(t))
            self.definitions[q] = Bin(Op.FLOORDIV, source, const(k))
            self.definitions[t] = Bin(Op.MOD, source, const(k))
            self.aux[key] = (q, t)
        return self.aux[key]

    def constraints(self, pred: Expr) -> list[Constraint] | None:
        """Linear constraints equivalent to `pred`, or None if it is not linear."""
        match pred:
            case Const(True):
                return []
            case Bin(Op.AND, a, b):
                ca, cb = self.constraints(a), self.constraints(b)
                return None if ca is None or cb is None else ca + cb
            case Call("not", (Bin(op, a, b),)) if op in _NEGATE:
                return self.constraints(Bin(_NEGATE[op], a, b))
            case Bin(op, a, b) if op in _NEGATE and op is not Op.NE:
                la, lb = self.affine(a), self.affine(b)
                if la is None or lb is None:
                    return None
                d = lb - la  # b - a
                match op:
                    case Op.LE:
                        return [Constraint("ge", d)]
                    case Op.LT:
                        return [Constraint("ge", d - Affine.of({}, 1))]
                    case Op.GE:
                        return [Constraint("ge", d.scale(-1))]
                    case Op.GT:
                        return [Constraint("ge", d.scale(-1) - Affine.of({}, 1))]
                    case Op.EQ:
                        return [Constraint("eq", d)]
        return None


_NEGATE = {Op.LT: Op.GE, Op.GE: Op.LT, Op.LE: Op.GT, Op.GT: Op.LE, Op.EQ: Op.NE, Op.NE: Op.EQ}


def linear_form(e: Expr) -> tuple[dict[Var, int], int] | None:
    """({var: coefficient}, constant) of an integer expression built from + - * by constants."""
    match e:
        case Const(v, dtype) if not is_float(dtype) and dtype != "bool":
            return {}, int(v)
        case Var():
            return {e: 1}, 0
        case Call("neg", (a,)):
            la = linear_form(a)
            return None if la is None else ({v: -c for v, c in la[0].items()}, -la[1])
        case Bin(Op.ADD | Op.SUB as op, a, b):
            la, lb = linear_form(a), linear_form(b)
            if la is None or lb is None:
                return None
            sign = 1 if op is Op.ADD else -1
            coeffs = dict(la[0])
            for v, c in lb[0].items():
                coeffs[v] = coeffs.get(v, 0) + sign * c
            return coeffs, la[1] + sign * lb[1]
        case Bin(Op.MUL, a, b):
            la, lb = linear_form(a), linear_form(b)
            if la is None or lb is None or (la[0] and lb[0]):
                return None
            (coeffs, c), k = (la, lb[1]) if not lb[0] else (lb, la[1])
            return {v: a * k for v, a in coeffs.items()}, c * k
    return None
