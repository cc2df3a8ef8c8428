"""tools/kernel_snapshot.py: what compile_kernel records, and what a comparison reports."""
import importlib.util
from pathlib import Path

import pytest

from halide_ad.runtime.compile import record_source

_spec = importlib.util.spec_from_file_location(
    "kernel_snapshot", Path(__file__).resolve().parents[2] / "tools" / "kernel_snapshot.py")
snapshot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(snapshot)


def _record(folder: Path, root: str, kernels, monkeypatch) -> None:
    monkeypatch.setenv("HALIDE_AD_KERNEL_SNAPSHOT", str(folder))
    for context, source in kernels:
        monkeypatch.setenv("HALIDE_AD_SNAPSHOT_CONTEXT", context)
        record_source(source, "forward", "forward of f")
    (folder / "root.txt").write_text(root)


def test_compare_names_each_changed_kernel_with_a_diff(tmp_path, monkeypatch, capsys):
    same = "def forward(x, status):\n    return None\n"
    _record(tmp_path / "a", "/one", [("case", same), ("case", "# (/one/p.py:3, in f)\nx = 1\n")], monkeypatch)
    _record(tmp_path / "b", "/two", [("case", same), ("case", "# (/two/p.py:3, in f)\nx = 2\n")], monkeypatch)
    assert snapshot.compare(tmp_path / "a", tmp_path / "b") == 1
    out = capsys.readouterr().out
    assert "* case / forward of f / forward" in out and "-x = 1\n+x = 2" in out
    assert "1 of 2 kernels differ" in out


def test_compare_ignores_the_checkout_and_on_request_line_numbers(tmp_path, monkeypatch, capsys):
    _record(tmp_path / "a", "/one", [("case", "# (/one/t.py:3, in f)\n")], monkeypatch)
    _record(tmp_path / "b", "/two", [("case", "# (/two/t.py:4, in f)\n")], monkeypatch)
    assert snapshot.compare(tmp_path / "a", tmp_path / "b") == 1
    assert snapshot.compare(tmp_path / "a", tmp_path / "b", lines=False) == 0
    _record(tmp_path / "c", "/two", [("case", "# (/two/t.py:3, in f)\n"), ("other", "y = 1\n")], monkeypatch)
    capsys.readouterr()
    assert snapshot.compare(tmp_path / "a", tmp_path / "c") == 1  # a kernel more: counted, named
    assert "* other / forward of f / forward: 0 kernel(s) before, 1 after" in capsys.readouterr().out


def test_compare_ignores_another_checkouts_root_in_comments_only(tmp_path, monkeypatch):
    """A kernel the cache kept from another checkout names that checkout's files: the same kernel.
    A path outside a comment is code: a difference."""
    _record(tmp_path / "a", "/one", [("case", "    # f  (/main/tests/t.py:3, in f)\nx = '/main/tests/t.py:3, in '\n")],
            monkeypatch)
    _record(tmp_path / "b", "/two", [("case", "    # f  (/wt/x/tests/t.py:3, in f)\nx = '/main/tests/t.py:3, in '\n")],
            monkeypatch)
    _record(tmp_path / "c", "/two", [("case", "    # f  (/two/tests/t.py:3, in f)\nx = '/wt/x/tests/t.py:3, in '\n")],
            monkeypatch)
    assert snapshot.compare(tmp_path / "a", tmp_path / "b") == 0
    assert snapshot.compare(tmp_path / "a", tmp_path / "c") == 1


def test_nothing_is_recorded_without_the_setting(tmp_path, monkeypatch):
    monkeypatch.delenv("HALIDE_AD_KERNEL_SNAPSHOT", raising=False)
    monkeypatch.chdir(tmp_path)
    record_source("x = 1\n", "forward", "forward of f")
    assert not any(tmp_path.iterdir())
    with pytest.raises(FileNotFoundError):
        snapshot.load(tmp_path)
