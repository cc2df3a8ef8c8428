"""`hd.checkpoint(fn)`: fn's intermediates are recomputed by the backward pass instead of stored.

A program compiles into one forward kernel that allocates every stored Func up front, and one
backward kernel that reads them all and allocates every adjoint up front; its peak memory holds
all of both. A program with checkpointed blocks runs instead as segments, in trace order: each
checkpointed call is a segment, and so is each run of other Funcs between them. Each segment is
a program of its own, compiled once per structure (its buffers and variables renamed
canonically, so the blocks of a deep pipeline share their kernels):

* forward: the segments run in order; a checkpointed segment keeps only its outputs (what later
  segments and the program's outputs read), so its intermediates are freed as it ends;
* backward: the segments run last to first, each one's gradient seeded by the adjoints of its
  outputs; a checkpointed segment first runs its forward again, from its inputs. The adjoints of
  a segment's outputs are dropped once it has run.

Peak memory then holds the other segments' buffers, the block outputs, and one block's
intermediates and adjoints at a time. The gradient is the same computation, split at the block
boundaries (kernels may fuse differently across them, so float32 sums may round differently).
`hd.explain` shows the program whole, as without checkpoints. Segments always run their compiled
kernels: a program with checkpoints has no interpreter tier (halide_ad/tiered.py) on its first calls.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace

import numpy as np

from halide_ad import ir
from halide_ad.ad import differentiable_buffers
from halide_ad.compiler import compile_forward, compile_gradient
from halide_ad.runtime.execute import BackwardRun, ForwardRun

from halide_ad.traverse import rewrite, walk

SEGMENTS = "\0segments"  # the key of a segmented forward's saved buffers, in the buffers it returns


@dataclass(frozen=True)
class _Segment:
    program: ir.Program                  # canonical names
    names: dict[str, str]                # original buffer name -> canonical
    inputs: tuple[str, ...]              # original names of the buffers it reads from before it
    recompute: bool                      # a checkpointed block: its forward runs again for its gradient


_compiled: dict = {}  # canonical program (and wrt) -> ForwardRun / BackwardRun
_lock = threading.Lock()


def _run(key, build):
    run = _compiled.get(key)
    if run is None:
        with _lock:
            run = _compiled.get(key)
            if run is None:
                run = _compiled[key] = build()
    return run


class Segmented:
    """A program with checkpointed blocks, run segment by segment (see the module's doc)."""

    def __init__(self, program: ir.Program, blocks: tuple[tuple[str, ...], ...]):
        block_of: dict[str, int] = {}
        for k, names in enumerate(blocks):  # an enclosing block ends (and is listed) after those inside it
            block_of.update(dict.fromkeys(names, k))
        groups: list[tuple[int | None, list[ir.Func]]] = []
        for f in program.funcs:
            b = block_of.get(f.name)
            if groups and groups[-1][0] == b:
                groups[-1][1].append(f)
            else:
                groups.append((b, [f]))
        self.program = program
        self.segments = []
        for k, (block, funcs) in enumerate(groups):
            later = {n.buffer for _, fs in groups[k + 1:] for f in fs for n in walk(f.body)
                     if isinstance(n, ir.Load)}
            outputs = tuple(f.name for f in funcs if f.name in later or f.name in program.outputs)
            defined = {f.name for f in funcs}
            read = dict.fromkeys(n.buffer for f in funcs for n in walk(f.body)
                                 if isinstance(n, ir.Load) and n.buffer not in defined)
            sub = ir.Program(program.name, tuple(program.buffer(n) for n in read), tuple(funcs), outputs)
            self.segments.append(_canonical(sub, block is not None))

    def forward(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The program's inputs and outputs, the Funcs that later segments read, and (under
        SEGMENTS) what each segment's gradient reads that is not among those."""
        buffers = dict(arrays)
        saved = []
        for seg in self.segments:
            out = self._forward(seg, buffers)
            back = {seg.names[n]: n for n in seg.names}
            for name in seg.program.outputs:
                buffers[back[name]] = out[name]
            saved.append(None if seg.recompute else out)
        buffers[SEGMENTS] = saved
        return buffers

    def _forward(self, seg: _Segment, buffers: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        run = _run(seg.program, lambda: ForwardRun(seg.program, compile_forward(seg.program)))
        return run({seg.names[n]: buffers[n] for n in seg.inputs})

    def backward(self, wrt: tuple[str, ...], buffers: dict[str, np.ndarray],
                 cotangents: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        needs = differentiable_buffers(self.program, wrt)
        adjoints = {n: np.asarray(c) for n, c in cotangents.items()}
        for seg, saved in zip(reversed(self.segments), reversed(buffers[SEGMENTS]), strict=True):
            back = {c: n for n, c in seg.names.items()}
            sub_wrt = tuple(b.name for b in seg.program.inputs
                            if back[b.name] in needs and ir.is_float(b.dtype))
            outputs = [seg.program.func(o) for o in seg.program.outputs]
            seeds = {o.name: adjoints.pop(back[o.name], None) for o in outputs}
            if not sub_wrt:
                continue
            seeds = {o.name: np.zeros(o.shape or (1,), o.dtype) if seeds[o.name] is None else seeds[o.name]
                     for o in outputs}
            run = _run((seg.program, sub_wrt), lambda: BackwardRun(*compile_gradient(seg.program, sub_wrt)))
            forward = self._forward(seg, buffers) if seg.recompute else saved
            for name, g in run(forward, seeds).items():
                if name in sub_wrt:
                    n = back[name]
                    adjoints[n] = g if n not in adjoints else adjoints[n] + g.reshape(adjoints[n].shape)
        zeros = lambda b: np.zeros(b.shape, b.dtype)  # noqa: E731 (a wrt that reaches no output)
        return {w: adjoints[w] if w in adjoints else zeros(self.program.buffer(w)) for w in wrt}


def _canonical(sub: ir.Program, recompute: bool) -> _Segment:
    """`sub` with its buffers named in0, in1, ... and t0, t1, ..., and each Func's variables v0, ...
    and r0, ...: the same block traced twice gives equal programs, which share their kernels."""
    names = ({b.name: f"in{k}" for k, b in enumerate(sub.inputs)}
             | {f.name: f"t{k}" for k, f in enumerate(sub.funcs)})

    def rename(e: ir.Expr, env: dict[ir.Var, ir.Var]) -> ir.Expr:
        def rule(n: ir.Expr):
            if isinstance(n, ir.Load):
                return replace(n, buffer=names[n.buffer])
            if isinstance(n, ir.Var):
                return env.get(n)
            if isinstance(n, ir.Reduce):
                return replace(n, rvars=tuple(ir.Range(env[r.var], r.lo, r.hi) for r in n.rvars))
            return None
        return rewrite(e, rule)

    funcs = []
    for f in sub.funcs:
        env = {v: ir.Var(f"v{k}") for k, v in enumerate(f.vars)}
        rvars = [r.var for n in walk(f.body) if isinstance(n, ir.Reduce) for r in n.rvars]
        env |= {v: ir.Var(f"r{k}") for k, v in enumerate(dict.fromkeys(rvars))}
        funcs.append(replace(f, name=names[f.name], vars=tuple(env[v] for v in f.vars),
                             body=rename(f.body, env)))
    program = ir.Program("segment", tuple(replace(b, name=names[b.name]) for b in sub.inputs), tuple(funcs),
                         tuple(names[o] for o in sub.outputs))
    return _Segment(program, names, tuple(b.name for b in sub.inputs), recompute)
