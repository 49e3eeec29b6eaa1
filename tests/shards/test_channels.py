"""Gray pixel packs: ``--channels 1`` stores one channel, read back exactly, trained on as is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from click.testing import CliRunner
from PIL import Image

from stoker.cli.inspect import inspect
from stoker.data import open_data
from stoker.packer import pack
from stoker.shards import ShardDataset, verify


def _gray_folders(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for label in range(3):
        (root / str(label)).mkdir(parents=True)
        for i in range(8):
            Image.fromarray(rng.integers(0, 255, (10, 12), dtype=np.uint8), "L").save(root / str(label) / f"{i}.png")
    return root


def test_one_channel_pixels_take_a_third_and_read_back_exactly(tmp_path: Path) -> None:
    src = _gray_folders(tmp_path / "gray")
    rgb = pack(src, tmp_path / "rgb", store="pixels", workers=0, progress=False)
    one = pack(src, tmp_path / "one", store="pixels", channels=1, workers=0, progress=False)
    assert one.channels == 1 and rgb.channels == 3
    assert sum(i.bytes for i in one.shards) < 0.5 * sum(i.bytes for i in rgb.shards)
    assert verify(tmp_path / "one").ok
    files = open_data(src, "train")
    gray = ShardDataset(tmp_path / "one")
    assert gray.channels == 1
    by_key = {str(k): i for i, k in enumerate(files.index.keys)}
    batch = gray.__getitems__(list(range(len(gray))))
    assert tuple(batch.images.shape) == (24, 1, 10, 12)
    for j in range(len(gray)):
        image, _ = files[by_key[gray.trace(j)["key"]]]
        assert torch.equal(batch.images[j, 0], image[0])  # the one channel the gray file has
    result = CliRunner().invoke(inspect, [str(tmp_path / "one")])
    assert result.exit_code == 0 and "1 channel" in result.output
    again = pack(tmp_path / "one", tmp_path / "back", store="pixels", workers=0, progress=False)  # re-pack as RGB
    assert again.channels == 3 and tuple(ShardDataset(tmp_path / "back")[0][0].shape) == (3, 10, 12)


def test_training_reads_one_channel_packs(tmp_path: Path) -> None:
    from stoker.train.runner.config import parse_config
    from stoker.train.runner.from_config import train_from_config

    src = _gray_folders(tmp_path / "gray")
    runner = CliRunner()
    from stoker.cli.pack import pack as pack_command

    result = runner.invoke(pack_command, [str(src), str(tmp_path / "one"), "--store", "pixels", "--channels", "1",
                                          "--split", "valid=0.25", "--quiet", "--workers", "0"])
    assert result.exit_code == 0, result.output
    cfg = parse_config({"data": {"path": str(tmp_path / "one"), "batch_size": 8},
                        "run": {"epochs": 1, "device": "cpu", "log_dir": str(tmp_path / "runs"), "name": "g", "progress": False}})
    history = train_from_config(cfg, echo=None).history
    assert history[0].train_samples == 18 and history[0].valid_samples == 6
