"""docs/operators.md covers every operator, names tests that exist, and is what the generator
writes today (its forms come from hd.explain, so a solver change that alters one shows here)."""
import importlib
import importlib.util
import re
from pathlib import Path

from halide_ad import ops

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "operators.md"


def _generator():
    spec = importlib.util.spec_from_file_location("make_operator_table", ROOT / "docs" / "make_operator_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_operator_has_a_row_and_every_row_a_real_test():
    text = TABLE.read_text()
    listed = set(re.findall(r"^\| `(\w+)` \|", text, flags=re.MULTILINE))
    assert listed == set(ops.__all__), f"missing: {set(ops.__all__) - listed}, unknown: {listed - set(ops.__all__)}"
    for path, names in re.findall(r"`(tests/ops/\w+\.py)::([\w, ]+)`", text):
        module = importlib.import_module(path[:-3].replace("/", "."))
        for name in names.split(", "):
            assert callable(getattr(module, name, None)), f"{path}::{name} does not exist"


def test_table_is_up_to_date():
    assert _generator().render() == TABLE.read_text(), "run python docs/make_operator_table.py"
