"""The update-definition cases (`python -m benchmarks --cases updates`, issue 29): a histogram, a
linear recurrence and a bilateral-grid splat, each written with `t[index] += value` in halide_ad and
in PyTorch's and JAX's own formulations, forward and backward.

These cases have integer inputs and gradients with respect to some inputs only, so they are timed
here rather than as `Case`s (whose inputs are all float and all differentiated), the same way:
medians of `--repeat` calls after three warm-up calls, halide_ad's backward as `vjp_fn(ct)` after
`hd.vjp`, PyTorch's forward under no_grad and its backward as `torch.autograd.grad` on a graph built
once (default allocator), JAX's as the jitted vjp function on a jitted `jax.vjp`'s residuals. Where
a library has several formulations, each is timed and the faster one reported, named in the
table. halide_ad's values are checked against the first peer's (`benchmarks.checks`), and its
forward is run twice more and compared bit for bit (`deterministic`).

The backward's peak memory (`benchmarks.memory`, a fresh process per case and library) is measured
on each library's first differentiable formulation (PyTorch's index_add_ and loop, JAX's .at[].add
and lax.scan) and reported in the notes.
"""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

import halide_ad as hd
from benchmarks import memory, peers
from benchmarks.checks import compare_arrays
from benchmarks.runner import Row
from benchmarks.timing import measure, time_once
from halide_ad import tiered

BINS = 256
SPLAT_CELL, SPLAT_LEVELS = 8, 8  # as examples/bilateral_grid.py: S, D


# --- halide_ad programs ---------------------------------------------------------------------------


@hd.func
def histogram(idx, w):
    """Sums of the weights w by bin idx, clamped into [0, BINS): a data-dependent index."""
    h = hd.zeros((BINS,), w.dtype)
    r = hd.rdom(idx.shape[0])
    h[hd.clamp(idx[r], 0, BINS - 1)] += w[r]
    return h


@hd.func
def recurrence(a, b):
    """y[m, n] = a[m, n] * y[m, n-1] + b[m, n], y[m, 0] = b[m, 0]: a scan along n."""
    M, N = b.shape
    y = hd.compute((M, N), lambda m, n: b[m, n], name="y")
    m, r = hd.var("m"), hd.rdom((1, N))
    y[m, r] = a[m, r] * y[m, r - 1] + b[m, r]
    return y


@hd.func
def splat(img):
    """examples/bilateral_grid.py's splat of an (H, W, 3) image in [0, 1]: each pixel's colors and a
    count add into the grid cell of its position and brightness."""
    H, W, _ = img.shape
    gray = hd.compute((H, W), lambda y, x: 0.299 * img[y, x, 0] + 0.587 * img[y, x, 1]
                      + 0.114 * img[y, x, 2], name="gray")
    grid = hd.zeros(_grid_shape(H, W), img.dtype)
    c = hd.var("c")
    y, x = hd.rdom(H, W)
    z = hd.clamp(hd.cast(hd.floor(gray[y, x] * (SPLAT_LEVELS - 1) + 0.5), "int64"), 0, SPLAT_LEVELS - 1)
    grid[y // SPLAT_CELL, x // SPLAT_CELL, z, c] += hd.where(c < 3, img[y, x, hd.clamp(c, 0, 2)], 1.0)
    return grid


def _grid_shape(h: int, w: int) -> tuple[int, int, int, int]:
    return (-(-h // SPLAT_CELL), -(-w // SPLAT_CELL), SPLAT_LEVELS, 4)


# --- PyTorch programs -----------------------------------------------------------------------------


def torch_histogram_bincount(idx, w):
    import torch
    return torch.bincount(idx.clamp(0, BINS - 1), weights=w, minlength=BINS).to(w.dtype)


def torch_histogram_index_add(idx, w):
    import torch
    return torch.zeros(BINS, dtype=w.dtype).index_add_(0, idx.clamp(0, BINS - 1), w)


def torch_recurrence_loop(a, b):
    """A Python loop over the 4096 steps, each vectorized over the rows: what a PyTorch user
    writes (torch has no linear-recurrence scan; the cumprod/cumsum closed form under- and
    overflows over thousands of steps)."""
    import torch
    at, bt = a.t().contiguous(), b.t().contiguous()
    y = bt[0]
    ys = [y]
    for n in range(1, bt.shape[0]):
        y = at[n] * y + bt[n]
        ys.append(y)
    return torch.stack(ys, dim=1)


def _gray_level(img, xp):
    """Each pixel's brightness level as a float in [0, SPLAT_LEVELS), in `xp` (torch or jax.numpy)."""
    gray = 0.299 * img[..., 0] + 0.587 * img[..., 1] + 0.114 * img[..., 2]
    return xp.clip(xp.floor(gray * (SPLAT_LEVELS - 1) + 0.5), 0, SPLAT_LEVELS - 1)


def _splat_cells(level, xp):
    """Each pixel's flat grid-cell index, from its position and its (integer) brightness level."""
    h, w = level.shape
    gw = _grid_shape(h, w)[1]
    rows = (xp.arange(h) // SPLAT_CELL)[:, None]
    cols = (xp.arange(w) // SPLAT_CELL)[None, :]
    return ((rows * gw + cols) * SPLAT_LEVELS + level).reshape(-1)


def torch_splat_index_add(img):
    import torch
    h, w, _ = img.shape
    cells = _splat_cells(_gray_level(img, torch).long(), torch)
    values = torch.cat([img, torch.ones((h, w, 1), dtype=img.dtype)], dim=-1).reshape(-1, 4)
    shape = _grid_shape(h, w)
    grid = torch.zeros((shape[0] * shape[1] * shape[2], 4), dtype=img.dtype)
    return grid.index_add_(0, cells, values).reshape(shape)


# --- JAX programs ---------------------------------------------------------------------------------


def jax_histogram(idx, w):
    import jax.numpy as jnp
    return jnp.zeros(BINS, w.dtype).at[jnp.clip(idx, 0, BINS - 1)].add(w)


def jax_recurrence_scan(a, b):
    """`jax.lax.scan` over the columns, carrying one column."""
    import jax.numpy as jnp
    from jax import lax

    def step(y, ab):
        y = ab[0] * y + ab[1]
        return y, y

    _, ys = lax.scan(step, b[:, 0], (a[:, 1:].T, b[:, 1:].T))
    return jnp.concatenate([b[:, :1], ys.T], axis=1)


def jax_recurrence_associative(a, b):
    """`jax.lax.associative_scan` of the affine maps y -> a y + b along each row (log-depth)."""
    from jax import lax

    def combine(first, second):
        return first[0] * second[0], second[0] * first[1] + second[1]

    return lax.associative_scan(combine, (a.at[:, 0].set(0), b), axis=1)[1]


def jax_splat(img):
    import jax.numpy as jnp
    h, w, _ = img.shape
    cells = _splat_cells(_gray_level(img, jnp).astype(jnp.int32), jnp)
    values = jnp.concatenate([img, jnp.ones((h, w, 1), img.dtype)], axis=-1).reshape(-1, 4)
    shape = _grid_shape(h, w)
    return jnp.zeros((shape[0] * shape[1] * shape[2], 4), img.dtype).at[cells].add(values).reshape(shape)


# --- the cases ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Formulation:
    """One way a peer writes the case; `differentiable` is False for one timed forward only.
    `skip_memory` says why its backward's peak memory is not measured, where it is not."""

    name: str
    fn: Callable
    differentiable: bool = True
    skip_memory: str | None = None


@dataclass(frozen=True, slots=True)
class UpdateCase:
    """One update program in halide_ad, its peers' formulations, its inputs and what its backward
    differentiates."""

    name: str
    description: str
    make_inputs: Callable[[bool], list[np.ndarray]]  # small -> the inputs
    out_shape: Callable[..., tuple[int, ...]]  # the inputs' shapes -> the output's
    wrt: tuple[int, ...]  # the inputs the backward differentiates
    halide_ad: Callable
    torch: tuple[Formulation, ...]
    jax: tuple[Formulation, ...]


def _histogram_inputs(small: bool) -> list[np.ndarray]:
    """16M weights, standard normal, and their bins, a few outside [0, BINS) for the clamp."""
    n = 1001 if small else 16 * 2**20
    rng = np.random.default_rng(0)
    return [rng.integers(-8, BINS + 8, n), rng.standard_normal(n, dtype=np.float32)]


def _recurrence_inputs(small: bool) -> list[np.ndarray]:
    """Decays a in [0.5, 1), so y stays bounded over the 4096 steps, and standard normal b."""
    shape = (5, 33) if small else (512, 4096)
    rng = np.random.default_rng(0)
    return [rng.uniform(0.5, 1.0, shape).astype(np.float32), rng.standard_normal(shape, dtype=np.float32)]


def _splat_inputs(small: bool) -> list[np.ndarray]:
    """An image in [0.01, 0.99], with the pixels whose brightness lies within 1e-3 of a level
    boundary moved off it, so that float rounding cannot put a pixel in another cell in one
    library than in another."""
    shape = (37, 29, 3) if small else (2048, 2048, 3)
    img = np.random.default_rng(0).uniform(0.01, 0.98, shape)
    level = img @ np.array([0.299, 0.587, 0.114]) * (SPLAT_LEVELS - 1) + 0.5
    near = np.abs(level - np.round(level)) < 1e-3
    img[near] += 3e-3 / (SPLAT_LEVELS - 1)  # the weights sum to 1: the level moves by 3e-3
    return [img.astype(np.float32)]


UPDATE_CASES: tuple[UpdateCase, ...] = (
    UpdateCase("histogram", f"sums of 16M float32 weights into {BINS} bins by a clamped int index, "
               "h[clamp(idx[r], 0, 255)] += w[r]; backward w.r.t. the weights",
               _histogram_inputs, lambda idx, w: (BINS,), (1,), histogram,
               (Formulation("bincount", torch_histogram_bincount, differentiable=False),
                Formulation("index_add_", torch_histogram_index_add)),
               (Formulation(".at[].add", jax_histogram),)),
    UpdateCase("recurrence", "y[m, n] = a[m, n] y[m, n-1] + b[m, n] on 512 x 4096 float32, "
               "backward w.r.t. a and b",
               _recurrence_inputs, lambda a, b: a, (0, 1), recurrence,
               (Formulation("loop", torch_recurrence_loop, skip_memory=(
                   "the memory process, three forwards and four backwards through the loop's 4096-step "
                   "graph, ran past 5 minutes")),),
               (Formulation("scan", jax_recurrence_scan),
                Formulation("associative_scan", jax_recurrence_associative))),
    UpdateCase("splat", "bilateral-grid splat of a 2048^2 RGB float32 image into a (256, 256, 8, 4) "
               "grid (examples/bilateral_grid.py); backward w.r.t. the image",
               _splat_inputs, lambda img: _grid_shape(*img[:2]), (0,), splat,
               (Formulation("index_add_", torch_splat_index_add),),
               (Formulation(".at[].add", jax_splat),)),
)


# --- measuring ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Run:
    """One formulation's medians (seconds) and values."""

    forward_s: float
    output: np.ndarray
    backward_s: float | None = None
    gradients: tuple[np.ndarray, ...] = ()


def _halide_ad(case: UpdateCase, inputs, ct, repeat: int, first: dict[str, float]) -> _Run:
    out, first["forward"] = time_once(lambda: case.halide_ad(*inputs))
    tiered.settle()
    run = _Run(measure(lambda: case.halide_ad(*inputs), repeat).median_ms * 1e-3, np.asarray(out))
    (_, vjp_fn), first_vjp = time_once(lambda: hd.vjp(case.halide_ad, *inputs))
    grads, first_apply = time_once(lambda: vjp_fn(ct))
    first["backward"] = first_vjp + first_apply
    tiered.settle()
    run.backward_s = measure(lambda: vjp_fn(ct), repeat).median_ms * 1e-3
    run.gradients = tuple(np.asarray(grads[k]) for k in case.wrt)
    return run


def _torch(case: UpdateCase, form: Formulation, inputs, ct, repeat: int) -> _Run:
    torch = peers.load_torch(thp=False)
    xs = [torch.from_numpy(a) for a in inputs]
    wrt = [xs[k].requires_grad_(True) for k in case.wrt]
    with torch.no_grad():
        run = _Run(measure(lambda: form.fn(*xs), repeat).median_ms * 1e-3, form.fn(*xs).numpy())
    if form.differentiable:
        ct_t = torch.from_numpy(ct)
        y = form.fn(*xs)
        run.backward_s = measure(lambda: torch.autograd.grad(y, wrt, ct_t, retain_graph=True),
                                 repeat).median_ms * 1e-3
        run.gradients = tuple(g.numpy() for g in torch.autograd.grad(y, wrt, ct_t))
    return run


def _jax(case: UpdateCase, form: Formulation, inputs, ct, repeat: int) -> _Run:
    jax = peers.load_jax()
    xs = [jax.device_put(a) for a in inputs]

    def of_wrt(*ws):  # form.fn as a function of the differentiated inputs only
        full = list(xs)
        for k, w in zip(case.wrt, ws, strict=True):
            full[k] = w
        return form.fn(*full)

    forward = jax.jit(form.fn)
    run = _Run(measure(lambda: jax.block_until_ready(forward(*xs)), repeat).median_ms * 1e-3,
               np.asarray(forward(*xs)))
    vjp = jax.jit(lambda *ws: jax.vjp(of_wrt, *ws))
    apply_vjp = jax.jit(lambda vjp_fn, c: vjp_fn(c))
    _, vjp_fn = jax.block_until_ready(vjp(*(xs[k] for k in case.wrt)))
    ct_j = jax.device_put(ct)
    run.backward_s = measure(lambda: jax.block_until_ready(apply_vjp(vjp_fn, ct_j)), repeat).median_ms * 1e-3
    run.gradients = tuple(np.asarray(g) for g in apply_vjp(vjp_fn, ct_j))
    return run


def run_update_case(case: UpdateCase, *, small: bool, repeat: int, peer_names: Sequence[str]) -> list[Row]:
    """The case's forward and backward rows; halide_ad checked against the first peer that ran."""
    inputs = case.make_inputs(small)
    forward, backward = Row(case.name, "forward"), Row(case.name, "backward")
    ct = _cotangent(case, inputs)
    first: dict[str, float] = {}
    runs: dict[str, _Run] = {}
    try:
        runs["halide_ad"] = ours = _halide_ad(case, inputs, ct, repeat, first)
        forward.first_call_s, backward.first_call_s = first["forward"], first["backward"]
        if not all(np.array_equal(case.halide_ad(*inputs), ours.output) for _ in range(2)):
            forward.errors["halide_ad"] = "not deterministic: a second forward's bits differ"
    except Exception as error:  # noqa: BLE001 - one failing library must not end the run
        forward.record_error("halide_ad", error)
        backward.errors["halide_ad"] = forward.errors["halide_ad"]
    measurers = {"torch": (_torch, case.torch), "jax": (_jax, case.jax)}
    for library in peer_names:
        measurer, forms = measurers[library]
        try:
            timed = {form.name: measurer(case, form, inputs, ct, repeat) for form in forms}
        except Exception as error:  # noqa: BLE001
            forward.record_error(library, error)
            backward.errors[library] = forward.errors[library]
            continue
        _keep_fastest(forward, library, {n: r.forward_s for n, r in timed.items()}, forms)
        _keep_fastest(backward, library, {n: r.backward_s for n, r in timed.items()
                                          if r.backward_s is not None}, forms)
        runs[library] = next(r for r in timed.values() if r.backward_s is not None)
        for name, run in timed.items():  # a formulation timed but not the one checked against
            if not (agrees := compare_arrays([run.output], [runs[library].output])).ok:
                forward.errors[library] = f"its {name} formulation differs from its others: {agrees.detail}"
    if "halide_ad" in runs:
        ours = runs["halide_ad"]
        _keep_fastest(forward, "halide_ad", {"update": ours.forward_s}, ())
        _keep_fastest(backward, "halide_ad", {"update": ours.backward_s}, ())
        forward.check_values({k: [r.output] for k, r in runs.items()})
        backward.check_values({k: list(r.gradients) for k, r in runs.items()})
    return [forward, backward]


def _cotangent(case: UpdateCase, inputs) -> np.ndarray:
    """A standard normal float32 cotangent shaped like the output."""
    shape = case.out_shape(*(a.shape for a in inputs))
    return np.random.default_rng(1).standard_normal(shape, dtype=np.float32)


def _keep_fastest(row: Row, library: str, timed: dict[str, float], forms: Sequence[Formulation]) -> None:
    """The fastest formulation's median into `row`, named where the library has several, and
    every formulation's in `row.parts_s` (the JSON); printed to stderr as the run goes."""
    if not timed:
        return
    name = min(timed, key=timed.__getitem__)
    row.times_s[library] = timed[name]
    row.parts_s[library] = dict(timed)
    if len(forms) > 1:
        row.variants[library] = name
    print(f"[{row.case}] {library}: {row.phase} "
          + ", ".join(f"{n} {t * 1e3:.3g} ms" for n, t in timed.items()), file=sys.stderr)


def memory_programs(case: UpdateCase, *, small: bool) -> tuple[memory.Programs, list[np.ndarray], np.ndarray]:
    """What `benchmarks.memory` measures of `case`: each library's first differentiable
    formulation, the inputs and the cotangent."""
    inputs = case.make_inputs(small)
    programs = memory.Programs(case.halide_ad, _differentiable(case.torch).fn,
                               _differentiable(case.jax).fn, case.wrt)
    return programs, inputs, _cotangent(case, inputs)


def _differentiable(forms: Sequence[Formulation]) -> Formulation:
    return next(f for f in forms if f.differentiable)


def memory_note(case: UpdateCase, peer_names: Sequence[str], *, small: bool) -> str:
    """The backward's peak memory in each library, each from a fresh process, as a note."""
    figures = []
    forms = {"torch": _differentiable(case.torch), "jax": _differentiable(case.jax)}
    for library in ("halide_ad", *peer_names):
        if library in forms and forms[library].skip_memory:
            figures.append(f"{library} not measured ({forms[library].skip_memory})")
            continue
        try:
            footprint = memory.measure_in_subprocess(case.name, library, small=small)
        except subprocess.CalledProcessError as error:
            figures.append(f"{library} failed ({error})")
            continue
        figures.append(f"{library} {footprint.peak:.3g} MiB")
        print(f"[{case.name}] {library}: backward peak memory {footprint.peak:.3g} MiB", file=sys.stderr)
    return f"{case.name}: the backward's peak memory (benchmarks/memory.py): {', '.join(figures)}."
