"""An unshuffled pack of class-sorted data scores clearly worse than a shuffled one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from click.testing import CliRunner
from PIL import Image

from stoker.cli.main import main
from stoker.packer import pack
from stoker.shards.quality import stream_quality


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
    sorted_q = stream_quality(tmp_path / "sorted", "train", batch_size=16, shuffle_buffer=8)
    shuffled_q = stream_quality(tmp_path / "shuffled", "train", batch_size=16, shuffle_buffer=8)
    assert sorted_q["stored order"].verdict == "poor"
    assert shuffled_q["stored order"].verdict == "good"
    assert shuffled_q["stored order"].score > sorted_q["stored order"].score + 0.5
    # a small stream buffer cannot undo a sorted pack: flagged, not hidden
    assert not sorted_q["stream (buffer 8)"].ok


def test_inspect_shows_shuffle_quality(tmp_path: Path) -> None:
    src = _class_sorted_folders(tmp_path / "src", classes=3, per_class=10)
    pack(src, tmp_path / "packed", shuffle=False, progress=False, workers=0)
    result = CliRunner().invoke(main, ["inspect", str(tmp_path / "packed"), "--batch-size", "8"])
    assert result.exit_code == 0, result.output
    assert "shuffle quality (batch 8)" in result.output
    assert "stored order" in result.output and "(poor)" in result.output
