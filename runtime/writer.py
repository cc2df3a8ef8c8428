"""A small indenting writer that builds a loop nest (runtime/loops.py) from lines and loops.

The code generator writes statements as lines at a depth and opens loops with `loop`; `tree()`
nests each line and loop under the line or loop before it at a smaller depth, so the loops reach
the emitter as For nodes (which it outlines) and the lines as Source nodes.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from halide_ad.runtime.loops import Block, Bound, For, Kind, Source, Stmt


@dataclass(frozen=True, slots=True)
class _Open:
    """A loop opened at a depth: its body is what follows at a greater depth."""
    var: str
    lo: Bound
    hi: Bound
    kind: Kind
    step: int = 1


class Writer:
    def __init__(self) -> None:
        self.ops: list[tuple[int, str | _Open]] = []  # (depth, a line or a loop), in order
        self.depth = 0
        self._tmp = 0

    def line(self, text: str = "") -> None:
        self.ops.append((self.depth, text))

    def loop(self, var: str, lo: Bound, hi: Bound, kind: Kind = Kind.SERIAL, step: int = 1) -> None:
        """Open `for var in range(lo, hi, step)`: what follows one level deeper is its body."""
        self.ops.append((self.depth, _Open(var, lo, hi, kind, step)))
        self.depth += 1

    def add(self, s: Stmt) -> None:
        """Append `s`, a resolved nest (runtime/emit.py `resolve`: For and Source nodes only), at
        the current depth."""
        match s:
            case Block(body):
                for c in body:
                    self.add(c)
            case Source(text, body):
                self.line(text)
                self.depth += 1
                self.add(body)
                self.depth -= 1
            case For(var, lo, hi, kind, body, step):
                self.loop(var, lo, hi, kind, step)
                self.add(body)
                self.depth -= 1
            case _:
                raise TypeError(f"not resolved: {s!r}")

    def rewrite(self, start: int, transform) -> None:
        """Replace what was written since `start` (`len(self.ops)` then: a nest at the current
        depth) with `transform(that nest)`, a pass over its For and Source nodes."""
        tail = Writer()
        tail.ops = self.ops[start:]
        del self.ops[start:]
        self.add(transform(tail.tree(self.depth)))

    def extend(self, other: Writer) -> None:
        """Append what `other` wrote (at its own depths)."""
        self.ops += other.ops

    @contextmanager
    def block(self, header: str):
        self.line(header)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def temp(self, base: str) -> str:
        self._tmp += 1
        return f"{base}{self._tmp}"

    def tree(self, depth: int = 0) -> Block:
        """What was written from `depth` on, as a Block of For and Source nodes."""
        ops, k = self.ops, 0

        def level(at: int) -> tuple[Stmt, ...]:
            nonlocal k
            out: list[Stmt] = []
            while k < len(ops) and ops[k][0] >= at:
                d, op = ops[k]
                assert d == at, f"a statement at depth {d} under none at depth {d - 1}: {op!r}"
                k += 1
                body = Block(level(at + 1))
                out.append(Source(op, body) if isinstance(op, str) else For(op.var, op.lo, op.hi, op.kind, body, op.step))
            return tuple(out)

        top = level(depth)
        assert k == len(ops), f"a statement above depth {depth}: {ops[k]!r}"
        return Block(top)
