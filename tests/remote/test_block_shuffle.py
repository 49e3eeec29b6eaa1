"""Map-style training reads over a shard set four times its cache, 2 ranks x 2 workers, 2 epochs, on moto's S3 server.

The block shuffle (chosen by itself: the split does not fit the limit) fetches each shard
at most once per epoch on the machine, every sample is read once per epoch over the
ranks, and the cache folder stays within its limit. The GETs are counted from the
server's own record of the requests it answered.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from stoker.loading import make_loader
from stoker.shards import ShardDataset
from stoker.shards.cache.entries import entry_cost

from .conftest import ServerRecord, upload_folder
from .test_cache_limit import EPOCHS, SHARDS, _gets, _Sampler, pack16  # noqa: F401 - pack16 is a fixture

__all__ = ["pack16"]


def _keys(batch: tuple[torch.Tensor, torch.Tensor]) -> list[str]:
    images, _ = batch
    return [hashlib.sha1(image.numpy().tobytes()).hexdigest() for image in images]


def _train_rank(rank: int, url: str, cache: str, limit: int, out: str, workers: int, batch: int) -> None:
    """One rank of a training-like loop: a gloo group, the loader's share, a collective per step (as DDP's)."""
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=2)
    try:
        ds = ShardDataset(url, cache_dir=cache, cache_limit=limit)
        loader = make_loader(ds, batch_size=batch, num_workers=workers, device="cpu", seed=4, backend="process")
        epochs = []
        for _ in range(EPOCHS):
            keys: list[str] = []
            for batch in loader:
                keys += _keys(batch)
                dist.all_reduce(torch.zeros(1))  # the ranks keep in step, as a gradient's all-reduce keeps them
            epochs.append(keys)
        blocks = loader._sampler.blocks  # type: ignore[union-attr]
        (Path(out) / f"rank{rank}.json").write_text(json.dumps({"epochs": epochs, "budget": blocks and blocks.budget}))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("workers", "batch"), [(0, 16), (2, 4)])
def test_map_style_training_over_a_set_four_times_its_cache_fetches_each_shard_once_per_epoch(
    s3_server: str, bucket: str, pack16: Path, tmp_path: Path, server_record: ServerRecord,  # noqa: F811
    forked_ranks: Callable[..., None], workers: int, batch: int,
) -> None:
    """1 and 2 workers per rank; with 2 (prefetch 2) the batch is one whose reads ahead stay within a block of 2 shards."""
    url = upload_folder(pack16, f"{bucket}/blocks{workers}")
    local = ShardDataset(pack16)
    infos = local.manifest.shards
    limit = 4 * entry_cost(max(i.bytes for i in infos)) + 8192  # 4 shards, and what the cached manifests take
    assert sum(entry_cost(i.bytes) for i in infos) >= 3.5 * limit  # the set is about four times the limit
    server_record.start()  # the uploads are not counted
    cache = tmp_path / "cache"
    sampler = _Sampler(cache)
    sampler.start()
    try:
        forked_ranks(_train_rank, url, str(cache), limit, str(tmp_path), workers, batch, world_size=2, timeout_s=240)
    finally:
        sampler.stop()
    every = sorted(_keys((torch.stack([local[i][0] for i in range(len(local))]), torch.zeros(0))))  # type: ignore[misc]
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert all(r["budget"] for r in results)  # the block shuffle was chosen by itself
    for epoch in range(EPOCHS):
        seen = sorted(key for r in results for key in r["epochs"][epoch])
        assert seen == every  # every sample exactly once per epoch, over both ranks (512 samples: nothing trimmed)
    gets = _gets(server_record, url.removeprefix("s3://"))
    assert sampler.samples > 10
    assert sampler.peak <= limit, f"the cache folder took {sampler.peak:,} bytes, over its limit of {limit:,}"
    assert 0 < gets <= SHARDS * EPOCHS, f"{gets} GETs for {SHARDS} shards x {EPOCHS} epochs"
