"""Snapshot the source of every kernel a set of programs generates, and compare two snapshots.

    python tools/kernel_snapshot.py record SNAP [--tests PATH ...] [--no-tests] [--no-benchmarks]
    python tools/kernel_snapshot.py --compare A B

The kernel cache keys on source text, so moving code generation around is neutral for speed when
every kernel comes out byte-identical (ARCHITECTURE.md, "Moving without breaking speed"). `record`
runs with HALIDE_AD_KERNEL_SNAPSHOT=SNAP, under which `runtime/compile.py` keeps each source handed
to numba as `SNAP/<sha256>.py` and a line in `SNAP/index.jsonl` naming where it came from (the test,
or the benchmark case, its shapes and its parallel threshold), the pass's title and its entry.

What it covers:
* the tests in TESTS below (or `--tests`), run with pytest: schedule, reductions, fuzzed programs,
  gradients and the ops library;
* every kernel case of `python -m benchmarks`, every everyday case and every update case
  (`--cases updates`), traced at their `--small` shapes and at their full shapes, forward and
  gradient compiled but not run, each once with the default parallel threshold and once with
  HALIDE_AD_PARALLEL_MIN_POINTS=0 (so that every loop nest with a parallel dimension is outlined:
  the small shapes alone never are).
Not covered: the dispatch and training-step call cases (the programs are the layer's again) and
the rest of the test suite (slow on a shared machine; pass it with `--tests`).

`--compare A B` lists the kernels that differ, by where they came from, each with a unified diff,
and exits with status 1 if any differ (`--ignore-line-numbers`: but for the line numbers in
location comments, which move when a test file is edited). PYTHONHASHSEED is fixed so that two
records of the same code agree. A location comment's checkout is compared as `<root>`, whichever
it is: a kernel whose text another checkout generated first (the kernel cache keeps it on disk)
names that checkout's files, `(/work/main/tests/...` where the record ran in another. Only
comments: the same kernel under two checkouts' comments is two cache entries, because the kernel
cache keys on the whole text.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ("tests/runtime/test_schedule.py", "tests/runtime/test_reductions.py", "tests/runtime/test_fuzz_programs.py",
         "tests/api/test_gradients.py", "tests/ops")
MIN_POINTS = "HALIDE_AD_PARALLEL_MIN_POINTS"


def _environment(folder: Path) -> dict[str, str]:
    env = dict(os.environ, HALIDE_AD_KERNEL_SNAPSHOT=str(folder.resolve()), PYTHONHASHSEED="0",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop(MIN_POINTS, None)
    return env


def record(folder: Path, tests: list[str], benchmarks: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    index = folder / "index.jsonl"
    if index.exists():
        index.unlink()
    (folder / "root.txt").write_text(str(ROOT))
    env = _environment(folder)
    if tests:
        # failures do not stop the record: a failing test's kernels are recorded up to the failure
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                       cwd=ROOT, env=env, check=False)
    if benchmarks:
        subprocess.run([sys.executable, __file__, "_benchmarks"], cwd=ROOT, env=env, check=True)


def _record_benchmarks() -> None:
    """Each benchmark program's forward and gradient kernels, compiled, not run (zeros as inputs:
    only the shapes matter)."""
    import numpy as np

    from halide_ad.api import as_function
    from halide_ad.compiler import compile_forward, compile_gradient
    from benchmarks.cases import CASES
    from benchmarks.everyday import EVERYDAY_CASES
    from benchmarks.updates import UPDATE_CASES

    def compile_case(context: str, program, inputs: list[np.ndarray], wrt: tuple[int, ...] | None) -> None:
        """`program`'s forward kernels at these inputs' shapes, and its gradient's with respect to
        inputs `wrt` (None: every float input), if any."""
        os.environ["HALIDE_AD_SNAPSHOT_CONTEXT"] = context
        traced, _ = as_function(program).trace(tuple(inputs), {})
        compile_forward(traced.program)  # (not traced's own kernels: those are kept once built)
        names = traced.float_args if wrt is None else tuple(traced.arg_names[k] for k in wrt)
        if names:
            compile_gradient(traced.program, names)

    for min_points in (None, "0"):
        if min_points is None:
            os.environ.pop(MIN_POINTS, None)
        else:
            os.environ[MIN_POINTS] = min_points
        for case in (*CASES, *EVERYDAY_CASES):
            for size in ("small", "full"):
                compile_case(f"benchmarks:{case.name}:{size}:min_points={min_points}", case.halide_ad,
                             [np.zeros(s, np.float32) for s in case.input_shapes(small=size == "small")],
                             None if case.backward else ())
        for case in UPDATE_CASES:  # integer inputs among them: each input's own dtype
            for size in ("small", "full"):
                compile_case(f"benchmarks:{case.name}:{size}:min_points={min_points}", case.halide_ad,
                             [np.zeros_like(a) for a in case.make_inputs(size == "small")], case.wrt)
    os.environ.pop(MIN_POINTS, None)


def load(folder: Path) -> dict[tuple[str, str, str], list[str]]:
    """(where from, title, entry) -> the sources' hashes, in the order they were made."""
    kernels: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    with open(folder / "index.jsonl") as fh:
        for line in fh:
            row = json.loads(line)
            kernels[row["context"], row["title"], row["entry"]].append(row["sha"])
    return kernels


_LINE = re.compile(r"(\.py):\d+(, in )")
# a location comment's file under a checkout's root: `# ... (/any/checkout/tests/t.py:3, in f)`
_CHECKOUT = re.compile(r"(#.*\()/[^\s(),]*?/(?=(?:%s)/[^\s(),]*\.py:\d+, in )"
                       % "|".join(sorted(p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith("."))))


def _text(folder: Path, sha: str, lines: bool = True) -> str:
    """A recorded source, with any checkout (named in `(file:line)` comments: the one it was
    recorded in, or the one whose kernel the cache kept) as `<root>`, so that two checkouts'
    records compare; without `lines`, without the comments' line numbers (a test file edited
    above a program moves them)."""
    root = folder / "root.txt"
    text = (folder / f"{sha}.py").read_text()
    text = text.replace(root.read_text(), "<root>") if root.exists() else text
    text = _CHECKOUT.sub(r"\1<root>/", text)
    return text if lines else _LINE.sub(r"\1:N\2", text)


def compare(a: Path, b: Path, lines: bool = True) -> int:
    """Print what differs between snapshots `a` and `b`; the number of kernels that do."""
    old, new = load(a), load(b)
    changed = 0
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key, []), new.get(key, [])
        where = " / ".join(key)
        if len(before) != len(after):
            print(f"* {where}: {len(before)} kernel(s) before, {len(after)} after")
            changed += 1
        for x, y in zip(before, after):
            if x == y or _text(a, x, lines) == _text(b, y, lines):
                continue
            changed += 1
            print(f"* {where}: {x} -> {y}")
            sys.stdout.writelines(difflib.unified_diff(
                _text(a, x, lines).splitlines(True), _text(b, y, lines).splitlines(True), f"{a}/{x}.py", f"{b}/{y}.py"))
    total = sum(map(len, old.values()))
    print(f"{changed} of {total} kernels differ ({len(set(h for v in old.values() for h in v))} distinct before, "
          f"{len(set(h for v in new.values() for h in v))} after)")
    return changed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_benchmarks"]:
        folder = Path(os.environ["HALIDE_AD_KERNEL_SNAPSHOT"])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "root.txt").write_text(str(ROOT))
        _record_benchmarks()
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"), help="compare two snapshots")
    parser.add_argument("--ignore-line-numbers", action="store_true",
                        help="compare location comments without their line numbers")
    parser.add_argument("command", nargs="?", choices=["record"])
    parser.add_argument("folder", nargs="?", type=Path)
    parser.add_argument("--tests", nargs="+", default=list(TESTS), help="pytest paths to run")
    parser.add_argument("--no-tests", action="store_true")
    parser.add_argument("--no-benchmarks", action="store_true")
    args = parser.parse_args(argv)
    if args.compare:
        return 1 if compare(*args.compare, lines=not args.ignore_line_numbers) else 0
    if args.command != "record" or args.folder is None:
        parser.error("say `record FOLDER` or `--compare A B`")
    record(args.folder, [] if args.no_tests else args.tests, not args.no_benchmarks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
