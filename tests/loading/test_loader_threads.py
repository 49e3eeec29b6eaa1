"""Thread-backend loader threads run torch with an intra-op thread count of their own, whatever the process set."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from stoker.loading import backends, make_loader
from stoker.loading.backends import loader_intra_op_threads, own_intra_op_threads


@pytest.fixture()
def two_process_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture()
def one_process_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # fit's setting where the loaders take the cores
    yield
    torch.set_num_threads(before)


class _Recording(torch.utils.data.Dataset):
    """Sample i is i; each batch notes the torch thread count of the thread that read it."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.counts: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with self._lock:
            self.counts.append((threading.current_thread().name, torch.get_num_threads()))
        return torch.full((3, 2, 2), i % 256, dtype=torch.uint8), i


@pytest.mark.usefixtures("one_process_thread")
def test_loader_threads_have_their_own_count_and_the_process_keeps_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "LOADER_INTRA_OP_THREADS", 3)
    dataset = _Recording(97)
    loader = make_loader(dataset, batch_size=8, shuffle=True, num_workers=3, backend="thread", device="cpu")
    for epoch in range(2):
        loader.set_epoch(epoch)
        seen = [int(i) for _, labels in loader for i in labels]
        assert sorted(seen) == list(range(97))  # every sample once per epoch
    threads = {name for name, _ in dataset.counts}
    assert all(name.startswith("stoker-loader") for name in threads) and len(threads) >= 1
    assert {count for _, count in dataset.counts} == {3}
    assert torch.get_num_threads() == 1  # the training process's setting is untouched

    plain: list[int] = []
    other = threading.Thread(target=lambda: plain.append(torch.get_num_threads()))
    other.start()
    other.join()
    assert plain == [1]  # a thread started later still starts from the process's count


def test_the_default_loader_count_is_torch_default_not_the_process_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert loader_intra_op_threads() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert loader_intra_op_threads() == 5


@pytest.mark.usefixtures("two_process_threads")
def test_own_intra_op_threads_sets_the_calling_thread_alone() -> None:
    result: list[tuple[bool, int]] = []

    def run() -> None:
        done = own_intra_op_threads(3)
        result.append((done, torch.get_num_threads()))

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert result == [(True, 3)]
    assert torch.get_num_threads() == 2


@pytest.mark.usefixtures("two_process_threads")
def test_jpeg_batches_on_loader_threads_equal_the_in_process_ones(tmp_path: Path) -> None:
    from stoker.packer import pack
    from stoker.shards import ShardDataset
    from stoker.sources.synthetic import make_celeba

    make_celeba(tmp_path / "celeba", 40, classes=4, workers=1, progress=False, overwrite=True)
    pack([tmp_path / "celeba"], tmp_path / "jpeg", store="encoded", size=(112, 112), crop=(40, 20, 138, 138), seed=0,
         progress=False, workers=1, label_order="sorted")
    dataset = ShardDataset(tmp_path / "jpeg")
    assert dataset.loader_defaults["backend"] == "thread"

    def epoch(backend: str, workers: int) -> tuple[np.ndarray, np.ndarray]:
        loader = make_loader(dataset, batch_size=8, shuffle=True, seed=3, num_workers=workers, backend=backend,  # type: ignore[arg-type]
                             device="cpu")
        batches = list(loader)
        return torch.cat([b[0] for b in batches]).numpy(), torch.cat([b[1] for b in batches]).numpy()

    threaded, reference = epoch("thread", 2), epoch("process", 0)
    assert np.array_equal(threaded[1], reference[1])  # the same samples in the same order
    assert np.array_equal(threaded[0], reference[0])  # and the same pixels, exactly
