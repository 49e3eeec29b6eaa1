"""stoker.train.engine.adapt: what a round tries, driven by given step times (no clock: the choices, not the speed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stoker import make_loader, open_data
from stoker.train.engine import adapt as adapt_module
from stoker.train.engine.adapt import Adapter, Setting

Times = dict[tuple[str, int, int], tuple[float, float]]  # (backend, workers, prefetch) -> (seconds, wait) a batch


def _adapter(folders: Path, monkeypatch: pytest.MonkeyPatch, workers: int = 0, device: str = "cpu") -> Adapter:
    monkeypatch.setattr(adapt_module, "usable_cores", lambda: 2)  # candidates 0, 1 and 2 workers on any machine
    data = open_data(folders, valid=0.25, image_size=16, seed=0)
    loader = make_loader(data["train"], batch_size=2, num_workers=workers, device="cpu")  # no batch is read here
    return Adapter(loader, torch.device(device), batches=100_000)


def _feed(adapter: Adapter, times: Times, batches: int, default: tuple[float, float]) -> None:
    """What ``_AdaptedPass`` does between batches (apply the change asked for), with each setting's given times."""
    for _ in range(batches):
        change, adapter._change = adapter._change, None
        if change is not None:
            adapter._apply(change)
        now = adapter._setting_now()
        adapter._observe(*times.get((now.backend, now.workers, now.prefetch), default))


def test_a_step_that_hardly_waits_tries_no_loader_setting(folders: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loader setting saves at most the step's data wait: at 5 % (under the margin) nothing else is tried."""
    adapter = _adapter(folders, monkeypatch)
    _feed(adapter, {}, 200, default=(0.02, 0.001))
    record = adapter.record()
    assert [t["workers"] for t in record["trials"]] == [0] and record["switches"] == 0
    assert record["chosen"] == record["given"] and "waits 5% for data" in record["reason"]


def test_on_the_cpu_a_step_that_hardly_waits_tries_fewer_readers_only(folders: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU the readers share the cores with the model: fewer of them may win what no wait could."""
    adapter = _adapter(folders, monkeypatch, workers=2)
    _feed(adapter, {}, 300, default=(0.02, 0.001))
    record = adapter.record()
    tried = [(t["backend"], t["workers"], t["prefetch"]) for t in record["trials"]]
    assert tried == [("process", 2, 2), ("process", 0, 2), ("process", 1, 2), ("thread", 1, 2)]  # no prefetch, no more
    assert record["chosen"] == record["given"] and "only fewer readers" in record["reason"]


def test_off_the_cpu_a_step_that_hardly_waits_tries_no_loader_setting(folders: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = _adapter(folders, monkeypatch, workers=2, device="meta")  # a device that is not the CPU
    _feed(adapter, {}, 200, default=(0.02, 0.001))
    record = adapter.record()
    assert len(record["trials"]) == 1 and record["switches"] == 0 and "settings are kept" in record["reason"]


def test_no_setting_is_timed_again_when_none_could_win(folders: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another setting replaces the given one only when clearly faster: with none within reach after the first
    trials, the round ends there (one change back, no re-timing)."""
    adapter = _adapter(folders, monkeypatch)
    _feed(adapter, {("process", 0, 2): (0.02, 0.01), ("process", 1, 2): (0.019, 0.005)}, 300, default=(0.03, 0.01))
    record = adapter.record()
    tried = [(t["backend"], t["workers"]) for t in record["trials"]]
    assert tried == [("process", 0), ("process", 1), ("process", 2), ("thread", 1), ("thread", 2)]
    assert record["chosen"] == record["given"] and record["in_force"] == record["given"]
    assert record["switches"] == 5  # four trials and the way back


def test_a_clear_winner_is_timed_again_against_the_start_and_kept(folders: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = _adapter(folders, monkeypatch)
    times = {("process", 0, 2): (0.02, 0.01), ("thread", 2, 2): (0.01, 0.001), ("thread", 2, 4): (0.0105, 0.001)}
    _feed(adapter, times, 400, default=(0.03, 0.01))
    record = adapter.record()
    tried = [(t["backend"], t["workers"], t["prefetch"]) for t in record["trials"]]
    assert tried[5:7] == [("thread", 2, 2), ("process", 0, 2)]  # the winner (in force) and the start, again
    assert ("thread", 2, 4) in tried[7:]  # then the winner's prefetch depth
    assert Setting(**record["chosen"]) == Setting("thread", 2, 2)
    assert record["in_force"] == record["chosen"]
