"""The Hessian-vector product case (`python -m benchmarks --cases hvp`): the HVP of a clamped-stencil
energy, a data term through a clamped blur plus a smoothed total variation, on a 2048^2 float32
image, in each library, with one gradient of the same energy as the yardstick.

* halide_ad: `hd.jvp(hd.grad(E), ...)` (forward over reverse) and `hd.grad` of `<hd.grad(E), v>`
  (reverse over reverse), each one `@hd.func`, so one compiled program per product;
* JAX: `jax.jit` of `jax.jvp(jax.grad(E), ...)`, and of `jax.grad(E)`;
* PyTorch: `torch.func.jvp(torch.func.grad(E), ...)`, and double backward
  (`torch.autograd.grad(..., create_graph=True)` then a second `torch.autograd.grad`), each from
  the input, as a user calls them; the gradient is `torch.func.grad(E)`.

Every time is a whole call, from arrays to arrays (the forward pass included), a median of
`--repeat` runs after three warm-up calls. Every HVP is checked against halide_ad's forward over
reverse to float32 rounding.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

import halide_ad as hd
from benchmarks import peers
from benchmarks.timing import measure
from halide_ad import tiered

SIZE, SMALL_SIZE = 2048, 64
LAMBDA, EPSILON = 0.1, 0.01  # the weight of the total variation, and its smoothing


@dataclass(frozen=True, slots=True)
class HvpCase:
    name: str = "hvp"
    description: str = (f"the Hessian-vector product of a clamped-stencil energy (a data term through a "
                        f"clamped blur plus a smoothed total variation) on a {SIZE}^2 float32 image, "
                        "against one gradient of the energy")


HVP = HvpCase()


@dataclass(slots=True)
class HvpRow:
    """One way of computing one quantity in one library: its median in seconds, and its check."""

    library: str
    what: str  # "gradient", "HVP, forward over reverse", "HVP, reverse over reverse"
    seconds: float | None = None
    mismatch: str | None = None  # how its values differ from halide_ad's
    error: str | None = None


def energy(u, target):
    """The energy of `examples/newton_denoise.py`: 0.5 |blur(u) - target|^2 + LAMBDA * TV_eps(u),
    the blur and the forward differences reading u with its edges repeated."""
    c = hd.repeat_edge(u)
    blur = hd.compute(u.shape, lambda y, x: (c[y - 1, x] + c[y + 1, x] + c[y, x - 1] + c[y, x + 1]
                                             + 4 * c[y, x]) / 8, name="blur")
    tv = hd.compute(u.shape, lambda y, x: hd.sqrt((c[y, x + 1] - c[y, x]) ** 2 + (c[y + 1, x] - c[y, x]) ** 2
                                                  + EPSILON), name="tv")
    return 0.5 * hd.sum((blur - target) ** 2) + LAMBDA * hd.sum(tv)


grad_energy = hd.grad(energy)


@hd.func
def hvp_forward_over_reverse(u, target, v):
    return hd.jvp(lambda u: grad_energy(u, target), (u,), (v,))[1]


@hd.func
def hvp_reverse_over_reverse(u, target, v):
    return hd.grad(lambda u: hd.sum(grad_energy(u, target) * v))(u)


def _jax_energy(jnp):
    def energy(u, target):
        c = jnp.pad(u, 1, mode="edge")
        blur = (c[:-2, 1:-1] + c[2:, 1:-1] + c[1:-1, :-2] + c[1:-1, 2:] + 4 * c[1:-1, 1:-1]) / 8
        tv = jnp.sqrt((c[1:-1, 2:] - c[1:-1, 1:-1]) ** 2 + (c[2:, 1:-1] - c[1:-1, 1:-1]) ** 2 + EPSILON)
        return 0.5 * jnp.sum((blur - target) ** 2) + LAMBDA * jnp.sum(tv)
    return energy


def _torch_energy(torch):
    def energy(u, target):
        c = torch.nn.functional.pad(u[None, None], (1, 1, 1, 1), mode="replicate")[0, 0]
        blur = (c[:-2, 1:-1] + c[2:, 1:-1] + c[1:-1, :-2] + c[1:-1, 2:] + 4 * c[1:-1, 1:-1]) / 8
        tv = torch.sqrt((c[1:-1, 2:] - c[1:-1, 1:-1]) ** 2 + (c[2:, 1:-1] - c[1:-1, 1:-1]) ** 2 + EPSILON)
        return 0.5 * ((blur - target) ** 2).sum() + LAMBDA * tv.sum()
    return energy


def _halide_ad(u, target, v) -> dict[str, Callable[[], np.ndarray]]:
    return {"gradient": lambda: grad_energy(u, target),
            "HVP, forward over reverse": lambda: hvp_forward_over_reverse(u, target, v),
            "HVP, reverse over reverse": lambda: hvp_reverse_over_reverse(u, target, v)}


def _jax(u, target, v) -> dict[str, Callable[[], np.ndarray]]:
    jax = peers.load_jax()
    energy = _jax_energy(jax.numpy)
    uj, tj, vj = (jax.device_put(a) for a in (u, target, v))
    gradient = jax.jit(jax.grad(energy))
    hvp = jax.jit(lambda u, t, v: jax.jvp(lambda u: jax.grad(energy)(u, t), (u,), (v,))[1])
    return {"gradient": lambda: np.asarray(jax.block_until_ready(gradient(uj, tj))),
            "HVP, forward over reverse": lambda: np.asarray(jax.block_until_ready(hvp(uj, tj, vj)))}


def _torch(u, target, v) -> dict[str, Callable[[], np.ndarray]]:
    torch = peers.load_torch(thp=False)
    energy = _torch_energy(torch)
    ut, tt, vt = (torch.from_numpy(a) for a in (u, target, v))
    gradient = torch.func.grad(energy)

    def double_backward():
        x = ut.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(energy(x, tt), x, create_graph=True)
        return torch.autograd.grad(g, x, vt)[0].numpy()

    return {"gradient": lambda: gradient(ut, tt).numpy(),
            "HVP, forward over reverse":
                lambda: torch.func.jvp(lambda x: gradient(x, tt), (ut,), (vt,))[1].numpy(),
            "HVP, reverse over reverse": double_backward}


LIBRARIES = {"halide_ad": _halide_ad, "jax": _jax, "torch": _torch}


def run_hvp(*, small: bool, repeat: int, peer_names: Sequence[str]) -> list[HvpRow]:
    """Each library's rows; halide_ad's forward-over-reverse HVP is the reference."""
    size = SMALL_SIZE if small else SIZE
    rng = np.random.default_rng(0)
    u, target, v = (rng.standard_normal((size, size), dtype=np.float32) for _ in range(3))
    rows, reference = [], {}
    for library in ("halide_ad", *peer_names):
        for what, fn in LIBRARIES[library](u, target, v).items():
            row = HvpRow(library, what)
            rows.append(row)
            try:
                values = fn()  # compiles
                tiered.settle()
                reference.setdefault(what.split(",")[0], values)
                row.mismatch = _differs(values, reference[what.split(",")[0]])
                row.seconds = measure(fn, repeat).median_ms * 1e-3
            except Exception as error:  # noqa: BLE001 (a peer's failure is reported, not fatal)
                row.error = f"{type(error).__name__}: {error}"
    return rows


def _differs(got: np.ndarray, want: np.ndarray) -> str | None:
    scale = np.abs(want).max()
    difference = np.abs(got - want).max()
    if difference <= 1e-4 * scale:
        return None
    return f"max abs difference {difference:.3g} (largest entry {scale:.3g})"


def hvp_table(rows: list[HvpRow]) -> list[str]:
    """The markdown table (each time also over the same library's gradient, and a peer's time over
    halide_ad's for the same quantity, its jvp(grad) for an HVP), then whether the issue's target holds."""
    seconds = {(r.library, r.what): r.seconds for r in rows}
    ours = seconds.get(("halide_ad", "HVP, forward over reverse"))
    header = ["library", "computes", "time", "/ its gradient", "/ halide_ad's", "check"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        gradient = seconds.get((r.library, "gradient"))
        cells = [r.library, r.what]
        if r.seconds is None:
            cells += ["error", "–", "–", r.error or "–"]
        else:
            # a peer's gradient over halide_ad's gradient, a peer's HVP over halide_ad's jvp(grad)
            ours_of_kind = seconds.get(("halide_ad", "gradient")) if r.what == "gradient" else ours
            cells += [f"{r.seconds * 1e3:.3g} ms",
                      "–" if r.what == "gradient" or not gradient else f"{r.seconds / gradient:.2f}",
                      "–" if not ours_of_kind or r.library == "halide_ad"
                      else f"{r.seconds / ours_of_kind:.2f}",
                      f"✗ {r.mismatch}" if r.mismatch else "ok"]
        lines.append("| " + " | ".join(cells) + " |")
    gradient = seconds.get(("halide_ad", "gradient"))
    peer_hvps = [s for (library, what), s in seconds.items()
                 if library != "halide_ad" and what.startswith("HVP") and s is not None]
    if ours and gradient and peer_hvps:
        faster = ours < min(peer_hvps)
        lines += ["", f"Target (faster than every peer's HVP, at most 3x one gradient): halide_ad's "
                      f"jvp(grad) is {min(peer_hvps) / ours:.2f}x as fast as the fastest peer HVP "
                      f"({'met' if faster else 'missed'}) and {ours / gradient:.2f}x its gradient "
                      f"({'met' if ours <= 3 * gradient else 'missed'})."]
    return lines
