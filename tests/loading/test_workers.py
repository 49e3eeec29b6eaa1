"""The one worker default: the data set's measured loader_defaults, else the machine's share (a stream split by worker:
FALLBACK_WORKERS), wherever workers are left out."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from stoker import ConfigError, make_loader
from stoker.cores import CORES_ENV, usable_cores
from stoker.loading.workers import FALLBACK_WORKERS, batches_follow_workers, default_workers, machine_workers


class _Numbers(Dataset):
    def __init__(self, loader_defaults: dict[str, Any] | None = None) -> None:
        if loader_defaults is not None:
            self.loader_defaults = loader_defaults

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.zeros(3, 8, 8, dtype=torch.uint8), i % 2


class _Stream(IterableDataset):
    def __iter__(self):  # type: ignore[no-untyped-def]
        yield from ((torch.zeros(3, 8, 8, dtype=torch.uint8), i % 2) for i in range(8))


class _ElasticStream(_Stream):
    elastic = True  # its batches do not depend on the worker count


def test_the_rule_measured_defaults_else_the_machine() -> None:
    assert FALLBACK_WORKERS == 2  # stated in the README ("Loading in parallel") and the data.workers help
    assert default_workers({}, follows_workers=True) == default_workers({"backend": "thread"}, follows_workers=True) == 2
    assert default_workers({"num_workers": 0}) == 0 and default_workers({"num_workers": 3}, follows_workers=True) == 3
    assert default_workers(None, backend="thread", cores=16, ranks=1) == 14  # never a constant 2 on 16 cores
    for bad in (-1, True, 1.5, "2"):
        with pytest.raises(ConfigError, match="loader_defaults give num_workers"):
            default_workers({"num_workers": bad})


@pytest.mark.parametrize(("cores", "ranks", "accelerator", "expected"), [
    (1, 1, True, 0),  # one core: read in the training process
    (2, 1, True, 1), (4, 1, True, 3), (8, 1, True, 6), (16, 1, True, 14),  # the training process keeps 1, from 8 cores 2
    (16, 2, True, 6), (16, 4, True, 3), (16, 16, True, 0), (3, 4, True, 0),  # this rank's share of the host
    (2, 1, False, 1), (16, 1, False, 8), (16, 2, False, 4), (1, 1, False, 0),  # on the CPU the model takes half
])
def test_the_machine_share_follows_cores_and_local_ranks(cores: int, ranks: int, accelerator: bool, expected: int) -> None:
    assert machine_workers(accelerator=accelerator, backend="thread", cores=cores, ranks=ranks) == expected


def test_worker_processes_stay_within_their_share_of_memory() -> None:
    gib = 2**30
    plenty = {"accelerator": True, "cores": 16, "ranks": 1, "resident_bytes": gib}
    assert machine_workers(backend="process", available_bytes=64 * gib, **plenty) == 14
    assert machine_workers(backend="process", available_bytes=8 * gib, **plenty) == 4  # half of 8 GiB at 1 GiB each
    assert machine_workers(backend="process", available_bytes=gib, **plenty) == 0  # read in the training process
    assert machine_workers(backend="thread", available_bytes=gib, **plenty) == 14  # threads share the process's memory


def test_local_ranks_come_from_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert machine_workers(accelerator=True, backend="thread", cores=16) == 3


def test_the_core_count_is_set_by_stoker_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CORES_ENV, "16")
    assert usable_cores() == 16
    assert make_loader(_Numbers(), batch_size=4, device="cpu", backend="thread").num_workers == 8  # CPU: half of 16
    assert make_loader(_Numbers(), batch_size=4, device="meta", backend="thread").num_workers == 14
    for bad in ("0", "-2", "many"):
        monkeypatch.setenv(CORES_ENV, bad)
        with pytest.raises(ConfigError, match="STOKER_CORES"):
            usable_cores()


def test_a_stream_split_by_worker_keeps_the_constant(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its worker count decides its batches: a default that followed the machine would change them."""
    monkeypatch.setenv(CORES_ENV, "16")
    assert batches_follow_workers(_Stream()) and batches_follow_workers(_Stream)
    assert not batches_follow_workers(_ElasticStream()) and not batches_follow_workers(_Numbers())
    assert make_loader(_Stream(), batch_size=4, device="cpu").num_workers == FALLBACK_WORKERS
    elastic = batches_follow_workers(_ElasticStream())
    assert default_workers({}, follows_workers=elastic, backend="thread", cores=16, ranks=1) == 14  # the machine's


def test_make_loader_takes_the_rule_when_workers_are_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """stoker train defers to it too (data.workers unset: tests/train/test_data.py)."""
    monkeypatch.setenv(CORES_ENV, "4")
    assert make_loader(_Numbers(), batch_size=4, device="cpu").num_workers == 2  # half of 4 beside a CPU model
    assert make_loader(_Numbers({"num_workers": 1}), batch_size=4, device="cpu").num_workers == 1
    assert make_loader(_Numbers({"num_workers": 1}), batch_size=4, num_workers=0, device="cpu").num_workers == 0
