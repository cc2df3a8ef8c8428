"""HALIDE_AD_JIT=0 runs the generated kernels as plain Python (the README's debug mode): a few
programs of the ops library, forward and gradient, agree with the compiled kernels. The plain
run is a subprocess, since the setting is read when a kernel compiles, and a kernel compiled
once is reused."""
import os
import pathlib
import subprocess
import sys

import numpy as np

import halide_ad as hd
from halide_ad import ops

ROOT = pathlib.Path(__file__).resolve().parents[2]


@hd.func
def blur3(img):
    c = hd.repeat_edge(img)
    return hd.compute(img.shape, lambda y, x: (c[y, x - 1] + c[y, x] + c[y, x + 1]) / 3)


@hd.func
def conv(x, w, b):
    return ops.relu(ops.conv2d(x, w, b, padding=1))


@hd.func
def pool(x):
    return ops.max_pool2d(x, 2)


@hd.func
def softmax(x):
    return ops.softmax(x, axis=-1)


@hd.func
def histogram(idx, w):
    h = hd.zeros((5,), w.dtype)
    r = hd.rdom(idx.shape[0])
    h[hd.clamp(idx[r], 0, 4)] += w[r] * w[r]
    return h


def results() -> dict[str, np.ndarray]:
    """Each program's output and its vjp with a fixed cotangent, float64."""
    rng = np.random.default_rng(0)
    cases = {
        "blur3": (blur3, (rng.standard_normal((5, 7)),)),
        "conv": (conv, (rng.standard_normal((2, 3, 6, 6)), rng.standard_normal((2, 3, 3, 3)),
                        rng.standard_normal(2))),
        "pool": (pool, (rng.standard_normal((2, 2, 6, 6)),)),
        "softmax": (softmax, (rng.standard_normal((3, 8)),)),
        "histogram": (histogram, (rng.integers(-1, 7, 20), rng.standard_normal(20))),
    }
    out = {}
    for name, (fn, args) in cases.items():
        value, vjp_fn = hd.vjp(fn, *args)
        out[f"{name}.value"] = np.asarray(value)
        grads = vjp_fn(rng.standard_normal(np.shape(value)))
        for k, g in enumerate(grads):
            if g is not None:
                out[f"{name}.grad{k}"] = np.asarray(g)
    return out


def test_plain_python_kernels_agree_with_compiled_ones(tmp_path):
    path = tmp_path / "plain.npz"
    env = dict(os.environ, HALIDE_AD_JIT="0", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = "import sys, numpy as np; from tests.runtime.test_no_jit import results; np.savez(sys.argv[1], **results())"
    run = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    plain = dict(np.load(path))
    compiled = results()
    assert sorted(plain) == sorted(compiled)
    assert len(compiled) == 12  # 5 values, 7 gradients (not the histogram's integer index)
    for key, value in compiled.items():
        np.testing.assert_allclose(plain[key], value, rtol=1e-12, atol=1e-12, err_msg=key)
