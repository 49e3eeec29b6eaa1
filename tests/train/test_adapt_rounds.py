"""stoker.train.engine.adapt: what a round tries, driven by given step times (no clock: the choices, not the speed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from stoker import make_loader, open_data
from stoker.train.engine import adapt as adapt_module
from stoker.train.engine.adapt import Adapter, Setting

Times = Callable[[Setting], tuple[float, float]]  # the setting in force -> (seconds, wait) a batch


def _adapter(folders: Path, workers: int = 0, device: str = "cpu", cores: int = 2, batches: int = 100_000,
             lines: list[str] | None = None, backend: str = "process") -> Adapter:
    """``cores`` beyond this machine's: the thread backend (torch warns of more worker processes than cores)."""
    data = open_data(folders, valid=0.25, image_size=16, seed=0)
    loader = make_loader(data["train"], batch_size=2, num_workers=workers, device="cpu",  # no batch is read here
                         backend=backend)  # type: ignore[arg-type]
    return Adapter(loader, torch.device(device), batches=batches, cores=cores,
                   say=lines.append if lines is not None else None)


def _feed(adapter: Adapter, times: Times, batches: int) -> None:
    """What ``_AdaptedPass`` does between batches (apply the change asked for), with each setting's given times."""
    for _ in range(batches):
        change, adapter._change = adapter._change, None
        if change is not None:
            adapter._apply(change)
        adapter._observe(*times(adapter._setting_now()))


def _readers(setting: Setting) -> int:
    return max(setting.workers, 1) if setting.backend == "thread" else setting.workers


def _fed_by_readers(per_reader_s: float, step_s: float) -> Times:
    """A step of ``step_s`` that uses no CPU, fed by readers that each bring a batch every ``per_reader_s``."""
    def times(setting: Setting) -> tuple[float, float]:
        readers = _readers(setting)
        arrive = per_reader_s + step_s if readers == 0 else max(step_s, per_reader_s / readers)
        return arrive, arrive - step_s if readers else per_reader_s
    return times


def _tried(adapter: Adapter) -> list[tuple[str, int, int]]:
    return [(t["backend"], t["workers"], t["prefetch"]) for t in adapter.record()["trials"]]


# The backend stage tries worker processes at the count found: more than this machine's cores (torch warns).
MORE_PROCESSES_THAN_CORES = "ignore:This DataLoader will create"


@pytest.mark.filterwarnings(MORE_PROCESSES_THAN_CORES)
def test_a_step_that_waits_gets_more_readers_up_to_the_cores(folders: Path) -> None:
    """On 16 cores the old search tried 2, 0 and 1 workers and kept 2; this one doubles while the step waits."""
    adapter = _adapter(folders, workers=2, device="meta", cores=16, backend="thread")  # meta: not the CPU
    _feed(adapter, _fed_by_readers(per_reader_s=0.16, step_s=0.01), 600)
    record = adapter.record()
    assert [w for _, w, _ in _tried(adapter)][:4] == [2, 4, 8, 16]
    assert record["readers_timed"][:4] == [2, 4, 8, 16]
    assert Setting(**record["chosen"]).workers == 16 and record["in_force"] == record["chosen"]
    assert "waited" in record["reason"] and "16 loader threads, prefetch 2 was fastest" in record["reason"]


def test_on_the_cpu_a_step_that_hardly_waits_tries_fewer_readers_only(folders: Path) -> None:
    """The readers share the cores with the model: fewer of them may win what no wait could, and so may the other
    backend (worker processes compete with the training process for the cores; threads share its own)."""
    adapter = _adapter(folders, workers=2)
    _feed(adapter, lambda setting: (0.02, 0.001), 300)
    record = adapter.record()
    assert _tried(adapter) == [("process", 2, 2), ("thread", 2, 2),  # the other backend first: a cheap change
                               ("process", 1, 2), ("process", 0, 2)]  # fewer readers; no prefetch (nothing to hide)
    assert record["chosen"] == record["given"] and "hardly waited" in record["reason"]


def test_a_step_that_hardly_waits_in_the_training_process_tries_nothing_else(folders: Path) -> None:
    adapter = _adapter(folders, device="meta")
    _feed(adapter, lambda setting: (0.02, 0.001), 200)
    record = adapter.record()
    assert len(record["trials"]) == 1 and record["switches"] == 0 and "it is kept" in record["reason"]


def test_no_setting_is_timed_again_when_none_could_win(folders: Path) -> None:
    """Another setting replaces the given one only when clearly faster: with none within reach, the round ends
    after the search (one change back, no re-timing)."""
    adapter = _adapter(folders)
    _feed(adapter, lambda setting: {0: (0.02, 0.01), 1: (0.019, 0.005)}.get(_readers(setting), (0.03, 0.01)), 300)
    record = adapter.record()
    assert [w for _, w, _ in _tried(adapter)] == [0, 1, 2]
    assert record["chosen"] == record["given"] and record["in_force"] == record["given"]
    assert record["switches"] == 3  # two trials and the way back
    assert "none was 10% faster" in record["reason"]


def test_a_clear_winner_is_timed_again_against_the_start_and_kept(folders: Path) -> None:
    adapter = _adapter(folders)
    _feed(adapter, _fed_by_readers(per_reader_s=0.04, step_s=0.01), 400)
    record = adapter.record()
    tried = _tried(adapter)
    assert [w for _, w, _ in tried[:3]] == [0, 1, 2]
    assert tried[3:5] == [("process", 2, 2), ("process", 0, 2)]  # the winner (in force) and the start, again
    assert ("thread", 2, 2) in tried[5:]  # then the other backend at the winner's count
    assert Setting(**record["chosen"]).workers == 2 and record["in_force"] == record["chosen"]


@pytest.mark.filterwarnings(MORE_PROCESSES_THAN_CORES)
def test_a_search_its_budget_cut_short_goes_on_in_a_later_epoch(folders: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loader-bound with more readers left to time: adapt acts on it at the epoch's end instead of advising."""
    monkeypatch.setattr(adapt_module, "BUDGET_SHARE", 0.1)  # 1,000 batches: 100 a round (a trial's warm-up grows with its readers)
    lines: list[str] = []
    adapter = _adapter(folders, workers=1, device="meta", cores=64, batches=1000, lines=lines, backend="thread")
    times = _fed_by_readers(per_reader_s=0.64, step_s=0.01)
    _feed(adapter, times, 200)
    first = adapter.record()
    assert first["readers_timed"][:5] == [1, 2, 4, 8, 16] and 64 not in first["readers_timed"]
    assert "it goes on in a later epoch" in first["reason"] and Setting(**first["chosen"]).workers >= 16
    adapter.epoch_end(0.8)
    _feed(adapter, times, 300)
    record = adapter.record()
    assert record["continues"] == 1 and record["readers_timed"][:len(first["readers_timed"])] == first["readers_timed"]
    assert any("the search for the reader count goes on" in line for line in lines)
    assert Setting(**record["chosen"]).workers == 64


def test_the_loader_bound_finding_is_said_once(folders: Path) -> None:
    lines: list[str] = []
    adapter = _adapter(folders, workers=2, device="meta", cores=2, lines=lines)
    times = _fed_by_readers(per_reader_s=0.4, step_s=0.01)  # two readers are all there are, and still too few
    _feed(adapter, times, 300)
    assert adapter.search is not None and adapter.search.done()
    adapter.epoch_end(0.9)
    adapter.epoch_end(0.9)
    said = [line for line in lines if "reading is the limit here" in line]
    assert len(said) == 1 and adapter.record()["continues"] == 0
