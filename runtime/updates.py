"""Update definitions in the forward pass: the kernel of one update stage, and of a scan's adjoint
(the nests of runtime/lower_updates.py, printed by runtime/emit.py), and a forward program cut
around its updates. Each update is a kernel of its own; the stages between updates compile as the
usual forward segments.
"""
from __future__ import annotations

from collections.abc import Callable

from halide_ad import config
from halide_ad.ir import Load, Program, ReverseScan, Update, adjoint_name, tape_name
from halide_ad.runtime import emit, lower_updates
from halide_ad.runtime.emit import Emitter
from halide_ad.runtime.compile import compile_kernel
from halide_ad.runtime.execute import Kernel, NumbaStep
from halide_ad.runtime.loops import Comment, Stmt, block
from halide_ad.runtime.loops import show as show_nest
from halide_ad.runtime.lower_updates import bins_buffer, tape_buffer
from halide_ad.solver.updates import Schedule, schedule
from halide_ad.ir import show
from halide_ad.traverse import walk


def emit_update(u: Update, shapes: dict[str, tuple[int, ...]],
                entry: str) -> tuple[str, list[str], list[str], Schedule]:
    """(source of `entry(...)`, its parameters, its run-time checks, the schedule it follows)."""
    s = schedule(u)
    scratch = ([bins_buffer(u, s)] if s.rung == 3 else []) + ([tape_buffer(u)] if u.taped else [])
    em = Emitter(dict(shapes) | {b.name: b.shape for b in scratch})
    em.used[u.name] = None  # (the output first among the kernel's parameters)
    if u.taped:
        em.used[tape_name(u.name)] = None
    comment = Comment(f"update of {u.prev} (rung {s.rung}): {u.name}[{', '.join(map(show, u.index))}] = {show(u.value)}"
                      + (f"  ({u.loc})" if u.loc else ""))
    source = emit.function(em, entry, block(comment, _dumped(lower_updates.forward(u, s))))
    return source, list(em.used), em.checks, s


def emit_reverse_scan(scan: ReverseScan, shapes: dict[str, tuple[int, ...]],
                      entry: str) -> tuple[str, list[str], list[str]]:
    """(source of `entry(...)`, its parameters, its run-time checks): the update run backwards, as
    `ir.ReverseScan` says (`lower_updates.reverse_scan`)."""
    u = scan.update
    em = Emitter(dict(shapes) | {adjoint_name(n): scan.writes_shape for n, _ in scan.stored}
                 | {adjoint_name(scan.writes): scan.writes_shape, tape_name(u.name): scan.writes_shape}
                 | ({adjoint_name(scan.state): u.shape} if scan.state is not None else {}))
    comment = Comment(f"the update of {u.prev} run backwards" + (f"  ({u.loc})" if u.loc else ""))
    source = emit.function(em, entry, block(comment, _dumped(lower_updates.reverse_scan(scan))))
    return source, list(em.used), em.checks


def _dumped(nest: Stmt) -> Stmt:
    """`nest`, printed first where HALIDE_AD_DUMP names `updates`."""
    if config.dumped("updates"):
        print(f"# update nest\n{show_nest(nest)}")
    return nest


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
            scratch.append(tape_buffer(f))
    flush()
    return Kernel(steps, "\n".join(sources), tuple(scratch))
