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


def _modules():
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):  # subpackages too (runtime/schedule/, runtime/engines/)
            parts = path.relative_to(folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            yield ".".join((package, *parts)), ast.parse(path.read_text(), str(path))


def _imports(tree):
    """(imported halide_ad module, whether at module level) for each import in `tree`."""
    inside = set(map(id, _inside_functions(tree)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] == "halide_ad":
                yield _known(name), id(node) not in inside


def _inside_functions(tree) -> list[ast.AST]:
    """The import statements and `__import__` calls inside a function's body."""
    return [n for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))
            or (isinstance(n, ast.Call) and getattr(n.func, "id", None) == "__import__")]


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


def test_no_function_level_imports():
    """Of halide_ad's own modules (a cycle dodged) or of any other (numba's internals, math): only
    the optional integrations import their library when they are used."""
    inside = [f"{importer}: line {node.lineno}" for importer, tree in MODULES.items()
              if importer not in OPTIONAL for node in _inside_functions(tree)]
    assert not inside, "function-level imports:\n" + "\n".join(inside)


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


def test_module_level_imports_form_no_cycle():
    """Imports point one way within each layer too (the front end: expr, stages, updates, tensor,
    functions). A submodule's arrow to its own package does not count: Python loads the package
    first either way."""
    graph = {m: {i for i, top in _imports(tree) if top and i in MODULES and i != m and not m.startswith(i + ".")}
             for m, tree in MODULES.items()}
    done, path = set(), []

    def visit(m):
        if m in path:
            raise AssertionError("an import cycle: " + " -> ".join(path[path.index(m):] + [m]))
        if m not in done:
            path.append(m)
            for n in sorted(graph[m]):
                visit(n)
            path.pop()
            done.add(m)

    for m in sorted(graph):
        visit(m)
