"""Lowering, Python source generation, numba compilation and execution for halide_ad.

This package (installed as `halide_ad.runtime`) is the only code that imports numba.
"""
