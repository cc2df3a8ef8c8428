"""Scheduling of gradient kernels (strided windows in phases, pointwise adjoints not stored) and of
pointwise forward definitions (in phases where they read through quotients and parities).
Each schedule is checked for its shape in the generated source and against the serial scatter
reference (odd sizes, so that boundaries and partial periods run)."""
import ast
import re

import numpy as np
import pytest

import halide_ad as hd
from halide_ad.api import as_function
from halide_ad.runtime.reference import evaluate
from tests.programs import scatter_adjoints


@hd.func
def avgpool3s2(x):
    r, s = hd.rdom(3, 3)
    return hd.compute(((x.shape[0] - 3) // 2 + 1, (x.shape[1] - 3) // 2 + 1),
                      lambda i, j: hd.sum(x[2 * i + r, 2 * j + s]) / 9)


@hd.func
def maxpool2s2(x):
    r, s = hd.rdom(2, 2)
    return hd.compute((x.shape[0] // 2, x.shape[1] // 2), lambda i, j: hd.max(x[2 * i + r, 2 * j + s]))


@hd.func
def blur_relu_pool(x):
    e = hd.repeat_edge(x)
    r, s = hd.rdom(3, 3)
    blurred = hd.compute(x.shape, lambda i, j: hd.sum(e[i + r - 1, j + s - 1]) / 9)
    return maxpool2s2(hd.relu(blurred))


def _matches_scatter_reference(fn, *args):
    """The gradient equals the serial scatter's, run in float64 (a float32 one within float32's error)."""
    traced, arrays = as_function(fn).trace(args, {})
    out, f_vjp = hd.vjp(fn, *args)
    ct = (np.arange(out.size, dtype=np.float64).reshape(out.shape) % 7 - 3).astype(out.dtype)
    ref = scatter_adjoints(traced.program, tuple(n for n in traced.arg_names if n),
                           arrays | evaluate(traced.program, arrays), {traced.program.outputs[0]: ct})
    grads = f_vjp(ct)
    for name, g in zip(traced.arg_names, grads if isinstance(grads, tuple) else (grads,), strict=False):
        if name is not None:
            tol = 1e-13 if g.dtype == np.float64 else 1e-5  # sums in another order
            np.testing.assert_allclose(g, ref[name], rtol=tol, atol=tol)


@pytest.mark.parametrize("fn, shape", [(avgpool3s2, (9, 13)), (maxpool2s2, (7, 10)), (maxpool2s2, (6, 9))])
def test_pooling_gradients_run_in_phases(fn, shape):
    x = (np.arange(np.prod(shape)) * 7 % 11).astype(np.float64).reshape(shape)
    source = hd.explain(fn, x).backward_source
    assert "# phase 0 of 2" in source and "# phase 1 of 2" in source, source
    # inside the phases, the column is q: no shift or floor division of j1 is left
    phased = source.split("# phase 0 of 2")[1]
    assert not re.search(r"j1\)? *(>>|//|&|%)", phased), source
    _matches_scatter_reference(fn, x)
    hd.check_grad(fn, x + np.linspace(0, 0.5, x.size).reshape(shape))  # no ties for the max


def test_pointwise_adjoints_are_not_stored():
    """blur -> relu -> pool: the pool is differentiated through the relu (no adjoint of its own),
    and the blur's /9 adjoint is computed inside the pooling gradient's pass; only the window
    sum's input is stored."""
    x = (np.arange(63) * 5 % 13 - 6).astype(np.float64).reshape(7, 9)
    report = hd.explain(blur_relu_pool, x)
    assert sum("[not stored" in c.formula for c in report.contributions) == 1, str(report)
    assert not any("adj_relu" in c.formula for c in report.contributions), str(report)
    _matches_scatter_reference(blur_relu_pool, x)
    hd.check_grad(blur_relu_pool, x + np.linspace(0, 0.3, x.size).reshape(x.shape))


@hd.func
def blur_relu_pool_planes(x, w=None):
    """blur -> relu -> 2x2 maxpool on each plane of an (n, c, h, w) batch; the blur's 3x3 window
    weighted by w where given."""
    e = hd.repeat_edge(x)
    r, s = hd.rdom(3, 3)
    tap = (lambda n, c, i, j: e[n, c, i + r - 1, j + s - 1]) if w is None else \
        (lambda n, c, i, j: e[n, c, i + r - 1, j + s - 1] * w[r, s])
    y = hd.relu(hd.compute(x.shape, lambda n, c, i, j: hd.sum(tap(n, c, i, j)) / 9))
    p, q = hd.rdom(2, 2)
    return hd.compute(x.shape[:2] + (x.shape[2] // 2, x.shape[3] // 2),
                      lambda n, c, i, j: hd.max(y[n, c, 2 * i + p, 2 * j + q]))


@pytest.mark.parametrize("shape, dtype", [((2, 3, 7, 9), np.float64), ((1, 2, 4, 6), np.float32)])
def test_pooling_gradient_handed_to_the_blur_a_plane_at_a_time(shape, dtype):
    """The window sum's adjoint (the pooling gradient through the relu) is read by the blur's
    gradient only: per (n, c), its plane is computed into a local array that the blur's
    gradient reads while it is in cache, and never stored whole."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(dtype)
    fn = blur_relu_pool_planes
    report = hd.explain(fn, x)
    source = report.backward_source
    assert re.search(r"\bstage\d+ = np\.empty\(", source) and re.search(r"\bstage\d+\[", source), source
    assert sum("a plane at a time]" in c.formula for c in report.contributions) == 1, str(report)
    entry = next(line for line in source.splitlines() if line.startswith("def backward"))
    assert "adj_x" in entry and not re.search(r"adj_\w*sum", entry), entry  # not a kernel parameter
    _matches_scatter_reference(fn, x)
    if dtype == np.float64:
        hd.check_grad(fn, x)


@hd.func
def pooled_blur_and_blur(x):
    """The pooled blur, and the blur itself as a second output."""
    e = hd.repeat_edge(x)
    r, s = hd.rdom(3, 3)
    blurred = hd.compute(x.shape, lambda n, c, i, j: hd.sum(e[n, c, i + r - 1, j + s - 1]) / 9)
    p, q = hd.rdom(2, 2)
    pooled = hd.compute(x.shape[:2] + (x.shape[2] // 2, x.shape[3] // 2),
                        lambda n, c, i, j: hd.max(blurred[n, c, 2 * i + p, 2 * j + q]))
    return pooled, blurred


def test_a_staged_adjoint_with_a_cotangent_of_its_own():
    """The blur is an output too: its adjoint, handed to the blur's window gradient a plane at a
    time, starts from its own cotangent."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 7, 8))
    assert re.search(r"\bstage\d+ = np\.empty\(", hd.explain(pooled_blur_and_blur, x).backward_source)
    traced, arrays = as_function(pooled_blur_and_blur).trace((x,), {})
    (pooled, blurred), vjp_fn = hd.vjp(pooled_blur_and_blur, x)
    cts = rng.standard_normal(pooled.shape), rng.standard_normal(blurred.shape)
    (gx,) = vjp_fn(cts)
    program = traced.program
    ref = scatter_adjoints(program, ("x",), arrays | evaluate(program, arrays), dict(zip(program.outputs, cts)))
    np.testing.assert_allclose(gx, ref["x"], rtol=1e-13, atol=1e-13)


def test_an_adjoint_with_two_readers_is_stored():
    """With the blur's weights an input, the window sum's adjoint has two readers (the
    gradients of x and of w): it is stored whole, and both gradients read it."""
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 3, 7, 9)), rng.standard_normal((3, 3))
    assert not re.search(r"\bstage\d+\b", hd.explain(blur_relu_pool_planes, x, w).backward_source)
    _matches_scatter_reference(blur_relu_pool_planes, x, w)
    hd.check_grad(blur_relu_pool_planes, x, w)


@hd.func
def blur_edge(x):
    e = hd.repeat_edge(x)
    r, s = hd.rdom(3, 3)
    return hd.compute(x.shape, lambda i, j: hd.sum(e[i + r - 1, j + s - 1]) / 9)


def _bilinear2x_at(read, i, j):
    """Output pixel (i, j) of a 2x bilinear upsampling with half-pixel centres; `read(y, x)` is
    the source at (y, x)."""
    def taps(i):
        w = hd.where(i % 2 == 0, 0.25, 0.75)
        return ((i - 1) // 2, w), ((i + 1) // 2, 1 - w)

    (y0, wy0), (y1, wy1) = taps(i)
    (x0, wx0), (x1, wx1) = taps(j)
    return wy0 * (wx0 * read(y0, x0) + wx1 * read(y0, x1)) + wy1 * (wx0 * read(y1, x0) + wx1 * read(y1, x1))


@hd.func
def bilinear2x(x):
    """2x bilinear upsampling with half-pixel centres, edges repeated (as torch's default)."""
    e = hd.repeat_edge(x)
    return hd.compute((2 * x.shape[0], 2 * x.shape[1]),
                      lambda i, j: _bilinear2x_at(lambda y, x: e[y, x], i, j))


@pytest.mark.parametrize("fn, shape", [(blur_edge, (9, 11)), (bilinear2x, (5, 7)), (blur_edge, (1, 6))])
def test_boundary_regions_fold_to_constants(fn, shape):
    """Each edge row and column around the interior runs its own copy of the gathers, specialized
    to it: no guard, clamped window bound or parity test is left to run per point. The bilinear
    weights' parity tests, (2*j + t + 1) % 2, do not depend on j: no phases for them. (A separable
    window's loop over the source rows an output row filters starts at 0 for the first one: that
    test runs once per row.)"""
    x = (np.arange(np.prod(shape)) * 7 % 11 - 5).astype(np.float64).reshape(shape)
    source = hd.explain(fn, x).backward_source
    code = "\n".join(line for line in source.splitlines()
                     if not line.strip().startswith(("#", "for row in range(0 if ")))
    assert not re.search(r"\b(min|max)\(|\bif |& 1|# phase", code), source
    _matches_scatter_reference(fn, x)
    hd.check_grad(fn, x)



@hd.func
def bilinear2x_planes(x):
    """bilinear2x on each (n, c) plane."""
    e = hd.repeat_edge(x)
    N, C, H, W = x.shape
    return hd.compute((N, C, 2 * H, 2 * W),
                      lambda n, c, i, j: _bilinear2x_at(lambda y, x: e[n, c, y, x], i, j))


@pytest.mark.parametrize("fn, shape, dtype", [(bilinear2x, (5, 7), np.float64),
                                              (bilinear2x_planes, (2, 3, 5, 7), np.float64),
                                              (bilinear2x_planes, (2, 3, 6, 4), np.float32)])
def test_corners_share_one_loop_over_tables(fn, shape, dtype):
    """The corners of a bilinear gradient's planes are constant taps: one loop reads each
    corner's position, taps and weights from module-level tables, instead of a copy of the body
    per corner (which cost numba as much to compile as an edge's loop)."""
    x = (np.arange(np.prod(shape)) * 7 % 11 - 5).astype(dtype).reshape(shape)
    source = hd.explain(fn, x).backward_source
    h, w = shape[-2:]
    assert "for point in range(0, 4):" in source, source
    table = re.search(r"^tab_\d+ = np\.array\((\[\[\d+, \d+\](, \[\d+, \d+\])*\]), np\.int64\)", source, re.M)
    corners = [[0, 0], [0, w - 1], [h - 1, 0], [h - 1, w - 1]]
    assert table and sorted(ast.literal_eval(table.group(1))) == corners, source
    _matches_scatter_reference(fn, x)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_shared_indices_and_equal_weights_are_computed_once(dtype):
    """numba's compile time grows with every operation: an edge of a bilinear gradient's planes
    reads 12 loads at 4 columns, each column computed once before them, and sums the loads of
    each of its 5 weights before one multiplication."""
    x = (np.arange(2 * 3 * 6 * 8) * 7 % 11 - 5).astype(dtype).reshape(2, 3, 6, 8)
    source = hd.explain(bilinear2x_planes, x).backward_source
    code = [line.strip() for line in source.splitlines() if not line.strip().startswith("#")]
    top = code.index("for j3 in range(1, 7):", code.index("j2 = 0"))  # the top edge, j2 = 0, along j3
    body = code[top + 1:code.index(next(c for c in code[top:] if c.startswith("adj_x[")), top)]
    columns = [c for c in body if re.fullmatch(r"ix\d+ = .*", c)]
    assert sorted(c.split(" = ")[1] for c in columns) == [
        "((2 * j3) + 1)", "((2 * j3) + 2)", "((2 * j3) - 1)", "(2 * j3)"], source
    assert sum(c.startswith("h") for c in body) == 12 and not any("2 * j3" in c for c in body if c[0] == "h")
    sums = [c for c in body if c.startswith("acc")]
    assert len(sums) == 5 and all(c.count(" * ") == 1 for c in sums), source
    _matches_scatter_reference(bilinear2x_planes, x)


@pytest.mark.parametrize("box, extents", [
    ({"a": (1, 6), "b": (2, 9)}, {"a": 8, "b": 12}),  # few edge values: one region each
    ({"a": (3, 4), "b": (0, 5), "c": (2, 3)}, {"a": 8, "b": 6, "c": 7}),  # many: one per side
    ({"a": (0, 4)}, {"a": 5}),  # no margin: nothing outside
])
def test_regions_tile_the_points_outside_the_box(box, extents):
    from halide_ad.ir import Var
    from halide_ad.runtime.schedule.boundary import _regions
    box = {Var(v): b for v, b in box.items()}
    extents = {Var(v): n for v, n in extents.items()}
    count = np.zeros(tuple(extents.values()), dtype=int)
    for region in _regions(box, extents):
        count[tuple(slice(lo, hi + 1) for lo, hi in region.values())] += 1
    inside = tuple(slice(lo, hi + 1) for lo, hi in box.values())
    assert (count[inside] == 0).all()
    count[inside] = 1
    assert (count == 1).all()


@hd.func
def blur5_planes(x):
    """A 5x5 box blur of each plane of an (n, c, h, w) batch."""
    e = hd.repeat_edge(x)
    r, s = hd.rdom(5, 5)
    return hd.compute(x.shape, lambda n, c, i, j: hd.sum(e[n, c, i + r - 2, j + s - 2]) / 25)


@hd.func
def laplacian(x):
    """A 3x3 window whose weights are not an outer product: no two passes for it."""
    e = hd.repeat_edge(x)
    return hd.compute(x.shape, lambda i, j: 4 * e[i, j] - e[i - 1, j] - e[i + 1, j] - e[i, j - 1] - e[i, j + 1])


@hd.func
def upsample2x_planes(x):
    """Nearest 2x upsampling of each plane: its gradient sums 2x2 blocks, columns at stride 2."""
    return hd.compute(x.shape[:2] + (2 * x.shape[2], 2 * x.shape[3]), lambda n, c, i, j: x[n, c, i // 2, j // 2])


@hd.func
def upsample3x_planes(x):
    """Nearest 3x upsampling of each plane: no two output rows share a source row."""
    shape = x.shape[:2] + (3 * x.shape[2], 3 * x.shape[3])
    return hd.compute(shape, lambda n, c, i, j: x[n, c, i // 3, j // 3])


@pytest.mark.parametrize("fn, shape, dtype, separable", [
    (upsample2x_planes, (2, 3, 5, 7), np.float64, True),
    (upsample3x_planes, (2, 2, 4, 5), np.float32, True),
    (upsample2x_planes, (1, 2, 1, 3), np.float32, True),
    (bilinear2x, (5, 7), np.float64, True),
    (bilinear2x, (6, 4), np.float32, True),
    (blur5_planes, (2, 3, 9, 11), np.float64, True),
    (laplacian, (6, 7), np.float64, False),
    (blur_edge, (9, 11), np.float64, False),
])
def test_separable_windows_run_in_two_passes(fn, shape, dtype, separable):
    """A window whose weights are rows[r] * cols[c] runs as a pass along the rows into a temporary,
    then one along the columns: the same sums, in another order. Not a 3x3 box: 6 terms instead of
    9 do not pay for the temporary. A window whose columns are strided does, whatever its size: the
    rows pass reads each source row once, in order (a nearest upsampling's gradient, with no
    boundary or phase to split for). The temporary is a ring of the few rows one output row reads
    (5 for a 5x5 box: 8), whether output rows share source rows (stride 1 or 2) or not (stride 3)."""
    x = (np.arange(np.prod(shape)) * 7 % 11 - 5).astype(dtype).reshape(shape)
    source = hd.explain(fn, x).backward_source
    assert ("# separable window" in source) == separable, source
    if separable:
        rows = int(re.search(r"# separable window: (\d+) rows", source).group(1))
        ring = int(re.search(r"window\d+ = np\.empty\(\((\d+), ", source).group(1))
        assert rows <= ring < 2 * rows, source
    _matches_scatter_reference(fn, x)
    if dtype == np.float64:
        hd.check_grad(fn, x)


@pytest.mark.parametrize("fn, shape, row", [(blur_edge, (9, 11), "1, 8"), (avgpool3s2, (9, 13), None)])
def test_edge_columns_run_inside_the_row_loop(fn, shape, row):
    """The regions beside the box in its last dimension run in the box's row loop, each row's
    edge columns next to its interior (for a phased row, once per phase), not in a pass of their
    own over the rows."""
    x = (np.arange(np.prod(shape)) * 7 % 11 - 5).astype(np.float64).reshape(shape)
    source = hd.explain(fn, x).backward_source
    lines = source.splitlines()
    header = next(k for k, line in enumerate(lines) if re.search(
        rf"for \w+ in p?range\({row}\):" if row else r"for \w+_q in p?range\(", line))
    indent = len(lines[header]) - len(lines[header].lstrip())
    body = []
    for line in lines[header + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        body.append(line)
    width = shape[1]
    text = "\n".join(body)  # the left columns and the right ones: loops, or one column's assignment
    assert re.search(r"range\(0, \d\):|^ *\w+ = 0$", text, re.M), source
    assert f", {width})" in text or re.search(rf"^ *\w+ = {width - 1}$", text, re.M), source
    _matches_scatter_reference(fn, x)


@hd.func
def upsample_odd(x):
    """Nearest 2x, one row and one column short: partial periods at the end."""
    return hd.compute((2 * x.shape[0] - 1, 2 * x.shape[1] - 1), lambda i, j: x[i // 2, j // 2] * 2)


@pytest.mark.parametrize("fn, shape, dtype", [(bilinear2x, (5, 7), np.float64),
                                              (bilinear2x_planes, (2, 3, 6, 4), np.float32),
                                              (upsample_odd, (4, 5), np.float64),
                                              (upsample_odd, (3, 2), np.int64)])
def test_pointwise_forward_runs_in_phases(fn, shape, dtype):
    """A definition read through quotients and parities of its innermost variables runs, as a
    strided gradient does, in phases j = s*q + p, with no quotient or parity of j left; the
    points past the last whole period run the definition as written."""
    x = (np.arange(np.prod(shape)) * 7 % 11 - 5).astype(dtype).reshape(shape)
    source = hd.explain(fn, x).forward_source
    assert "# phase 1 of" in source, source
    phased = source.split("# phase 0 of")[1]
    assert not re.search(r"\b(i|j)\)? *(>>|//|&|%)", phased), source
    traced, arrays = as_function(fn).trace((x,), {})
    expected = evaluate(traced.program, arrays)[traced.program.outputs[0]]
    np.testing.assert_array_equal(fn(x), expected)
