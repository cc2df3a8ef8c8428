"""halide_ad's calls after idle gaps: layer norm's forward over (4096, 1024) and tanh over 4M
float32, each timed call after a sleep and an untimed call, with the kernel threads kept off the
caller's CPU and left where the OS puts them (HALIDE_AD_PIN_WORKERS 1 and 0, which `parallel_for`
reads at each loop), in alternating rounds in one process, kernels compiled first.

    python -m benchmarks.after_idle [--sleep-ms 0,5,10,50] [--rounds 60]

A program that calls a kernel after its own Python work, data loading or a pause for input
meets its threads woken from sleep; the runner's tables time calls after 5 ms pauses. On this
2-vCPU VM a worker woken after 10 ms or more of idling often started on the caller's vCPU
(runtime/parallel.py, `_keep_workers_off_caller`).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HALIDE_AD_TIERED", "0")  # time the kernels, not the first calls' interpreter

import numpy as np  # noqa: E402

from benchmarks.everyday import ELEMENTS, ROWS, layer_norm, tanh  # noqa: E402


def measure(sleeps_s: list[float], rounds: int) -> dict[tuple[str, float, str], float]:
    """{(case, sleep, "kept off" or "left to the OS"): median ms of `rounds` timed calls}."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(ROWS, dtype=np.float32)
    gamma, beta = (rng.standard_normal(ROWS[1:], dtype=np.float32) for _ in range(2))
    flat = rng.standard_normal(ELEMENTS, dtype=np.float32)
    calls = {"layer norm forward": lambda: layer_norm(x, gamma, beta), "tanh forward": lambda: tanh(flat)}
    for call in calls.values():
        call()
        call()
    settings = {"kept off": "1", "left to the OS": "0"}
    samples: dict[tuple[str, float, str], list[float]] = {}
    before = os.environ.get("HALIDE_AD_PIN_WORKERS")
    try:
        for sleep_s in sleeps_s:
            for round_ in range(rounds):
                for setting in list(settings)[:: 1 if round_ % 2 else -1]:
                    os.environ["HALIDE_AD_PIN_WORKERS"] = settings[setting]
                    for name, call in calls.items():
                        time.sleep(sleep_s)
                        call()
                        start = time.perf_counter()
                        call()
                        samples.setdefault((name, sleep_s, setting), []).append(time.perf_counter() - start)
    finally:
        if before is None:
            os.environ.pop("HALIDE_AD_PIN_WORKERS", None)
        else:
            os.environ["HALIDE_AD_PIN_WORKERS"] = before
    return {key: statistics.median(times) * 1e3 for key, times in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sleep-ms", default="0,5,10,50", help="comma-separated idle gaps before each call")
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    sleeps = [float(ms) / 1e3 for ms in args.sleep_ms.split(",")]
    medians = measure(sleeps, args.rounds)
    print("| case | idle before the call | threads kept off the caller's CPU | left to the OS |")
    print("|---|---|---|---|")
    for name in ("layer norm forward", "tanh forward"):
        for sleep_s in sleeps:
            print(f"| {name} | {sleep_s * 1e3:g} ms | {medians[(name, sleep_s, 'kept off')]:.2f} ms "
                  f"| {medians[(name, sleep_s, 'left to the OS')]:.2f} ms |")


if __name__ == "__main__":
    main()
