"""Side-by-side benchmarks of halide_ad against PyTorch and JAX on the CPU.

Run everything with ``python -m benchmarks`` (``--help`` lists the options), or one group of
cases with ``--cases kernels`` or ``--cases everyday`` (`benchmarks.selection`). Each case in
`benchmarks.cases` and `benchmarks.everyday` is one program written three times (halide_ad,
PyTorch, JAX); the runner times forward and backward passes of each in one process, measures the
machine's lower bounds in the same run (`benchmarks.bounds`), checks halide_ad's outputs and
gradients against a peer, and prints markdown tables and writes JSON (`benchmarks.report`). Whole
calls (dispatch, a training step: `benchmarks.calls`) and first calls in fresh processes
(`benchmarks.warm_start`) are timed and checked the same way. BENCHMARKS.md in the project's shared folder
says how peers must be measured; this package follows it.
"""
