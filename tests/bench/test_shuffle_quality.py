"""shuffle_quality: sorted streams score low, random ones high, and the order between them holds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stoker import ConfigError
from stoker.bench import shuffle_quality, simulate_buffer_shuffle, suggest_buffer_size

SORTED = np.repeat(np.arange(20), 100)  # 2000 labels, class by class


def _stream(pack_labels: np.ndarray, shard: int, buffer: int, shards_at_once: int = 32) -> np.ndarray:
    """The labels a ShardStream reads from a pack whose rows hold ``pack_labels`` in ``shard``-row shards."""
    from stoker.shards import stream_order

    sizes = [shard] * (len(pack_labels) // shard)
    order = stream_order(sizes, seed=0, epoch=0, shuffle=True, shuffle_buffer=buffer, rank=0, world_size=1, worker=0,
                         num_workers=1, shards_at_once=shards_at_once)
    return pack_labels[order]


def test_sorted_is_poor_and_permutation_is_good() -> None:
    sorted_q = shuffle_quality(SORTED, batch_size=64, num_classes=20)
    random_q = shuffle_quality(np.random.default_rng(1).permutation(SORTED), batch_size=64, num_classes=20)
    assert sorted_q.verdict == "poor" and sorted_q.score < 0.05 and not sorted_q.ok
    assert random_q.verdict == "good" and random_q.score > 0.95 and random_q.ok
    assert sorted_q.autocorr_mean > 0.9 and abs(random_q.autocorr_mean) < 0.05
    assert sorted_q.hist_distance > random_q.hist_distance


def test_streamed_shards_packed_from_sorted_data_score_worse_than_shuffled_ones_one_shard_at_a_time() -> None:
    unshuffled_pack = shuffle_quality(_stream(SORTED, shard=100, buffer=64, shards_at_once=1), 64, 20)
    shuffled = np.random.default_rng(2).permutation(SORTED)
    shuffled_pack = shuffle_quality(_stream(shuffled, shard=100, buffer=64, shards_at_once=1), 64, 20)
    assert unshuffled_pack.verdict == "poor" and shuffled_pack.verdict == "good"
    assert shuffled_pack.score - unshuffled_pack.score > 0.5
    # read all 20 shards at once (the default reads up to 32), the sorted pack mixes as well as the shuffled one
    merged = shuffle_quality(_stream(SORTED, shard=100, buffer=64), 64, 20)
    assert merged.verdict == "good" and merged.classes_per_batch > 0.9 * shuffled_pack.classes_per_batch


def test_a_real_pack_is_mixed_while_its_class_sorted_source_is_not(tiny, tmp_path: Path) -> None:
    from stoker.packer import pack
    from stoker.shards import ShardDataset

    pack(tiny, tmp_path / "packed", store="encoded", seed=0, workers=0, progress=False)
    packed = shuffle_quality(ShardDataset(tmp_path / "packed").labels, batch_size=4, num_classes=4)
    source = shuffle_quality(tiny.labels, batch_size=4, num_classes=4)  # read in folder order
    assert source.verdict == "poor" and packed.score > source.score + 0.5


def test_score_grows_with_the_shuffle_buffer() -> None:
    scores = [shuffle_quality(simulate_buffer_shuffle(SORTED, b, seed=0), 64, 20).score for b in (16, 256, 2000)]
    assert scores[0] < 0.2 < scores[1] < scores[2] and scores[2] > 0.9
    suggested = suggest_buffer_size(SORTED, 64, 20)
    assert 256 < suggested <= 2048
    assert shuffle_quality(simulate_buffer_shuffle(SORTED, suggested), 64, 20).ok


def test_simulated_buffer_keeps_every_label() -> None:
    mixed = simulate_buffer_shuffle(SORTED, 37, seed=3)
    assert np.array_equal(np.sort(mixed), SORTED)


def test_edge_cases_and_bad_input() -> None:
    assert shuffle_quality(np.array([3]), batch_size=8).score == 1.0
    assert shuffle_quality(np.zeros(50, dtype=np.int64), batch_size=8).verdict == "good"  # one class: nothing to mix
    with pytest.raises(ConfigError, match="batch_size"):
        shuffle_quality(SORTED, batch_size=0)
    with pytest.raises(ConfigError, match="num_classes"):
        shuffle_quality(SORTED, batch_size=8, num_classes=3)
    with pytest.raises(ConfigError, match="integers"):
        shuffle_quality(np.array([0.5, 1.0]), batch_size=8)
    assert set(shuffle_quality(SORTED, 64).to_dict()) >= {"score", "verdict", "autocorr", "autocorr_mean"}
