"""Runs one of the benchmark modules in a fresh Python process and reads back the JSON it wrote.

A measurement that must not share a process with the others goes through here: torch with its
huge-page allocator (`benchmarks.torch_thp`), first calls (`benchmarks.warm_start`), the backward's
peak memory (`benchmarks.memory`). Each such module takes `--json PATH` and writes its results there.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent


def run_json(module: str, arguments: Sequence[str], *,
             env: Mapping[str, str] | None = None) -> Any:
    """`python -m module *arguments --json PATH` from the repository root; the JSON at PATH.
    Raises subprocess.CalledProcessError when the process fails (its traceback is on stderr)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        command = [sys.executable, "-m", module, *arguments, "--json", str(out)]
        subprocess.run(command, cwd=REPO_ROOT, check=True, env=env)
        return json.loads(out.read_text())
