"""The driver's optional passes (HALIDE_AD_SKIP) and its stage dumps (HALIDE_AD_DUMP)."""
import numpy as np
import pytest

import halide_ad as hd
import halide_ad.ops as ops
from halide_ad.compiler import plan_gradient
from halide_ad.runtime.contract import Contraction


def layer(x, w):
    y = ops.conv2d(x, w, padding=1)
    return hd.sum(hd.relu(y) * y)


def _data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((2, 3, 6, 6)), rng.standard_normal((2, 3, 3, 3))


@pytest.mark.parametrize("skip", ["route", "inline", "fuse", "route,inline,fuse"])
def test_each_optional_pass_can_be_left_out(monkeypatch, skip):
    x, w = _data()
    expected = hd.grad(layer, argnums=(0, 1))(x, w)
    monkeypatch.setenv("HALIDE_AD_SKIP", skip)
    got = hd.grad(lambda x, w: layer(x, w) + 0.0, argnums=(0, 1))(x, w)  # a new program: compiled again
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-10)
    traced, _ = hd.func(lambda x, w: layer(x, w) + 0.0).trace((x, w), {})
    plans = plan_gradient(traced.program, ("x", "w"))
    engines = [c for p in plans for c in p.contributions if isinstance(c, Contraction)]
    assert (not engines) == ("route" in skip)
    assert any(p.inlined for p in plans) == ("inline" not in skip)


def test_dump_prints_each_named_stage(monkeypatch, capsys):
    x, w = _data()
    monkeypatch.setenv("HALIDE_AD_DUMP", "ad,invert,route,inline")
    traced, _ = hd.func(lambda x, w: layer(x, w) * 2.0).trace((x, w), {})
    plan_gradient(traced.program, ("x", "w"))
    out = capsys.readouterr().out
    for stage in ("-- ad", "-- invert", "-- route", "-- inline"):
        assert stage in out
    assert "[gather-window] [BLAS]" in out or "[gather-window] [direct" in out
