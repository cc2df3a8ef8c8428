"""`@hd.func`: a traced, compiled function. Each signature of shapes and dtypes is traced once into a
`Traced`, which holds its program and compiles its kernels; a call finds it by one dict lookup.
Its arguments are classified, and a call's dispatch key read, in halide_ad/arguments.py; the
gradient transformations built on it are in halide_ad/transforms.py."""
from __future__ import annotations

import functools
import inspect
import threading
import weakref
from dataclasses import dataclass, field

import numpy as np

from halide_ad import capture, config, ir, tiered
from halide_ad.ad import read_by_gradients, without_unused_argindex
from halide_ad.arguments import call_key, classify, static_used_as_array
from halide_ad.segments import Segmented
from halide_ad.compiler import compile_forward, compile_gradient
from halide_ad.errors import ShapeError, TraceError, user_loc
from halide_ad.runtime import direct
from halide_ad.runtime.execute import BackwardRun, ForwardRun, Kernel
from halide_ad.runtime.plans import AdjointPlan
from halide_ad.tensor import Tensor, compute
from halide_ad.trace import TraceState, current, tracing
from halide_ad.traverse import live_funcs
from halide_ad.trees import flatten


class _Call:
    """A call signature traced before: its Traced, and which arguments are its array buffers."""

    __slots__ = ("traced", "positions", "keywords", "direct", "gradients")

    def __init__(self, traced: Traced, positions: tuple[tuple[int, str], ...], keywords: tuple[str, ...]):
        self.traced = traced
        self.positions = positions
        self.keywords = keywords
        # (args, kwargs) -> results, written out once the kernels run (runtime/direct.py): the
        # plain call's, and value_and_grad's by argnums; False where one never will be
        self.direct = None
        self.gradients: dict = {}

    def sources(self) -> dict[str, int | str]:
        """Where each array comes from: its position in args, or its keyword."""
        return {name: k for k, name in self.positions} | {name: name for name in self.keywords}

    def arrays(self, args: tuple, kwargs: dict) -> dict[str, np.ndarray]:
        """The arrays by buffer name, C-contiguous, as `classify` passes them on."""
        arrays = {name: np.asarray(args[k], order="C") for k, name in self.positions}
        for name in self.keywords:
            arrays[name] = np.asarray(kwargs[name], order="C")
        return arrays


# A program's two forwards: the one a gradient runs after, which stores what gradients read, and
# a plain call's, which stores only the outputs (and compiles without running reverse mode).
FORWARD, CALL = "forward", "call"


@dataclass(eq=False)
class Traced:
    """One traced signature: the program, its forward kernel, and gradient kernels by `wrt`, with
    what the signature fixes for a call worked out once (ForwardRun, BackwardRun, the outputs'
    shapes)."""
    program: ir.Program
    rebuild: object
    arg_names: list[str]           # buffer name for each positional array argument, else None
    kinds: list[str]
    captured: tuple = ()           # capture.Captured for each array read from a closure or global
    _grads: dict = field(default_factory=dict)  # wrt -> BackwardRun
    _forwards: dict = field(default_factory=dict)  # FORWARD or CALL -> ForwardRun
    _lock: threading.Lock = field(default_factory=threading.Lock)
    scalar_gradients: dict = field(default_factory=dict)  # argnums -> _ScalarGradient
    named: tuple[str, ...] = ()  # the Funcs the user named, that the program keeps (hd.adjoints)
    checkpoints: tuple[tuple[str, ...], ...] = ()  # Funcs of each hd.checkpoint call: run by segments

    def __post_init__(self):
        program = self.program
        self._outputs = tuple((o, program.func(o).shape == ()) for o in program.outputs)
        self._arg_shapes = tuple(None if n is None else program.buffer(n).shape for n in self.arg_names)
        self.float_args = tuple(n for n in self.arg_names if n is not None and ir.is_float(program.buffer(n).dtype))
        self._structure = None
        self._written_vjp = None  # direct_vjp's function, or False
        # tiered execution (halide_ad/tiered.py), per pass: FORWARD, CALL, or a gradient's wrt
        self._compiled: set = set()        # the passes that run their kernels from now on
        self._jobs: dict = {}              # pass -> the Future compiling its kernels
        self.interpreted: dict = {}        # pass -> calls the interpreter ran
        self._small: dict = {}             # wrt -> whether the interpreter may run its passes
        self._marked: set = set()          # the passes whose kernels ran here: marked built on disk

    def _interpreting(self, key, warming) -> bool:
        """Whether this call of pass `key` runs on the interpreter: while its kernels compile in
        the background (`warming()` gives the job that compiles them, by a run on copies of this
        call's arrays), for small programs whose kernels are neither in this process nor on disk
        (`tiered.built_before`: a pass is marked built once its kernels ran, `_mark_built`).
        Once it returns False for a pass, it does for good."""
        if key in self._compiled:
            return False
        forward = key in (FORWARD, CALL)
        built = self._forwards.get(key) if forward else self._grads.get(key)
        # (the disk asked once, before the pass's first background compile: not on every call after)
        if (built is not None and built.kernel.compiled()
                or key not in self._jobs and tiered.built_before(self.program, key)):
            self._compiled.add(key)
            return False
        # a plain call and a gradient's forward go with the gradient by every float argument: a
        # forward interpreted while its gradient compiles first leaves the forward's kernels
        # compiling in the background ahead of the gradient's (a 4096^2 blur's first forward and
        # backward: 4.9 s, against 2.0 s compiling both first)
        wrt = self.float_args if forward else key
        small = self._small.get(wrt)
        if small is None:  # (reverse mode runs to count a gradient's work: once per wrt)
            small = self._small[wrt] = tiered.interpretable(self.program, wrt)
        if not small:
            self._compiled.add(key)
            return False
        job = self._jobs.get(key)
        if job is None:
            with self._lock:
                job = self._jobs.get(key)
                if job is None:
                    job = self._jobs[key] = tiered.in_background(warming())
                    job.add_done_callback(lambda done: done.exception() is None and self._mark_built(key))
        if job.done():  # (a compile that failed fails again in the caller, with its error)
            self._compiled.add(key)
            return False
        self.interpreted[key] = self.interpreted.get(key, 0) + 1
        if self.interpreted[key] == 2:  # a loop of calls: its kernels are worth building now
            tiered.repeated()
        return True

    def _mark_built(self, key) -> None:
        """Say on disk that pass `key`'s kernels ran (`tiered.built_before`), once per process."""
        if key not in self._marked:
            self._marked.add(key)
            tiered.mark_built(self.program, key)

    def _inputs(self, buffers: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The program's inputs among `buffers`, in their declared shapes."""
        return {b.name: np.asarray(buffers[b.name]).reshape(b.shape) for b in self.program.inputs}

    def _stand_ins(self) -> dict[str, np.ndarray]:
        """Zeros for each input, for a background compile's run: the run only makes numba compile
        (its results are dropped), and a copy of the call's arrays cost a first call of a (16, 64,
        128, 128) program ~0.1 s a pass. np.zeros touches no page until it is written; every read
        of an interpreted program is in range whatever the data (`tiered.interpretable`)."""
        return {b.name: np.zeros(b.shape, b.dtype) for b in self.program.inputs}

    def _kept(self, key: str) -> set[str] | None:
        """The buffers the interpreter's forward for `key` keeps, as the kernels' forward stores
        them: the outputs, and for a gradient's forward what any gradient reads (None: every
        buffer, where reverse mode fails)."""
        kept = set(self.program.outputs)
        return kept if key == CALL else None if self._read_by_gradients is None else kept | self._read_by_gradients

    @functools.cached_property
    def _read_by_gradients(self) -> set[str] | None:
        return read_by_gradients(self.program)

    @functools.cached_property
    def _segmented(self) -> Segmented:
        return Segmented(self.program, self.checkpoints)

    def forward_kernel(self) -> Kernel:
        return self.forward_run().kernel

    def forward_run(self, key: str = FORWARD) -> ForwardRun:
        run = self._forwards.get(key)  # read without the lock: a call never waits for another's compile
        if run is None:
            with self._lock:
                if key not in self._forwards:
                    kernel = compile_forward(self.program, for_gradients=key == FORWARD)
                    self._forwards[key] = ForwardRun(self.program, kernel)
                run = self._forwards[key]
        return run

    def gradient(self, wrt: tuple[str, ...]) -> tuple[Kernel, list[AdjointPlan]]:
        run = self.backward(wrt)
        return run.kernel, run.plans

    def backward(self, wrt: tuple[str, ...]) -> BackwardRun:
        run = self._grads.get(wrt)
        if run is None:
            with self._lock:
                if wrt not in self._grads:
                    self._grads[wrt] = BackwardRun(*compile_gradient(self.program, wrt))
                run = self._grads[wrt]
        return run

    def run(self, arrays: dict[str, np.ndarray], key: str = FORWARD) -> dict[str, np.ndarray]:
        """The forward pass's buffers: from its kernels, or the interpreter's while they compile.
        `key`: FORWARD keeps what gradients read (`gradient_of` may follow), CALL only the outputs."""
        if self.checkpoints:
            return self._segmented.forward(arrays)
        if key in self._compiled:
            return self.forward_run(key)(arrays)
        def warming():
            stand_ins = self._stand_ins()
            return lambda: self.forward_run(key)(stand_ins)

        with tiered.interpreting():
            if self._interpreting(key, warming):
                return tiered.forward(self.program, arrays, self._kept(key))
        out = self.forward_run(key)(arrays)
        self._mark_built(key)
        return out

    def gradient_of(self, wrt: tuple[str, ...], buffers: dict[str, np.ndarray],
                    cotangents: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """{name: gradient} for `wrt`, from `run`'s buffers: from the kernels, or from the
        interpreter (forward and backward on it) while they compile."""
        if self.checkpoints:
            return self._segmented.backward(wrt, buffers, cotangents)
        interpreted = tiered.INTERPRETED in buffers
        if not interpreted and wrt in self._compiled:
            return self.backward(wrt)(buffers, cotangents)
        def warming():
            stand_ins = self._stand_ins()
            seeds = {k: np.zeros(np.shape(v), np.asarray(v).dtype) for k, v in cotangents.items()}
            return lambda: self.backward(wrt)(self.forward_run(FORWARD)(stand_ins), seeds)

        with tiered.interpreting():
            if self._interpreting(wrt, warming):
                forward = buffers if interpreted else tiered.forward(self.program, self._inputs(buffers),
                                                                       self._kept(FORWARD))
                return tiered.backward(self.program, wrt, forward, cotangents)
        if interpreted:  # the interpreter ran the forward, and the kernels are ready now
            buffers = self._kernel_buffers(buffers)
        out = self.backward(wrt)(buffers, cotangents)
        self._mark_built(wrt)
        return out

    def _kernel_buffers(self, buffers: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The kernels' forward buffers in place of the interpreter's `buffers`, run once and kept
        under their INTERPRETED key: a vjp closure made on the interpreter tier and called again
        later (a benchmark's, a training loop's) then runs kernels, not the interpreter, for good."""
        kept = buffers[tiered.INTERPRETED]
        if not isinstance(kept, dict):
            kept = buffers[tiered.INTERPRETED] = self.forward_run(FORWARD)(self._inputs(buffers))
        return kept

    def direct_ready(self, *passes):
        """Whether a call may run as one function of (args, kwargs) (runtime/direct.py):
        once the kernels of `passes` run, for a program that reads no captured array and runs in
        one piece. None while they may still run on the interpreter; False for good."""
        if self.captured or self.checkpoints:
            return False
        return all(p in self._compiled for p in passes) or None

    def direct_call(self, call: _Call):
        """The plain call of `call`'s signature written out (`direct.call`), or see `direct_ready`."""
        ready = self.direct_ready(CALL)
        if not ready:
            return ready
        structure = self.structure()
        return direct.call(self.forward_run(CALL), call.sources(), self._outputs,
                           None if isinstance(structure, int) else self.rebuild)

    def direct_vjp(self):
        """The gradient by every float argument, from a vjp's forward buffers and the cotangent of
        a program with one output, written out (`direct.vjp`), or see `direct_ready`. Cached."""
        if self._written_vjp is not None:
            return self._written_vjp
        wrt = self.float_args
        ready = self.direct_ready(wrt)
        if ready is None:
            return None
        written = False
        if ready and len(self._outputs) == 1:
            func = self.program.func(self._outputs[0][0])
            args = tuple((n if n in wrt else None, shape == ())
                         for n, shape in zip(self.arg_names, self._arg_shapes, strict=True))
            written = direct.vjp(self.backward(wrt), func.name, func.shape, np.dtype(func.dtype), args)
        self._written_vjp = written
        return written

    def outputs(self, buffers: dict[str, np.ndarray]):
        """The outputs in the structure fn returned. Kernels see a 0-d buffer as shape (1,); every
        other buffer has its output's shape already."""
        return self.rebuild([buffers[o].reshape(()) if scalar else buffers[o] for o, scalar in self._outputs])

    def gradients(self, grads: dict[str, np.ndarray]) -> tuple:
        """One gradient per positional argument: None for static and integer arguments."""
        return tuple(None if n is None or n not in grads else grads[n].reshape(()) if shape == () else grads[n]
                     for n, shape in zip(self.arg_names, self._arg_shapes, strict=True))

    def structure(self):
        """The outputs' structure, output k's place holding k (`leaves_like` follows it)."""
        if self._structure is None:
            self._structure = self.rebuild(list(range(len(self.program.outputs))))
        return self._structure


class Function:
    """What `@hd.func` returns: called with arrays it compiles (once per signature) and runs;
    called while tracing it inlines."""

    wraps_python_function = True  # capture.py looks through it to `fn`

    def __init__(self, fn, *, shares=None):
        if shares is not None:  # the same code as `shares`, with other closure values: its caches
            self.__dict__.update(shares.__dict__)
            self.fn = self.__wrapped__ = fn
            return
        if not callable(fn):
            raise TraceError(f"hd.func needs a function, got {type(fn).__name__}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self._traces: dict = {}
        self._calls: dict = {}  # call_key -> _Call: the signatures a call finds without classifying
        self._bound: set = set()  # (positional count, keyword names) that bind to the signature
        self._lock = threading.Lock()
        try:
            self._signature = inspect.signature(fn)
        except (TypeError, ValueError):  # some builtins and C functions have none
            self._signature = None
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        params = self._signature.parameters.values() if self._signature is not None else ()
        self._positional = [p.name if p.kind in positional else None for p in params]

    def __repr__(self) -> str:
        return f"<hd.func {getattr(self.fn, '__qualname__', self.fn)}>"

    def __reduce__(self):
        """Pickled by reference to the module-level name it is bound to, as functions are (dask
        and multiprocessing send functions so): its traces, kernels and locks stay behind, and
        the receiving process finds its kernels in the on-disk cache."""
        return getattr(self.fn, "__qualname__", repr(self))

    def __call__(self, *args, **kwargs):
        if current() is not None:
            self._check_arguments(args, kwargs)
            return self.fn(*args, **kwargs)
        key = call_key(args, kwargs)
        call = self._calls.get(key)  # (None, for arguments without a key, is never one)
        if call is not None:
            if call.direct:
                return call.direct(args, kwargs)
            if call.direct is None:
                call.direct = call.traced.direct_call(call)
        traced, arrays = self.trace(args, kwargs, key)
        return traced.outputs(traced.run(arrays, CALL))

    def _param_names(self, count: int) -> list[str]:
        """The buffer name of each positional argument: its parameter's, else arg<k>."""
        names = self._positional
        return [names[k] if k < len(names) and names[k] is not None else f"arg{k}" for k in range(count)]

    def _check_arguments(self, args: tuple, kwargs: dict) -> None:
        """Too many, too few or unknown arguments: the caller's mistake, named before tracing."""
        if self._signature is None:
            return
        arity = (len(args), tuple(kwargs))  # all that binding depends on
        if arity in self._bound:
            return
        try:
            self._signature.bind(*args, **kwargs)
        except TypeError as e:
            name = getattr(self.fn, "__name__", "fn")
            raise ShapeError(f"{name}{self._signature} was called with {len(args)} positional and "
                             f"{len(kwargs)} keyword argument(s): {e}", user_loc()) from None
        self._bound.add(arity)

    def trace(self, args: tuple, kwargs: dict, key=False) -> tuple[Traced, dict[str, np.ndarray]]:
        """(the Traced of this call's signature, traced on its first call; the arrays by buffer
        name). A signature called before is found by `call_key` (`key`, where the caller has
        it) without classifying anything."""
        if key is False:
            key = call_key(args, kwargs)
        call = None if key is None else self._calls.get(key)  # (a dict read needs no lock)
        if call is not None:
            if not call.traced.captured:
                return call.traced, call.arrays(args, kwargs)
            captured = capture.read(call.traced.captured, self.fn)
            if captured is not None:
                return call.traced, call.arrays(args, kwargs) | captured
        self._check_arguments(args, kwargs)
        names = self._param_names(len(args))
        classified = [classify(n, a) for n, a in zip(names, args, strict=True)]
        kw = {k: classify(k, v) for k, v in sorted(kwargs.items())}
        for kind, v in classified + list(kw.values()):
            if kind == "tensor":
                raise TraceError(f"{self!r} got a symbolic tensor outside a trace")
        signature = (tuple((k, v.shape, v.dtype.str) if k == "array" else (k, type(v), v) for k, v in classified),
                     tuple((name, k, (v.shape, v.dtype.str) if k == "array" else v) for name, (k, v) in kw.items()))
        arrays = {n: v for n, (k, v) in zip(names, classified, strict=True) if k == "array"}
        arrays |= {n: v for n, (k, v) in kw.items() if k == "array"}
        def stored():
            traced = self._traces.get(signature)
            return traced, None if traced is None else capture.read(traced.captured, self.fn)
        traced, captured = stored()
        if captured is None:  # first call of this signature, or a captured array changed shape
            with self._lock:  # one trace per signature, however many threads call it at once:
                traced, captured = stored()  # a thread that waited here finds the first one's
                if captured is None:
                    traced, captured = self._trace(names, classified, kw)
                    if capture.read(traced.captured, self.fn) is None:
                        return traced, arrays | captured  # an array found on no path: trace every call
                    self._traces[signature] = traced
        arrays |= captured
        if key is not None and key == key and all(  # (a NaN option never equals itself)
                a.dtype.isnative for a in (*args, *kwargs.values()) if type(a) is np.ndarray):
            self._calls[key] = _Call(traced, tuple((k, n) for k, n in enumerate(names) if type(args[k]) is np.ndarray),
                                     tuple(n for n, a in kwargs.items() if type(a) is np.ndarray))
        return traced, arrays

    def _trace(self, names, classified, kw) -> tuple[Traced, dict[str, np.ndarray]]:
        """(the Traced, the captured arrays by buffer name as this trace read them)."""
        state = TraceState(getattr(self.fn, "__name__", "fn"), root=self.fn)
        for n in list(names) + list(kw):
            state.names.add(n)

        def symbolic(name, kind, value):
            if kind != "array":
                return value
            buf = ir.Buffer(name, tuple(value.shape), value.dtype.name)
            state.inputs.append(buf)
            return Tensor(buf)

        with tracing(state):
            sym_args = [symbolic(n, k, v) for n, (k, v) in zip(names, classified, strict=True)]
            sym_kwargs = {n: symbolic(n, k, v) for n, (k, v) in kw.items()}
            try:
                result = self.fn(*sym_args, **sym_kwargs)
            except (AttributeError, TypeError) as e:  # e.g. x.shape or x[i] where x is None or 3.0
                statics = {n: v for n, (k, v) in list(zip(names, classified)) + list(kw.items())
                           if k == "static"}
                error = static_used_as_array(e, statics, getattr(self.fn, "__name__", "fn"))
                if error is None:
                    raise
                raise error from e
            leaves, rebuild = flatten(result, f"the result of {self.fn.__name__}")
            outputs = []
            for leaf in leaves:
                if leaf.name in outputs or leaf.name in {b.name for b in state.inputs}:
                    leaf = _copy(leaf)  # every output gets a buffer of its own
                outputs.append(leaf.name)
        funcs = live_funcs(state.funcs, outputs, state.overrides)
        live = {f.name for f in funcs}
        overrides = tuple(o for o in state.overrides if live & set(o.outputs))
        program = without_unused_argindex(
            ir.Program(state.name, tuple(state.inputs), funcs, tuple(outputs), overrides))
        arg_names = [n if k == "array" else None for n, (k, _) in zip(names, classified, strict=True)]
        records, captured = capture.trace_results(state)
        kept = {f.name for f in program.funcs}
        traced = Traced(program, rebuild, arg_names, [k for k, _ in classified], records,
                        named=tuple(n for n in state.named if n in kept),
                        checkpoints=tuple(tuple(n for n in block if n in kept) for block in state.checkpoints))
        return _shared(traced), captured


_by_program: dict = {}  # (program, arguments, captures, outputs' structure) -> Traced
_by_program_lock = threading.Lock()
MAX_SHARED_TRACES = 512


def _shared(traced: Traced) -> Traced:
    """The Traced of an equal program traced before (by another Function of the same code, or
    before a captured array changed shape and back), whose kernels are built; else `traced`."""
    key = (traced.program, tuple(traced.arg_names), tuple(traced.kinds), traced.captured,
           repr(traced.structure()), traced.named, traced.checkpoints,
           config.compile_settings())  # kernels compiled under other settings are not these
    with _by_program_lock:
        found = _by_program.get(key)
        if found is None:
            if len(_by_program) >= MAX_SHARED_TRACES:
                _by_program.pop(next(iter(_by_program)))
            found = _by_program[key] = traced
    return found


def _copy(t: Tensor) -> Tensor:
    return compute(t.shape, lambda *i: t[i], name=f"{t.name}_out")


_wrapped: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_wrapped_lock = threading.Lock()


def func(fn) -> Function:
    """Decorator: trace `fn` over symbolic hd.Tensors and compile it (see the README)."""
    return fn if isinstance(fn, Function) else Function(fn)


def as_function(fn) -> Function:
    """`fn` itself if decorated; a plain function is traced as if decorated, and cached the same way."""
    if isinstance(fn, Function):
        return fn
    try:
        f = _wrapped.get(fn)  # a read needs no lock; adding one does
    except TypeError:
        return Function(fn)
    if f is not None:
        return f
    key = capture.code_key(fn)  # a new lambda of code seen before shares its traces and kernels
    with _wrapped_lock:
        f = _wrapped.get(fn)
        if f is None:
            first = _by_code.get(key) if key is not None else None
            f = _wrapped[fn] = Function(fn) if first is None else Function(fn, shares=first)
            if key is not None and first is None:
                if len(_by_code) >= MAX_SHARED_TRACES:
                    _by_code.pop(next(iter(_by_code)))
                _by_code[key] = Function(None, shares=f)  # its caches, not its function's arrays
        return f


# capture.code_key -> the caches of the first Function of that code, so that a lambda made anew
# for each call is traced once
_by_code: dict = {}


def forget_shared_traces() -> None:
    """Drop the traces and kernels that functions share by their code or by their program (the
    test suite does, before each test, so that a test that changes a compile setting compiles)."""
    with _wrapped_lock:
        _by_code.clear()
    with _by_program_lock:
        _by_program.clear()


