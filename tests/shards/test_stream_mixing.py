"""ShardStream over a class-sorted pack cut into shards of one class each (issue 21).

Read one shard at a time, a buffer holding about one shard gave batches of one class;
read several shards at once, its batches hold as many classes as a shuffled pack's, for
0 or 2 workers and 1 or 2 ranks. When the mix is poor anyway (a buffer and a reading made
too small on purpose), training, ``stoker inspect`` and the check say so, with the fix.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from stoker.loading import make_loader
from stoker.packer import pack
from stoker.shards import ShardStream
from stoker.shards.check.quality import check_stream, loader_label_streams

CLASSES, PER_CLASS, BATCH = 10, 40, 16


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same 10 classes x 40 tiny images packed class-sorted (one class per shard) and shuffled."""
    root = tmp_path_factory.mktemp("mixing")
    src = root / "src"
    for label in range(CLASSES):
        (src / f"{label:02d}").mkdir(parents=True)
        for j in range(PER_CLASS):
            Image.fromarray(np.full((4, 4, 3), label * 20 + j % 3, dtype=np.uint8)).save(src / f"{label:02d}" / f"{j:02d}.png")
    out = {"sorted": root / "sorted", "shuffled": root / "shuffled"}
    pack(src, out["sorted"], shuffle=False, shard_samples=PER_CLASS, store="pixels", progress=False, workers=0)
    pack(src, out["shuffled"], shard_samples=PER_CLASS, store="pixels", progress=False, workers=0)
    return out


def _batches(stream: ShardStream, workers: int) -> list[list[int]]:
    loader = make_loader(stream, batch_size=BATCH, num_workers=workers, device="cpu")
    return [batch[1].tolist() for batch in loader]


def test_the_sorted_pack_is_cut_into_shards_of_one_class(packs: dict[str, Path]) -> None:
    stream = ShardStream(packs["sorted"], shuffle=False)
    labels = np.asarray(stream.dataset.labels)
    sizes = [info.samples for info in stream.dataset.shards.infos]
    assert sizes == [PER_CLASS] * CLASSES
    assert all(len(set(labels[i : i + PER_CLASS].tolist())) == 1 for i in range(0, len(labels), PER_CLASS))
    assert ShardStream(packs["sorted"]).shards_at_once == CLASSES  # every shard at once: fewer than 32


@pytest.mark.parametrize(("workers", "world_size"), [(0, 1), (2, 1), (0, 2), (2, 2)])
def test_batches_of_a_class_sorted_pack_hold_as_many_classes_as_a_shuffled_packs(
    packs: dict[str, Path], workers: int, world_size: int
) -> None:
    seen: list[int] = []
    per_batch = {}
    for name in ("sorted", "shuffled"):
        counts = []
        for rank in range(world_size):
            stream = ShardStream(packs[name], shuffle_buffer=8, seed=5, rank=rank, world_size=world_size)
            batches = _batches(stream, workers)
            assert sum(len(b) for b in batches) == len(stream)  # len(): this rank's share
            counts += [len(set(b)) for b in batches if len(b) == BATCH]
            if name == "sorted":
                seen += [label for b in batches for label in b]
        per_batch[name] = float(np.mean(counts))
    assert sorted(seen) == sorted(np.repeat(np.arange(CLASSES), PER_CLASS).tolist())  # exactly once over ranks x workers
    assert per_batch["sorted"] >= 0.9 * per_batch["shuffled"], per_batch
    # what it was, one shard at a time (the buffer of 8 holds a fifth of a shard): about one class per batch
    one = ShardStream(packs["sorted"], shuffle_buffer=8, seed=5, rank=0, world_size=world_size, shards_at_once=1)
    assert float(np.mean([len(set(b)) for b in _batches(one, 0) if len(b) == BATCH])) < 0.5 * per_batch["shuffled"]


def test_the_scored_stream_is_the_one_the_loader_delivers_with_shards_at_once(packs: dict[str, Path]) -> None:
    stream = ShardStream(packs["sorted"], shuffle_buffer=4, seed=3, rank=1, world_size=2, shards_at_once=3)
    stored = ShardStream(packs["sorted"], shuffle=False)
    expected = loader_label_streams(np.asarray(stored.dataset.labels), [PER_CLASS] * CLASSES, batch_size=BATCH,
                                    workers=2, ranks=2, seed=3, shuffle_buffer=4, shards_at_once=3)[1]
    assert [label for b in _batches(stream, 2) for label in b] == expected.tolist()


def test_resuming_mid_epoch_reads_the_rest_of_the_interleaved_order(packs: dict[str, Path]) -> None:
    stream = ShardStream(packs["sorted"], shuffle_buffer=8, seed=2, read_rows=16, shards_at_once=4)
    stream.set_epoch(1)
    whole = [label for _, label in stream]
    assert [label for _, label in stream.iter_from(37)] == whole[37:]
    assert len(set(whole[:40])) >= 4  # the first 40 rows come from a group of four one-class shards


def test_check_stream_names_the_setting_that_fixes_a_poor_mix(packs: dict[str, Path]) -> None:
    poor = check_stream(ShardStream(packs["sorted"], shuffle_buffer=2, shards_at_once=1), BATCH, num_workers=2)
    assert poor is not None and not poor.ok and poor.quality.classes_per_batch < 3
    assert poor.fix == "shards_at_once" and poor.fixed is not None and poor.fixed.ok
    assert f"shards_at_once={poor.fix_value}" in poor.warning("sorted")
    assert "is not well mixed" in poor.warning("sorted") and "classes on average" in poor.warning("sorted")
    good = check_stream(ShardStream(packs["sorted"], shuffle_buffer=2), BATCH, num_workers=2, world_size=2)
    assert good is not None and good.ok and good.fix is None
    assert check_stream(ShardStream(packs["sorted"], shuffle=False), BATCH, 0) is None  # stored order: not scored


def _scenario(stream: ShardStream) -> object:
    from stoker.train import Scenario

    model = nn.Sequential(nn.Flatten(), nn.LazyLinear(CLASSES))
    loader = make_loader(stream, batch_size=BATCH, num_workers=0, device="cpu")
    return Scenario(model, torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1), nn.CrossEntropyLoss(), loader,
                    None, epochs=1, device="cpu")


def test_training_says_before_the_first_epoch_when_the_stream_is_poorly_mixed(
    packs: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="stoker"):
        _scenario(ShardStream(packs["sorted"], shuffle_buffer=2))
        assert not [r for r in caplog.records if "not well mixed" in r.getMessage()]
        _scenario(ShardStream(packs["sorted"], shuffle_buffer=2, shards_at_once=1))  # too small on purpose
    warned = [r.getMessage() for r in caplog.records if "not well mixed" in r.getMessage()]
    assert len(warned) == 1 and "shards_at_once=" in warned[0] and str(packs["sorted"]) in warned[0], warned


def _gloo_rank(rank: int, folder: str, sorted_pack: str) -> None:
    import torch.distributed as dist

    from stoker.shards.check.quality import warn_if_poorly_mixed

    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=2)
    try:
        stream = ShardStream(sorted_pack, shuffle_buffer=8, seed=5)  # placement from torch.distributed
        batches = _batches(stream, workers=2)
        poor = warn_if_poorly_mixed(ShardStream(sorted_pack, shuffle_buffer=2, shards_at_once=1), BATCH, 2)
        found = {"batches": batches, "len": len(stream), "warned": None if poor is None else poor.warning("x")}
        Path(folder, f"rank{rank}.json").write_text(json.dumps(found))
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_with_two_workers_read_mixed_batches_once_and_rank_0_warns(
    packs: dict[str, Path], tmp_path: Path, forked_ranks: Callable[..., None]
) -> None:
    forked_ranks(_gloo_rank, str(tmp_path), str(packs["sorted"]))
    found = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    seen = [label for mine in found for batch in mine["batches"] for label in batch]
    assert sorted(seen) == sorted(np.repeat(np.arange(CLASSES), PER_CLASS).tolist())  # exactly once
    assert [sum(len(b) for b in mine["batches"]) for mine in found] == [mine["len"] for mine in found] == [200, 200]
    shuffled = ShardStream(packs["shuffled"], shuffle=False)
    reference = loader_label_streams(np.asarray(shuffled.dataset.labels), [PER_CLASS] * CLASSES, batch_size=BATCH,
                                     workers=2, ranks=2, seed=5, shuffle_buffer=8)
    expected = np.mean([len(set(s[i : i + BATCH].tolist())) for s in reference for i in range(0, len(s) - BATCH + 1, BATCH)])
    got = np.mean([len(set(b)) for mine in found for b in mine["batches"] if len(b) == BATCH])
    assert got >= 0.9 * expected, (got, expected)
    assert found[1]["warned"] is None and "is not well mixed" in found[0]["warned"]  # measured and said on rank 0 only
