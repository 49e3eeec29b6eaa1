"""stoker.train.engine.threads: a CPU run leaves the loader workers their cores, from Python as from the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from stoker import Scenario, fit, make_loader, open_data
from stoker.train import SmallCNN
from stoker.train.engine.threads import ComputeThreads, usable_cores
from stoker.train.loggers import Logger


class _SeesThreads(Logger):
    def __init__(self) -> None:
        self.during: list[int] = []

    def batch_end(self, progress: object) -> None:
        self.during.append(torch.get_num_threads())


def test_fit_lowers_compute_threads_beside_loader_workers(tmp_path: Path, folders: Path) -> None:
    data = open_data(folders, valid=0.25, image_size=16)
    train = make_loader(data["train"], batch_size=40, num_workers=1, device="cpu")
    valid = make_loader(data["valid"], batch_size=40, shuffle=False, num_workers=0, device="cpu")
    model = SmallCNN(num_classes=data.num_classes)
    seen = _SeesThreads()
    torch.set_num_threads(2)  # what torch would pick on this machine's two cores
    fit(Scenario(model, torch.optim.SGD(model.parameters(), 0.01), nn.CrossEntropyLoss(), train, valid, epochs=1,
                 device="cpu", log_dir=tmp_path, name="t", loggers=(), plot=False), callbacks=[seen])
    assert set(seen.during) == {max(1, min(2, usable_cores() - 1))}
    assert torch.get_num_threads() == 2  # restored after the run


def test_the_rule_and_its_override() -> None:
    class L:
        num_workers = 3

    cpu = torch.device("cpu")
    torch.set_num_threads(2)
    assert ComputeThreads(cpu, [L()], requested=2).threads == 2
    assert ComputeThreads(cpu, [L()]).threads == max(1, min(2, usable_cores() - 3))
    assert ComputeThreads(cpu, []).threads == 2  # no workers: nothing to leave
    assert "3 left to the train loader's process workers" in ComputeThreads(cpu, [L()]).reason


def test_only_the_train_loaders_workers_count() -> None:
    """A validation folder's 2 workers wait while the model trains: the line names the train loader's, as it is."""

    class Train:
        num_workers, backend = 0, "process"

    class Valid:
        num_workers, backend = 2, "process"

    cpu = torch.device("cpu")
    torch.set_num_threads(2)
    chosen = ComputeThreads(cpu, [Train(), Valid()])
    assert chosen.threads == 2 and "left to" not in chosen.reason

    class Threads:
        num_workers, backend = 0, "thread"  # the thread backend reads on one pool thread even with 0 workers

    chosen = ComputeThreads(cpu, [Threads(), Valid()])
    assert chosen.threads == max(1, min(2, usable_cores() - 1))
    assert "1 left to the train loader's thread workers" in chosen.reason


def test_ranks_of_one_host_share_its_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks on one host, no workers: each gets its half of the cores, not torch's default of all of them."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    torch.set_num_threads(max(2, usable_cores()))
    chosen = ComputeThreads(torch.device("cpu"), [])
    assert chosen.threads == max(1, usable_cores() // 2)
    assert "share with 2 ranks on this host" in chosen.reason
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert ComputeThreads(torch.device("cpu"), []).threads == max(2, usable_cores())  # alone, no workers: unchanged
