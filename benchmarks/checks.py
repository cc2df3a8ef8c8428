"""halide_ad's results compared with a peer's, so that no wrong kernel's speed is reported."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RTOL = 1e-3  # float32 sums of up to ~1000 terms in different orders stay well inside this


@dataclass(frozen=True, slots=True)
class Check:
    """Whether values match a reference; `error` is max |value - reference| / max |reference|."""

    ok: bool
    error: float
    detail: str


def compare_arrays(values: Sequence[np.ndarray], references: Sequence[np.ndarray]) -> Check:
    """Match each array's shape and float32 dtype, and its values to `RTOL` of the reference's
    largest magnitude (allclose with an absolute tolerance scaled to the data)."""
    if len(values) != len(references):
        return Check(False, np.inf, f"{len(values)} arrays, expected {len(references)}")
    worst = 0.0
    for position, (value, reference) in enumerate(zip(values, references, strict=True)):
        value = np.asarray(value)
        if value.shape != reference.shape or value.dtype != np.float32:
            got, expected = f"{value.dtype}{list(value.shape)}", f"float32{list(reference.shape)}"
            return Check(False, np.inf, f"#{position}: {got}, expected {expected}")
        scale = max(float(np.max(np.abs(reference), initial=0.0)), np.finfo(np.float32).tiny)
        error = float(np.max(np.abs(value - reference), initial=0.0)) / scale
        worst = max(worst, error)
        if not np.allclose(value, reference, rtol=RTOL, atol=RTOL * scale):
            return Check(False, worst, f"#{position}: relative error {error:.2e}")
    return Check(True, worst, "")
