"""The loop nests of update definitions (runtime/lower_updates.py): which kind of loop each rung and
each adjoint yields, read from the nests, not from their text; and a tested write's failure as
emit.py prints it, run as plain Python."""
from dataclasses import replace

import numpy as np

import halide_ad as hd
from halide_ad.ad import reverse_mode
from halide_ad.compiler import compile_forward
from halide_ad.ir import Const, Load, Update
from halide_ad.runtime import emit, lower_updates
from halide_ad.runtime.emit import Emitter
from halide_ad.runtime.loops import Accumulate, Block, Fail, For, If, Kind, Store, loops, walk
from halide_ad.runtime.parallel import parallel_for
from halide_ad.solver.updates import PARTITIONS, Schedule, schedule
from tests.updates import programs as P


def _traced(fn, *args):
    return fn.trace(args, {})[0]


def _update(fn, *args) -> Update:
    [u] = [f for f in _traced(fn, *args).program.funcs if isinstance(f, Update)]
    return u


def _forward(fn, *args):
    u = _update(fn, *args)
    s = schedule(u)
    return u, s.rung, lower_updates.forward(u, s)


def _kinds(s) -> list[tuple[str, Kind]]:
    return [(getattr(f.var, "name", f.var), f.kind) for f in loops(s)]


def _scan(fn, *args):
    """The ReverseScan of the one update of `fn`, from reverse mode."""
    return _scan_of(_traced(fn, *args))


def _scan_of(traced):
    [scan] = [a.scan for a in reverse_mode(traced.program, tuple(traced.float_args)) if a.scan is not None]
    return scan


X = np.linspace(0.1, 0.9, 8)


def test_rung_1_runs_its_independent_rdom_in_parallel():
    u, rung, nest = _forward(P.strided_scatter, X)
    assert rung == 1
    copy, update = nest.body
    assert _kinds(copy) == [("c0__", Kind.PARALLEL)]
    assert _kinds(update) == [(u.rdom[0].var.name, Kind.PARALLEL)]


def test_rung_2_is_a_gather_over_the_elements_with_no_loop_over_the_rdom():
    u, rung, nest = _forward(P.pairs, X)
    assert rung == 2
    outer = loops(nest)[0]
    assert outer.kind is Kind.PARALLEL and outer.hi == u.shape[0]
    assert u.rdom[0].var not in {f.var for f in loops(nest)}
    assert [n.buffer for n in walk(nest) if isinstance(n, Store)] == [u.name]  # one writer per element


def test_rung_3_sums_fixed_partitions_into_bins_then_adds_them_in_partition_order():
    u, rung, nest = _forward(P.histogram, np.arange(40) % 5, np.linspace(0, 1, 40), 5)
    assert rung == 3
    copy, partitions, total = nest.body
    assert (partitions.var.name, partitions.kind, partitions.hi) == ("k__", Kind.PARALLEL, PARTITIONS)
    assert [k for _, k in _kinds(partitions)[1:]] == [Kind.SERIAL, Kind.SERIAL]  # zero the bins, the points
    into = [n for n in walk(partitions) if isinstance(n, Accumulate)]
    assert [n.target.buffer for n in into] == [f"{u.name}_bins"]  # never the tensor itself
    assert _kinds(total) == [("j0__", Kind.PARALLEL), ("k__", Kind.SERIAL)]
    assert loops(total)[1].hi == PARTITIONS


def test_rung_3_at_each_row_of_a_per_row_histogram_and_rung_4_from_partitions_rows_on():
    w = np.linspace(0, 1, 4 * 40).reshape(4, 40)
    u, rung, nest = _forward(P.row_hist, np.arange(4 * 40).reshape(4, 40) % 3, w)
    assert rung == 3
    copy, partitions, total = nest.body
    assert [k for _, k in _kinds(partitions)] == [Kind.PARALLEL] + [Kind.SERIAL] * 4  # zero, the row, the points
    assert _kinds(partitions)[3][0] == u.pure[0].var.name
    rows = np.arange(PARTITIONS * 40).reshape(PARTITIONS, 40)  # enough rows to keep the threads busy
    u, rung, nest = _forward(P.row_hist, rows % 3, np.ones(rows.shape))
    assert rung == 4 and _kinds(nest.body[1])[0] == (u.pure[0].var.name, Kind.PARALLEL)


def test_rung_4_is_serial_over_the_rdom_and_parallel_over_the_pure_variable():
    u, rung, nest = _forward(P.iir, np.ones((3, 6)), np.ones((3, 6)))
    assert rung == 4
    assert _kinds(nest.body[1]) == [(u.pure[0].var.name, Kind.PARALLEL), (u.rdom[0].var.name, Kind.SERIAL)]
    u, rung, nest = _forward(P.cumsum, X)  # no pure variable: nothing but the copy runs in parallel
    assert rung == 4 and [k for _, k in _kinds(nest.body[1])] == [Kind.SERIAL]


def test_a_data_dependent_write_is_tested_and_fails_instead_of_writing():
    u, rung, nest = _forward(P.unclamped, np.array([0, 1, 2, 3, 4]), np.ones(5), 4)
    [test] = [n for n in walk(nest) if isinstance(n, If)]
    assert isinstance(test.then.body[0], Fail) and "outside dimension 0" in test.then.body[0].message
    assert [type(n) for n in test.otherwise.body] == [Store]


def test_a_taped_update_records_what_each_point_overwrites_before_it_writes():
    u, rung, nest = _forward(P.ring, X[:3])
    assert u.taped
    stores = [n for n in walk(nest) if isinstance(n, Store)]
    assert [s.buffer for s in stores] == [u.name, f"{u.name}_tape", u.name]  # the copy, the tape, the write


def test_a_plain_call_records_no_tape():
    """Only the forward that a gradient follows writes the tape; a plain call's kernel has none."""
    traced = _traced(P.horner, X[:3], X)
    tape = f"{_update(P.horner, X[:3], X).name}_tape"
    assert tape in [b.name for b in compile_forward(traced.program).scratch]
    plain = compile_forward(traced.program, for_gradients=False)
    assert tape not in [b.name for b in plain.scratch] and "_tape" not in plain.source
    np.testing.assert_allclose(P.horner(X[:3], X), np.polyval(X[:3], X), rtol=1e-12)


def test_a_scans_adjoint_runs_its_rdom_in_reverse():
    scan = _scan(P.iir, np.ones((3, 6)), np.ones((3, 6)))
    u = scan.update
    nest = lower_updates.reverse_scan(scan)
    assert _kinds(nest.body[1]) == [(u.pure[0].var.name, Kind.PARALLEL), (u.rdom[0].var.name, Kind.REVERSED)]


def test_an_inplace_max_rolls_back_through_its_tape_in_reverse():
    scan = _scan(P.row_max, np.ones((3, 4)))
    u = scan.update
    nest = lower_updates.reverse_scan(scan)
    assert [f.kind for f in loops(nest.body[-1])] == [Kind.PARALLEL, Kind.REVERSED]
    [rollback] = [n for n in walk(nest.body[-1]) if isinstance(n, Store) and n.buffer == f"adj_{scan.state}"]
    assert rollback.value.buffer == f"{u.name}_tape"


def test_failed_tests_print_as_an_elif_chain_that_skips_the_write():
    """Two tested indices: a point out of range in either fails the call with that dimension's
    message and writes nothing; the others write (run as plain Python, the kernel's helpers
    stubbed)."""
    u = _update(P.hist2d, np.zeros(3, np.int64), np.zeros(3, np.int64), np.ones(3))
    r = u.rdom[0].var
    u = replace(u, index=(Load("i", (r,), "int64"), Load("j", (r,), "int64")))  # unclamped
    nest = lower_updates.write(u, lambda at: Store("h", at, Const(1.0, "float64")))
    em = Emitter({"h": (2, 2), "i": (3,), "j": (3,)})
    source = emit.function(em, "run", Block((For(r, 0, 3, Kind.SERIAL, nest),)))
    assert source.count("elif") == 1 and "dimension 1" in em.checks[1]
    h, status = np.zeros((2, 2)), np.zeros(3, np.int64)
    namespace = {"np": np, "kernel": lambda f: f, "parallel_for": parallel_for, "nonneg": lambda k: k}
    exec(source, namespace)
    namespace["run"](h=h, i=np.array([0, 1, 1]), j=np.array([0, 9, 1]), status=status)
    assert status.tolist() == [1, 1, 9]
    np.testing.assert_array_equal(h, [[1, 0], [0, 1]])


def test_dump_prints_each_update_nest_with_its_loop_kinds(monkeypatch, capsys):
    from halide_ad.runtime.updates import emit_reverse_scan, emit_update
    monkeypatch.setenv("HALIDE_AD_DUMP", "updates")
    traced = _traced(P.iir, np.ones((3, 6)), np.ones((3, 6)))
    scan, program = _scan_of(traced), traced.program
    u = scan.update
    shapes = {b.name: b.shape for b in program.inputs} | {f.name: f.shape for f in program.funcs}
    emit_update(u, shapes, "update1")
    emit_reverse_scan(scan, shapes | {f"adj_{n}": u.shape for n in shapes}, "backward0")
    forward, backward = capsys.readouterr().out.split("# update nest\n")[1:]
    assert "# parallel" in forward and "# reversed" not in forward
    assert f"for {u.rdom[0].var.name} in [1, 6):  # reversed" in backward


def test_partial_bins_of_a_zero_d_tensor_run_as_plain_python():
    """Rung 3's nest forced on a 0-d tensor (one bin per partition), printed and run as Python: 3
    partitions of the 8 points (3, 3 and 2 of them) add up to the serial sum."""
    program = _traced(P.sum_of_squares, X).program
    [u] = [f for f in program.funcs if isinstance(f, Update)]
    bins = f"{u.name}_bins"
    em = Emitter({b.name: b.shape for b in (*program.inputs, *program.funcs)} | {bins: (3, 1)})
    source = emit.function(em, "run", lower_updates.partitioned(u, Schedule(3, False, "forced", partitions=3)))
    namespace = {"np": np, "kernel": lambda f: f, "parallel_for": parallel_for, "nonneg": lambda k: k}
    exec(source, namespace)
    out = np.zeros(1)
    namespace["run"](**{u.name: out, u.prev: np.full(1, 0.5), bins: np.full((3, 1), np.nan),
                        program.inputs[0].name: X, "status": np.zeros(3, np.int64)})
    np.testing.assert_allclose(out, [0.5 + (X * X).sum()], rtol=1e-14)


@hd.func
def offset_grid_histogram(idx, w):  # a 2-D rdom starting at row 1, into few bins: rung 3
    h = hd.zeros((3,), w.dtype)
    y, x = hd.rdom((1, idx.shape[0]), idx.shape[1])
    h[hd.clamp(idx[y, x], 0, 2)] += w[y, x]
    return h


def test_partial_bins_walk_a_multi_dimensional_rdom_with_an_offset():
    """The flat position of each partition's points maps back to (y, x) = (1 + p // 7, p % 7)."""
    idx, w = np.arange(42).reshape(6, 7) % 4, np.linspace(-1, 1, 42).reshape(6, 7)
    u = _update(offset_grid_histogram, idx, w)
    assert schedule(u).rung == 3
    expected = np.zeros(3)
    np.add.at(expected, np.clip(idx[1:], 0, 2).ravel(), w[1:].ravel())
    np.testing.assert_allclose(offset_grid_histogram(idx, w), expected, rtol=1e-13)
