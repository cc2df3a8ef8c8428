"""One kernel for every size of a dimension whose extent is only a trip count.

A kernel's source bakes every extent in (`range(0, 4)`, `parallel_for(f, 0, 4000, ...)`), so a
program called with another batch size generates another source and numba compiles it again:
seconds, for a layer. Here a source is compared with the latest one generated before it that has
the same text but for its integer literals (`_Parsed.key`) and that no shared kernel serves. Where every literal that differs is, in
both, the extent of one dimension of a buffer its function takes (4 -> 3 where x.shape[0] went
from 4 to 3), those literals become reads of that extent at run time (`x.shape[0]`), and the
kernel so written serves the second size and any later one whose source it reproduces exactly:
each literal it replaced equal to that buffer's extent there, each other literal unchanged.
That check is what makes sharing safe: a schedule decision that depends on the size (a parallel
loop or a serial one, a boundary split `range(1, n - 1)`, BLAS or loops) changes the text or a
literal that is no extent, and the size then gets a kernel of its own. The first size keeps its
kernel as it was generated, byte for byte.
"""
from __future__ import annotations

import ast
import hashlib
import io
import threading
import tokenize
from dataclasses import dataclass

_SCRATCH = ["lanes", ".", "scratch", "("]
MAX_SOURCES = 512  # sources remembered: a new one beyond drops the oldest


@dataclass(frozen=True)
class _Literal:
    value: int
    at: tuple[int, int]  # (line, column) where the token starts, as tokenize counts them
    params: tuple[str, ...] | None  # the parameters of the function it is in; None at module level
    pinned: bool  # numba needs it as a constant: `lanes.scratch(n, ...)`, an array on the stack


@dataclass(frozen=True)
class _Parsed:
    key: str  # a hash of the source's tokens with its integer literals and comments left out
    literals: tuple[_Literal, ...]


@dataclass(frozen=True)
class Shared:
    """A kernel's source that reads extents at run time, what it reads (`x.shape[0]`, ...), and
    where: for each integer literal of the sources it serves, None (a constant) or (buffer, axis)."""
    source: str
    marks: tuple[tuple[str, int] | None, ...]
    constants: tuple[int, ...]

    @property
    def reads(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f"{m[0]}.shape[{m[1]}]" for m in self.marks if m is not None))

    def serves(self, parsed: _Parsed, shapes: dict[str, tuple[int, ...]]) -> bool:
        """Whether this kernel computes exactly what `parsed`'s source does at `shapes`."""
        for mark, constant, literal in zip(self.marks, self.constants, parsed.literals, strict=True):
            if mark is None:
                if literal.value != constant:
                    return False
                continue
            name, axis = mark
            shape = shapes.get(name)
            if shape is None or len(shape) <= axis or shape[axis] != literal.value:
                return False
        return True


_lock = threading.Lock()
MAX_KEPT = 4  # per key, shared kernels and unshared sources remembered: programs whose text only their sizes tell apart


@dataclass
class _Kind:
    """What was generated before with one key, newest first: the kernels shared so far, and the
    sources that none of them serves. A new size is compared with each of those: sizes of one
    program follow one another, and another program of the same text (a pooled width where this
    one has another) shares nothing with them."""
    shared: list[Shared]
    unshared: list[tuple[str, _Parsed, dict]]


_seen: dict[str, _Kind] = {}


def shared(source: str, shapes: dict[str, tuple[int, ...]]) -> Shared | None:
    """The kernel written to serve `source` at `shapes` and the other sizes before it, or None:
    `source` is compiled as it is (the first of its kind, or one no extent explains)."""
    parsed = _parse(source)
    if parsed is None:
        return None
    with _lock:
        kind = _seen.get(parsed.key)
        if kind is None:
            if len(_seen) >= MAX_SOURCES:
                _seen.pop(next(iter(_seen)))
            kind = _seen[parsed.key] = _Kind([], [])
        served = next((s for s in kind.shared if s.serves(parsed, shapes)), None)
        if served is not None:
            return served
        if any(all(a.value == b.value for a, b in zip(before[1].literals, parsed.literals, strict=True))
               for before in kind.unshared):
            return None  # the same kernel (or one whose comments differ): nothing to read at run time
        for before in kind.unshared:
            made = _share(*before, parsed, shapes)
            if made is not None:
                kind.shared = [made, *kind.shared[:MAX_KEPT - 1]]
                return made
        kind.unshared = [(source, parsed, dict(shapes)), *kind.unshared[:MAX_KEPT - 1]]
        return None


def _share(source: str, first: _Parsed, first_shapes: dict, parsed: _Parsed, shapes: dict) -> Shared | None:
    """`source` (at `first_shapes`) with each literal that differs in `parsed` (at `shapes`)
    replaced by the extent that explains it in both, or None where one has no such extent."""
    marks = []
    for a, b in zip(first.literals, parsed.literals, strict=True):
        if a.value == b.value:
            marks.append(None)
            continue
        mark = None if a.pinned else next(((name, axis) for name in a.params or ()
                     for shape, new in [(first_shapes.get(name), shapes.get(name))]
                     if shape is not None and new is not None and len(shape) == len(new)
                     for axis in range(len(shape)) if shape[axis] == a.value and new[axis] == b.value), None)
        if mark is None:
            return None
        marks.append(mark)
    lines = source.splitlines(keepends=True)
    for literal, mark in sorted(zip(first.literals, marks), key=lambda lm: lm[0].at, reverse=True):
        if mark is not None:  # (right to left, so that the columns of those before stay right)
            row, col = literal.at
            line = lines[row - 1]
            lines[row - 1] = line[:col] + f"{mark[0]}.shape[{mark[1]}]" + line[col + len(str(literal.value)):]
    return Shared("".join(lines), tuple(marks), tuple(lit.value for lit in first.literals))


def _parse(source: str) -> _Parsed | None:
    try:
        tree = ast.parse(source)
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (SyntaxError, tokenize.TokenError):
        return None
    functions = [(f.lineno, f.end_lineno, tuple(a.arg for a in f.args.args))
                 for f in tree.body if isinstance(f, ast.FunctionDef)]
    text, literals, before = hashlib.sha256(), [], []
    for t in tokens:
        if t.type == tokenize.COMMENT or t.type == tokenize.NL:
            continue
        if t.type == tokenize.NUMBER and t.string.isdigit():
            params = next((p for lo, hi, p in functions if lo <= t.start[0] <= hi), None)
            literals.append(_Literal(int(t.string), t.start, params, before[-4:] == _SCRATCH))
            text.update(b"\0#")
        else:
            text.update(b"\0" + t.string.encode())
        before.append(t.string)
    return _Parsed(text.hexdigest(), tuple(literals))
