"""The kernels' two entry points: IR -> the loop nests of a kernel, for runtime/emit.py to print as
the Python numba compiles.

`emit_forward` builds one function that fills every Func's buffer, stage after stage;
`emit_backward` one that fills every adjoint: a gather loop nest per adjoint (one writer per
element, parallel over the outermost useful dimension; runtime/gathers.py), then any fallback
scatters. Two adjoints may run a plane at a time together (`schedule.stage.stage_depth`), and
consecutive ones a row of each per iteration of one parallel loop (`schedule.stage.row_group`),
the sums over those rows that follow in the same loop, per block of rows
(`schedule.column_parts`); the forward's nests likewise (`schedule.fuse_rows`).

Every forward nest but the split ones (pointwise, sums and products, max and min, argmax and
argmin), a gather's pieces and the fallback scatters come from runtime/lower.py, scheduled by the
passes of runtime/schedule/ (`choose_parallel`, `interchange_rows`, `split_accumulators`,
`fuse_rows`). The split forward nests (`pointwise_split`) and the gather loop nests
(runtime/gathers.py) are built as whole nests following the decisions of runtime/schedule/
(`interior`, `pointwise_split`, `separable_window`, `tabled_points`, `loads_to_hoist`,
`gathers_by_rows`, `column_blocks`, `stage_depth`, `row_group`) and the passes over them; a staged pair's
nests then keep the first adjoint's plane in a local array (the `stage_plane` pass). Each
adjoint's nest is resolved (`Emitter.put`) as soon as it is built: the kernel lists its buffers
in that order.
"""
from __future__ import annotations

from dataclasses import replace

from halide_ad import config
from halide_ad.ir import (INDEX_DTYPE, Buffer, Cast, Const, Func, Load, Op, Program, Reduce, Var, adjoint_name, argindex_name,
                          dtype_of)
from halide_ad.show import show_func
from halide_ad.solver import Gather
from halide_ad.runtime import emit, lower, schedule
from halide_ad.runtime.emit import Emitter
from halide_ad.runtime.lanes import SCRATCH_MAX
from halide_ad.runtime.loops import (Accumulate, Allocate, Block, Chain, Comment, For, Kind, Let, Local, Stmt, Store, block,
                                     nest as loop_nest, walk, weighted_sums)
from halide_ad.runtime.gathers import (gather_statements, gather_terms, lift_reductions, point_start, row_gathers,
                                       scatter, split_loop_nest, wide_gathers)
from halide_ad.runtime.schedule import Split, interior
from halide_ad.runtime.schedule.accumulate import split_accumulators
from halide_ad.runtime.schedule.column_parts import ROWS_AT_ONCE, column_parts, row_blocks, row_term
from halide_ad.runtime.schedule.fuse_folds import fuse_folds
from halide_ad.runtime.schedule.fuse_rows import fuse_rows, rows_local
from halide_ad.runtime.schedule.parallel import choose_parallel, parallel_dim, parallel_min_points
from halide_ad.runtime.schedule.phases import as_gather, pointwise_split
from halide_ad.runtime.schedule.row_sums import fuse_row_sums
from halide_ad.runtime.schedule.rows import gathers_by_rows, interchange_rows
from halide_ad.runtime.schedule.stage import clip_split, read_box, row_group, stage_depth
from halide_ad.runtime.schedule.staging import fuse_plane, plane_read, stage_plane
from halide_ad.traverse import flat_index, walk as walk_expr


def settings() -> tuple:
    """The environment settings that change generated code: keys of cached code include them."""
    return (parallel_min_points(), config.skipped_passes())  # HALIDE_AD_SKIP changes generated code


def _function(em: Emitter, entry: str) -> str:
    """The module text for `entry(<the buffers it uses>, status)`: runtime/emit.py outlines its
    parallel loops."""
    return emit.function(em, entry, block(*em.out))


def emit_forward(program: Program, funcs: tuple[Func, ...], entry: str, local: frozenset[str] = frozenset()
                 ) -> tuple[str, list[str], list[str]]:
    """The source of `entry(...)` computing `funcs`, its parameter names, and the run-time index
    checks. `local`: the Funcs that nothing after this kernel reads, which a row group may keep a
    row at a time (`fuse_rows.rows_local`)."""
    shapes = {b.name: b.shape for b in program.inputs} | {f.name: f.shape for f in program.funcs}
    shapes |= {argindex_name(f.name): f.shape for f in program.funcs if f.keeps_argindex}
    em = Emitter(shapes)
    run: list[tuple[Func, Stmt]] = []  # the funcs since the last phased one, with their nests
    phased = [f for f in funcs if pointwise_split(f) is not None]
    local = local - {n.buffer for f in phased for n in walk_expr(f.body) if isinstance(n, Load)}
    for f in funcs:
        if (split := pointwise_split(f)) is None:
            run.append((f, _forward_nest(f, em.temp)))
            continue
        _emit_nests(em, run, local)
        run = []
        em.put(_comment(f), _phased(em, f, split))
    _emit_nests(em, run, local)
    return _function(em, entry), list(em.used), em.checks


def _comment(f: Func) -> Comment:
    return Comment(show_func(f) + (f"  ({f.loc})" if f.loc else ""))


def _forward_nest(f: Func, temp) -> Stmt:
    """The scheduled loop nest computing Func `f`, which is not run in phases."""
    if not isinstance(f.body, Reduce):
        return schedule.run(choose_parallel, lower.pointwise(f))
    if f.body.op in ("sum", "prod") or f.body.op in ("max", "min") and not f.keeps_argindex:
        nest = lower.reduction(f, lower.accumulator(f.body, "acc"))
        nest = schedule.run(choose_parallel, nest, lower.terms(f.body))
        nest = schedule.run(interchange_rows, nest, f.dtype, temp)
        return schedule.run(split_accumulators, nest)
    nest = lower.extremum_func(f, argindex_name(f.name) if f.keeps_argindex else None, flat_index(f.body.rvars))
    return schedule.run(choose_parallel, nest, lower.terms(f.body))


def _emit_nests(em: Emitter, run: list[tuple[Func, Stmt]], local: frozenset[str]) -> None:
    """The nests of `run`'s funcs, each after its comment, those of a row group in one loop
    (`fuse_rows`), the `local` Funcs that one group alone reads a row at a time (`rows_local`)."""
    if not run:
        return
    nests = schedule.run(fuse_rows, block(*(s for f, nest in run for s in (_comment(f), nest))))
    nests = rows_local(nests, {f.name: (f.shape, f.dtype) for f, _ in run  # (an argindex is stored for a gradient)
                               if f.name in local and not f.keeps_argindex}, em.temp)
    for stmt in nests.body:
        stored = {n.buffer for n in walk(stmt) if isinstance(n, Store)}
        for f, _ in run:
            if isinstance(f.body, Reduce) and f.name in stored:
                em.index(f.name, f.vars, f.name)  # (the output first among the kernel's parameters)
        em.put(stmt)


def _phased(em: Emitter, f: Func, split: Split) -> Stmt:
    """Pointwise `f`'s nest as `split` runs it (`pointwise_split`)."""
    def body(gs, at=None, terms=(), terms_dtype=None):
        index = tuple((at or {}).get(v, v) for v in f.vars)
        values = [p.value for g in gs for p in g.pieces] + weighted_sums(list(terms), f.dtype)
        # (a region where every term's test fails, a select's edge: 0)
        return Store(f.name, index, Chain(Op.ADD, tuple(values)) if values else Const(0, f.dtype))

    return split_loop_nest(em, f.vars, f.shape, split, body, [as_gather(f)], f.name)


def emit_backward(program: Program, plans, entry: str, private: frozenset[str] = frozenset(),
                  temporaries: tuple[tuple[str, tuple[int, ...]], ...] = (), optional: frozenset[str] = frozenset()
                  ) -> tuple[str, list[str], list[str], tuple[Buffer, ...], frozenset[str]]:
    """The source of `backward(...)`: one gather loop nest per adjoint, then fallback scatters;
    its parameters, its run-time checks, the buffers of its own that a run allocates (a row
    group's partial column sums, `column_parts`), and the adjoints of `optional` it left out.

    `optional` names adjoints (a bias's gradient, a sum over rows that numpy would run after the
    kernel, one more pass over them) that the kernel computes only where they fold into a row
    group's column sums; the others it leaves out, for the caller to compute.

    `plans` are `AdjointPlan`s in order (outputs first), each adjoint's contributions inverted.
    `private` names the adjoints that only the next plan reads: such a pair may run one plane at
    a time, the first adjoint's plane kept in a local array (`schedule.stage.stage_depth`). `temporaries`: the
    names and shapes of buffers that earlier steps of the gradient filled and that no program
    buffer is the adjoint of (a strided convolution's products per tap).
    """
    shapes = {b.name: b.shape for b in program.inputs} | {f.name: f.shape for f in program.funcs}
    shapes |= {adjoint_name(n): sh for n, sh in shapes.items()}  # inlined adjoints read ones stored earlier
    shapes |= dict(temporaries)
    shapes |= {argindex_name(f.name): f.shape for f in program.funcs if f.keeps_argindex}
    computed = [p for p in plans if p.contributions and not p.inlined]
    shapes |= {"ct_" + p.adjoint.buffer: p.adjoint.shape for p in computed if p.adjoint.seeded}
    gathers = [[c for c in p.contributions if isinstance(c, Gather)] for p in computed]
    splits = [interior(p.new_vars, p.adjoint.shape, gs) for p, gs in zip(computed, gathers, strict=True)]
    terms = [gather_terms(gs, p.adjoint.shape) for p, gs in zip(computed, gathers, strict=True)]
    left = optional - _folded(computed, splits, gathers, terms, private) if optional else frozenset()
    if left:
        kept = [p for p in plans if adjoint_name(p.adjoint.buffer) not in left]
        return (*emit_backward(program, kept, entry, private, temporaries)[:4], left)
    em = Emitter(shapes)

    def nest(k: int, opened: int = 0, read=None, staged: frozenset[str] = frozenset()) -> Stmt:
        """Adjoint k's loop nest, inside `opened` loops already open; only the `read` box of it
        where given (`clip_split`); `staged`: the buffers read a plane at a time (`stage_plane`)."""
        plan, adj = computed[k], computed[k].adjoint
        name = adjoint_name(adj.buffer)
        split = splits[k] if read is None else clip_split(splits[k], plan.new_vars, adj.shape, read) or splits[k]

        def body(gs, at=None, terms=(), terms_dtype=None) -> Stmt:
            """acc = the gathers `gs` (and the `terms`, (expression, weight) pairs whose
            expressions are of `terms_dtype`), stored at j, or at `at[j]` for phased dimensions."""
            index = tuple((at or {}).get(v, v) for v in plan.new_vars)
            wide = wide_gathers(gs, adj)
            acc = Local("acc", "float64" if wide else adj.dtype)
            like: dict[tuple[Load, ...], float] = {}
            # the pieces under a guard or in a loop go after the sums, their reductions before
            guarded = [s for g in gs for s in gather_statements(g, like, adj.dtype, acc.dtype)]
            lifted, guarded = lift_reductions(block(*guarded), em.temp)
            seed = Load("ct_" + adj.buffer, index, adj.dtype) if adj.seeded else None
            first, sums = point_start(like, terms, terms_dtype, seed, adj.dtype)
            return block(*lifted, Let(acc, Cast("float64", first) if wide else first),
                         *(Accumulate(acc, term, augmented=True) for term in sums), guarded, Store(name, index, acc))

        if not opened and splits[k] is None and gathers_by_rows(plan.new_vars, adj.shape, gathers[k]):
            em.index(name, plan.new_vars, name)  # (the adjoint first among the buffers its rows use)
            return row_gathers(plan, gathers[k], name, em.temp)
        terms = gather_terms(gathers[k], adj.shape) if not opened else 1
        return split_loop_nest(em, plan.new_vars, adj.shape, split, body, gathers[k], name, opened, terms, adj, staged)

    scratch: list[Buffer] = []
    k = 0
    while k < len(computed):
        plan = computed[k]
        name = adjoint_name(plan.adjoint.buffer)
        em.put(Comment(f"{name}: {len(plan.contributions)} contribution(s)"))
        count, depth, after = _row_group_at(computed, splits, gathers, terms, k, private)
        if count:
            em.put(_row_group(em, computed, range(k, k + count), depth,
                              lambda m: stage_depth(computed, splits, gathers, m, private), nest,
                              [(computed[m], gathers[m]) for m in after], scratch))
            k = after.stop
            continue
        depth = stage_depth(computed, splits, gathers, k, private)
        if depth:
            em.put(_staged(em, computed, k, depth, nest))
            k += 2
            continue
        em.put(nest(k), *(scatter(s, name, plan.adjoint.dtype) for s in plan.contributions if not isinstance(s, Gather)))
        k += 1
    return _function(em, entry), list(em.used), em.checks, tuple(scratch), frozenset()


def _row_group_at(computed, splits, gathers, terms, k: int, private) -> tuple[int, int, range]:
    """The row group that starts at adjoint k (its size and depth, 0 for none) and the adjoints
    after it that fold into it (`column_parts`)."""
    # (HALIDE_AD_SKIP=fuse_rows leaves the forward's row groups and these out)
    count, depth = (0, 0) if config.skipped("fuse_rows") else row_group(computed, splits, gathers, terms, k, private)
    start = k + count
    return count, depth, range(start, start + (column_parts(computed, gathers, range(k, start), depth) if count else 0))


def _folded(computed, splits, gathers, terms, private) -> set[str]:
    """The adjoints that fold into a row group's column sums, as `emit_backward` walks them."""
    folded, k = set(), 0
    while k < len(computed):
        count, _, after = _row_group_at(computed, splits, gathers, terms, k, private)
        folded |= {adjoint_name(computed[m].adjoint.buffer) for m in after}
        k = after.stop if count else k + (2 if stage_depth(computed, splits, gathers, k, private) else 1)
    return folded


def _row_group(em: Emitter, computed, members: range, depth: int, staged, nest,
               folded=(), scratch: list[Buffer] | None = None) -> Stmt:
    """Adjoints `members` in one loop nest over their leading `depth` dimensions, the last of
    them parallel, a plane of each per iteration (`schedule.stage.row_group`); `staged(m)`:
    adjoint m and the next one's `stage_depth`. `folded`: (plan, gathers) of the sums
    over the rows that follow (`column_parts`): the rows then run in parallel blocks, each adding
    its rows' terms into a row of partial sums, a buffer appended to `scratch`, and the blocks'
    rows are added in order after the group."""
    first = computed[members.start]
    if folded:
        blocks, row, part = row_blocks(first.adjoint.shape[0]), first.new_vars[0], Var("part")
        parts = [_parts(em, plan, blocks, scratch) for plan, _ in folded]
        part_name = em.name(part)
        zeros = block(*(_columns(plan, Store(name, (part, plan.new_vars[0]), Const(0.0, "float64")))
                        for (plan, _), name in zip(folded, parts, strict=True)))
        size = Const(blocks.size, INDEX_DTYPE)
        start = Chain(Op.MUL, (part, size))
        loops_ = [(em.name(row), start, Chain(Op.ADD, (start, size)), Kind.SERIAL)]
    else:
        loops_ = [(em.name(first.new_vars[d]), 0, first.adjoint.shape[d], Kind.PARALLEL if d == depth - 1 else Kind.SERIAL)
                  for d in range(depth)]
    body: list[Stmt] = []
    m = members.start
    while m < members.stop:
        plan, out = computed[m], []
        if m > members.start:
            out.append(Comment(f"{adjoint_name(plan.adjoint.buffer)}: {len(plan.contributions)} contribution(s)"))
        unit = 2 if staged(m) else 1
        for mine, theirs in zip(computed[m + unit - 1].new_vars[:depth], first.new_vars[:depth], strict=True):
            if em.name(mine) != em.name(theirs):
                out.append(Let(mine, theirs))
        out.append(_staged(em, computed, m, staged(m), nest, depth) if unit == 2 else nest(m, depth))
        body.append(block(*out))
        m += unit
    body = [schedule.run(fuse_folds, schedule.run(fuse_row_sums, block(*body)))]
    if not folded:
        return loop_nest(loops_, block(*body))
    step = ROWS_AT_ONCE if blocks.size % ROWS_AT_ONCE == 0 and not config.skipped("rows_at_once") else 1
    rows = Var("rows") if step > 1 else None
    if rows is not None:
        em.name(rows)
    # one loop over the columns for the folded adjoints of one extent (a gain's and a shift's
    # gradient): each column's partial sums take their terms in the same order as in loops of
    # their own, and the block's rows of the cotangent are walked once, not once per sum
    shared = len({plan.adjoint.shape for plan, _ in folded}) == 1
    column = folded[0][0].new_vars[0]
    per_column = []  # each folded adjoint's statements at one column (at `column` where `shared`)
    for (plan, gs), name in zip(folded, parts, strict=True):
        target = Load(name, (part, plan.new_vars[0]), "float64")

        def term(p, target=target):
            if rows is None:
                return Accumulate(target, row_term(p, row))
            # the step's rows summed in the terms' type first, in order, then added to the partial
            # sum: one conversion to float64 and one float64 add per column a step, not one a row
            # (the loop's largest share of layer norm's backward), each step's sum rounded in
            # float32 once a row (3 roundings of 4 terms, before the float64 sum takes them)
            first = row_term(p, rows)
            rows_sum = Local(f"{name}_rows", dtype_of(first))
            return block(Let(rows_sum, first),
                         For(em.name(row), Chain(Op.ADD, (rows, Const(1, INDEX_DTYPE))),
                             Chain(Op.ADD, (rows, Const(step, INDEX_DTYPE))), Kind.SERIAL,
                             block(Accumulate(rows_sum, row_term(p, row)))),
                         Accumulate(target, rows_sum))
        per_column.append(block(
            Comment(f"{adjoint_name(plan.adjoint.buffer)}: {len(plan.contributions)} contribution(s), "
                    f"this block's rows added into {name}" + (f", {step} rows at a time" if rows else "")),
            *([Let(plan.new_vars[0], column)] if shared and em.name(plan.new_vars[0]) != em.name(column) else []),
            *(term(p) for g in gs for p in g.pieces)))
    sums = [_columns(folded[0][0], block(*per_column))] if shared else \
        [_columns(plan, s) for (plan, _), s in zip(folded, per_column, strict=True)]
    if rows is None:
        body += sums
    else:
        loops_ = [(em.name(rows), start, Chain(Op.ADD, (start, size)), Kind.SERIAL)]
        body = [For(em.name(row), rows, Chain(Op.ADD, (rows, Const(step, INDEX_DTYPE))), Kind.SERIAL, block(*body)), *sums]
    combined = []
    for (plan, _), name in zip(folded, parts, strict=True):
        col, acc, b = plan.new_vars[0], Local("acc", "float64"), Var("part")
        combined.append(_columns(plan, block(
            Let(acc, Load(name, (Const(0, INDEX_DTYPE), col), "float64")),
            For(b, 1, blocks.count, Kind.SERIAL, block(Accumulate(acc, Load(name, (b, col), "float64")))),
            Store(adjoint_name(plan.adjoint.buffer), (col,), acc))))
    rows_loop = loop_nest(loops_, block(*body))
    if rows is not None:
        rows_loop = replace(rows_loop, step=step)
    group = For(part_name, 0, blocks.count, Kind.PARALLEL, block(zeros, rows_loop))
    return block(group, *combined)


def _parts(em: Emitter, plan, blocks, scratch: list[Buffer]) -> str:
    """A float64 buffer of the kernel's own for a folded adjoint's partial rows, one per block."""
    name = adjoint_name(plan.adjoint.buffer) + "_parts"
    while name in em.shapes:
        name += "_"
    em.shapes[name] = (blocks.count, *plan.adjoint.shape)
    scratch.append(Buffer(name, em.shapes[name], "float64"))
    return name


def _columns(plan, s: Stmt) -> For:
    """`s` for each point of a 1-D adjoint."""
    return For(plan.new_vars[0], 0, plan.adjoint.shape[0], Kind.SERIAL, block(s))


def _staged(em: Emitter, computed, k: int, depth: int, nest, opened: int = 0) -> Stmt:
    """Adjoint k and the next one, a plane of each per iteration of their leading `depth`
    dimensions, adjoint k's plane in a local array (see `stage_depth`, `stage_plane`);
    `nest(k, opened, read, staged)` builds adjoint k's loop nest inside loops already open. The
    loops over the first `opened` dimensions are open already (a row group's, the parallel one
    among them)."""
    producer, consumer = computed[k], computed[k + 1]
    shape, dtype = consumer.adjoint.shape, producer.adjoint.dtype
    name = adjoint_name(producer.adjoint.buffer)
    stage = em.temp("stage")  # unique in the kernel: two stages in one function may differ in type
    par = parallel_dim(shape)
    plane = producer.adjoint.shape[depth:]
    allocate = Allocate(stage, tuple(plane), dtype, stack=len(plane) == 1 and plane[0] <= SCRATCH_MAX)
    loops_ = [(d, em.name(consumer.new_vars[d])) for d in range(opened, depth)]
    body = [Let(mine, theirs) for mine, theirs in zip(producer.new_vars[:depth], consumer.new_vars[:depth], strict=True)
            if em.name(mine) != em.name(theirs)]
    read = read_box(producer, consumer, [c for c in consumer.contributions if isinstance(c, Gather)], depth)
    pair = block(nest(k, depth, read, {name}), nest(k + 1, depth, staged={name}))
    staged = schedule.run(fuse_plane, schedule.run(stage_plane, pair, name, depth, stage, dtype), stage, dtype)
    whole = plane_read(staged, stage)  # else each element is read in the iteration that computes it
    comment = Comment(f"{adjoint_name(consumer.adjoint.buffer)}: {len(consumer.contributions)} contribution(s), "
                      + (f"reading {name} one plane at a time from {stage}" if whole else
                         f"reading each element of {name} where it is computed"))
    allocate = allocate if whole else Block()
    inner: Stmt = block(*body, staged)
    for d, var in reversed(loops_):
        inner = For(var, 0, shape[d], Kind.PARALLEL if d == par else Kind.SERIAL,
                    block(allocate, inner) if d == par else block(inner))  # (one plane per thread)
    return block(comment, allocate, inner) if par is None or par < opened else block(comment, inner)
