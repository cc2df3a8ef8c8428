"""Loop nests (runtime/loops.py) -> the Python source that numba compiles.

`function` prints a kernel's nest as one module: each parallel For becomes a numba function of its
loop index, `entry_b<k>(j, ...)`, and one that runs the iterations [start, stop),
`entry_p<k>(start, stop, ...)`, which the entry hands to `parallel_for` (runtime/parallel.py); the
statements between parallel loops become serial numba functions `entry_s<k>(...)`; serial loops
that enclose a parallel one (of extent 1: the parallel dimension is the first longer one) stay in
the entry, as Python. With the loop inside the body's own function, LLVM made the bilinear
gradient ~20% slower, hence the two functions per parallel loop.

Expressions, names and buffers print through the code generator's `Emitter` (`em`), which owns the
kernel's namespace: its `name` and `buffer` give every variable and buffer a name that no name of
the generated code's own takes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from halide_ad.runtime.loops import COMBINE, Accumulate, Block, Bound, For, If, Kind, Let, Local, Source, Stmt, Store, block, walk
from halide_ad.runtime.writer import Writer

_NAME = re.compile(r"\b[A-Za-z_]\w*\b")  # identifiers in a helper's body: which parameters it needs


def function(em, entry: str, body: Block) -> str:
    """The module text for `entry(<the buffers it uses>, status)` running `body`."""
    pieces = _cut(body.body, em)  # (prints every expression first: that names the buffers used)
    names = [*map(em.buffer, em.used), "status"]
    helpers: list[str] = []

    def params(lines: list[str], outer: list[str]) -> list[str]:
        used = set(_NAME.findall("\n".join(lines)))
        return [v for v in outer if v in used] + [n for n in names if n in used]

    def helper(kind: str, args: list[str], lines: list[str]) -> str:
        name = f"{entry}_{kind}{len(helpers)}"
        helpers.append(f"@kernel\ndef {name}({', '.join(args)}):\n" + "".join(f"    {line}\n" for line in lines) + "\n\n")
        return name

    def level(pieces: list, indent: int, outer: list[str]) -> list[str]:
        pad, out, serial = "    " * indent, [], []

        def flush() -> None:
            if any(line.strip() and not line.strip().startswith("#") for line in serial):
                args = params(serial, outer)
                out.append(pad + f"{helper('s', args, serial)}({', '.join(args)})")
            else:
                out.extend(pad + line if line else line for line in serial)
            serial.clear()

        for piece in pieces:
            if isinstance(piece, list):
                serial += piece
                continue
            flush()
            if isinstance(piece, _Parallel):
                args = params(piece.lines, outer)
                iteration = helper("b", [piece.var, *args], piece.lines)
                call = f"{iteration}({', '.join([piece.var, *args])})"
                name = helper("p", ["start", "stop", *args], [f"for {piece.var} in range(start, stop):", f"    {call}"])
                out.append(pad + f"parallel_for({name}, {piece.bounds}{''.join(', ' + a for a in args)}, "
                                 f"iteration={iteration})")
            else:
                out.append(pad + piece.header)
                out += level(piece.pieces, indent + 1, outer + [piece.var])
        flush()
        return out

    entry_lines = level(pieces, 1, []) + ["    return None"]
    literals = "".join(f"{name} = {text}\n" for text, name in em.literals.items())
    return literals + "".join(helpers) + f"def {entry}({', '.join(names)}):\n" + "\n".join(entry_lines) + "\n"


@dataclass(frozen=True, slots=True)
class _Parallel:
    """A parallel loop, printed: what `function` outlines."""
    var: str
    bounds: str
    lines: list[str]


@dataclass(frozen=True, slots=True)
class _Around:
    """A serial loop with a parallel one inside: it stays in the entry."""
    header: str
    var: str
    pieces: list


def _cut(stmts: tuple[Stmt, ...], em) -> list:
    """`stmts` printed: lines for each statement with no parallel loop inside, else a _Parallel or
    an _Around."""
    out: list = []
    for s in stmts:
        if not any(isinstance(n, For) and n.kind is Kind.PARALLEL for n in walk(s)):
            out.append(render(s, em))
            continue
        assert isinstance(s, For), f"a parallel loop inside a statement that is not a loop: {s!r}"
        s = resolve(s, em)
        if s.kind is Kind.PARALLEL:
            out.append(_Parallel(s.var, f"{s.lo}, {s.hi}", render(s.body, em)))
        else:
            out.append(_Around(_header(s), s.var, _cut(s.body.body, em)))
    return out


def resolve(s: Stmt, em) -> Stmt:
    """`s` with every expression printed, in order: For nodes with named variables and bounds as
    text, the other statements as Source lines. Printing names variables and buffers, numbers
    literals and run-time checks and lists the buffers used, so a nest is resolved where it
    stands among the statements the code generator still writes as text."""
    match s:
        case Block(body):
            return block(*(resolve(c, em) for c in body))
        case Source(text, body):
            return Source(text, resolve(body, em))
        case For(var, lo, hi, kind, body, step):
            name = var if isinstance(var, str) else em.name(var)
            return For(name, _bound(lo, em), _bound(hi, em), kind, resolve(body, em), step)
        case Store(buffer, index, value):
            return _with_inline(em, lambda: f"{em.index(buffer, index, buffer)} = {em.expr(value)}")
        case Accumulate(Local(name), value, op):
            return _with_inline(em, lambda: f"{name} = {COMBINE[op].format(name, em.expr(value))}")
        case Let(var, value):
            return _with_inline(em, lambda: f"{em.expr(var)} = {em.expr(value)}")
        case If(cond, then, otherwise):
            test = _with_inline(em, lambda: f"if {em.expr(cond)}:")
            head = block(*test.body[:-1], Source(test.body[-1].text, resolve(then, em)))
            return head if otherwise is None else block(head, Source("else:", resolve(otherwise, em)))
    raise TypeError(f"not a statement: {s!r}")


def render(s: Stmt, em, indent: int = 0) -> list[str]:
    """The lines of `s`, indented `indent` levels (a parallel loop inside runs serially: only
    `function` outlines them)."""
    return _lines(resolve(s, em), indent)


def _lines(s: Stmt, indent: int) -> list[str]:
    pad = "    " * indent
    match s:
        case Block(body):
            return [line for c in body for line in _lines(c, indent)]
        case Source(text, body):
            return [pad + text if text else ""] + _lines(body, indent + 1)
        case For(var, lo, hi, Kind.UNROLLED, body):
            return [line for k in range(int(lo), int(hi)) for line in [f"{pad}{var} = {k}", *_lines(body, indent)]]
        case For(body=body):
            return [pad + _header(s)] + _lines(body, indent + 1)
    raise TypeError(f"not resolved: {s!r}")


def _header(s: For) -> str:
    """The header of a resolved loop."""
    assert s.step == 1 or s.kind is Kind.SERIAL, f"a {s.kind.value} loop with a step: {s!r}"
    if s.kind is Kind.REVERSED:
        return f"for {s.var} in range({_shift(s.hi)}, {_shift(s.lo)}, -1):"
    return f"for {s.var} in range({s.lo}, {s.hi}{'' if s.step == 1 else f', {s.step}'}):"


def _shift(text: str) -> str:
    """A bound minus one."""
    return str(int(text) - 1) if text.lstrip("-").isdigit() else f"{text} - 1"


def _bound(b: Bound, em) -> str:
    return b if isinstance(b, str) else str(b) if isinstance(b, int) else em.expr(b)


def _with_inline(em, line) -> Block:
    """`line()`'s text as a Source line, after the loops of the reductions it computes inline (the
    Emitter writes those to `em.out` while it prints the expression)."""
    saved, em.out = em.out, Writer()
    em.out._tmp = saved._tmp  # temporaries stay unique in the kernel
    try:
        text = line()
    finally:
        inline, em.out = em.out, saved
        saved._tmp = inline._tmp
    return block(inline.tree(), Source(text))
