"""benchmarks.timing: the libraries take turns, and one that raises leaves the turns alone."""
import pytest

from benchmarks import timing


@pytest.fixture(autouse=True)
def no_pause(monkeypatch):
    monkeypatch.setattr(timing, "PAUSE_S", 0.0)


def test_calls_take_turns_in_rotating_order_each_timed_after_an_untimed_call_of_its_own():
    log = []
    calls = {name: (lambda name=name: log.append(name)) for name in "abc"}
    timings, errors = timing.measure_turns(calls, 3, warmup=1)
    assert errors == {}
    assert set(timings) == set("abc") and all(len(t.samples_ms) == 3 for t in timings.values())
    turns = log[3:]  # after one warm-up of each
    assert log[:3] == list("abc")
    assert turns == list("aabbcc") + list("bbccaa") + list("ccaabb")


def test_a_single_call_is_timed_back_to_back_and_inner_batches_count_once_per_sample():
    log = []
    timings, errors = timing.measure_turns({"only": lambda: log.append(1)}, 4, warmup=2, inner=3)
    assert errors == {} and len(timings["only"].samples_ms) == 4
    assert len(log) == (2 + 4) * 3


def test_a_call_that_raises_leaves_the_turns_and_the_others_are_still_timed():
    log = []
    count = 0

    def flaky():
        nonlocal count
        count += 1
        if count == 3:
            raise RuntimeError("third call")

    timings, errors = timing.measure_turns({"a": lambda: log.append("a"), "flaky": flaky}, 5, warmup=1)
    assert list(errors) == ["flaky"] and str(errors["flaky"]) == "third call"
    assert set(timings) == {"a"} and len(timings["a"].samples_ms) == 5


def test_measure_raises_what_its_call_raised():
    def broken():
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        timing.measure(broken, 3)
    with pytest.raises(ValueError, match="repeat"):
        timing.measure(lambda: None, 0)


def test_a_subprocess_time_goes_on_the_main_run_scale_by_halide_ads_ratio():
    from benchmarks.torch_thp import on_main_scale

    def timings(forward, backward):
        return timing.Timings(timing.Timing(forward, forward, (forward,)),
                              timing.Timing(backward, backward, (backward,)), {})

    scaled = on_main_scale(timings(10.0, 20.0), ours_here=timings(2.0, 4.0), ours_main=timings(1.0, 6.0))
    assert scaled.forward.median_ms == 5.0 and scaled.backward.median_ms == 30.0
