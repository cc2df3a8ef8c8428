"""Errors about the user's program (`HalideADError` and its subclasses) and about halide_ad itself.

Every error that concerns what a user wrote carries the `SourceLoc` of the line behind it, so the
message can quote that line.
"""
from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True, slots=True)
class SourceLoc:
    filename: str
    lineno: int
    function: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}, in {self.function}"

    def source_line(self) -> str:
        return linecache.getline(self.filename, self.lineno).strip()


def user_loc() -> SourceLoc | None:
    """The innermost stack frame outside halide_ad: the user's line that is being traced."""
    frame = sys._getframe(1)
    while frame is not None:
        if is_user_frame(frame) and not frame.f_code.co_filename.startswith("<"):
            return SourceLoc(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return None


def is_user_frame(frame) -> bool:
    """Whether `frame` runs the user's code, not halide_ad's own (its tests, examples and benchmarks
    count as users)."""
    filename = frame.f_code.co_filename
    inside = os.path.abspath(filename).startswith(_PACKAGE_DIR + os.sep) and (
        os.sep + "tests" + os.sep not in filename and os.sep + "examples" + os.sep not in filename
        and os.sep + "benchmarks" + os.sep not in filename)
    return not inside


class HalideADError(Exception):
    """Base of every error about the user's program."""

    def __init__(self, message: str, loc: SourceLoc | None = None):
        self.loc = loc
        self.bare_message = message
        if loc is not None:
            line = loc.source_line()
            message = f"{loc}\n    {line}\n{message}" if line else f"{loc}\n{message}"
        super().__init__(message)


class BoundsError(HalideADError, IndexError):
    """A read or write that may leave its tensor."""


class ShapeError(HalideADError, ValueError):
    """Shapes, ranks or argument counts that do not fit together."""


class DTypeError(HalideADError, TypeError):
    """An array of a dtype that halide_ad cannot use there."""


class NotDifferentiableError(HalideADError):
    """A gradient was asked of something that has none."""


class TraceError(HalideADError):
    """Python control flow on symbolic values, or a construct halide_ad cannot trace."""


class HalideADWarning(UserWarning):
    """Not an error: halide_ad chose a slower safe path, e.g. a scatter where z3 timed out."""


class InternalError(Exception):
    """A broken invariant inside halide_ad: a bug in halide_ad, never the user's fault."""

    def __init__(self, message: str):
        super().__init__(f"{message} (this is a bug in halide_ad; please report it)")
