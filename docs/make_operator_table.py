"""Write docs/operators.md: every operator of halide_ad.ops, the form of each of its adjoint
contributions as `hd.explain` reports it, and the test that covers it.

    python docs/make_operator_table.py          # rewrite docs/operators.md
    python docs/make_operator_table.py --check  # exit 1 if docs/operators.md is out of date

The kernels run as plain Python (HALIDE_AD_JIT=0): the table needs the solver's answers, not
numba's machine code, so it is written in seconds.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "operators.md"

E, N, C, R, S, P = ("tests/ops/test_elementwise.py", "tests/ops/test_nn.py", "tests/ops/test_conv.py",
                    "tests/ops/test_reduce.py", "tests/ops/test_shape.py", "tests/ops/test_pool.py")
U = "tests/ops/test_scatter.py"


def _cases():
    """(operator, configuration, function, arguments, test) for each row of the table."""
    from halide_ad import ops
    rng = np.random.default_rng(0)
    x, pos = rng.standard_normal((2, 3, 4)), rng.random((2, 3, 4)) + 0.5
    x4, img = rng.standard_normal((2, 3, 5, 6)), rng.standard_normal((1, 2, 4, 5))
    b3, t = rng.standard_normal(3), rng.integers(0, 3, 2)
    unary = f"{E}::test_unary_gradients, test_unary_match_torch"
    binary = f"{E}::test_binary_gradients, test_binary_match_torch"
    return [
        ("log", "", ops.log, (pos,), unary),
        ("sqrt", "", ops.sqrt, (pos,), unary),
        ("exp", "", ops.exp, (x,), unary),
        ("sigmoid", "", ops.sigmoid, (x,), unary),
        ("tanh", "", ops.tanh, (x,), unary),
        ("relu", "", ops.relu, (x,), unary),
        ("leaky_relu", "negative_slope=0.2", lambda x: ops.leaky_relu(x, 0.2), (x,), unary),
        ("prelu", "alpha per channel", ops.prelu, (x, b3), binary),
        ("abs", "", ops.abs, (x,), unary),
        ("negative", "", ops.negative, (x,), unary),
        ("clip", "tensor bounds", ops.clip, (x, -pos[0, 0], pos[0, 0]), binary),
        ("power", "tensor exponent", ops.power, (pos, x[0]), binary),
        ("maximum", "broadcast (2,3,4), (3,1)", ops.maximum, (x, b3[:, None]), binary),
        ("minimum", "broadcast", ops.minimum, (x, b3[:, None]), binary),
        ("where", "bool condition", ops.where, (x > 0, x, pos), binary),
        ("add", "broadcast", ops.add, (x, b3[:, None]), binary),
        ("subtract", "broadcast", ops.subtract, (x, b3[:, None]), binary),
        ("multiply", "broadcast", ops.multiply, (x, b3[:, None]), binary),
        ("divide", "broadcast", ops.divide, (x, pos[0]), binary),
        ("softmax", "axis=1", lambda x: ops.softmax(x, 1), (x,), f"{N}::test_gradients_and_torch"),
        ("log_softmax", "axis=-1", ops.log_softmax, (x,), f"{N}::test_gradients_and_torch"),
        ("bias_add", "axis=1", ops.bias_add, (x4, b3), f"{N}::test_gradients_and_torch"),
        ("batch_norm", "training, affine", ops.batch_norm, (x4, b3, b3 + 1),
         f"{N}::test_gradients_and_torch"),
        ("layer_norm", "last two axes, affine", lambda x, g, b: ops.layer_norm(x, g, b, (-2, -1)),
         (x4, x4[0, 0], x4[1, 0]), f"{N}::test_gradients_and_torch"),
        ("l2_normalize", "axis=1", ops.l2_normalize, (x,), f"{N}::test_gradients_and_torch"),
        ("lrn", "size=3", lambda x: ops.lrn(x, 3), (x4,), f"{N}::test_gradients_and_torch"),
        ("dropout", "bool mask", lambda x, m: ops.dropout(x, m, 0.25), (x, x > 0), f"{N}::test_gradients_and_torch"),
        ("cross_entropy", "class targets, mean", ops.cross_entropy, (x[:, :, 0], t),
         f"{N}::test_gradients_and_torch"),
        ("cross_entropy", "probability targets", ops.cross_entropy, (x[:, :, 0], pos[:, :, 0]),
         f"{N}::test_gradients_and_torch"),
        ("nll_loss", "class weights, mean", ops.nll_loss, (x[:, :, 0], t, pos[0, :, 0]),
         f"{N}::test_gradients_and_torch"),
        ("mse_loss", "mean", ops.mse_loss, (x, pos), f"{N}::test_gradients_and_torch"),
        ("dense", "with bias", ops.dense, (x[0], x[1], b3), f"{C}::test_dense_and_matmul"),
        ("matmul", "batched, broadcast", ops.matmul, (x[:, None], x[0].T), f"{C}::test_dense_and_matmul"),
        ("conv1d", "stride 2, dilation 2, padding 2", lambda x, w: ops.conv1d(x, w, None, 2, 2, 2),
         (x, rng.standard_normal((2, 3, 2))), f"{C}::test_conv1d"),
        ("conv2d", "stride 2, padding 1, bias", lambda x, w, b: ops.conv2d(x, w, b, 2, 1), (x4, x4[:, :, :3, :3], b3[:2]),
         f"{C}::test_conv2d"),
        ("conv2d", "groups 3, dilation 2, 'same'", lambda x, w: ops.conv2d(x, w, None, 1, "same", 2, 3),
         (x4, x4[:, :1, :3, :3].reshape(3, 1, 3, 2)[:, :, :2]), f"{C}::test_conv2d"),
        ("conv2d", "padding_mode='reflect'", lambda x, w: ops.conv2d(x, w, None, 1, 1, 1, 1, "reflect"),
         (x4, x4[:, :, :3, :3]), f"{C}::test_conv2d"),
        ("conv2d_transpose", "stride 2, padding 1, output_padding 1",
         lambda x, w: ops.conv2d_transpose(x, w, None, 2, 1, 1), (x4, x4[:, :, :3, :3].transpose(1, 0, 2, 3)),
         f"{C}::test_conv2d_transpose"),
        ("max_pool2d", "3x3, stride 2, padding 1", lambda x: ops.max_pool2d(x, 3, 2, 1), (x4,),
         f"{P}::test_max_pool2d_and_global_max"),
        ("avg_pool2d", "3x3, stride 2, padding 1", lambda x: ops.avg_pool2d(x, 3, 2, 1), (x4,),
         f"{P}::test_avg_pool2d_and_global_avg"),
        ("global_max_pool2d", "", ops.global_max_pool2d, (x4,), f"{P}::test_max_pool2d_and_global_max"),
        ("global_avg_pool2d", "", ops.global_avg_pool2d, (x4,), f"{P}::test_avg_pool2d_and_global_avg"),
        ("upsampling", "nearest, x2", lambda x: ops.upsampling(x, 2), (img,), f"{P}::test_nearest_upsampling_and_resize"),
        ("upsampling", "bilinear, x2", lambda x: ops.upsampling(x, 2, "bilinear"), (img,),
         f"{P}::test_bilinear_upsampling_and_resize"),
        ("resize", "bilinear to (7, 9)", lambda x: ops.resize(x, (7, 9)), (img,), f"{P}::test_bilinear_upsampling_and_resize"),
        ("resize", "bilinear, align_corners, to (3, 8)", lambda x: ops.resize(x, (3, 8), align_corners=True),
         (img,), f"{P}::test_bilinear_upsampling_and_resize"),
        ("flatten", "", ops.flatten, (x,), f"{S}::test_flatten_reshape_transpose_squeeze_expand_broadcast"),
        ("reshape", "(4, -1)", lambda x: ops.reshape(x, (4, -1)), (x,),
         f"{S}::test_flatten_reshape_transpose_squeeze_expand_broadcast"),
        ("transpose", "(2, 0, 1)", lambda x: ops.transpose(x, (2, 0, 1)), (x,),
         f"{S}::test_flatten_reshape_transpose_squeeze_expand_broadcast"),
        ("squeeze", "", ops.squeeze, (x[:, :1],), f"{S}::test_flatten_reshape_transpose_squeeze_expand_broadcast"),
        ("expand_dims", "axis=1", lambda x: ops.expand_dims(x, 1), (x,),
         f"{S}::test_flatten_reshape_transpose_squeeze_expand_broadcast"),
        ("concatenate", "axis=1", lambda x, y: ops.concatenate([x, y], 1), (x, x[:, :2]),
         f"{S}::test_concatenate_split_strided_slice"),
        ("split", "[1, 3], axis=2", lambda x: ops.split(x, [1, 3], 2), (x,), f"{S}::test_concatenate_split_strided_slice"),
        ("pad", "constant", lambda x: ops.pad(x, 1), (x,), f"{S}::test_pad_constant_edge_reflect"),
        ("pad", "edge", lambda x: ops.pad(x, 1, "edge"), (x,), f"{S}::test_pad_constant_edge_reflect"),
        ("pad", "reflect", lambda x: ops.pad(x, 1, "reflect"), (x,), f"{S}::test_pad_constant_edge_reflect"),
        ("strided_slice", "step 2", lambda x: ops.strided_slice(x, [0], [4], [2], [2]), (x,),
         f"{S}::test_concatenate_split_strided_slice"),
        ("broadcast_to", "(2, 2, 3, 4)", lambda x: ops.broadcast_to(x, (2, 2, 3, 4)), (x[:, :1],),
         f"{S}::test_flatten_reshape_transpose_squeeze_expand_broadcast"),
        ("take", "axis=1", lambda x, i: ops.take(x, i, 1), (x, t), f"{S}::test_take_gradient_is_a_scatter"),
        ("sum", "axis=1", lambda x: ops.sum(x, 1), (x,), f"{R}::test_reductions_gradients_and_torch"),
        ("mean", "axis=(0, 2)", lambda x: ops.mean(x, (0, 2)), (x,), f"{R}::test_reductions_gradients_and_torch"),
        ("max", "axis=-1", lambda x: ops.max(x, -1), (x,), f"{R}::test_reductions_gradients_and_torch"),
        ("min", "axis=0", lambda x: ops.min(x, 0), (x,), f"{R}::test_reductions_gradients_and_torch"),
        ("prod", "axis=1", lambda x: ops.prod(x, 1), (x,), f"{R}::test_reductions_gradients_and_torch"),
        ("cumsum", "axis=1", lambda x: ops.cumsum(x, 1), (x,), f"{U}::test_cumsum_and_cumprod"),
        ("cumprod", "axis=-1", ops.cumprod, (x,), f"{U}::test_cumsum_and_cumprod"),
        ("index_add", "axis=0", lambda x, i, s: ops.index_add(x, 0, i, s),
         (x[0], np.array([0, 2, 2, 1]), rng.standard_normal((4, 4))), f"{U}::test_index_add_and_scatter_add"),
        ("scatter_add", "axis=0", lambda x, i, s: ops.scatter_add(x, 0, i, s),
         (x[0], rng.integers(0, 3, (5, 4)), rng.standard_normal((5, 4))), f"{U}::test_index_add_and_scatter_add"),
        ("segment_sum", "5 segments", lambda d, i: ops.segment_sum(d, i, 5),
         (x[0].T, np.array([1, 0, 4, 1])), f"{U}::test_segment_sum_and_bincount"),
        ("bincount", "weights, length=4", lambda i, w: ops.bincount(i, w, 4),
         (rng.integers(0, 4, 64), rng.random(64)), f"{U}::test_segment_sum_and_bincount"),
        ("histogram", "8 bins over [-1, 1], weights", lambda x, w: ops.histogram(x, 8, -1.0, 1.0, w),
         (rng.standard_normal(64), rng.random(64)), f"{U}::test_histogram_matches_histc"),
        ("embedding_bag", "mode='mean'", lambda w, i, o: ops.embedding_bag(w, i, o, "mean"),
         (x[0].T, np.array([3, 0, 2, 1]), np.array([0, 1, 1])), f"{U}::test_embedding_bag"),
    ]


def _forms(fn, args) -> tuple[str, list[str]]:
    """'x: gather-window; w: gather-window' and the reasons of any scatter, from hd.explain."""
    import halide_ad as hd
    by_buffer: dict[str, list[str]] = {}
    reasons = []
    # A fresh Function (never the operator's own): its kernels here are interpreted Python.
    program = hd.func(fn.fn if isinstance(fn, hd.Function) else fn)
    explanation = hd.explain(program, *args)
    inputs = [b.name for b in explanation.program.inputs]
    for c in sorted(explanation.contributions, key=lambda c: c.buffer not in inputs):
        by_buffer.setdefault(c.buffer, []).append(c.form)
        if c.reason:
            reasons.append(c.reason)
    parts = []
    for buffer, forms in by_buffer.items():
        counted = [f"{f} ×{forms.count(f)}" if forms.count(f) > 1 else f for f in dict.fromkeys(forms)]
        parts.append(f"`{buffer}`: {', '.join(counted)}")
    parts += [f"update of `{u.prev}`: rung {explanation.rungs[u.name].split(':')[0]}"  # docs/updates.md
              for u in explanation.program.funcs if u.name in explanation.rungs]
    return "; ".join(parts), reasons


HEADER = """# Operators

Every operator of `halide_ad.ops` is written in the DSL only (`hd.compute`, `hd.rdom`, reductions,
boundary views): no gradient is written by hand. This table lists, for one representative call of
each, every adjoint contribution that reverse mode derived and the form the index inverter gave it
(`hd.explain`):

* `gather`: each gradient element reads one element (one writer per element, race-free);
* `gather-window`: each gradient element sums a small window found by the inverter (a
  convolution's taps, a pooling window, a broadcast axis);
* `scatter-parallel` / `scatter-serial`: the index depends on data, so the contribution stays a
  scatter (parallel over a loop that z3 proves writes distinct elements), with the reason.

Buffers are named as in the traced program: the operator's arguments first (by their parameter
names), then the intermediate tensors that the operator builds. Generated by
`python docs/make_operator_table.py`; `tests/ops/test_coverage.py` fails when it is out of date.

| operator | configuration | adjoint contributions | all gathers | test |
|---|---|---|---|---|
"""

FOOTER = """
Notes:

* `take` reads `x` at data-dependent indices, so its adjoint is a scatter: parallel over every
  loop whose writes z3 proves distinct (here the axes of `x` that the indices do not touch),
  deterministic, never atomic.
* Resampling (`upsampling`, `resize`) computes its source rows and columns with integer floor
  division of the output index, e.g. `((2 * i + 1) * H - H_out) // (2 * H_out)` for bilinear
  with half-pixel centres, and the bilinear weight from the matching remainder; so every size,
  not only integer scale factors, inverts to a gather. No operator indexes with float data.
* `cross_entropy` and `nll_loss` select the target class with `target == c` over the classes
  instead of indexing `logp[n, target[n]]`, so their adjoints are gathers; a target outside
  `[0, C)` still raises `BoundsError` at run time.
* The scans and scatters (`cumsum` to `embedding_bag`) are update definitions; the rung is how the
  forward update runs (docs/updates.md: 1 parallel, 3 partial bins, 4 serial over the rdom,
  parallel over the other axes). A scan's adjoint is a `reverse-scan`, the update run backwards.
* `conv2d`/`conv1d` with `padding_mode` 'reflect', 'replicate' or 'circular' read a padded copy
  made with a boundary view (its adjoint is a small piecewise gather); zero padding is read
  through `hd.constant_exterior` inside the convolution itself.
"""


def render() -> str:
    previous = os.environ.get("HALIDE_AD_JIT")
    os.environ["HALIDE_AD_JIT"] = "0"
    try:
        rows = []
        for name, config, fn, args, test in _cases():
            forms, reasons = _forms(fn, args)
            ok = "yes" if not reasons else "no: " + "; ".join(dict.fromkeys(reasons))
            rows.append(f"| `{name}` | {config} | {forms} | {ok} | `{test}` |")
    finally:
        if previous is None:
            del os.environ["HALIDE_AD_JIT"]
        else:
            os.environ["HALIDE_AD_JIT"] = previous
    return HEADER + "\n".join(rows) + "\n" + FOOTER


def main() -> int:
    sys.path.insert(0, str(ROOT))
    text = render()
    if "--check" in sys.argv:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is out of date: run python docs/make_operator_table.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
