"""The inverter's on-disk cache: a new process (here: a cleared in-memory cache) loads results instead
of running z3; corrupted entries are rebuilt, never trusted; results that saw a z3 timeout are not
stored."""
import importlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import z3

import halide_ad as hd
from halide_ad.api import as_function
from halide_ad.errors import SourceLoc
from halide_ad.ir import Bin, Load, Op, Range, Scatter, Var, const
from halide_ad.runtime.reference import evaluate
from tests.programs import scatter_adjoints
from halide_ad.solver import Fallback, Gather

from tests import programs as P

inv = importlib.import_module("halide_ad.solver.invert")
z3_bridge = importlib.import_module("halide_ad.solver.z3_bridge")

i, r, j = Var("i"), Var("r"), Var("j")
ADJ_Y = Load("adj_y", (i,), "float64")
# adj_x[2*i + r + 1] += adj_y[i] over i < 6, r < 3: a gather-window (a strided, overlapping window)
WINDOW = Scatter("x", (Bin(Op.ADD, Bin(Op.ADD, Bin(Op.MUL, const(2), i), r), const(1)),), ADJ_Y,
                 (Range(i, 0, 6), Range(r, 0, 3)))
POOL = Scatter("x", (Bin(Op.ADD, Bin(Op.MUL, const(3), i), r),), ADJ_Y,  # adj_x[3*i + r], r < 3
               (Range(i, 0, 4), Range(r, 0, 3)))
SHIFT = Scatter("x", (Bin(Op.ADD, i, const(1)),), ADJ_Y, (Range(i, 0, 6),))  # adj_x[i + 1]: a gather
# adj_x[i, idx[i]]: data-dependent, a scatter, parallel over i
DATA = Scatter("x", (i, Load("idx", (i,), "int64")), ADJ_Y, (Range(i, 0, 6),))
SHAPE = {WINDOW: (14,), POOL: (12,), SHIFT: (7,), DATA: (6, 9)}


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """An empty disk cache and an empty in-memory cache; the folder the solver's entries go to."""
    monkeypatch.setenv("HALIDE_AD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(inv, "_cache", {})
    return tmp_path / "solver"


def entries(folder):
    return sorted(folder.glob("*.pickle")) if folder.exists() else []


def invert(s, loc=None):
    if loc is not None:
        s = Scatter(s.buffer, s.index, s.value, s.domain, s.where, loc)
    return inv.invert(s, SHAPE[s], (j,) if len(SHAPE[s]) == 1 else (Var("j0"), Var("j1")))


def new_process(monkeypatch):
    """Forget the in-memory results; count the inversions that run z3 from now on."""
    monkeypatch.setattr(inv, "_cache", {})
    calls = []
    real = inv._invert
    monkeypatch.setattr(inv, "_invert", lambda *args: calls.append(args) or real(*args))
    return calls


def no_z3(monkeypatch):
    def refuse(*_):
        raise AssertionError("z3 ran, but the result was on disk")
    monkeypatch.setattr(inv, "_invert", refuse)
    monkeypatch.setattr(z3_bridge.Query, "check", refuse)


@pytest.mark.parametrize("s, form", [(WINDOW, "gather-window"), (SHIFT, "gather"), (DATA, "scatter-parallel")])
def test_a_second_process_loads_the_result_without_z3(folder, monkeypatch, s, form):
    first = invert(s)
    assert first.form == form and isinstance(first, Fallback if form.startswith("scatter") else Gather)
    assert len(entries(folder)) == 1
    monkeypatch.setattr(inv, "_cache", {})
    no_z3(monkeypatch)
    loc = SourceLoc("elsewhere.py", 7, "f")
    again = invert(s, loc)
    assert again == first
    assert again.scatter.loc == loc, "the loaded result names this trace's source line"
    assert invert(s) is again, "then kept in memory"


def test_entries_depend_on_the_key_and_the_salt(folder, monkeypatch):
    invert(WINDOW)
    invert(SHIFT)
    inv.invert(SHIFT, (8,), (j,))  # another shape: another entry
    assert len(entries(folder)) == 3
    monkeypatch.setattr(inv, "_cache", {})
    disk_cache = importlib.import_module("halide_ad.disk_cache")
    monkeypatch.setattr(disk_cache, "_salt", lambda: "another version of the solver")
    calls = new_process(monkeypatch)
    invert(WINDOW)
    assert len(calls) == 1 and len(entries(folder)) == 4


def _garble(path):
    data = bytearray(path.read_bytes())
    for k in range(len(data) // 2, min(len(data) // 2 + 16, len(data))):
        data[k] ^= 0xA5
    path.write_bytes(bytes(data))


CORRUPTIONS = {
    "truncated": lambda p, other: os.truncate(p, p.stat().st_size // 2),
    "empty": lambda p, other: os.truncate(p, 0),
    "garbled": lambda p, other: _garble(p),
    "not a pickle": lambda p, other: p.write_bytes(b"x" * 100),
    "another key's entry": lambda p, other: p.write_bytes(other.read_bytes()),
    "a folder": lambda p, other: (p.unlink(), p.mkdir()),
}


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=list(CORRUPTIONS))
def test_a_corrupted_entry_is_recomputed_and_rewritten(folder, monkeypatch, corrupt):
    invert(SHIFT)
    (other_path,) = entries(folder)
    first = invert(WINDOW)
    (path,) = set(entries(folder)) - {other_path}
    CORRUPTIONS[corrupt](path, other_path)
    calls = new_process(monkeypatch)
    again = invert(WINDOW)
    assert again == first and len(calls) == 1, "not trusted: recomputed"
    if corrupt != "a folder":  # which cannot be replaced by a file: then just not stored
        monkeypatch.setattr(inv, "_cache", {})
        no_z3(monkeypatch)
        assert invert(WINDOW) == first, "rewritten"
    assert not list(folder.glob("*.tmp"))


def test_an_unwritable_cache_dir_only_stores_nothing(tmp_path, monkeypatch):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("HALIDE_AD_CACHE_DIR", str(blocker / "cache"))  # cannot be created
    monkeypatch.setattr(inv, "_cache", {})
    first = invert(WINDOW)
    assert isinstance(first, Gather)
    calls = new_process(monkeypatch)
    assert invert(WINDOW) == first and len(calls) == 1


def test_a_result_that_saw_a_z3_timeout_is_not_stored(folder, monkeypatch):
    """One query (is the pooling window's loop a single step?) answers `unknown`: the result is still
    a gather, a correct one, but a later run with more time may prove more: not stored."""
    real = inv._at_most_once

    def undecided(*args):
        with monkeypatch.context() as m:
            m.setattr(z3.Solver, "check", lambda self, *a: z3.unknown)
            return real(*args)
    monkeypatch.setattr(inv, "_at_most_once", undecided)
    before = z3_bridge.unknown_answers()
    result = invert(POOL)
    assert result.form == "gather-window" and z3_bridge.unknown_answers() > before
    assert entries(folder) == []
    monkeypatch.setattr(inv, "_at_most_once", real)
    calls = new_process(monkeypatch)
    decided = invert(POOL)
    assert decided.form == "gather", "what the timeout had cost: a loop"
    assert len(calls) == 1 and len(entries(folder)) == 1


def test_a_timed_out_inverse_warns_every_process_and_is_not_stored(folder, monkeypatch):
    monkeypatch.setattr(z3.Solver, "check", lambda self, *a: z3.unknown)
    for _ in range(2):
        monkeypatch.setattr(inv, "_cache", {})
        with pytest.warns(hd.HalideADWarning, match="within its time limit"):
            result = invert(SHIFT)
        assert isinstance(result, Fallback)
        assert entries(folder) == []


SCRIPT = textwrap.dedent("""
    import importlib, sys
    import numpy as np
    import halide_ad as hd
    from tests import programs as P
    inv = importlib.import_module("halide_ad.solver.invert")
    if sys.argv[1] == "warm":
        def refuse(*_):
            raise AssertionError("z3 ran again")
        inv._invert = refuse
    img = np.arange(42.0).reshape(6, 7) ** 1.5
    out, f_vjp = hd.vjp(P.blur3, img, "repeat_edge")
    dx = f_vjp(np.cos(out))[0]
    np.save(sys.argv[2], dx)
""")


def test_a_second_process_computes_the_same_gradient_from_the_disk_cache(tmp_path):
    env = {**os.environ, "HALIDE_AD_CACHE_DIR": str(tmp_path / "cache"), "HALIDE_AD_JIT": "0"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for run in ("cold", "warm"):
        subprocess.run([sys.executable, "-c", SCRIPT, run, str(tmp_path / f"{run}.npy")], env=env,
                       capture_output=True, check=True, cwd=root)
    assert entries(tmp_path / "cache" / "solver")
    np.testing.assert_array_equal(np.load(tmp_path / "warm.npy"), np.load(tmp_path / "cold.npy"))
    # and both are right: reverse mode's scatters run as written, without the solver
    img = np.arange(42.0).reshape(6, 7) ** 1.5
    traced, arrays = as_function(P.blur3).trace((img, "repeat_edge"), {})
    forward = evaluate(traced.program, arrays)
    out = forward[traced.program.outputs[0]]
    expected = scatter_adjoints(traced.program, ("img",), arrays | forward, {traced.program.outputs[0]: np.cos(out)})
    np.testing.assert_allclose(np.load(tmp_path / "warm.npy"), expected["img"], rtol=1e-12, atol=1e-12)


def test_generated_gradient_code_is_cached_too(folder, monkeypatch):
    """The scheduler asks z3 whether pieces are empty: a new process reuses the generated code."""
    monkeypatch.setenv("HALIDE_AD_JIT", "0")
    compiler = importlib.import_module("halide_ad.compiler")
    from halide_ad.api import as_function

    @hd.func
    def pool(x):
        r = hd.rdom(3)
        return hd.compute(((x.shape[0] - 3) // 2 + 1,), lambda i: hd.sum(x[2 * i + r]) / 3)

    x = np.arange(11.0)
    traced, _ = as_function(pool).trace((x,), {})
    kernel, _ = compiler.compile_gradient(traced.program, ("x",))
    monkeypatch.setattr(compiler, "emit_backward", lambda *a: pytest.fail("generated again"))
    monkeypatch.setattr(inv, "_cache", {})
    again, _ = compiler.compile_gradient(traced.program, ("x",))
    assert again.source == kernel.source
    hd.check_grad(pool, x)  # through the cached code
