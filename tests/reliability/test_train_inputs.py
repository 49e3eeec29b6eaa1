"""Config values torch would reject are ConfigErrors up front; a full disk while checkpointing says how much."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from stoker.errors import CheckpointError, ConfigError
from stoker.train.engine import checkpoint
from stoker.train.engine.checkpoint import save_checkpoint
from stoker.train.runner.config import parse_config


def _raw(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {"data": {"path": "data"}, "model": {"name": "small_cnn"}, "optim": {}, "run": {}}
    for dotted, value in changes.items():
        table, key = dotted.split("__")
        raw[table][key] = value
    return raw


@pytest.mark.parametrize("lr", [float("nan"), float("inf")])
def test_non_finite_learning_rate_is_a_config_error(lr: float) -> None:
    with pytest.raises(ConfigError, match="optim.lr must be a finite number"):
        parse_config(_raw(optim__lr=lr))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_device_without_a_gpu_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no CUDA GPU"):
        parse_config(_raw(run__device="cuda:0"))


def test_gpu_index_past_the_last_gpu_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cuda:99"):
        parse_config(_raw(run__device="cuda:99"))


def test_huge_image_size_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="image_size must be a size in pixels"):
        parse_config(_raw(data__image_size=10**9))


def test_checkpoint_refused_before_writing_when_the_disk_is_too_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_checkpoint({"w": torch.zeros(1000)}, tmp_path / "last.pt")
    usage = checkpoint.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda _: usage._replace(free=100))
    with pytest.raises(CheckpointError, match=r"the disk is full: the checkpoint needs about 0\.4 MiB and 0\.0 MiB are free"):
        save_checkpoint({"w": torch.zeros(100_000)}, tmp_path / "last.pt")
    assert torch.load(tmp_path / "last.pt", weights_only=True)["w"].shape == (1000,)  # the previous one is intact


def test_torch_write_failure_mid_save_is_a_checkpoint_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def save(*args: object, **kwargs: object) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:783] . PytorchStreamWriter failed writing file data/0: file write failed")

    monkeypatch.setattr(checkpoint.torch, "save", save)
    with pytest.raises(CheckpointError, match="cannot write checkpoint .* MiB are free; the previous one is intact"):
        save_checkpoint({"w": torch.zeros(10)}, tmp_path / "last.pt")
    assert os.listdir(tmp_path) == []


def test_stray_temporaries_of_a_killed_save_are_removed(tmp_path: Path) -> None:
    (tmp_path / ".last.pt.abc123.tmp").write_bytes(b"half")  # a save killed before this version
    (tmp_path / ".last.pt.999999999.x.tmp").write_bytes(b"half")  # a dead pid
    save_checkpoint({"w": torch.zeros(3)}, tmp_path / "last.pt")
    assert sorted(os.listdir(tmp_path)) == ["last.pt"]


def test_a_config_or_settings_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    from stoker.bench.settings import load_data_table
    from stoker.train.runner.config import load_config

    bad = tmp_path / "latin1.toml"
    bad.write_bytes('[run]\nname = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.toml: not a UTF-8 text file"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"latin1.toml: not a UTF-8 text file"):
        load_data_table(bad)


def test_an_unusable_cache_folder_is_one_line_naming_it() -> None:
    from stoker.fs import where
    from stoker.shards.cache.store import ShardCache
    from stoker.shards.format.manifest import ShardInfo

    cache = ShardCache("/proc/stoker-cache", limit="1MB")  # /proc takes no new folders
    shard = ShardInfo(name="train-00000.arrow", split="train", samples=1, bytes=10, sha256="0" * 64)
    with pytest.raises(ConfigError, match=r"/proc/stoker-cache: the shard cache folder cannot be used .*--cache-dir"):
        cache.fetch(where("memory://stoker-unusable-cache/packed"), shard)  # before a byte is asked for
