"""Solver results and generated code on disk, so that a new process does not run z3
(or the scheduler, which asks z3 too) again for a program it compiled before. It needs neither z3
nor numba: the solver and the driver both store through it.

One file per entry in `<cache dir>/solver/` (the kernels' cache dir: `HALIDE_AD_CACHE_DIR`, else
`~/.cache/halide_ad`), named by a sha256 of the key's repr and a salt: z3's and Python's versions and
a hash of halide_ad's source, so that editing the compiler invalidates old entries.
A file holds a sha256 of its payload, then the pickled (repr(key), value): a file that is
truncated, garbled, unreadable or for another key is a miss, never trusted, and the recomputed
value replaces it. Writes go to a temporary file in the same folder and `os.replace` it, so
concurrent processes see whole entries only; an unwritable cache dir just stores nothing.
"""
from __future__ import annotations

import functools
import glob
import hashlib
import importlib.metadata
import importlib.util
import os
import pickle
import sys
import tempfile

from halide_ad import config


@functools.cache
def _salt() -> str:
    """z3's and Python's versions and a hash of all of halide_ad's source: solver results
    and generated code both depend on it. The packages are found without importing them."""
    source = hashlib.sha256()
    for package in ("halide_ad", "halide_ad.solver", "halide_ad.runtime"):
        folder = os.path.dirname(importlib.util.find_spec(package).origin)
        for path in sorted(glob.glob(os.path.join(folder, "**", "*.py"), recursive=True)):
            with open(path, "rb") as fh:
                source.update(fh.read())
    return f"{importlib.metadata.version('z3-solver')}|{sys.version_info[:2]}|{source.hexdigest()}"


def _path(key_text: str) -> str:
    name = hashlib.sha256((_salt() + "\n" + key_text).encode()).hexdigest()
    return os.path.join(config.cache_dir(), "solver", f"{name}.pickle")


def load(key):
    """The value stored for `key`, or None (missing, corrupted or another key's entry)."""
    try:
        key_text = repr(key)
        with open(_path(key_text), "rb") as fh:
            data = fh.read()
        digest, payload = data[:32], data[32:]
        if hashlib.sha256(payload).digest() != digest:
            return None
        stored_key, value = pickle.loads(payload)
        return value if stored_key == key_text else None
    except Exception:  # missing, unreadable, unpicklable: recompute
        return None


def cached(key, compute, keep=lambda: True, load_stored=True):
    """`compute()`, or its value stored for `key` by an earlier call or process (where
    `load_stored`). Stored only where `keep()` holds once it is computed (the driver passes: no z3
    query answered 'unknown' meanwhile, so that a later run, with more time, may do better)."""
    value = load(key) if load_stored else None
    if value is None:
        value = compute()
        if keep():
            store(key, value)
    return value


def store(key, value) -> None:
    """Save `value` for `key` atomically; silently skipped where the cache dir is not writable."""
    tmp = None
    try:
        key_text = repr(key)
        path = _path(key_text)
        payload = pickle.dumps((key_text, value), protocol=pickle.HIGHEST_PROTOCOL)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(hashlib.sha256(payload).digest() + payload)
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old entry or the new one
        tmp = None
    except Exception:  # read-only or full disk, a value too deep to pickle: no entry
        if tmp is not None:
            try:
                os.remove(tmp)
            except OSError:
                pass
