"""An unshuffled pack of class-sorted data scores clearly worse than a shuffled one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from click.testing import CliRunner
from PIL import Image

from stoker.cli.main import main
from stoker.packer import pack
from stoker.shards.check.quality import stream_quality


def _class_sorted_folders(root: Path, classes: int = 6, per_class: int = 40) -> Path:
    pixels = np.zeros((4, 4, 3), dtype=np.uint8)
    for label in range(classes):
        (root / str(label)).mkdir(parents=True)
        for j in range(per_class):
            Image.fromarray(pixels + label).save(root / str(label) / f"{j:03d}.png")
    return root


def test_sorted_pack_scores_worse_than_shuffled(tmp_path: Path) -> None:
    src = _class_sorted_folders(tmp_path / "src")
    pack(src, tmp_path / "sorted", shuffle=False, shard_samples=40, progress=False, workers=0)
    pack(src, tmp_path / "shuffled", shard_samples=40, progress=False, workers=0)
    sorted_q = stream_quality(tmp_path / "sorted", "train", batch_size=16, shuffle_buffer=8, shards_at_once=1)
    shuffled_q = stream_quality(tmp_path / "shuffled", "train", batch_size=16, shuffle_buffer=8, shards_at_once=1)
    assert sorted_q["stored order"].verdict == "poor"
    assert shuffled_q["stored order"].verdict == "good"
    assert shuffled_q["stored order"].score > sorted_q["stored order"].score + 0.5
    # one shard at a time, a small stream buffer cannot undo a sorted pack: flagged, not hidden
    assert not sorted_q["stream (buffer 8)"].ok
    # reading its six shards at once (the default) it can
    assert stream_quality(tmp_path / "sorted", "train", batch_size=16, shuffle_buffer=8)["stream (buffer 8)"].ok


def test_inspect_shows_shuffle_quality(tmp_path: Path) -> None:
    src = _class_sorted_folders(tmp_path / "src", classes=3, per_class=10)
    pack(src, tmp_path / "packed", shuffle=False, progress=False, workers=0)
    result = CliRunner().invoke(main, ["inspect", str(tmp_path / "packed"), "--batch-size", "8"])
    assert result.exit_code == 0, result.output
    assert "shuffle quality (batch 8)" in result.output
    assert "stored order" in result.output and "(poor)" in result.output


def _stream_labels(loader) -> list[int]:
    return [int(label) for _, labels in loader for label in labels]


def test_the_scored_stream_is_what_a_loader_with_workers_and_ranks_delivers(tmp_path: Path) -> None:
    from stoker import make_loader
    from stoker.shards import ShardStream
    from stoker.shards.check.quality import loader_label_streams

    src = _class_sorted_folders(tmp_path / "src", classes=3, per_class=12)
    pack(src, tmp_path / "packed", shuffle=False, shard_samples=6, progress=False, workers=0)
    stored = ShardStream(tmp_path / "packed", shuffle=False)
    labels = np.asarray(stored.dataset.labels)
    sizes = [info.samples for info in stored.dataset.shards.infos]
    for rank, world_size, workers in ((0, 1, 2), (1, 2, 2), (0, 1, 0)):
        stream = ShardStream(tmp_path / "packed", shuffle_buffer=4, seed=3, rank=rank, world_size=world_size)
        loader = make_loader(stream, batch_size=4, num_workers=workers, device="cpu", shuffle=False)
        expected = loader_label_streams(labels, sizes, batch_size=4, workers=workers, ranks=world_size, seed=3,
                                        shuffle_buffer=4)[rank]
        assert _stream_labels(loader) == expected.tolist(), (rank, world_size, workers)


def test_inspect_scores_the_stream_for_the_workers_and_ranks_given_and_warns(tmp_path: Path) -> None:
    src = _class_sorted_folders(tmp_path / "src", classes=4, per_class=16)
    pack(src, tmp_path / "packed", shuffle=False, shard_samples=16, progress=False, workers=0)
    args = ["inspect", str(tmp_path / "packed"), "--batch-size", "8", "--shuffle-buffer", "4"]
    result = CliRunner().invoke(main, [*args, "--workers", "2", "--ranks", "2", "--shards-at-once", "1"])
    assert result.exit_code == 0, result.output
    assert "stream (buffer 4, 2 workers x 2 ranks)" in result.output
    assert ("warning: train: a ShardStream read by 2 worker(s) x 2 rank(s) (buffer 4, 1 shard(s) at once, batch 8) "
            "is not well mixed") in result.output
    assert "read more shards at once: shards_at_once=" in result.output  # the setting that fixes it
    result = CliRunner().invoke(main, [*args, "--workers", "2", "--ranks", "2"])  # all 4 shards at once
    assert result.exit_code == 0 and "warning" not in result.output, result.output
    shuffled = tmp_path / "shuffled"
    pack(src, shuffled, shard_samples=16, progress=False, workers=0)
    result = CliRunner().invoke(main, ["inspect", str(shuffled), "--batch-size", "8", "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert "stream (buffer 10000, 2 workers x 1 rank)" in result.output and "warning" not in result.output
