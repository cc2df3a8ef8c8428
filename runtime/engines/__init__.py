"""Engines: code that computes a contraction (runtime/contract.py) faster than a generated loop
nest. Each module here has `plan(c: Contraction, *, any_size=False) -> Plan | None`; a plan has a
`name` (what hd.explain and the kernel source say) and `accumulate(buffers, *, assign=False)`.
runtime/route.py asks them in order, the direct convolution kernels first; BLAS takes every
contraction. An engine that declines a contraction for its size alone takes it with `any_size`
(route.engines: a block of a bigger array takes the whole array's engine).
"""
