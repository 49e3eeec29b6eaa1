"""stoker's map-style samplers: the loader reads stoker.order's epoch order, and each rank its share (real gloo ranks)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.utils.data import BatchSampler, SequentialSampler

from stoker.errors import ConfigError
from stoker.loading import EpochSampler, RankSlice, make_loader
from stoker.loading.samplers import IndexBatches
from stoker.order import permutation, share


def _epochs(loader, count: int) -> list[list[int]]:  # type: ignore[no-untyped-def]
    return [[int(i) for batch in loader for i in batch] for _ in range(count)]


@pytest.mark.parametrize("backend", ["process", "thread"])
def test_the_loader_reads_the_epoch_permutation(backend: str) -> None:
    loader = make_loader(list(range(10)), batch_size=4, num_workers=0 if backend == "process" else 2, device=None,
                         seed=3, backend=backend)  # type: ignore[arg-type]
    assert _epochs(loader, 2) == [permutation(10, 3, 0).tolist(), permutation(10, 3, 1).tolist()]
    unshuffled = make_loader(list(range(10)), batch_size=4, shuffle=False, num_workers=0, device=None)  # type: ignore[arg-type]
    assert _epochs(unshuffled, 1) == [list(range(10))]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("n", "batch_size"), [(0, 3), (1, 3), (9, 3), (10, 3), (10, 1), (5, 7)])
def test_index_batches_are_torchs_batch_sampler(n: int, batch_size: int, drop_last: bool) -> None:
    sampler = SequentialSampler(range(n))
    ours, torchs = IndexBatches(sampler, batch_size, drop_last), BatchSampler(sampler, batch_size, drop_last)
    assert list(ours) == list(torchs)
    assert len(ours) == len(torchs)


def test_an_in_process_loader_and_one_with_workers_give_the_same_batches() -> None:
    in_process = make_loader(list(range(23)), batch_size=4, num_workers=0, device=None, seed=5)  # type: ignore[arg-type]
    workers = make_loader(list(range(23)), batch_size=4, num_workers=2, device=None, seed=5)  # type: ignore[arg-type]
    for _ in range(2):
        assert [b.tolist() for b in in_process] == [b.tolist() for b in workers]
    assert len(in_process) == 6


def test_the_even_split_drops_the_tail_of_each_epochs_order_and_rank_slice_drops_none() -> None:
    even = [EpochSampler(range(11), r, 3, seed=1) for r in range(3)]
    for epoch in (0, 1):
        order = permutation(11, 1, epoch)
        for s in even:
            s.set_epoch(epoch)
        assert [list(s) for s in even] == [order[r:9:3].tolist() for r in range(3)]
        assert [len(s) for s in even] == [3, 3, 3] and {s.trimmed for s in even} == {2}
    uneven = [RankSlice(range(11), r, 3) for r in range(3)]
    assert [list(s) for s in uneven] == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8]]
    assert [len(s) for s in uneven] == [4, 4, 3] and {s.trimmed for s in uneven} == {0}
    with pytest.raises(ConfigError, match="rank=3 with world_size=3"):
        EpochSampler(range(4), 3, 3)


def _rank_main(rank: int, folder: str) -> None:
    import torch.distributed as dist

    early = make_loader(list(range(11)), batch_size=2, num_workers=0, device=None, seed=4)  # type: ignore[arg-type]
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=2)
    try:
        found = {"early": {"epochs": _epochs(early, 2), "trimmed": early.trimmed, "batches": len(early)}}
        for even in (True, False):
            loader = make_loader(list(range(11)), batch_size=2, num_workers=0, device=None, seed=4, even=even)  # type: ignore[arg-type]
            found[str(even)] = {"epochs": _epochs(loader, 2), "trimmed": loader.trimmed, "batches": len(loader)}
        Path(folder, f"rank{rank}.json").write_text(json.dumps(found))
    finally:
        dist.destroy_process_group()


def test_make_loader_under_two_gloo_ranks_reads_the_rank_shares(tmp_path: Path, forked_ranks: Callable[..., None]) -> None:
    forked_ranks(_rank_main, str(tmp_path))
    found = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    for rank, mine in enumerate(found):
        orders = [permutation(11, 4, epoch) for epoch in (0, 1)]
        assert mine["True"]["epochs"] == [share(order, rank, 2, even=True).tolist() for order in orders]
        assert mine["False"]["epochs"] == [share(order, rank, 2).tolist() for order in orders]
        assert mine["True"]["trimmed"] == (1 if rank == 0 else 0)  # counted once, on rank 0
        assert mine["False"]["trimmed"] == 0
    assert found[0]["True"]["batches"] == found[1]["True"]["batches"] == 3  # 5 samples each: equal steps
    # Made before the process group started (a Lightning module's loader): it splits once the ranks exist.
    assert [mine["early"] for mine in found] == [mine["True"] for mine in found]
    assert torch.distributed.is_available()
