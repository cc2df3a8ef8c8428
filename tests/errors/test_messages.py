"""One test per user mistake listed in issue 4: each raises a HalideADError subclass whose message
says what went wrong and what to do, matched here by its text (unread messages rot)."""
import importlib
import math
import re
import warnings

import numpy as np
import pytest
from halide_ad.runtime.reference import evaluate
from tests.programs import scatter_adjoints

import halide_ad as hd
from halide_ad.api import as_function
from tests import programs as P

X4, W4 = np.ones((1, 2, 5, 5)), np.ones((3, 2, 2, 2))


@pytest.fixture
def interpreted(monkeypatch):
    """Kernels run as plain Python: these tests are about messages, not machine code."""
    monkeypatch.setenv("HALIDE_AD_JIT", "0")


# ---- arguments ----------------------------------------------------------------------------------

def test_wrong_number_of_arguments_names_the_function_and_its_parameters():
    with pytest.raises(hd.ShapeError, match=r"conv2d\(x, w\) was called with 3 positional and 0 "
                                            r"keyword argument\(s\): too many positional arguments"):
        P.conv2d(X4, W4, W4)
    with pytest.raises(hd.ShapeError, match=r"conv2d\(x, w\) .* missing a required argument: 'w'"):
        P.conv2d(X4)
    with pytest.raises(hd.ShapeError, match="unexpected keyword argument 'bias'"):
        hd.vjp(P.conv2d, X4, W4, bias=np.ones(3))
    with pytest.raises(hd.ShapeError, match=r"blur3\(img, view='repeat_edge'\) was called with 0"):
        hd.grad(P.blur3)()


def test_wrong_number_of_arguments_to_an_inlined_func(interpreted):
    with pytest.raises(hd.ShapeError, match=r"blur3\(img, view='repeat_edge'\) .* too many") as e:
        hd.func(lambda a: P.blur3(a, "mirror", 1))(np.ones((2, 3)))
    assert "test_messages.py" in str(e.value)


def test_conv_whose_channel_counts_disagree_is_a_shape_error_not_a_read_out_of_bounds():
    # w has more channels than x: the sum over x's 2 channels would silently skip w's third
    with pytest.raises(hd.ShapeError, match=r"share the reduction variable .* dimension 1 of x \(size 2\) "
                                            r"and dimension 1 of w \(size 3\): the shapes disagree"):
        P.conv2d(np.ones((1, 2, 5, 5)), np.ones((4, 3, 2, 2)))
    # x has more channels than w: the sum would read past w
    with pytest.raises(hd.ShapeError, match=r"channel counts differ") as e:
        P.conv2d(np.ones((1, 3, 5, 5)), np.ones((4, 2, 2, 2)))
    assert "programs.py" in str(e.value)  # the user's line


def test_arithmetic_on_an_unindexed_boundary_view_names_the_view_and_the_fix():
    # `c + x[i]` forgets c's index; it used to escape as Python's TypeError
    for body in (lambda x, c: lambda i: x[i] + c, lambda x, c: lambda i: 2 * c, lambda x, c: lambda i: -c):
        f = hd.func(lambda x, body=body: hd.compute(x.shape, body(x, hd.repeat_edge(x))))
        with pytest.raises(hd.TraceError, match=r"hd.repeat_edge\(x\) is a boundary view, which only indexing "
                                                r"reads: write hd.repeat_edge\(x\)\[i, \.\.\.\]"):
            f(np.ones(4))
    # with a whole tensor it reads the view at each point, from either side
    y = hd.func(lambda x: hd.repeat_edge(x) * x + x * hd.repeat_edge(x))(np.arange(4.0))
    np.testing.assert_array_equal(y, 2 * np.arange(4.0) ** 2)


def test_wrong_rank_names_the_tensor():
    with pytest.raises(hd.ShapeError, match=r"x has shape \(2, 5, 5\) \(3 dimension\(s\)\), but conv2d "
                                            "unpacks its shape into 4 names"):
        P.conv2d(np.ones((2, 5, 5)), W4)
    with pytest.raises(hd.ShapeError, match=r"x has shape \(3,\) .* x.shape\[1\] does not exist"):
        P.softmax(np.ones(3))
    with pytest.raises(hd.ShapeError, match=r"indexed with 1 index"):
        hd.func(lambda a: hd.compute((2,), lambda i: a[i]))(np.ones((2, 2)))


def test_kernel_larger_than_the_image():
    with pytest.raises(hd.ShapeError, match=r"shape \(1, 3, 0, 0\) has a dimension of size 0; every "
                                            "extent must be positive"):
        P.conv2d(np.ones((1, 2, 2, 2)), np.ones((3, 2, 3, 3)))


def test_broadcasting_that_fails():
    with pytest.raises(hd.ShapeError, match=r"shapes \(2, 3\) and \(2,\) do not broadcast together"):
        hd.func(lambda a, b: a * b)(np.ones((2, 3)), np.ones(2))
    with pytest.raises(hd.ShapeError, match=r"matmul needs \(m, k\) @ \(k, n\)"):
        hd.func(lambda a, b: a @ b)(np.ones((2, 3)), np.ones((2, 3)))


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64, object, np.float16, "U3", "M8[s]"])
def test_unusable_dtypes(dtype):
    a = np.ones((3, 3)).astype(dtype) if dtype != object else np.array([[1.0, None]], dtype=object)
    with pytest.raises(hd.DTypeError, match=re.escape(f"has dtype {np.dtype(dtype)}; halide_ad takes float32 "
                                            "and float64 arrays")):
        P.blur3(a)


def test_bool_or_int_where_float_is_needed():
    with pytest.raises(hd.NotDifferentiableError, match=r"argument 0 \('x'\) of <lambda> is a bool array: "
                                                        "integer and bool arrays are data"):
        hd.grad(lambda x: hd.sum(hd.cast(x, "float64")))(np.ones(3, bool))
    with pytest.raises(hd.DTypeError, match="check_grad needs at least one float32 or float64 array "
                                            "argument, got bool"):
        hd.check_grad(lambda x: hd.cast(x, "float64") * 2.0, np.ones(3, bool))
    with pytest.raises(hd.DTypeError, match="the cotangent for output 'blur3' has dtype bool"):
        hd.vjp(P.blur3, np.ones((3, 3)))[1](np.ones((3, 3), bool))


def test_non_array_arguments(interpreted):
    with pytest.raises(hd.TraceError, match="argument 'img' is a list; pass numpy arrays"):
        P.blur3([[1.0, 2.0]])
    with pytest.raises(hd.TraceError, match=r"argument 'x' of conv2d is NoneType None, but conv2d uses it "
                                            r"as an array \(x.shape\): pass a numpy array") as e:
        P.conv2d(None, W4)
    assert isinstance(e.value.__cause__, AttributeError)  # Python's own error stays attached
    with pytest.raises(hd.TraceError, match=r"argument 'x' of softmax is float 2.5, but softmax uses it"):
        P.softmax(2.5)
    with pytest.raises(hd.TraceError, match="argument 'x' is a dict"):
        P.softmax({"a": 1})
    lookup = hd.func(lambda t, idx: hd.compute(idx.shape, lambda i: t[idx[i]]))
    with pytest.raises(hd.TraceError, match=r"argument 't' of <lambda> is float 1.0, but <lambda> uses it "
                                            r"as an array \(t\[...\]\)"):
        lookup(np.float64(1.0), np.array([0, 1]))
    with pytest.raises(hd.TraceError, match=r"the symbolic tensor view cannot be a dict key .* was an array "
                                            "passed where a static option"):
        P.blur3(np.ones((3, 4)), np.ones(2))


def test_arrays_that_numpy_accepts_are_accepted(interpreted):
    """0-d arrays stay 0-d, foreign byte order and strides are converted, numpy scalars are static."""
    assert hd.func(lambda x: x * 2.0)(np.array(3.0)).shape == ()
    assert hd.grad(lambda x: x * x)(np.array(3.0)) == 6.0
    img = np.arange(24.0).reshape(4, 6)
    expect = P.numpy_blur3(img[:, ::2], "mirror")
    np.testing.assert_array_equal(P.blur3(img[:, ::2], "mirror"), expect)
    np.testing.assert_array_equal(P.blur3(img[:, ::2].astype(">f8"), "mirror"), expect)
    np.testing.assert_array_equal(P.blur3(np.asfortranarray(img), "mirror"), P.numpy_blur3(img, "mirror"))
    tile = hd.func(lambda x, n: hd.compute((n,), lambda i: x[i % 2] * 1.0))
    assert tile(np.array([1.0, 2.0]), np.int64(3)).tolist() == [1.0, 2.0, 1.0]


def test_zero_size_dimensions():
    with pytest.raises(hd.ShapeError, match=r"argument 'img' has shape \(0, 3\), with no elements; every "
                                            "dimension must be at least 1"):
        P.blur3(np.ones((0, 3)))
    with pytest.raises(hd.ShapeError, match=r"hd.compute's shape \(3, 0\) has a dimension of size 0"):
        hd.func(lambda a: hd.compute((3, 0), lambda i, j: a[i]))(np.ones(3))


@pytest.mark.parametrize("extent", [0, -2, (3, 3), (2, 1)])
def test_non_positive_rdom_extents(extent):
    with pytest.raises(hd.ShapeError, match=r"hd.rdom extent .* is empty; extents must be positive"):
        hd.func(lambda a: hd.compute((), lambda: hd.sum(a[hd.rdom(extent) % 3])))(np.ones(3))


def test_huge_and_negative_sizes():
    with pytest.raises(hd.ShapeError, match=r"has 1.13e\+15 elements, more than any machine can hold"):
        hd.func(lambda a, n: hd.compute((n, n), lambda i, j: a[i % 3]))(np.ones(3), 2**25)
    with pytest.raises(hd.ShapeError, match=r"shape \(-4,\) has a dimension of size -4"):
        hd.func(lambda a, n: hd.compute((n,), lambda i: a[i % 3]))(np.ones(3), -4)
    with pytest.raises(hd.ShapeError, match=r"reshape's shape \(-5, 3\) has a dimension of size -5"):
        hd.func(lambda a: a.reshape(-5, 3))(np.ones(6))
    # a stage whose loops would run for hours is refused before anything is compiled
    with pytest.raises(hd.ShapeError, match=r"loops over 2e\+12 points \(shape \(2,\), reduction ranges "
                                             r"\[\(0, 1000000000000\)\]\), past halide_ad's limit .*"
                                             r"HALIDE_AD_MAX_POINTS"):
        hd.func(lambda a: hd.compute((2,), lambda i: hd.sum(a[i] + 0.0 * hd.rdom(10**12))))(np.ones(2))
    with pytest.raises(hd.ShapeError, match=r"hd.rdom extent \(10000000000000000000, 10000000000000000002\) "
                                             r"reaches past 2\*\*48"):
        hd.func(lambda a: hd.compute((2,), lambda i: hd.sum(a[i] + hd.rdom((10**19, 10**19 + 2)))))(np.ones(2))


# ---- Python on symbolic values ------------------------------------------------------------------

def test_python_control_flow_on_symbolic_values():
    def branchy(x):
        return hd.compute(x.shape, lambda i: x[i] if x[i] > 0 else 0.0)
    with pytest.raises(hd.TraceError, match=r"cannot use the symbolic value `x\[i\] > 0.0` as a Python "
                                            r"bool.*use hd.where\(cond, a, b\)") as e:
        hd.func(branchy)(np.ones(3))
    assert "x[i] if x[i] > 0 else 0.0" in str(e.value)  # the user's line
    with pytest.raises(hd.TraceError, match="Python control flow"):
        hd.func(lambda x: hd.compute(x.shape, lambda i: (x[i] > 0) and (x[i] < 1)))(np.ones(3))
    with pytest.raises(hd.TraceError, match=r"no truth value while tracing.*hd.where"):
        hd.func(lambda x: x * 2 if x > 0 else x)(np.ones(3))


@pytest.mark.parametrize("builtin, hint", [(max, "hd.maximum"), (min, "hd.minimum")])
def test_python_max_min_on_symbolic_values(builtin, hint):
    with pytest.raises(hd.TraceError, match=hint):
        hd.func(lambda x: hd.compute(x.shape, lambda i: builtin(x[i], 0.0)))(np.ones(3))
    with pytest.raises(hd.TraceError, match=hint):
        hd.func(lambda x: builtin(x, 0.0))(np.ones(3))


def test_python_abs_round_on_symbolic_values():
    with pytest.raises(hd.TraceError, match=r"Python's abs\(\) on the symbolic value `x\[i\]`: use hd.abs"):
        hd.func(lambda x: hd.compute(x.shape, lambda i: abs(x[i])))(np.ones(3))
    with pytest.raises(hd.TraceError, match=r"Python's round\(\) on the symbolic value `x\[i\]`: use hd.round"):
        hd.func(lambda x: hd.compute(x.shape, lambda i: round(x[i])))(np.ones(3))
    with pytest.raises(hd.TraceError, match=r"Python's abs\(\) on the symbolic tensor x: use hd.abs\(x\)"):
        hd.func(lambda x: abs(x))(np.ones(3))
    with pytest.raises(hd.TraceError, match=r"Python's round\(\) on the symbolic tensor x: use hd.round\(x\)"):
        hd.func(lambda x: round(x))(np.ones(3))


# ---- gradients ----------------------------------------------------------------------------------

def test_grad_of_a_non_scalar():
    with pytest.raises(hd.NotDifferentiableError, match=r"hd.grad needs blur3 to return one scalar "
                                                        r"\(shape \(\)\), but it returned shape\(s\) "
                                                        r"\[\(3, 3\)\]; reduce it .* or use hd.vjp"):
        hd.grad(P.blur3)(np.ones((3, 3)))


def test_gradient_with_respect_to_an_integer_array_or_a_static_argument():
    gather = lambda t, idx: hd.sum(hd.compute(idx.shape, lambda i: t[idx[i]]))
    with pytest.raises(hd.NotDifferentiableError, match=r"argument 1 \('idx'\) of <lambda> is a int64 "
                                                        "array: integer and bool arrays are data"):
        hd.grad(gather, argnums=1)(np.ones(4), np.array([0, 3]))
    with pytest.raises(hd.NotDifferentiableError, match="argument 1 of <lambda> is a static value"):
        hd.grad(lambda x, view: hd.sum(P.blur1d(x, view)), argnums=1)(np.ones(4), "mirror")
    with pytest.raises(hd.NotDifferentiableError, match="argnums must be an int or a tuple of ints"):
        hd.grad(lambda x: hd.sum(x), argnums="x")(np.ones(3))


# ---- what hd.compute cannot trace ---------------------------------------------------------------

@pytest.mark.parametrize("body, message", [
    (lambda x, i: np.exp(x[i]), (r"numpy's np.exp cannot compute on the symbolic value `x\[i\]` while "
                                 "tracing: use hd.exp")),
    (lambda x, i: np.maximum(x[i], 0.0), "np.maximum .* use hd.maximum"),
    (lambda x, i: np.where(x[i] > 0, x[i], 0.0), "np.where cannot run .* use hd.where"),
    (lambda x, i: np.arccosh(x[i]), "np.arccosh .* halide_ad has no such function"),
    (lambda x, i: math.sin(x[i]), r"Python's math module, int\(\), float\(\) .*hd.sin"),
    (lambda x, i: [1.0, 2.0, 3.0][i], "list indexing cannot use it"),
    (lambda x, i: {x[i]: 1.0}[x[i]], "cannot be a dict key or a set member"),
    (lambda x, i: x[i] + "a", "cannot use str 'a' in a halide_ad expression"),
    (lambda x, i: None, "cannot use NoneType None in a halide_ad expression"),
    (lambda x, i: x, "returned the whole tensor"),
    (lambda x, i: x[i * 1.0], r"the index `i \* 1.0` into x is float64; indices must be integers"),
    (lambda x, i: hd.compute((2,), lambda j: x[j])[0], "hd.compute was called inside another hd.compute"),
])
def test_unknown_function_or_unsupported_construct_inside_compute(body, message):
    with pytest.raises(hd.TraceError, match=message):
        hd.func(lambda x: hd.compute(x.shape, lambda i: body(x, i)))(np.ones(3))


def test_numpy_functions_and_math_on_whole_tensors():
    with pytest.raises(hd.TraceError, match="np.exp cannot compute on the symbolic value .* use hd.exp"):
        hd.func(lambda x: np.exp(x))(np.ones(3))
    with pytest.raises(hd.TraceError, match="numpy's np.sum cannot run .* use hd.sum"):
        hd.func(lambda x: np.sum(x))(np.ones(3))
    with pytest.raises(hd.TraceError, match="has no Python or numpy value while tracing"):
        hd.func(lambda x: math.sin(x))(np.ones(3))
    with pytest.raises(hd.TraceError, match="hd.compute needs a function of the index variables"):
        hd.func(lambda x: hd.compute(x.shape, 3.0))(np.ones(3))
    with pytest.raises(hd.TraceError, match="integers to negative integer powers are not allowed"):
        hd.func(lambda x: x ** -1)(np.ones(3, np.int64))


def test_numpy_scalars_and_shape_queries_still_work(interpreted):
    x = np.arange(3.0)
    out = hd.func(lambda t: np.float64(2) * t - np.float32(1) + np.ones(1)[0] * 0.0)(x)
    np.testing.assert_array_equal(out, 2 * x - 1)
    assert hd.func(lambda t: hd.compute(np.shape(t), lambda i: t[i] * np.ndim(t)))(x).tolist() == [0, 1, 2]


# ---- z3 timeouts, NaN and Inf: not errors -------------------------------------------------------

class _Undecided:
    """A z3 query that always answers `unknown`, as one that ran out of time does."""

    def __init__(self, query_class):
        self.query_class = query_class

    def __call__(self, *args, **kwargs):
        q = self.query_class(*args, **kwargs)
        q.check = lambda: "unknown"
        return q


def test_z3_timeout_falls_back_to_a_scatter_with_a_warning(interpreted, monkeypatch, tmp_path):
    monkeypatch.setenv("HALIDE_AD_CACHE_DIR", str(tmp_path))  # no inverse from the solver's disk cache
    z3_bridge = importlib.import_module("halide_ad.solver.z3_bridge")
    invert = importlib.import_module("halide_ad.solver.invert")
    monkeypatch.setattr(z3_bridge, "DEFAULT_TIMEOUT_MS", 1)
    monkeypatch.setattr(invert, "Query", _Undecided(invert.Query))  # 1 ms is not always too short
    monkeypatch.setattr(invert, "_cache", {})

    @hd.func
    def dilated(x, w):
        r = hd.rdom(w.shape[0])
        return hd.compute((x.shape[0] - 2 * w.shape[0] + 2,), lambda i: hd.sum(x[i + 2 * r] * w[r]))

    x, w = np.arange(17.0), np.array([1.0, -2.0, 3.0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = hd.explain(dilated, x, w)
    messages = [str(c.message) for c in caught if issubclass(c.category, hd.HalideADWarning)]
    assert any(re.match(r"adj_x\[i \+ 2 \* r\] \(.*test_messages.py:\d+, in <lambda>\) stays a scatter-"
                        r".*: z3 could not decide the inverse within its time limit \(1 ms\)", m)
               for m in messages), messages
    assert "kept as a scatter: z3 could not decide the inverse within its time limit" in str(report)
    assert set(report.forms("x")) <= {"scatter-parallel", "scatter-serial"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hd.HalideADWarning)
        out, f_vjp = hd.vjp(dilated, x, w)
        ct = np.arange(out.size, dtype=np.float64) - 4
        dx, dw = f_vjp(ct)
    traced, arrays = as_function(dilated).trace((x, w), {})
    ref = scatter_adjoints(traced.program, ("x", "w"), arrays | evaluate(traced.program, arrays),
                           {traced.program.outputs[0]: ct})
    np.testing.assert_array_equal(dx, ref["x"])
    np.testing.assert_array_equal(dw, ref["w"])


def test_z3_timeout_in_a_bounds_proof_checks_the_read_when_the_kernel_runs(monkeypatch):
    bounds = importlib.import_module("halide_ad.solver.bounds")
    monkeypatch.setattr(bounds, "Query", _Undecided(bounds.Query))

    @hd.func
    def shifted(x):  # x[i - 1] only where i >= 1: intervals alone cannot tell, z3 is needed
        return hd.compute(x.shape, lambda i: hd.where(i >= 1, x[i - 1], 0.0) * 2.0)

    x = np.arange(5.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = shifted(x)
    messages = [str(c.message) for c in caught if issubclass(c.category, hd.HalideADWarning)]
    assert any(re.match(r"x\[i - 1\] \(.*test_messages.py:\d+, in <lambda>\): z3 could not prove that "
                        r"dimension\(s\) \[0\] stay inside x within its time limit .*the kernels check "
                        r"them when they run", m) for m in messages), messages
    np.testing.assert_array_equal(out, [0.0, 0.0, 2.0, 4.0, 6.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hd.HalideADWarning)
        assert "x[nonneg(checked((i - 1), 5, status" in hd.explain(shifted, x).forward_source
        hd.check_grad(shifted, x)

        @hd.func
        def past_the_end(x):  # reads x[5] at i = 4: z3 would have said so; the kernel does instead
            return hd.compute(x.shape, lambda i: hd.where(i >= 0, x[i + 1], 0.0))
        with pytest.raises(hd.BoundsError, match=r"an index z3 could not bound was 5, outside dimension 0 "
                                                 r"of x \(valid: 0..4\), read at .*Read through a boundary "
                                                 r"view"):
            past_the_end(x)


def test_nan_and_inf_propagate_like_numpy_and_stay_put():
    img = np.arange(30.0).reshape(5, 6)
    img[2, 3], img[0, 0], img[4, 5] = np.nan, np.inf, -np.inf
    got = P.blur3(img, "mirror")
    np.testing.assert_array_equal(got, P.numpy_blur3(img, "mirror"))  # NaNs in the same places
    assert np.isnan(got).sum() == 3 and np.isfinite(got[[1, 3]]).all()

    x = np.arange(48.0).reshape(1, 2, 4, 6)
    x[0, 1, 0, 1], x[0, 0, 3, 5] = np.nan, np.inf
    pooled = P.maxpool2(x)
    expect = x.reshape(1, 2, 2, 2, 3, 2).transpose(0, 1, 2, 4, 3, 5).reshape(1, 2, 2, 3, 4).max(-1)
    np.testing.assert_array_equal(pooled, expect)
    assert np.isnan(pooled).sum() == 1 and np.isinf(pooled).sum() == 1

    # the gradient of a linear stencil does not depend on the data: NaN in x leaves it finite,
    # and a NaN cotangent reaches only the inputs that the NaN output read
    _, f_vjp = hd.vjp(P.blur3, img, "mirror")
    ct = np.ones_like(img)
    (g, _) = f_vjp(ct)
    assert np.isfinite(g).all()
    ct[1, 1] = np.nan
    (g, _) = f_vjp(ct)
    assert set(zip(*np.nonzero(np.isnan(g)))) == {(1, 0), (1, 1), (1, 2)}
