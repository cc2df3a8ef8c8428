"""Row groups: forward nests fused into one loop over the rows (runtime/schedule/fuse_rows.py) and
the gradient's adjoints computed a row of each per iteration (`schedule.stage.row_group`).

The pass is checked on hand-built nests; the kernels fused and unfused (HALIDE_AD_SKIP=fuse_rows)
must give the same bits, and the gradients PyTorch's."""
import re

import numpy as np
import pytest
import torch

import halide_ad as hd
import halide_ad.ops as ops
from halide_ad.api import CALL, as_function
from halide_ad.compiler import _private_adjoints, plan_gradient
from halide_ad.ir import INDEX_DTYPE, Bin, Const, Load, Op, Var
from halide_ad.runtime.gathers import gather_terms
from halide_ad.runtime.loops import Accumulate, Allocate, Comment, Element, For, Kind, Let, Local, Store, block, walk
from halide_ad.runtime.schedule import interior
from halide_ad.runtime.schedule.fuse_rows import fuse_rows, rows_local
from halide_ad.runtime.schedule.stage import row_group
from halide_ad.solver import Gather

i, k, j, r = Var("i"), Var("k"), Var("j"), Var("r")
ROWS, COLS = 64, 32


def _mirror(v: Var) -> Bin:
    return Bin(Op.SUB, Const(ROWS - 1, INDEX_DTYPE), v)


def _row_sum(name: str, src: str, var: Var, kind: Kind = Kind.PARALLEL, rows: int = ROWS) -> For:
    """name[var, 0] = sum of src[var, r] over r."""
    acc = Local("acc", "float64")
    return For(var, 0, rows, kind, block(Let(acc, Const(0.0, "float64")), For(r, 0, COLS, Kind.SERIAL, block(
        Accumulate(acc, Load(src, (var, r), "float64")))), Store(name, (var, Const(0, INDEX_DTYPE)), acc)))


def _scaled(name: str, src: str, by: Load, var: Var, kind: Kind = Kind.PARALLEL) -> For:
    """name[var, j] = src[var, j] / by."""
    return For(var, 0, ROWS, kind, block(For(j, 0, COLS, Kind.SERIAL, block(
        Store(name, (var, j), Bin(Op.DIV, Load(src, (var, j), "float64"), by))))))


def _s_at(v: Var) -> Load:
    return Load("s", (v, Const(0, INDEX_DTYPE)), "float64")


def test_nests_reading_the_same_row_join_one_loop():
    comment = Comment("out = x / s")
    fused = fuse_rows(block(_row_sum("s", "x", i), comment, _scaled("out", "x", _s_at(k), k)))
    # one loop over i: the row's sum, the comment, then the row divided (k renamed to i)
    assert fused == block(For(i, 0, ROWS, Kind.PARALLEL, block(
        _row_sum("s", "x", i).body, comment, _scaled("out", "x", _s_at(i), i).body)))


@pytest.mark.parametrize("later", [
    _scaled("out", "x", Load("s", (_mirror(k), Const(0, INDEX_DTYPE)), "float64"), k),  # another row of s
    _scaled("out", "x", Load("s", (Const(0, INDEX_DTYPE), Const(0, INDEX_DTYPE)), "float64"), k),      # row 0 of s
    For(k, 0, ROWS, Kind.SERIAL, block(For(j, 0, COLS, Kind.SERIAL, block(  # serial, adding into row 0
        Accumulate(Load("out", (Const(0, INDEX_DTYPE), j), "float64"), _s_at(k)))))),
    _row_sum("out", "s", k, rows=ROWS // 2),                                   # other bounds
], ids=["mirrored-row", "row-0", "serial", "other-bounds"])
def test_nests_that_cannot_share_a_row_stay_apart(later):
    nests = block(_row_sum("s", "x", i), later)
    assert fuse_rows(nests) == nests


def test_a_serial_nest_writing_its_own_rows_joins_a_parallel_group():
    """softmax's reciprocal per row: 4096 points, serial alone; its iterations are independent,
    so the fused loop stays parallel."""
    later = _scaled("out", "x", _s_at(k), k, Kind.SERIAL)
    fused = fuse_rows(block(_row_sum("s", "x", i), later))
    assert fused == block(For(i, 0, ROWS, Kind.PARALLEL, block(
        _row_sum("s", "x", i).body, _scaled("out", "x", _s_at(i), i).body)))


def test_a_read_of_a_buffer_written_at_another_row_refuses():
    """The earlier nest writes s at the mirrored row: the later one reads row i of s."""
    earlier = For(i, 0, ROWS, Kind.PARALLEL, block(Store("s", (_mirror(i), Const(0, INDEX_DTYPE)), Load("x", (i, Const(0, INDEX_DTYPE)), "float64"))))
    later = _scaled("out", "x", _s_at(k), k)
    assert fuse_rows(block(earlier, later)) == block(earlier, later)


def test_an_inner_loop_over_the_groups_variable_refuses_renaming():
    later = For(k, 0, ROWS, Kind.PARALLEL, block(For(i, 0, COLS, Kind.SERIAL, block(
        Store("out", (k, i), _s_at(k))))))
    nests = block(_row_sum("s", "x", i), later)
    assert fuse_rows(nests) == nests


def test_a_statement_that_is_not_a_nest_ends_the_group():
    other = Allocate("t", (4,), "float64")
    nests = block(_row_sum("s", "x", i), other, _scaled("out", "x", _s_at(i), i))
    assert fuse_rows(nests) == nests


def test_a_buffer_only_its_group_reads_is_kept_a_row_at_a_time():
    fused = fuse_rows(block(_row_sum("s", "x", i), _scaled("out", "x", _s_at(k), k)))
    names = iter(["row1"])
    (group,) = rows_local(fused, {"s": ((ROWS, 1), "float64")}, lambda base: next(names)).body
    assert group.body.body[0] == Allocate("row1", (1,), "float64", stack=True)
    stores = [n for n in walk(group) if isinstance(n, Store)]
    assert [n.buffer for n in stores] == ["out"] and stores[0].value.rhs == Element("row1", (Const(0, INDEX_DTYPE),), "float64")
    assert Let(Element("row1", (Const(0, INDEX_DTYPE),), "float64"), Local("acc", "float64")) in walk(group)
    # read by a nest outside the group (another row's s, so it does not join): stays a buffer
    later = _scaled("out2", "x", Load("s", (_mirror(k), Const(0, INDEX_DTYPE)), "float64"), k)
    two = fuse_rows(block(_row_sum("s", "x", i), _scaled("out", "x", _s_at(k), k), later))
    assert rows_local(two, {"s": ((ROWS, 1), "float64")}, lambda base: "row1") == two
    assert rows_local(fused, {}, lambda base: "row1") == fused  # a Func stored for a gradient or returned


def test_a_plain_softmax_keeps_its_exp_a_row_at_a_time(monkeypatch):
    """A plain call's forward stores only the output: exp(x - max), the sum and the max stay in
    the row group (the gradient's forward stores exp and the sum, which the gradient reads). The
    same bits either way."""
    monkeypatch.setenv("HALIDE_AD_TIERED", "0")
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "0")
    (x,) = _inputs("softmax", (13, 40), np.float32, False)
    fn = _fresh(OPS["softmax"][0])
    plain = fn(x)
    traced = as_function(fn).trace((x,), {})[0]
    kernel = traced.forward_run(CALL).kernel
    assert "lanes.scratch(40, np.float32)" in kernel.source
    assert kernel.buffers() == {traced.program.inputs[0].name, "softmax"}  # x in, the output out
    out, _ = hd.vjp(_fresh(OPS["softmax"][0]), x)
    assert plain.tobytes() == out.tobytes()


# ---- kernels: fused and unfused give the same bits ----

def _normalizations():
    def layer_norm(x, g, b):
        return ops.layer_norm(x, g, b, axis=-1)
    return {
        "softmax": (hd.func(lambda x: ops.softmax(x, axis=-1)), lambda x: torch.softmax(x, -1), 0),
        "log_softmax": (hd.func(lambda x: ops.log_softmax(x, axis=-1)), lambda x: torch.log_softmax(x, -1), 0),
        "layer_norm": (hd.func(layer_norm), lambda x, g, b: torch.nn.functional.layer_norm(x, x.shape[-1:], g, b), 2),
        "l2_normalize": (hd.func(lambda x: ops.l2_normalize(x, axis=-1)),
                         lambda x: torch.nn.functional.normalize(x, dim=-1), 0),
    }


OPS = _normalizations()


def _inputs(op: str, shape, dtype, strided: bool):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((shape[0], 2 * shape[1]) if strided else shape).astype(dtype)
    x = x[:, ::2] if strided else x
    params = [rng.standard_normal(shape[1:]).astype(dtype) for _ in range(OPS[op][2])]
    return (x, *params)


def _fresh(fn):
    """`fn` as a new function: traced and compiled under the settings of now (a function keeps
    the kernels of its first call's)."""
    return hd.func(lambda *args: fn(*args))


def _run(fn, args, ct):
    out, f_vjp = hd.vjp(_fresh(fn), *args)
    return out, f_vjp(ct)


CASES = [((13, 40), np.float32, False), ((13, 40), np.float64, False), ((1, 40), np.float32, False),
         ((13, 1), np.float64, False), ((13, 40), np.float32, True)]


@pytest.mark.parametrize("shape, dtype, strided", CASES,
                         ids=["rows-f32", "rows-f64", "one-row-f32", "one-column-f64", "strided-f32"])
@pytest.mark.parametrize("op", list(OPS))
def test_fused_kernels_give_the_unfused_bits(monkeypatch, op, shape, dtype, strided):
    """Every nest with a parallel dimension outlined (the gradient's row groups form at these
    small shapes), kernels not the interpreter's first calls."""
    monkeypatch.setenv("HALIDE_AD_TIERED", "0")
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "0")
    _check_fused(monkeypatch, op, shape, dtype, strided)


@pytest.mark.parametrize("op", ["softmax", "layer_norm"])
def test_fused_serial_kernels_give_the_unfused_bits(monkeypatch, op):
    """At the default threshold these shapes run serially: the forward's serial nests fuse."""
    monkeypatch.setenv("HALIDE_AD_TIERED", "0")
    _check_fused(monkeypatch, op, (13, 40), np.float32, False)


def _check_fused(monkeypatch, op: str, shape, dtype, strided: bool) -> None:
    """The same bits with and without HALIDE_AD_SKIP=fuse_rows, and PyTorch's values."""
    fn = OPS[op][0]
    args = _inputs(op, shape, dtype, strided)
    ct = np.random.default_rng(2).standard_normal(shape).astype(dtype)
    out, grads = _run(fn, args, ct)
    monkeypatch.setenv("HALIDE_AD_SKIP", "fuse_rows")
    out_unfused, grads_unfused = _run(fn, args, ct)
    assert out.tobytes() == out_unfused.tobytes()
    for g, h in zip(grads, grads_unfused, strict=True):
        assert g.tobytes() == h.tobytes()
    torch_args = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in args]
    OPS[op][1](*torch_args).backward(torch.tensor(ct.astype(np.float64)))
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(out, OPS[op][1](*torch_args).detach().numpy(), rtol=tol, atol=tol)
    for g, t in zip(grads, torch_args, strict=True):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("op", ["softmax", "layer_norm"])
def test_every_stage_of_a_row_runs_in_one_parallel_loop(monkeypatch, op):
    """With every nest parallel, softmax's forward (max, exp, sum, divide) and its gradient each
    make one parallel pass over the 13 rows; so do layer norm's (its gain's and bias's column
    sums run apart)."""
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "0")
    explained = hd.explain(_fresh(OPS[op][0]), *_inputs(op, (13, 40), np.float64, False))
    for source in (explained.forward_source, explained.backward_source):
        assert len(re.findall(r"parallel_for\(\w+, 0, 13,", source)) == 1, source


# ---- the gradient's row groups, decided on the plans ----

@hd.func
def mirrored_rows(x):
    """out[i, j] = x[i, j] * s[i], s[i] the sum of row R - 1 - i: adj_x reads adj_s at row R - 1 - i."""
    rows, cols = x.shape
    c = hd.rdom(cols)
    s = hd.compute((rows, 1), lambda i, j: hd.sum(x[rows - 1 - i, c]), name="s")
    return hd.compute(x.shape, lambda i, j: x[i, j] * s[i, 0], name="out")


def _row_group(fn, x):
    traced, _ = as_function(fn).trace((x,), {})
    plans = plan_gradient(traced.program, ("x",))
    computed = [p for p in plans if p.contributions and not p.inlined]
    gathers = [[c for c in p.contributions if isinstance(c, Gather)] for p in computed]
    splits = [interior(p.new_vars, p.adjoint.shape, gs) for p, gs in zip(computed, gathers, strict=True)]
    terms = [gather_terms(gs, p.adjoint.shape) for p, gs in zip(computed, gathers, strict=True)]
    private = _private_adjoints(traced.program, plans, ("x",))
    return [p.adjoint.buffer for p in computed], row_group(computed, splits, gathers, terms, 0, private)


def test_softmax_gradient_is_one_row_group(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "0")
    names, group = _row_group(OPS["softmax"][0], np.ones((8, 16)))
    assert names[group[0] - 1] == "x" and group == (len(names), 1), (names, group)


def test_a_read_of_another_rows_adjoint_is_no_row_group(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "0")
    names, group = _row_group(mirrored_rows, np.ones((8, 16)))
    assert len(names) >= 2 and group == (0, 0), (names, group)
    x = np.random.default_rng(3).standard_normal((8, 16))
    hd.check_grad(mirrored_rows, x)


def test_serial_gradients_form_no_row_group():
    names, group = _row_group(OPS["softmax"][0], np.ones((8, 16)))
    assert group == (0, 0)


# ---- a sum over the rows folded into the row group as partial sums per block ----

def test_rows_split_into_fixed_blocks():
    from halide_ad.runtime.schedule.column_parts import Blocks, row_blocks
    assert row_blocks(4096) == Blocks(16, 256)
    assert row_blocks(192) == Blocks(3, 64)
    assert row_blocks(127) is None and row_blocks(64) is None  # prime, or one block


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_gain_gradient_folds_into_the_row_group(monkeypatch, dtype):
    """The gain's and the shift's gradients sum over 256 rows: 4 blocks of 64 inside the row
    group, combined in order (the shift's, a sum of one array, would otherwise be numpy's, after
    the kernel). Against PyTorch, the passes after the group (HALIDE_AD_SKIP=column_parts), and
    one thread against two (the same bits)."""
    import numba
    monkeypatch.setenv("HALIDE_AD_TIERED", "0")
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "0")
    args = _inputs("layer_norm", (256, 24), dtype, False)
    ct = np.random.default_rng(2).standard_normal((256, 24)).astype(dtype)
    fn = _fresh(OPS["layer_norm"][0])
    explained = hd.explain(fn, *args)
    source = explained.backward_source
    assert "adj_arg1_parts" in source and "adj_arg2_parts" in source
    assert "(numpy" not in source
    gain, shift_sum = (source.index(f"adj_arg{k}_parts[part_nn, j__nn] = adj_arg{k}_parts") for k in (1, 2))
    assert "range(0, 24)" not in source[gain:shift_sum]  # one loop over the columns adds both
    (shift,) = [c for c in explained.contributions if c.buffer == "arg2"]
    assert "computed by" not in shift.formula, shift.formula
    _, grads = _run(fn, args, ct)
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        _, one = _run(fn, args, ct)
    finally:
        numba.set_num_threads(threads)
    assert all(g.tobytes() == h.tobytes() for g, h in zip(grads, one, strict=True))
    monkeypatch.setenv("HALIDE_AD_SKIP", "column_parts")
    fn_apart = _fresh(OPS["layer_norm"][0])
    apart_source = hd.explain(fn_apart, *args).backward_source
    assert "_parts" not in apart_source and "(numpy" in apart_source
    _, apart = _run(fn_apart, args, ct)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for g, h in zip(grads, apart, strict=True):
        np.testing.assert_allclose(g, h, rtol=tol, atol=tol)
    torch_args = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in args]
    OPS["layer_norm"][1](*torch_args).backward(torch.tensor(ct.astype(np.float64)))
    for g, t in zip(grads, torch_args, strict=True):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=10 * tol, atol=10 * tol)


def test_folded_rows_added_a_few_at_a_time_sum_them_in_their_type_first(monkeypatch):
    """Each block adds ROWS_AT_ONCE rows into its partial row per pass over it, their terms summed
    in order in float32 first: within float32's rounding of one row at a time, and not its bits."""
    from halide_ad.runtime import kernels
    monkeypatch.setenv("HALIDE_AD_TIERED", "0")
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "0")
    args = _inputs("layer_norm", (256, 24), np.float32, False)
    ct = np.random.default_rng(3).standard_normal((256, 24)).astype(np.float32)
    source = hd.explain(_fresh(OPS["layer_norm"][0]), *args).backward_source
    assert f"adj_arg1_parts, {kernels.ROWS_AT_ONCE} rows at a time" in source
    assert "adj_arg1_parts_rows = adj_arg1_parts_rows + " in source
    _, grads = _run(OPS["layer_norm"][0], args, ct)
    monkeypatch.setenv("HALIDE_AD_SKIP", "rows_at_once")
    assert "rows at a time" not in hd.explain(_fresh(OPS["layer_norm"][0]), *args).backward_source
    _, one = _run(OPS["layer_norm"][0], args, ct)
    assert grads[0].tobytes() == one[0].tobytes()  # adj_x is no column sum
    assert any(g.tobytes() != h.tobytes() for g, h in zip(grads[1:], one[1:], strict=True))
    for g, h in zip(grads[1:], one[1:], strict=True):
        np.testing.assert_allclose(g, h, rtol=1e-5, atol=1e-5 * np.abs(h).max())


def test_layer_norm_gain_gradient_folded_matches_finite_differences(monkeypatch):
    monkeypatch.setenv("HALIDE_AD_PARALLEL_MIN_POINTS", "0")
    x, g, b = _inputs("layer_norm", (128, 5), np.float64, False)
    fn = _fresh(OPS["layer_norm"][0])
    assert "adj_arg1_parts" in hd.explain(fn, x, g, b).backward_source
    hd.check_grad(fn, x, g, b, modes=("rev",))
