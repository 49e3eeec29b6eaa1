"""The block shuffle of a map-style shard set larger than its cache: the order, its split, its resume, its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from stoker import pack
from stoker.errors import ConfigError
from stoker.loading import make_loader
from stoker.loading.samplers import EpochSampler
from stoker.order import ShuffleBlocks, block_permutation, permutation, share
from stoker.shards import ShardDataset
from stoker.shards.cache.entries import entry_cost

from ..remote.conftest import pack_random, upload_folder, write_class_folders

SIZES = (7, 5, 8, 6, 9, 4, 7, 5)  # samples per shard: unequal, so a block's edges are not multiples of anything


def _starts() -> np.ndarray:
    return np.concatenate(([0], np.cumsum(SIZES)[:-1]))


def _shard_of(items: np.ndarray) -> np.ndarray:
    return np.searchsorted(_starts(), items, side="right") - 1


def test_blocks_hold_whole_shards_within_the_budget_and_every_sample_once() -> None:
    """Each stretch of the order is one block: whole shards whose costs fit the budget; every sample once per epoch."""
    costs = (3, 2, 4, 3, 5, 2, 3, 2)
    blocks = ShuffleBlocks(SIZES, costs, budget=7)
    for epoch in range(3):
        order = block_permutation(blocks, seed=1, epoch=epoch)
        assert sorted(order.tolist()) == list(range(sum(SIZES)))
        shard_order = permutation(len(SIZES), 1, epoch, 6)
        at = 0
        for block in blocks.blocks(shard_order):
            assert sum(costs[s] for s in block) <= 7 or len(block) == 1
            n = sum(SIZES[s] for s in block)
            assert set(_shard_of(order[at : at + n]).tolist()) == set(block.tolist())  # the block's shards, whole
            at += n
        assert at == sum(SIZES)
    assert not np.array_equal(block_permutation(blocks, 1, 0), block_permutation(blocks, 1, 1))  # a new order each epoch
    assert np.array_equal(block_permutation(blocks, 1, 0), block_permutation(blocks, 1, 0))  # from seed and epoch alone


def test_the_block_shuffle_differs_from_the_plain_shuffle_only_by_its_grouping() -> None:
    """One block holding every shard is the plain shuffle itself; smaller blocks read fewer shards per stretch, not other samples."""
    n = sum(SIZES)
    whole = ShuffleBlocks(SIZES, (1,) * len(SIZES), budget=len(SIZES))
    assert np.array_equal(block_permutation(whole, 3, 2), permutation(n, 3, 2))
    small = ShuffleBlocks(SIZES, (1,) * len(SIZES), budget=2)
    order = block_permutation(small, 3, 2)
    window = 8  # no block is shorter (2 shards of >= 4): a window meets two blocks at most, so 4 shards; the plain shuffle ~5
    spread_blocks = max(len(set(_shard_of(order[i : i + window]).tolist())) for i in range(0, n - window))
    spread_plain = np.mean([len(set(_shard_of(permutation(n, 3, e)[:window]).tolist())) for e in range(20)])
    assert spread_blocks <= 4 < spread_plain
    # within a block the samples are in a uniform order: each of a block's positions meets each of its samples
    one = ShuffleBlocks((6, 6), (1, 1), budget=1)
    hits = np.zeros((6, 6))
    for epoch in range(400):
        o = block_permutation(one, 0, epoch)
        first = o[:6] if o[0] < 6 else o[6:]
        hits[np.arange(6), first] += 1
    assert hits.min() > 30  # 400 / 6 ~ 67 each: no position is stuck with some samples


def test_a_view_is_grouped_by_the_shards_of_its_own_rows() -> None:
    """positions: the view's items in shard order; the order holds each once, each block's items from its shards only."""
    shard_of_item = np.asarray([2, 0, 1, 2, 0, 0, 1, 2, 1, 0])  # a view of 10 rows spread over 3 shards
    positions = np.argsort(shard_of_item, kind="stable")
    blocks = ShuffleBlocks((4, 3, 3), (1, 1, 1), budget=1, positions=positions)
    order = block_permutation(blocks, seed=0, epoch=0)
    assert sorted(order.tolist()) == list(range(10))
    shards = shard_of_item[order]
    runs = [int(s) for k, s in enumerate(shards.tolist()) if k == 0 or s != shards[k - 1]]
    assert sorted(runs) == [0, 1, 2]  # one block per shard: each shard's items together
    with pytest.raises(ConfigError, match="positions"):
        ShuffleBlocks((4, 3, 3), (1, 1, 1), budget=1, positions=positions[:5])


def test_the_sampler_splits_a_block_order_by_rank_as_any_other() -> None:
    """EpochSampler over a data set that shuffles in blocks: the ranks' shares are the block order's split, disjoint, whole."""

    class Blocked:
        def __len__(self) -> int:
            return sum(SIZES)

        def shuffle_blocks(self, scope: str) -> ShuffleBlocks | None:
            return None if scope == "split" else ShuffleBlocks(SIZES, (1,) * len(SIZES), budget=2)

    samplers = [EpochSampler(Blocked(), rank, 2, seed=5) for rank in range(2)]
    for s in samplers:
        s.set_epoch(1)
    order = block_permutation(ShuffleBlocks(SIZES, (1,) * len(SIZES), budget=2), 5, 1)
    got = [list(s) for s in samplers]
    assert got == [share(order, r, 2, even=True).tolist() for r in range(2)]
    assert sorted(got[0] + got[1]) == sorted(order[: len(order) - len(order) % 2].tolist())
    plain = EpochSampler(Blocked(), 0, 2, seed=5, scope="split")
    plain.set_epoch(1)
    assert list(plain) == share(permutation(sum(SIZES), 5, 1), 0, 2, even=True).tolist()
    with pytest.raises(ConfigError, match="shuffle_scope must be one of"):
        EpochSampler(Blocked(), scope="shards")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--shuffle-scope blocks"):
        EpochSampler(list(range(4)), scope="blocks")


@pytest.fixture(scope="module")
def pack12(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """192 random 16x16 images in 12 pixel shards of 16."""
    return pack_random(tmp_path_factory.mktemp("pack12"), shards=12, per_shard=16)


def _keys(batch: object) -> list[int]:
    images, _ = batch  # type: ignore[misc]
    return [int(x) for x in images.reshape(len(images), -1)[:, :8].to(torch.int64).sum(1).tolist()]


def _remote(pack12: Path, tmp_path: Path, tail: str, shards_held: int) -> ShardDataset:
    url = upload_folder(pack12, f"memory://stoker-blocks-test/{tail}")
    limit = shards_held * entry_cost(max(i.bytes for i in ShardDataset(pack12).manifest.shards))
    return ShardDataset(url, cache_dir=tmp_path / f"cache-{tail}", cache_limit=limit)


def test_a_split_larger_than_its_cache_is_shuffled_in_blocks_by_itself_said_once(
    pack12: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """auto: blocks (said once, with their size); each shard downloaded once per epoch; 'split' fetches again and says so."""
    ds = _remote(pack12, tmp_path, "auto", shards_held=4)
    with caplog.at_level("WARNING", logger="stoker"):
        loader = make_loader(ds, batch_size=16, num_workers=0, device="cpu", seed=2)
        for epoch in range(2):
            keys = [k for batch in loader for k in _keys(batch)]
            assert len(keys) == len(ds)
            assert ds.shards.cache.downloads <= 12 * (epoch + 1)  # type: ignore[union-attr]
    said = [r.getMessage() for r in caplog.records if "shuffled in blocks of shards of at most" in r.getMessage()]
    assert len(said) == 1 and "--shuffle-scope split" in said[0]
    assert not any("fetch shards again each time" in r.getMessage() for r in caplog.records)
    assert loader.state_dict()["order_plan"] == {"shuffle_blocks_budget": ds.shuffle_blocks("auto").budget}  # type: ignore[union-attr]

    plain = _remote(pack12, tmp_path, "split", shards_held=4)
    with caplog.at_level("WARNING", logger="stoker"):
        loader = make_loader(plain, batch_size=16, num_workers=0, device="cpu", seed=2, shuffle_scope="split")
        assert len([k for batch in loader for k in _keys(batch)]) == len(plain)
    assert plain.shards.cache.downloads > 12  # type: ignore[union-attr]  # the plain shuffle meets shards again
    assert any("--shuffle-scope" in r.getMessage() and "fetch shards again" in r.getMessage() for r in caplog.records)


def test_blocks_need_a_cache_limit(pack12: Path) -> None:
    with pytest.raises(ConfigError, match="--shuffle-scope blocks.*cache limit"):
        make_loader(ShardDataset(pack12), batch_size=16, num_workers=0, device="cpu", shuffle_scope="blocks")
    assert make_loader(ShardDataset(pack12), batch_size=16, num_workers=0, device="cpu")._sampler.blocks is None  # type: ignore[union-attr]


@pytest.mark.parametrize(("workers", "resume_workers"), [(0, 2), (2, 0)])
def test_a_block_shuffle_resumes_mid_epoch_under_another_worker_count(
    pack12: Path, tmp_path: Path, workers: int, resume_workers: int
) -> None:
    """Batches come from the order alone: k batches, a state, the rest under another worker count = the whole epoch."""
    ds = _remote(pack12, tmp_path, f"resume{workers}", shards_held=4)

    def loader(n: int) -> object:
        return make_loader(ds, batch_size=16, num_workers=n, device="cpu", seed=3, backend="process")

    first = loader(workers)
    first.set_epoch(1)  # type: ignore[attr-defined]
    whole = [k for batch in first for k in _keys(batch)]  # type: ignore[attr-defined]
    part = loader(workers)
    part.set_epoch(1)  # type: ignore[attr-defined]
    taken: list[int] = []
    for batch in part:  # type: ignore[attr-defined]
        taken += _keys(batch)
        if len(taken) >= 80:
            break
    state = json.loads(json.dumps(part.state_dict()))  # type: ignore[attr-defined]
    again = loader(resume_workers)
    again.load_state_dict(state)  # type: ignore[attr-defined]
    assert taken + [k for batch in again for k in _keys(batch)] == whole  # type: ignore[attr-defined]
    plain = make_loader(ds, batch_size=16, num_workers=0, device="cpu", seed=3, shuffle_scope="split")
    with pytest.raises(ConfigError, match="shuffle_blocks_budget"):
        plain.load_state_dict(state)  # another grouping mid-epoch would read some samples twice


def test_the_cli_takes_the_scope_as_a_flag_and_a_key(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from stoker.cli.train import train
    from stoker.train.runner.config import DataConfig

    assert DataConfig().shuffle_scope == "auto"
    result = CliRunner().invoke(train, ["--data", str(tmp_path), "--shuffle-scope", "shards"])
    assert result.exit_code != 0 and "--shuffle-scope" in str(result.exception) and "blocks" in str(result.exception)
    keys = CliRunner().invoke(train, ["--keys"])
    assert "shuffle_scope = \"auto\"" in keys.output and "(--shuffle-scope)" in keys.output


def test_readers_that_reach_past_a_block_are_told_the_limit_that_fetches_once(
    pack12: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """2 workers x prefetch 2 x batch 16 read 96 samples at once, blocks of 1-2 shards hold 16-32: said once, with a limit."""
    ds = _remote(pack12, tmp_path, "reach", shards_held=4)
    with caplog.at_level("WARNING", logger="stoker"):
        loader = make_loader(ds, batch_size=16, num_workers=2, backend="thread", device="cpu", seed=2)
        for _ in range(2):
            assert sum(len(_keys(batch)) for batch in loader) == len(ds)
    told = [r.getMessage() for r in caplog.records if "read at once" in r.getMessage()]
    assert len(told) == 1 and "96 samples" in told[0] and "--cache-limit" in told[0]
    fits = ds.shuffle_blocks("auto")
    assert fits is not None and fits.smallest_block() < 96 <= ShuffleBlocks(fits.sizes, fits.costs, fits.budget_for(96)).smallest_block()
    quiet = make_loader(ds, batch_size=4, num_workers=0, device="cpu", seed=2)
    with caplog.at_level("WARNING", logger="stoker"):
        caplog.clear()
        next(iter(quiet))
    assert not any("read at once" in r.getMessage() for r in caplog.records)


def test_the_block_shuffle_quality_is_measured_and_said_once_the_shards_are_cached(
    pack12: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A class-sorted pack in small blocks is poorly mixed (a warning), a shuffled pack well (info); uncached: not measured."""
    from stoker.shards.check.quality import block_shuffle_quality, warn_if_blocks_poorly_mixed

    sorted_root = tmp_path / "sorted-data"
    sorted_root.mkdir()
    for c in range(4):  # 48 images per class, listed class by class: packed unshuffled, a shard holds one class
        write_class_folders(tmp_path / f"tmp{c}", 48, classes=1, size=(16, 16))
        (tmp_path / f"tmp{c}" / "0").rename(sorted_root / f"{c}")
    packed = tmp_path / "sorted-pack"
    pack(sorted_root, packed, store="pixels", shard_samples=16, workers=0, progress=False, shuffle=False)
    url = upload_folder(packed, "memory://stoker-blocks-test/sorted")
    limit = 4 * entry_cost(max(i.bytes for i in ShardDataset(packed).manifest.shards))
    ds = ShardDataset(url, cache_dir=tmp_path / "cache-sorted", cache_limit=limit)
    blocks = ds.shuffle_blocks("auto")
    assert blocks is not None
    with caplog.at_level("INFO", logger="stoker"):
        assert warn_if_blocks_poorly_mixed(ds, blocks, batch_size=16, ranks=1) is None  # not cached: not measured
    assert any("not measured before its shards are in the cache" in r.getMessage() for r in caplog.records)
    assert ds.shards.cache.downloads == 0  # type: ignore[union-attr]
    big = ShardDataset(url, cache_dir=tmp_path / "cache-sorted")  # the same cache, no limit: fetch the split once
    big.shards.prefetch()
    caplog.clear()
    with caplog.at_level("INFO", logger="stoker"):
        poor = warn_if_blocks_poorly_mixed(ds, blocks, batch_size=16, ranks=1)
    assert poor is not None and not poor.ok
    assert any(r.levelname == "WARNING" and "block shuffle" in r.getMessage() and "--cache-limit" in r.getMessage()
               for r in caplog.records)
    assert block_shuffle_quality(ds.labels, ShuffleBlocks(blocks.sizes, blocks.costs, 10**9), 4, batch_size=16).ok
    shuffled = ShardDataset(pack12)
    quality = block_shuffle_quality(shuffled.labels, ShuffleBlocks(tuple(i.samples for i in shuffled.manifest.shards),
                                    (1,) * 12, budget=1), 4, batch_size=16, ranks=2)
    assert quality.ok  # a shuffled pack: each shard a random sample, blocks of one shard mix as well as a shuffle


def test_stoker_train_over_a_set_larger_than_its_cache_shuffles_in_blocks(
    pack12: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`stoker --cache-limit ... train` over a remote set four times its limit: blocks said once, the run completes."""
    from click.testing import CliRunner

    from stoker.cli.main import main

    url = upload_folder(pack12, "memory://stoker-blocks-test/cli")
    limit = 4 * entry_cost(max(i.bytes for i in ShardDataset(pack12).manifest.shards))
    with caplog.at_level("INFO", logger="stoker"):
        result = CliRunner().invoke(main, [
            "--cache-dir", str(tmp_path / "cache"), "--cache-limit", str(limit), "train", "--data", url,
            "--valid-share", "0.25", "--model", "small_cnn", "--epochs", "1", "--batch-size", "16", "--workers", "0",
            "--no-progress", "--set", f"run.log_dir={tmp_path / 'runs'}", "--set", "run.device=cpu",
        ])
    assert result.exit_code == 0, result.output
    said = [r.getMessage() for r in caplog.records if "shuffled in blocks of shards" in r.getMessage()]
    assert len(said) == 1
