"""z3 objects freed by Python's garbage collector in another thread than the one that made them.

Each thread solves in a z3 context of its own (`z3_bridge._context`), but a reference cycle
holding a thread's z3 objects is freed by whichever thread runs the collection: a compile on the
background thread (halide_ad/tiered.py) collects while the calling thread inverts. Without
z3's concurrent dec_ref, such a run segfaulted or hung within seconds.
"""
import subprocess
import sys
import textwrap

STRESS = textwrap.dedent("""
    import gc, threading, time
    import z3
    from halide_ad.solver.z3_bridge import _context

    garbage, stop = [], threading.Event()

    def solve():
        ctx = _context()
        x, y = z3.Int("x", ctx), z3.Int("y", ctx)
        n = 0
        while not stop.is_set():
            s = z3.Solver(ctx=ctx)
            s.add(x * 3 + y == n, x > 0, y < 5, x % 7 == 2)
            s.check()
            cycle = [x + n, s]
            cycle.append(cycle)
            garbage.append(cycle)
            n += 1

    worker = threading.Thread(target=solve)
    worker.start()
    end = time.monotonic() + 5
    while time.monotonic() < end:
        garbage.clear()
        gc.collect()  # frees the worker's z3 objects from this thread
    stop.set()
    worker.join()
    print("done")
""")


def test_z3_objects_freed_by_another_threads_collection():
    done = subprocess.run([sys.executable, "-c", STRESS], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "done", (done.returncode, done.stderr[-2000:])
