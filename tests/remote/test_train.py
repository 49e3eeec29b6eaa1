"""``stoker train --data s3://...``: one epoch from a shard set in a bucket, through the verified cache."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from stoker import pack
from stoker.cli.train import train
from stoker.shards.cache.store import ShardCache
from stoker.shards.format.manifest import Manifest


def test_train_one_epoch_from_a_bucket(
    s3_server: str, bucket: str, small_folders: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{bucket}/packed"
    pack(small_folders, url, store="pixels", size=(16, 16), valid=0.25, shard_samples=8, workers=0, progress=False,
         cache_dir=tmp_path / "pack-cache")
    monkeypatch.setenv("STOKER_CACHE", str(tmp_path / "cache"))
    result = CliRunner().invoke(train, [
        "--data", url, "--model", "small_cnn", "--epochs", "1", "--batch-size", "8", "--workers", "0",
        "--no-progress", "--set", f"run.log_dir={tmp_path / 'runs'}", "--set", "run.device=cpu",
    ])
    assert result.exit_code == 0, result.output
    manifest = Manifest.load(url)
    cache = ShardCache(tmp_path / "cache")
    assert all(cache.has(info) for info in manifest.shards)  # every shard came through the verified cache
    assert not (tmp_path / "s3:").exists() and not Path("s3:").exists()
