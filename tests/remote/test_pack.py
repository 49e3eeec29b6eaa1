"""Packing to a bucket is as safe as packing locally: complete shards, manifest last, resumable, identical."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from stoker import pack
from stoker.cli.main import main as cli
from stoker.errors import ConfigError, ShardError
from stoker.fs import RemoteLocation
from stoker.shards import ShardDataset
from stoker.shards.pack import packing as packing_module

from .conftest import upload_folder

_ARGS: dict[str, Any] = {"store": "pixels", "shard_samples": 8, "progress": False}


def _objects(url: str) -> dict[str, bytes]:
    place = RemoteLocation(url)
    place.invalidate()
    return {name: place.read_bytes(name) for name in sorted(place.sizes())}


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


def test_pack_to_a_bucket_gives_the_bytes_of_a_local_pack(
    s3_server: str, bucket: str, small_folders: Path, small_pack: Path, tmp_path: Path
) -> None:
    url = f"{bucket}/packed"
    manifest = pack(small_folders, url, workers=2, cache_dir=tmp_path / "cache", **_ARGS)
    assert _objects(url) == _files(small_pack)  # shards and manifest, byte for byte
    assert not (tmp_path / "cache" / "pack").exists() or not any((tmp_path / "cache" / "pack").rglob("*.arrow"))
    again = pack(small_folders, url, workers=0, cache_dir=tmp_path / "cache", **_ARGS)
    assert again == manifest and _objects(url) == _files(small_pack)


def test_an_interrupted_remote_pack_never_looks_finished_and_resumes(
    s3_server: str, bucket: str, small_folders: Path, small_pack: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{bucket}/packed"
    real_upload = packing_module.upload_shard
    uploads: list[str] = []

    def upload_then_stop(place: RemoteLocation, staging: Path, info: Any) -> None:
        real_upload(place, staging, info)
        uploads.append(info.name)
        if len(uploads) == 2:
            raise KeyboardInterrupt  # the user pressed Ctrl-C after two shards went up

    monkeypatch.setattr(packing_module, "upload_shard", upload_then_stop)
    with pytest.raises(KeyboardInterrupt):
        pack(small_folders, url, workers=0, cache_dir=tmp_path / "cache", **_ARGS)
    left = _objects(url)
    assert "manifest.json" not in left and "pack-plan.json" in left
    with pytest.raises(ShardError, match="the pack did not finish"):
        ShardDataset(url, cache_dir=tmp_path / "read-cache")

    monkeypatch.setattr(packing_module, "upload_shard", lambda *a: (uploads.append(a[2].name), real_upload(*a)))
    pack(small_folders, url, workers=0, cache_dir=tmp_path / "cache", **_ARGS)
    shards = [name for name in _files(small_pack) if name.endswith(".arrow")]
    assert sorted(uploads) == shards  # the two shards already up were not sent again
    assert _objects(url) == _files(small_pack)


def test_bucket_to_bucket_repack(s3_server: str, bucket: str, small_pack: Path, tmp_path: Path) -> None:
    source = upload_folder(small_pack, f"{bucket}/source")
    local = pack(small_pack, tmp_path / "local", store="pixels", shard_samples=16, workers=0, progress=False)
    remote = pack(source, f"{bucket}/repacked", store="pixels", shard_samples=16, workers=0, progress=False,
                  cache_dir=tmp_path / "cache")
    assert remote.shards == local.shards
    assert remote.made_by["source"] == [source]
    objects = _objects(f"{bucket}/repacked")
    assert {k: v for k, v in objects.items() if k.endswith(".arrow")} == {
        k: v for k, v in _files(tmp_path / "local").items() if k.endswith(".arrow")
    }


def test_a_bucket_holding_other_files_is_not_packed_into(
    s3_server: str, bucket: str, small_folders: Path, tmp_path: Path
) -> None:
    url = f"{bucket}/busy"
    RemoteLocation(url).write_bytes("notes.txt", b"keep me")
    with pytest.raises(ConfigError, match="is not empty.*other files"):
        pack(small_folders, url, workers=0, cache_dir=tmp_path / "cache", **_ARGS)
    pack(small_folders, url, workers=0, cache_dir=tmp_path / "cache", overwrite=True, **_ARGS)
    assert "notes.txt" in _objects(url) and "manifest.json" in _objects(url)


def test_cli_pack_to_a_bucket_writes_no_local_folder(
    s3_server: str, bucket: str, small_folders: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STOKER_CACHE", str(tmp_path / "cache"))
    url = f"{bucket}/cli"
    result = CliRunner().invoke(cli, ["pack", str(small_folders), url, "--workers", "0", "--quiet", "--shard-samples", "8"])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "s3:").exists()
    assert "manifest.json" in _objects(url)
    assert len(ShardDataset(url)) == 40
