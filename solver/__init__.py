"""Index analysis for halide_ad: bounds proofs and the scatter-to-gather inverter.

This package (installed as `halide_ad.solver`) is the only code that imports z3.
"""
from halide_ad.solver.invert import Fallback, Gather, GatherPiece, invert

__all__ = ["Fallback", "Gather", "GatherPiece", "invert"]
