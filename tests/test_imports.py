"""Imports point one way (docs/architecture.md): the IR core imports neither the solver nor the
runtime, the solver imports only the core, and the runtime never imports the front end or the
driver. Walked with `ast`, so a new arrow that breaks the rule fails here."""
import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = {"halide_ad": ROOT / "halide_ad", "halide_ad.solver": ROOT / "solver",
            "halide_ad.runtime": ROOT / "runtime"}
CORE = {"halide_ad", "halide_ad.ir", "halide_ad.traverse", "halide_ad.show", "halide_ad.errors",
        "halide_ad.config", "halide_ad.affine", "halide_ad.ad", "halide_ad.disk_cache", "halide_ad.trace",
        "halide_ad.update_ad"}
# Optional integrations import their library (and halide_ad) when they are used.
OPTIONAL = {"halide_ad.torch", "halide_ad.jax", "halide_ad.dask"}
# Function-level imports that remain, each with its reason.
DEFERRED = {
    ("halide_ad.expr", "halide_ad.tensor"),  # Expr's operators accept Tensors, and Tensor is built on Expr
    ("halide_ad.ir", "halide_ad.show"),  # an Expr prints itself with show, which is written over the IR
    ("halide_ad.tensor", "halide_ad.updates"),  # Tensor.__setitem__ is an update definition, built on Tensor
}


def _modules():
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):  # subpackages too (runtime/schedule/, runtime/engines/)
            parts = path.relative_to(folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            yield ".".join((package, *parts)), ast.parse(path.read_text(), str(path))


def _imports(tree):
    """(imported halide_ad module, whether at module level) for each import in `tree`."""
    top = set(map(id, tree.body))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] == "halide_ad":
                yield _known(name), id(node) in top


def _known(name: str) -> str:
    """`halide_ad.solver.invert.Gather` -> `halide_ad.solver.invert`: the module a name lives in."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


MODULES = {name: tree for name, tree in _modules()}


def _allowed(importer: str, imported: str) -> bool:
    if importer in CORE:
        return imported in CORE
    if importer.startswith("halide_ad.solver"):
        return imported in CORE or imported.startswith("halide_ad.solver")
    if importer.startswith("halide_ad.runtime"):
        return (imported in CORE - {"halide_ad.ad", "halide_ad.trace"}
                or imported.startswith(("halide_ad.solver", "halide_ad.runtime")))
    return True  # the front end, the driver and the API see everything


def test_imports_point_one_way():
    wrong = [f"{importer} imports {imported}" for importer, tree in MODULES.items()
             for imported, _ in _imports(tree) if not _allowed(importer, imported)]
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_no_function_level_imports_of_halide_ad():
    inside = {(importer, imported) for importer, tree in MODULES.items() if importer not in OPTIONAL
              for imported, top in _imports(tree) if not top and imported != importer}
    assert inside <= DEFERRED, f"function-level imports: {sorted(inside - DEFERRED)}"


def test_the_ir_and_reverse_mode_import_without_numba_and_z3():
    code = ("import sys, halide_ad.ir, halide_ad.ad, halide_ad.affine, halide_ad.traverse, halide_ad.show\n"
            "print(sorted(m for m in ('numba', 'z3', 'halide_ad.solver', 'halide_ad.runtime') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_no_public_name_is_also_a_submodule():
    """`halide_ad/__init__` loads its names on first use; a submodule of the same name would
    replace the function (`hd.jvp`) with the module as soon as anything imports it."""
    import halide_ad
    submodules = {path.stem for path in (ROOT / "halide_ad").glob("*.py")} | {"ops", "solver", "runtime"}
    assert not set(halide_ad.__all__) & submodules
