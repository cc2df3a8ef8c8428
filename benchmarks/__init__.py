"""Side-by-side benchmarks of halide_ad against PyTorch and JAX on the CPU.

Run everything with ``python -m benchmarks`` (``--help`` lists the options). Each case in
`benchmarks.cases` is one program written three times (halide_ad, PyTorch, JAX); the runner times
forward and backward passes of each in one process, measures the machine's lower bounds in the same
run (`benchmarks.bounds`), checks halide_ad's outputs and gradients against a peer, and prints a
markdown table and writes JSON (`benchmarks.report`). BENCHMARKS.md in the project's shared folder
says how peers must be measured; this package follows it.
"""
