"""The driver, a table of contents of the passes. A gradient:

    adjoints = reverse_mode(program, wrt)        halide_ad/ad.py: Funcs -> Scatter contributions
    plans = inverted(adjoints)                   solver/invert.py: Scatter -> Gather | Fallback, z3-checked
    plans = route(plans)                         runtime/route.py: contributions an engine computes
    plans = inline_adjoints(plans)               runtime/inline.py: adjoints computed where read
    source = emit_backward(plans)                runtime/kernels.py: loop nests -> Python source
    kernel = compile_kernel(source)              runtime/compile.py: numba, cached on disk

A forward program: inline_stages (runtime/inline.py), split_reduction, emit_forward, compile_kernel.
emit_forward and emit_backward lower to loop nests and run the schedule passes of
runtime/schedule/ over them: choose_parallel, interchange_rows, split_accumulators, fuse_rows
(the forward's nests); split_box, edge_columns, phases, separable, tabled_points, hoist_loads,
outside_box, stage_plane (the gather nests).
`HALIDE_AD_DUMP=ad,invert,route,inline,source` (or a schedule pass's name) prints those stages as
they are made, and `HALIDE_AD_SKIP=route,inline,fuse` (or a schedule pass's name) turns the
optional passes off (to bisect a miscompile, or to measure a pass). Running the kernels is
runtime/execute.py's.
"""
from __future__ import annotations

import functools
from dataclasses import replace

from halide_ad import config, disk_cache
from halide_ad.ad import read_by_gradients, reverse_mode
from halide_ad.ir import Adjoint, Load, Program, Reduce, Update, adjoint_name, is_float, show
from halide_ad.runtime.kernels import emit_backward, emit_forward, settings as codegen_settings
from halide_ad.runtime.schedule.rfactor import split_reduction
from halide_ad.runtime.compile import compile_kernel
from halide_ad.runtime.contract import Contraction, contraction
from halide_ad.runtime.engines.direct_conv import DirectPlan
from halide_ad.runtime.execute import ContractionStep, Kernel, NumbaStep
from halide_ad.runtime.inline import inline_adjoints, inline_stages
from halide_ad.runtime.plans import AdjointPlan, gather_vars
from halide_ad.runtime.route import engines, route, with_engine
from halide_ad.runtime.schedule import piece_exprs
from halide_ad.runtime.updates import compile_with_updates, emit_reverse_scan
from halide_ad.show import show_scatter
from halide_ad.solver import Fallback, Gather, invert, z3_bridge
from halide_ad.traverse import live_funcs, walk


def _dump(stage: str, text: str) -> None:
    if config.dumped(stage):
        print(text)


def _generated(key, emit):
    """`emit()`, a kernel's generated code, or what an earlier process stored for `key`
    (disk_cache): a process that loads the kernels skips scheduling (0.14 s of bilinear's
    forward). Not stored where a z3 query answered 'unknown' meanwhile: a later run, with more
    time, may do better. Emitted afresh while HALIDE_AD_DUMP names a stage: a loaded kernel
    would print none."""
    unknowns = z3_bridge.unknown_answers()
    return disk_cache.cached(key, emit, lambda: z3_bridge.unknown_answers() == unknowns,
                             load_stored=not config.dumped_stages())


def _numba_step(source: str, params: list[str], checks: list[str], entry: str, title: str,
                shapes: dict[str, tuple[int, ...]]) -> NumbaStep:
    """The step, its kernel shared with other sizes of the program where one serves (by the
    `shapes` of its buffers: runtime/extents.py)."""
    _dump("source", source)
    return NumbaStep(compile_kernel(source, entry, title, shapes), params, checks)


def _shapes(program: Program) -> dict[str, tuple[int, ...]]:
    shapes = {b.name: b.shape for b in program.inputs} | {f.name: f.shape for f in program.funcs}
    return shapes | {adjoint_name(n): sh for n, sh in shapes.items()}


def compile_forward(program: Program, *, for_gradients: bool = True) -> Kernel:
    """Consecutive loop-nest stages share one numba function; contractions run between them.
    Funcs that need not be stored are computed where they are read (`inline_stages`); a reduction
    to one point runs as partial results first (`split_reduction`), in a buffer of the kernel's
    own (`Kernel.scratch`). The forward that a gradient runs after (`for_gradients`) stores every
    Func a gradient reads, which reverse mode finds (`read_by_gradients`); a plain call's forward
    stores only what the program returns, runs no reverse mode, and records no update's tape."""
    if any(isinstance(f, Update) for f in program.funcs):  # update definitions: runtime/updates.py
        if not for_gradients:  # a tape is read only by a backward run
            program = replace(program, funcs=tuple(replace(f, taped=False) if isinstance(f, Update) else f
                                                   for f in program.funcs))
        compile_segment = functools.partial(compile_forward, for_gradients=for_gradients)
        return compile_with_updates(program, compile_segment, read_by_gradients(program) if for_gradients else set())
    program, scratch, stored = _forward_stages(program, for_gradients)
    shapes = _shapes(program)
    steps, sources, segment = [], [], []

    def flush():
        if segment:
            entry = f"forward{len(sources)}" if len(sources) or len(segment) < len(program.funcs) else "forward"
            # what no later step reads may stay in the kernel, a row at a time
            read_after = {n.buffer for f in program.funcs if f not in segment for n in walk(f.body) if isinstance(n, Load)}
            local = frozenset(f.name for f in segment if f.name not in stored and f.name not in read_after)
            key = ("emit_forward", program, tuple(segment), entry, local, codegen_settings())
            source, params, checks = _generated(key, functools.partial(emit_forward, program, tuple(segment),
                                                                       entry, local))
            steps.append(_numba_step(source, params, checks, entry, f"forward of {program.name}", shapes))
            sources.append(source)
            segment.clear()

    for f in program.funcs:
        c = _func_contraction(f, shapes)
        if c is None:
            segment.append(f)
            continue
        flush()
        steps.append(ContractionStep(f.name, "zeros", (c,)))
        sources.append(f"# {f.name} by {c.engine}: {c.formula}\n")
    flush()
    return Kernel(steps, "\n".join(sources), scratch)


def _forward_stages(program: Program, for_gradients: bool = True) -> tuple[Program, tuple[str, ...], set[str]]:
    """`program` with its Funcs inlined and split as the forward kernels compute them, the
    scratch buffers of the split reductions, and the Funcs that must be stored (outputs, and
    what the gradients read; every Func under HALIDE_AD_SKIP=fuse)."""
    if not for_gradients:  # a plain call skips what only a gradient reads (a custom rule's factors)
        program = replace(program, funcs=live_funcs(program.funcs, program.outputs))
    funcs, scratch, taken = [], [], {b.name for b in program.inputs} | {f.name for f in program.funcs}
    stored_shapes = _shapes(program)
    is_contraction = lambda f: _func_contraction(f, stored_shapes) is not None  # noqa: E731
    needed = (None if config.skipped("fuse")  # None: store every Func
              else read_by_gradients(program) if for_gradients else set())
    for f in inline_stages(program, is_contraction, needed):
        parts = split_reduction(f, taken)
        if parts is not None:
            scratch.append(parts[0].buffer)
            taken.add(parts[0].name)
        funcs += parts or [f]
    stored = {f.name for f in funcs} if needed is None else set(program.outputs) | set(needed)
    return replace(program, funcs=tuple(funcs)), tuple(scratch), stored


def engine_choices(program: Program, *wrts: tuple[str, ...]) -> dict[tuple[str, str], str]:
    """The engine that each contraction of `program`'s forward, and of its gradients with respect
    to each of `wrts`, takes (as `route.engines` keeps them), planned without compiling. Compiled
    within `route.engines(...)` of these, a block of the program (halide_ad/dask.py) takes the
    same engines at its own, smaller sizes."""
    chosen = {}
    with engines(chosen):
        staged = _forward_stages(program)[0]
        shapes = _shapes(staged)
        for f in staged.funcs:
            _func_contraction(f, shapes)
        for wrt in wrts:
            plan_gradient(program, wrt)
    return chosen


def _func_contraction(f, shapes) -> Contraction | None:
    if not (isinstance(f.body, Reduce) and f.body.op == "sum" and is_float(f.dtype)):
        return None
    c = contraction(f.name, f.vars, f.body.body, f.domain + f.body.rvars, f.body.where, shapes)
    return None if c is None else with_engine(c)


def plan_gradient(program: Program, wrt: tuple[str, ...]) -> list[AdjointPlan]:
    """Reverse mode, the inverter, then each optional pass that HALIDE_AD_SKIP does not name."""
    adjoints = _dumped("ad", reverse_mode(program, wrt))
    plans = _dumped("invert", [_inverted(adj) for adj in adjoints])
    shapes = _shapes(program) | {adjoint_name(a.buffer): a.shape for a in adjoints}  # (a scan's writes too)
    passes = (("route", lambda plans: route(plans, shapes)),
              ("inline", lambda plans: inline_adjoints(plans, wrt)))
    for name, transform in passes:
        if not config.skipped(name):
            plans = _dumped(name, transform(plans))
    return plans


def _inverted(adj: Adjoint) -> AdjointPlan:
    new_vars = gather_vars(adj)
    return AdjointPlan(adj, new_vars, tuple(invert(s, adj.shape, new_vars) for s in adj.scatters))


def _dumped(stage: str, items: list):
    """`items` (adjoints or plans), printed first where HALIDE_AD_DUMP names `stage`."""
    if config.dumped(stage):
        lines = [f"-- {stage}"]
        for item in items:
            if isinstance(item, Adjoint):
                lines.append(f"adj_{item.buffer}{list(item.shape)}" + (" (seeded)" if item.seeded else ""))
                lines += [f"  {show_scatter(s)}" for s in item.scatters]
                continue
            lines.append(f"adj_{item.adjoint.buffer}{list(item.adjoint.shape)}"
                         + (" (inlined)" if item.inlined else ""))
            for c in item.contributions:
                engine = f" [{c.engine}]" if isinstance(c, Contraction) else ""
                inverse = c.inverse if isinstance(c, Contraction) else c
                lines.append(f"  [{inverse.form}]{engine} {show_scatter(inverse.scatter)}")
                if isinstance(inverse, Gather):
                    lines += [f"    {_show_piece(item.new_vars, p)}" for p in inverse.pieces]
        print("\n".join(lines))
    return items


def _show_piece(new_vars, piece) -> str:
    """A gather piece as the sum it adds at each point j: `+= value for loops if guards`."""
    bound = lambda b: b if isinstance(b, int) else show(b)  # noqa: E731
    loops = ", ".join(f"{r.var.name} in [{bound(r.lo)}, {bound(r.hi)})" for r in piece.loops)
    guards = " and ".join(show(g) for level in piece.guards for g in level)
    at = ", ".join(v.name for v in new_vars)
    return f"[{at}] += {show(piece.value)}" + (f" for {loops}" if loops else "") + (f" if {guards}" if guards else "")


def compile_gradient(program: Program, wrt: tuple[str, ...]) -> tuple[Kernel, list[AdjointPlan]]:
    """Loop-nest adjoints share numba functions; an adjoint with BLAS contributions ends one, and
    its contractions are added after the loop nest has written the rest. A sum of one array (a
    bias's gradient) that the row group before it can fold (`_summed_rows`) stays in that
    function instead. The plans returned are as computed (a folded sum's, its gather)."""
    plans = plan_gradient(program, wrt)
    scanned = {adjoint_name(p.adjoint.scan.update.name) for p in plans if p.adjoint.scan is not None}
    private = _private_adjoints(program, plans, wrt) - scanned  # an update's backward run reads them whole
    named = {b.name for b in program.inputs} | {f.name for f in program.funcs}
    temporaries = tuple((adjoint_name(p.adjoint.buffer), p.adjoint.shape)  # products per tap (`_tap_product`)
                        for p in plans if p.adjoint.buffer not in named)
    shapes = _shapes(program) | dict(temporaries)
    steps, sources, segment, scratch = [], [], [], []

    def flush(optional: frozenset[str] = frozenset()) -> frozenset[str]:
        """The segment's kernel; the adjoints of `optional` it left out (`emit_backward`)."""
        left = frozenset()
        if any(p.contributions and not p.inlined for p in segment):
            entry = f"backward{len(sources)}"
            mine = private & {adjoint_name(p.adjoint.buffer) for p in segment}
            key = ("emit_backward", program, tuple(segment), entry, tuple(sorted(mine)),
                   temporaries, tuple(sorted(optional)), codegen_settings())  # scheduling asks z3 too
            emit = functools.partial(emit_backward, program, list(segment), entry, frozenset(mine),
                                     temporaries, optional)
            source, params, checks, own, left = _generated(key, emit)
            scratch.extend(own)
            steps.append(_numba_step(source, params, checks, entry, f"gradient of {program.name}", shapes))
            sources.append(source)
        segment.clear()
        return left

    reported = list(plans)  # as computed: a folded sum as its gather (hd.explain)
    for k, plan in enumerate(plans):
        if plan.adjoint.scan is not None:  # an update run backwards: runtime/updates.py
            flush()
            entry = f"backward{len(sources)}"
            source, params, checks = emit_reverse_scan(plan.adjoint.scan, _shapes(program), entry)
            steps.append(_numba_step(source, params, checks, entry, f"gradient of {program.name}", shapes))
            sources.append(source)
            continue
        blas = tuple(c for c in plan.contributions if isinstance(c, Contraction))
        if not blas:
            segment.append(plan)
            continue
        name = adjoint_name(plan.adjoint.buffer)
        if segment and _summed_rows(plan, blas):  # in the kernel before, if it folds there
            segment.append(replace(plan, contributions=tuple(c.inverse for c in blas)))
            gathered = segment[-1]
            if name not in flush(frozenset({name})):
                reported[k] = gathered
                continue
        rest = replace(plan, contributions=tuple(c for c in plan.contributions if not isinstance(c, Contraction)))
        if rest.contributions:
            segment.append(rest)
            init = "kernel"
        else:
            init = "ct_" + plan.adjoint.buffer if plan.adjoint.seeded else "zeros"
        flush()
        steps.append(ContractionStep(name, init, blas))
        sources.append("".join(f"# {c.formula}  ({c.engine}{_calls(c)})\n" for c in blas))
    flush()
    return Kernel(steps, "\n".join(sources), tuple(scratch)), reported


def _summed_rows(plan: AdjointPlan, blas: tuple[Contraction, ...]) -> bool:
    """Whether every contribution of `plan` is a sum of one array (a bias's gradient, numpy's sum
    after the kernels): the kernel before may fold such a sum over its rows into its row group
    (`emit_backward`'s `optional`), as it reads them, instead of one more pass over them."""
    return (len(blas) == len(plan.contributions) and not plan.adjoint.seeded
            and all(c.b is None and not c.padded and isinstance(c.inverse, Gather) for c in blas))


def _calls(c: Contraction) -> str:
    """How the BLAS calls of a contraction go, as its source comment says."""
    if isinstance(c.plan, DirectPlan):
        return ""
    taps = ", ".join(t.var.name for t in c.taps)
    return f", per tap of {taps}" if taps else ", one call"


def _private_adjoints(program: Program, plans: list[AdjointPlan], wrt: tuple[str, ...]) -> frozenset[str]:
    """The stored adjoints of intermediate buffers that exactly one gather reads, and nothing else
    (no BLAS contraction, no scatter, no other plan): the loop nest that computes one may hand it
    to its reader a plane at a time (runtime/schedule/stage.py). Not those in `wrt` (`hd.adjoints`
    asks for intermediates): they are results."""
    inputs = {b.name for b in program.inputs}
    readers: dict[str, list] = {}
    for plan in plans:
        for c in () if plan.inlined else plan.contributions:  # an inlined one's readers read what it reads
            exprs = ([e for p in c.pieces for e in piece_exprs(p)] if isinstance(c, Gather) else
                     [c.scatter.value, *c.scatter.index] + ([c.scatter.where] if c.scatter.where is not None else [])
                     if isinstance(c, Fallback) else list(c.loads))
            for name in {n.buffer for e in exprs for n in walk(e) if isinstance(n, Load)}:
                readers.setdefault(name, []).append(c)
    return frozenset(adjoint_name(p.adjoint.buffer) for p in plans
                     if not p.inlined and p.adjoint.buffer not in inputs and p.adjoint.buffer not in wrt
                     and [isinstance(c, Gather) for c in readers.get(adjoint_name(p.adjoint.buffer), [])] == [True])
