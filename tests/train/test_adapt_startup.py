"""stoker.train.engine.adapt and the readers' start: a change starts readers that take time (and the CPU) to start.

Driven by given step times, no clock: after a change, the first batches come slowly
while the new readers start (worker processes on few cores take seconds), then at the
setting's own pace. A trial must time the pace, not the start, and the run must not pay
for starts past its budget.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stoker import make_loader, open_data
from stoker.train.engine.adapt import Adapter, Setting, warm_batches

# The search tries more worker processes than this machine's cores (torch warns).
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def _adapter(folders: Path, workers: int, batches: int, cores: int = 16) -> Adapter:
    data = open_data(folders, valid=0.25, image_size=16, seed=0)
    loader = make_loader(data["train"], batch_size=2, num_workers=workers, device="cpu")  # no batch is read here
    return Adapter(loader, torch.device("meta"), batches=batches, cores=cores)  # meta: the model is not on the CPU


def _readers(setting: Setting) -> int:
    return max(setting.workers, 1) if setting.backend == "thread" else setting.workers


def _feed(adapter: Adapter, batches: int, start_s: float, per_reader_s: float = 0.16, step_s: float = 0.01) -> None:
    """A step of ``step_s`` fed by readers that each bring a batch every ``per_reader_s``; after a change (and at the
    run's start) the first ``readers x prefetch - 1`` batches take ``start_s`` each, waiting: the readers starting."""
    starting = warm_batches(adapter._setting_now()) - 1
    for _ in range(batches):
        change, adapter._change = adapter._change, None
        if change is not None:
            adapter._apply(change)
            starting = warm_batches(change) - 1
        readers = _readers(adapter._setting_now())
        arrive = per_reader_s + step_s if readers == 0 else max(step_s, per_reader_s / readers)
        if starting > 0:
            starting -= 1
            adapter._observe(start_s, start_s - step_s)
        else:
            adapter._observe(arrive, arrive - step_s)


def test_a_trial_times_the_readers_pace_not_their_start(folders: Path) -> None:
    """More readers are faster, but start slowly: timed while starting they looked slower and the start was kept."""
    adapter = _adapter(folders, workers=2, batches=100_000)
    _feed(adapter, 600, start_s=0.3)
    record = adapter.record()
    assert record["readers_timed"][:3] == [2, 4, 8]
    assert Setting(**record["chosen"]).workers == 16 and record["in_force"] == record["chosen"]
    timed = {t["workers"]: t["ms_per_batch"] for t in record["trials"] if t["backend"] == "process"}
    assert timed[4] == pytest.approx(40.0) and timed[8] == pytest.approx(20.0)  # the pace: 0.16 s / readers
    settings = [Setting(t["backend"], t["workers"], t["prefetch"]) for t in record["trials"]]
    changed = [i for i in range(1, len(settings)) if settings[i] != settings[i - 1]]  # a trial that started readers
    assert changed and all(record["trials"][i]["warm_batches"] >= warm_batches(settings[i]) for i in changed)


def test_the_readers_start_counts_in_what_a_run_may_spend_on_trials(folders: Path) -> None:
    """Starting readers costs seconds: a run of 20 s stops trying once the starts have taken its budget, and the
    way back to the setting it keeps counts too (it was 8 changes, to 16 readers and back)."""
    adapter = _adapter(folders, workers=2, batches=2_000)  # at 2 readers: 80 ms a step, waiting 88 %: a run of 160 s
    _feed(adapter, 2_000, start_s=1.0)
    record = adapter.record()
    run_s = 2_000 * 0.08
    spent_s = sum(t["spent_s"] for t in record["trials"][1:])
    allowed_s = 0.25 * (0.08 - 0.01) / 0.08 * run_s  # a quarter of what the data wait costs the run
    assert record["switches"] <= 3 and spent_s <= allowed_s
    assert record["continues"] == 0 and record["rechecks"] == 0


def test_worker_processes_are_first_compared_with_threads_and_the_search_goes_on_with_the_faster(folders: Path) -> None:
    """Worker processes that take the training process's CPU (a slow step that hardly waits): the same count on threads,
    a cheap change, is timed before any other count, and the search steps the count of the faster backend."""
    adapter = _adapter(folders, workers=8, batches=100_000)

    def times(setting: Setting) -> tuple[float, float]:
        return (0.05, 0.001) if setting.backend == "process" and setting.workers else (0.01, 0.001)

    for _ in range(400):
        change, adapter._change = adapter._change, None
        if change is not None:
            adapter._apply(change)
        adapter._observe(*times(adapter._setting_now()))
    record = adapter.record()
    tried = [(t["backend"], t["workers"]) for t in record["trials"]]
    assert tried[:2] == [("process", 8), ("thread", 8)]
    assert all(backend == "thread" for backend, workers in tried[2:] if workers != 8)  # other counts: on threads
    assert Setting(**record["chosen"]).backend == "thread" and record["in_force"] == record["chosen"]
