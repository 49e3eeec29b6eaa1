"""stoker.train.engine.search: the reader search lands near the peak of simulated rate-against-readers curves.

A curve is a step on a stand-in accelerator (``compute`` seconds that grow once readers take
the training process's CPU) fed by readers (``supply``: seconds a batch takes to arrive
with that many readers; 0 reads in the training process, in series with the step). The
search sees each trial through seeded noise and has a budget of trials, as in a run.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from stoker.train.engine.search import ReaderSearch

MOST = 16
BUDGET = 8  # trials, the start's included
NOISE = 0.03  # the spread of one trial's step time (log-normal)

Curve = Callable[[int], tuple[float, float]]  # readers -> (seconds a step, data-wait share)


def _curve(compute: Callable[[int], float], supply: Callable[[int], float], in_process: float) -> Curve:
    def step(readers: int) -> tuple[float, float]:
        if readers == 0:  # the training process reads, then computes
            total = compute(0) + in_process
            return total, in_process / total
        arrive, work = supply(readers), compute(readers)
        total = max(arrive, work)
        return total, (total - work) / total

    return step


CURVES: dict[str, Curve] = {
    # readers scale until 14 of 16 cores, then take the training thread's CPU
    "peak at 14": _curve(lambda r: 0.010 * (1 + 0.1 * max(0, r - 14)), lambda r: 0.140 / r, 0.140),
    # one reader keeps up; every further one slows the step
    "peak at 1": _curve(lambda r: 0.010 * (1 + 0.15 * max(0, r - 1)), lambda r: 0.005 / r, 0.005),
    # storage saturates at 6 readers; readers cost the step a little
    "peak at 6": _curve(lambda r: 0.010 * (1 + 0.02 * r), lambda r: 0.060 / min(r, 6), 0.060),
    # the step is faster than 16 readers can feed it
    "peak at 16": _curve(lambda r: 0.010, lambda r: 0.200 / r, 0.200),
    # pixels: a copy, cheapest in the training process; readers only cost
    "peak at 0": _curve(lambda r: 0.010 * (1 + 0.1 * r), lambda r: 0.005 / r, 0.0005),
    # the step is the limit whatever reads
    "flat": _curve(lambda r: 0.010, lambda r: 0.001 / r, 0.001),
}


def _search(curve: Curve, start: int, seed: int) -> tuple[int, list[int]]:
    rng = np.random.default_rng(seed)
    search = ReaderSearch(start=start, most=MOST)
    timed: list[int] = []
    while len(timed) < BUDGET and (readers := search.next()) is not None:
        seconds, wait = curve(readers)
        noise = float(np.exp(rng.normal(0.0, NOISE)))
        search.add(readers, seconds * noise, min(1.0, wait * noise))
        timed.append(readers)
    return search.best(), timed


@pytest.mark.parametrize("name", sorted(CURVES))
@pytest.mark.parametrize("start", [0, 2, 14, 16])  # nothing, the old constant, the machine default on 16 cores, all
def test_the_search_lands_within_ten_percent_of_the_peak_inside_its_budget(name: str, start: int) -> None:
    curve = CURVES[name]
    rates = {r: 1 / curve(r)[0] for r in range(MOST + 1)}
    peak = max(rates.values())
    for seed in range(20):
        chosen, timed = _search(curve, start, seed)
        assert len(timed) <= BUDGET and len(set(timed)) == len(timed)  # no count timed twice
        assert timed[0] == start
        assert rates[chosen] >= 0.9 * peak, (name, start, seed, timed, chosen)


def test_more_readers_while_the_step_waits_stepping_by_two() -> None:
    """The old search tried 2, 0, 1 and never 8 or 16: this one doubles while the step waits."""
    _, timed = _search(CURVES["peak at 16"], start=2, seed=0)
    assert timed[:4] == [2, 4, 8, 16]


def test_fewer_readers_when_the_step_hardly_waits() -> None:
    _, timed = _search(CURVES["peak at 1"], start=14, seed=0)
    assert timed[:4] == [14, 7, 3, 1]


def test_no_more_readers_than_the_start_when_the_step_does_not_wait() -> None:
    for seed in range(5):
        _, timed = _search(CURVES["flat"], start=14, seed=seed)
        assert max(timed) == 14 and len(timed) <= 5


def test_more_readers_are_not_tried_past_a_count_that_does_not_wait() -> None:
    search = ReaderSearch(start=4, most=16)
    search.add(4, s_per_step=0.010, wait_share=0.0)
    search.add(2, s_per_step=0.020, wait_share=0.5)
    assert search.next() == 3  # between 2 (waits) and 4; never above 4
    search.add(3, s_per_step=0.013, wait_share=0.2)
    assert search.next() is None and search.best() == 4
