"""One kernel for every size of a dimension whose extent is only a trip count.

A kernel's source bakes every extent in (`range(0, 4)`, `parallel_for(f, 0, 4000, ...)`), so a
program called with another batch size generates another source and numba compiles it again:
seconds, for a layer. Here a source is compared with the recent ones generated before it that
have the same text but for their integer literals (`_Parsed.key`) and that no shared kernel
serves. Where every literal that differs is, in both, the extent of one dimension of a buffer
its function takes (4 -> 3 where x.shape[0] went from 4 to 3), those literals become reads of
that extent at run time (`x.shape[0]`), and the kernel so written serves the second size and
any later one whose source it reproduces exactly: each literal it replaced equal to that
buffer's extent there, each other literal unchanged.
That check is what makes sharing safe: a schedule decision that depends on the size (a parallel
loop or a serial one, a boundary split `range(1, n - 1)`, BLAS or loops) changes the text or a
literal that is no extent, and the size then gets a kernel of its own. The first size keeps its
kernel as it was generated, byte for byte.
"""
from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass

# an integer literal: digits that are no part of a name (j0), a float (2.0, .5) or an exponent (1e-05)
_INTEGER = re.compile(r"(?<![\w.])(?<!\d[eE][+-])(?<!\.[eE][+-])\d+(?![\w.])")
_SCRATCH = re.compile(r"lanes\s*\.\s*scratch\s*\(\s*$")  # numba needs its length as a constant
_DEF = re.compile(r"def\s+\w+\s*\(([^()]*)\)\s*:")
MAX_SOURCES = 512  # sources remembered: a new one beyond drops the oldest


@dataclass(frozen=True)
class _Literal:
    value: int
    at: tuple[int, int]  # (line from 1, column from 0) where its digits start
    params: tuple[str, ...] | None  # the parameters of the function it is in; None at module level
    pinned: bool  # numba needs it as a constant: `lanes.scratch(n, ...)`, an array on the stack


@dataclass(frozen=True)
class _Parsed:
    key: str  # a hash of the source's lines with its integer literals and comments left out
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
    """The key and the integer literals of a generated source, read line by line (tokenize took
    1% of the test suite): a kernel's source holds no string, so `#` starts a comment; a
    top-level `def` line opens a function, any other top-level line closes it. None for a
    function header this does not read (then nothing is shared)."""
    text, literals, params = hashlib.sha256(), [], None
    for row, line in enumerate(source.splitlines(), 1):
        code = line.split("#", 1)[0].rstrip()
        if not code:
            continue
        if not code[0].isspace():
            params = None
            if code.startswith("def "):
                header = _DEF.fullmatch(code)
                if header is None:
                    return None
                params = tuple(p.strip() for p in header.group(1).split(",") if p.strip())
        for number in _INTEGER.finditer(code):
            pinned = _SCRATCH.search(code, 0, number.start()) is not None
            literals.append(_Literal(int(number.group()), (row, number.start()), params, pinned))
        text.update(_INTEGER.sub("#", code).encode() + b"\n")
    return _Parsed(text.hexdigest(), tuple(literals))
