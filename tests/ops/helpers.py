"""Shared checks for the operator tests: halide_ad's forward and backward against PyTorch's, for
programs that return one array or a dict / tuple of them."""
from __future__ import annotations

import numpy as np
import pytest

import halide_ad as hd


def leaves(out) -> list:
    if isinstance(out, dict):
        return [x for k in out for x in leaves(out[k])]
    if isinstance(out, (tuple, list)):
        return [x for v in out for x in leaves(v)]
    return [out]


def like(out, values: list):
    """`values` arranged in the structure of `out`."""
    it = iter(values)

    def go(o):
        if isinstance(o, dict):
            return {k: go(v) for k, v in o.items()}
        if isinstance(o, (tuple, list)):
            return type(o)(go(v) for v in o)
        return next(it)
    return go(out)


def matches_torch(program, torch_fn, *args, rtol: float = 1e-9, atol: float = 1e-11, seed: int = 0,
                  skip_grad: tuple[int, ...] = ()):
    """Forward outputs and the vjp of a random cotangent agree with torch_fn's.

    torch_fn takes the same arguments as torch tensors (float ones require grad) and returns the
    outputs in the same structure. Arguments listed in `skip_grad`, and those whose torch gradient
    is None, are compared by finite differences only (hd.check_grad).
    """
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    out, f_vjp = hd.vjp(program, *args)
    outs = leaves(out)
    cts = [rng.standard_normal(np.shape(o)) for o in outs]
    grads = f_vjp(like(out, cts))
    targs = [torch.tensor(a, requires_grad=a.dtype.kind == "f" and k not in skip_grad)
             if isinstance(a, np.ndarray) else a for k, a in enumerate(args)]
    touts = leaves(torch_fn(*targs))
    assert len(touts) == len(outs), f"torch gave {len(touts)} outputs, halide_ad {len(outs)}"
    names = leaves(like(out, list(_paths(out))))
    for name, o, t in zip(names, outs, touts, strict=True):
        np.testing.assert_allclose(o, t.detach().numpy(), rtol=rtol, atol=atol, err_msg=f"forward {name}")
    wrt = [k for k, a in enumerate(targs) if isinstance(a, torch.Tensor) and a.requires_grad]
    pairs = [(t, torch.tensor(c)) for t, c in zip(touts, cts, strict=True) if t.requires_grad]
    tgrads = torch.autograd.grad([t for t, _ in pairs], [targs[k] for k in wrt], [c for _, c in pairs],
                                 allow_unused=True)
    for k, tg in zip(wrt, tgrads, strict=True):
        if tg is not None:
            np.testing.assert_allclose(grads[k], tg.numpy(), rtol=rtol, atol=atol, err_msg=f"gradient of argument {k}")
    return out


def _paths(out, prefix: str = ""):
    if isinstance(out, dict):
        for k, v in out.items():
            yield from _paths(v, f"{prefix}[{k!r}]")
    elif isinstance(out, (tuple, list)):
        for k, v in enumerate(out):
            yield from _paths(v, f"{prefix}[{k}]")
    else:
        yield prefix or "output"


def forms(program, *args) -> dict[str, list[str]]:
    """Each adjoint's contribution forms, by buffer, from hd.explain."""
    out: dict[str, list[str]] = {}
    for c in hd.explain(program, *args).contributions:
        out.setdefault(c.buffer, []).append(c.form)
    return out


def all_gathers(program, *args) -> bool:
    return all(f.startswith("gather") for fs in forms(program, *args).values() for f in fs)
