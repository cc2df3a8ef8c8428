"""Update definitions in the forward pass: the numba source of one update stage, at the rung
solver/updates.py chose, and a forward program cut around its updates.

Each update is a kernel of its own: it copies the previous stage into the new buffer, then
* rung 1 and 4: loops over the pure variables (parallel, the outermost one), then over the rdom
  (parallel too at rung 1 when its points are independent; else serial in lexicographic order);
* rung 3: a fixed number of partitions of the rdom, in parallel, each summing into bins of its own
  (`<name>_bins`, a scratch buffer); then each element adds the partitions' bins in order.
A write whose index reads data is checked before it is made: out of range, it is skipped and the
run raises BoundsError (as data-dependent reads do).

The stages between updates compile as the usual forward segments. Once the loop-nest IR lands,
an update becomes one more loop nest there (serial, parallel or partitioned loops) and this
module's emitter goes away; the schedule in solver/updates.py stays.
"""
from __future__ import annotations

import math
from collections.abc import Callable

from halide_ad.ir import Buffer, Load, Op, Program, ReverseScan, Update, adjoint_name, tape_name
from halide_ad.runtime import emit
from halide_ad.runtime.emit import Emitter
from halide_ad.runtime.gathers import open_loop
from halide_ad.runtime.compile import compile_kernel
from halide_ad.runtime.execute import Kernel, NumbaStep
from halide_ad.solver.bounds import box, checked_at_run_time, interval, is_data_dependent
from halide_ad.solver.updates import Schedule, combine, schedule
from halide_ad.ir import show
from halide_ad.traverse import walk


def bins_buffer(u: Update, s: Schedule) -> Buffer:
    """Rung 3's partial bins: one copy of the tensor per partition."""
    return Buffer(f"{u.name}_bins", (s.partitions,) + (u.shape or (1,)), u.dtype)


def emit_update(u: Update, shapes: dict[str, tuple[int, ...]],
                entry: str) -> tuple[str, list[str], list[str], Schedule]:
    """(source of `entry(...)`, its parameters, its run-time checks, the schedule it follows)."""
    s = schedule(u)
    shapes = dict(shapes)
    if s.rung == 3:
        shapes[bins_buffer(u, s).name] = bins_buffer(u, s).shape
    if u.taped:  # what each point overwrites, for the gradient (ir.Update.taped)
        shapes[tape_name(u.name)] = tuple(r.hi - r.lo for r in u.pure + u.rdom)
    em = Emitter(shapes)
    w = em.out
    w.depth = 1
    w.line(f"# update of {u.prev} (rung {s.rung}): {u.name}[{', '.join(map(show, u.index))}] = {show(u.value)}"
           + (f"  ({u.loc})" if u.loc else ""))
    em.used[u.name] = None  # (the output first among the kernel's parameters)
    if u.taped:
        em.used[tape_name(u.name)] = None
    if s.rung == 2:
        _emit_gathered(w, em, u, s)
    elif s.rung == 3:
        _copy(w, em, u.name, u.prev, u.shape)
        _emit_partitioned(w, em, u, s)
    else:
        _copy(w, em, u.name, u.prev, u.shape)
        depth = w.depth
        loops = u.pure + u.rdom
        parallel = 0 if u.pure or s.parallel_rdom else None
        for k, r in enumerate(loops):
            open_loop(w, em.name(r.var), r.lo, r.hi, k == parallel and r.hi - r.lo > 1)
        def store(ix: str) -> list[str]:
            value = em.expr(u.value)  # (before the tape's line: it may hoist a reduction)
            return ([f"{tape_name(u.name)}[{_point(em, u)}] = {u.name}[{ix}]"] if u.taped else []) + [
                f"{u.name}[{ix}] = {value}"]
        _emit_write(w, em, u, store)
        w.depth = depth
    w.line("return None")
    return emit.function(em, entry, em.out.tree(1)), list(em.used), em.checks, s


def _copy(w, em: Emitter, dst: str, src: str, shape: tuple[int, ...]) -> None:
    """dst = src, element by element (parallel over the first dimension)."""
    depth = w.depth
    dims = shape or (1,)
    names = [f"c{d}__" for d in range(len(dims))]
    for d, (name, n) in enumerate(zip(names, dims, strict=True)):
        open_loop(w, name, 0, n, d == 0 and n > 1)
    em.used[dst] = em.used[src] = None
    w.line(f"{dst}[{', '.join(names)}] = {src}[{', '.join(names)}]")
    w.depth = depth


def _emit_write(w, em: Emitter, u: Update, store: Callable[[str], str]) -> None:
    """Under the update's predicate: the write indices into locals, each checked when it reads
    data (or z3 could not bound it), then `store(indices)`."""
    if u.where is not None:
        w.line(f"if {em.expr(u.where)}:")
        w.depth += 1
    names = []
    for d, e in enumerate(u.index):
        name = f"w{d}__"
        w.line(f"{name} = {em.expr(e)}")
        names.append(name)
    ranges = box(u.pure + u.rdom)
    checked = [d for d, e in enumerate(u.index) if _needs_check(e, u.shape[d], ranges)]
    for j, d in enumerate(checked):
        kind = "a data-dependent index" if is_data_dependent(u.index[d]) else "an index z3 could not bound"
        em.checks.append(f"{kind} was {{value}}, outside dimension {d} of {u.prev} (valid: 0..{u.shape[d] - 1}), "
                         f"written at {u.loc or show(u.index[d])}. Clamp the index (hd.clamp) or fix the index data.")
        w.line(f"{'if' if j == 0 else 'elif'} {names[d]} < 0 or {names[d]} >= {u.shape[d]}:")
        for slot, text in enumerate(("1", str(len(em.checks) - 1), names[d])):
            w.line(f"    status[{slot}] = {text}")
    if checked:
        w.line("else:")
        w.depth += 1
    for line in store(", ".join(names) or "0"):
        w.line(line)


def emit_reverse_scan(scan: ReverseScan, shapes: dict[str, tuple[int, ...]],
                      entry: str) -> tuple[str, list[str], list[str]]:
    """(source of `entry(...)`, its parameters, its run-time checks): the update run backwards, as
    `ir.ReverseScan` says. Pure points stay independent (parallel over the first); the rdom runs
    in reverse lexicographic order."""
    u = scan.update
    adj, writes = adjoint_name(u.prev), adjoint_name(scan.writes)
    em = Emitter(dict(shapes) | {adjoint_name(n): scan.writes_shape for n, _ in scan.stored}
                 | {writes: scan.writes_shape, tape_name(u.name): scan.writes_shape}
                 | ({adjoint_name(scan.state): u.shape} if scan.state is not None else {}))
    w = em.out
    w.depth = 1
    w.line(f"# the update of {u.prev} run backwards  ({u.loc})" if u.loc else f"# the update of {u.prev} run backwards")
    _copy(w, em, adj, adjoint_name(u.name), u.shape)
    if scan.state is not None:
        _copy(w, em, adjoint_name(scan.state), u.name, u.shape)
    em.used[writes] = None
    for k, r in enumerate(u.pure):
        open_loop(w, em.name(r.var), 0, r.hi, k == 0 and r.hi > 1)
    for r in u.rdom:
        w.line(f"for {em.name(r.var)} in range({r.hi - 1}, {r.lo - 1}, -1):")
        w.depth += 1
    if u.where is not None:
        w.line(f"if {em.expr(u.where)}:")
        w.depth += 1
    at = [f"w{d}__" for d in range(len(u.index))]
    for name, e in zip(at, u.index, strict=True):
        w.line(f"{name} = {em.expr(e)}")
    written = f"{adj}[{', '.join(at) or '0'}]"
    point = _point(em, u)
    if scan.state is not None:  # the tensor as it was before this point wrote it
        state = adjoint_name(scan.state)
        em.used[tape_name(u.name)] = None
        w.line(f"{state}[{', '.join(at) or '0'}] = {tape_name(u.name)}[{point}]")
    w.line(f"{writes}[{point}] = {written}")
    w.line(f"{written} = 0")
    for name, value in scan.stored:
        em.used[adjoint_name(name)] = None
        w.line(f"{adjoint_name(name)}[{point}] = {em.expr(value)}")
    for term in scan.terms:
        depth = w.depth
        if term.where is not None and term.where != u.where:
            w.line(f"if {em.expr(term.where)}:")
            w.depth += 1
        w.line(f"{em.index(adj, term.index, str(term.loc) if term.loc else adj)} += {em.expr(term.value)}")
        w.depth = depth
    w.depth = 1
    w.line("return None")
    return emit.function(em, entry, em.out.tree(1)), list(em.used), em.checks


def _point(em: Emitter, u: Update) -> str:
    """The position of the current point in a buffer over the update's domain."""
    return ", ".join(em.name(r.var) + (f" - {r.lo}" if r.lo else "") for r in u.pure + u.rdom) or "0"


def _emit_gathered(w, em: Emitter, u: Update, s: Schedule) -> None:
    """Rung 2: name[j] = prev[j] + each piece of the inverted scatter at j, parallel over j (the
    pieces' loops and guards as the gradient's gathers have them, runtime/gathers.py)."""
    depth = w.depth
    js = s.gather.new_vars
    for d, (j, n) in enumerate(zip(js, u.shape, strict=True)):
        open_loop(w, em.name(j), 0, n, d == 0 and n > 1)
    at = ", ".join(em.name(j) for j in js) or "0"
    em.used[u.prev] = None
    w.line(f"acc = {u.prev}[{at}]")
    for piece in s.gather.pieces:
        inner = w.depth
        for level, guards in enumerate(piece.guards):
            if level > 0:
                loop = piece.loops[level - 1]
                w.line(f"for {em.name(loop.var)} in range({em.expr(loop.lo)}, {em.expr(loop.hi)}):")
                w.depth += 1
            if guards:
                w.line(f"if {' and '.join(em.expr(c) for c in guards)}:")
                w.depth += 1
        w.line(f"acc += {em.expr(piece.value)}")
        w.depth = inner
    w.line(f"{u.name}[{at}] = acc")
    w.depth = depth


def _needs_check(e, n: int, ranges) -> bool:
    """A data-dependent write index, unless its clamps alone keep it inside."""
    if not checked_at_run_time(e):
        return False
    iv = interval(e, ranges)
    return iv is None or iv[0] < 0 or iv[1] >= n


def _emit_partitioned(w, em: Emitter, u: Update, s: Schedule) -> None:
    op, operand = combine(u)
    bins = bins_buffer(u, s).name
    em.used[bins] = None
    dims = u.shape or (1,)
    points = math.prod(r.hi - r.lo for r in u.rdom)
    chunk = -(-points // s.partitions)
    depth = w.depth
    open_loop(w, "k__", 0, s.partitions, True)
    js = [f"j{d}__" for d in range(len(dims))]
    inner = w.depth
    for j, n in zip(js, dims, strict=True):
        open_loop(w, j, 0, n, False)
    w.line(f"{bins}[k__, {', '.join(js)}] = 0")
    w.depth = inner
    w.line(f"for p__ in range(k__ * {chunk}, min(k__ * {chunk} + {chunk}, {points})):")
    w.depth += 1
    stride = points
    for r in u.rdom:  # the flat position p__ as the rdom's point, lexicographic
        stride //= r.hi - r.lo
        w.line(f"{em.name(r.var)} = {r.lo} + (p__ // {stride}) % {r.hi - r.lo}")
    _emit_write(w, em, u, lambda ix: [f"{bins}[k__, {ix}] += {em.expr(operand)}"])
    w.depth = depth
    for d, (j, n) in enumerate(zip(js, dims, strict=True)):  # each element: the bins in partition order
        open_loop(w, j, 0, n, d == 0 and n > 1)
    at = ", ".join(js)
    sign = "-" if op is Op.SUB else "+"
    w.line(f"acc = {u.name}[{at}]")
    w.line(f"for k__ in range({s.partitions}):")
    w.line(f"    acc = acc {sign} {bins}[k__, {at}]")
    w.line(f"{u.name}[{at}] = acc")
    w.depth = depth


def compile_with_updates(program: Program, compile_forward: Callable[[Program], Kernel],
                         needed: set[str] | None) -> Kernel:
    """The forward kernel of a program with update stages: the stages between updates compile as
    forward programs of their own (`compile_forward`), whose inputs are every other buffer; each
    update is a step of its own. `needed`: the buffers a gradient reads (None: keep all)."""
    stages = program.funcs
    segment_of, k = {}, 0
    for f in stages:
        k += isinstance(f, Update)
        segment_of[f.name] = k
        k += isinstance(f, Update)
    keep = set(program.outputs) | (set(needed) if needed is not None else {f.name for f in stages})
    for f in stages:  # read across a cut: stored
        keep.update(n.buffer for n in walk(f.body) if isinstance(n, Load)
                    and n.buffer in segment_of and (isinstance(f, Update) or segment_of[n.buffer] != segment_of[f.name]))
    shapes = {b.name: b.shape for b in program.inputs} | {f.name: f.shape for f in stages}
    steps, sources, scratch, segment = [], [], [], []

    def flush() -> None:
        if segment:
            outputs = tuple(f.name for f in segment if f.name in keep)
            # every other buffer is an input of the segment: it reads the earlier ones, and the
            # names of the later ones stay taken (a split reduction names a buffer of its own)
            others = tuple(program.inputs) + tuple(f.buffer for f in stages if f not in segment)
            kernel = compile_forward(Program(program.name, others, tuple(segment), outputs))
            steps.extend(kernel.steps)
            sources.append(kernel.source)
            scratch.extend(kernel.scratch)
            segment.clear()

    for f in stages:
        if not isinstance(f, Update):
            segment.append(f)
            continue
        flush()
        entry = f"update{len(sources)}"
        source, params, checks, s = emit_update(f, shapes, entry)
        steps.append(NumbaStep(compile_kernel(source, entry, f"update of {f.prev} in {program.name}"), params, checks))
        sources.append(source)
        if s.rung == 3:
            scratch.append(bins_buffer(f, s))
        if f.taped:
            scratch.append(Buffer(tape_name(f.name), tuple(r.hi - r.lo for r in f.pure + f.rdom) or (1,), f.dtype))
    flush()
    return Kernel(steps, "\n".join(sources), tuple(scratch))
