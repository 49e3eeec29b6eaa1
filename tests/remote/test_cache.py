"""The verified shard cache: each shard downloaded once, checked before use, shared, evicted by size."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from stoker.errors import ConfigError, ShardError
from stoker.fs import RemoteLocation
from stoker.shards import ShardDataset, ShardStream
from stoker.shards.cache.entries import entry_cost
from stoker.shards.cache.store import ShardCache, default_cache_dir, parse_bytes

from .conftest import upload_folder


def _memory_copy(local: Path, name: str) -> str:
    url = f"memory://stoker-cache-test/{name}"
    place = RemoteLocation(url)
    if place.exists():
        place.fs.rm(place.path, recursive=True)
    return upload_folder(local, url)


def test_parse_bytes_and_the_default_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert parse_bytes("50GB") == 50 * 2**30 and parse_bytes("1.5k") == 1536 and parse_bytes(7) == 7
    with pytest.raises(ConfigError, match="not a size"):
        parse_bytes("lots")
    monkeypatch.setenv("STOKER_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("STOKER_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "stoker"


def test_each_shard_is_downloaded_once_and_reads_like_local(small_pack: Path, tmp_path: Path) -> None:
    url = _memory_copy(small_pack, "once")
    remote = ShardDataset(url, cache_dir=tmp_path / "cache")
    local = ShardDataset(small_pack)
    assert remote.shards.download_bytes() == remote.manifest.bytes
    every = list(range(len(local)))
    assert remote.__getitems__(every).images.equal(local.__getitems__(every).images)
    assert remote.shards.cache is not None and remote.shards.cache.downloads == len(remote.manifest.shards)
    again = ShardDataset(url, cache_dir=tmp_path / "cache")
    assert again.shards.download_bytes() == 0
    again.__getitems__(every)
    assert again.shards.cache is not None and again.shards.cache.downloads == 0


def test_a_damaged_object_is_refused_and_never_cached(small_pack: Path, tmp_path: Path) -> None:
    url = _memory_copy(small_pack, "damaged")
    place = RemoteLocation(url)
    name = "train-00001.arrow"
    data = bytearray(place.read_bytes(name))
    data[len(data) // 2] ^= 0xFF  # same size, so opening (sizes only) passes
    place.write_bytes(name, bytes(data))
    ds = ShardDataset(url, cache_dir=tmp_path / "cache")
    with pytest.raises(ShardError, match=r"train-00001.arrow.*SHA-256 does not match.*tried 3 times"):
        ds.__getitems__(list(range(len(ds))))
    cache = ShardCache(tmp_path / "cache")
    assert not cache.has(ds.manifest.shards[1])
    assert not list((tmp_path / "cache").rglob("*.tmp"))


class _FlakyMemory(MemoryFileSystem):
    """A memory filesystem whose first read of each object is cut short (a dropped connection)."""

    protocol = "stoker-flaky"
    cut: set[str] = set()

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        handle = super()._open(path, mode, **kwargs)
        if "r" in mode and path not in self.cut:
            self.cut.add(path)
            return io.BytesIO(handle.read()[:-7])
        return handle


def test_a_cut_download_is_retried(small_pack: Path, tmp_path: Path) -> None:
    fsspec.register_implementation("stoker-flaky", _FlakyMemory, clobber=True)
    url = upload_folder(small_pack, "stoker-flaky://flaky/packed")
    _FlakyMemory.cut.clear()
    ds = ShardDataset(url, cache_dir=tmp_path / "cache")
    every = list(range(len(ds)))
    assert ds.__getitems__(every).images.equal(ShardDataset(small_pack).__getitems__(every).images)
    assert ds.shards.cache is not None and ds.shards.cache.downloads == len(ds.manifest.shards)
    cut = {path.rsplit("/", 1)[-1] for path in _FlakyMemory.cut}
    assert {i.name for i in ds.manifest.shards} <= cut  # every shard's first download was cut, then retried


def test_a_truncated_object_is_found_on_opening(small_pack: Path, tmp_path: Path) -> None:
    url = _memory_copy(small_pack, "truncated")
    place = RemoteLocation(url)
    place.write_bytes("train-00002.arrow", place.read_bytes("train-00002.arrow")[:-10])
    with pytest.raises(ShardError, match="train-00002.arrow.*truncated or changed"):
        ShardDataset(url, cache_dir=tmp_path / "cache")


def test_eviction_keeps_the_cache_under_its_limit(small_pack: Path, tmp_path: Path) -> None:
    url = _memory_copy(small_pack, "evict")
    shard_bytes = max(i.bytes for i in ShardDataset(small_pack).manifest.shards)
    limit = 2 * entry_cost(shard_bytes) + 8192  # two shards, and the cached manifest (a block or two)
    stream = ShardStream(url, cache_dir=tmp_path / "cache", cache_limit=limit, shuffle_buffer=4, read_rows=4, fetch_ahead=1)
    assert (stream.shards_at_once, stream.fetch_ahead) == (1, 0)  # two shards: one group and the next one's first
    for epoch in range(2):
        stream.set_epoch(epoch)
        seen = [label for _, label in stream]
        assert len(seen) == len(stream)
        cache = ShardCache(tmp_path / "cache", limit)
        assert cache.size_bytes() <= limit
    assert stream.dataset.shards.cache is not None
    assert stream.dataset.shards.cache.downloads > len(stream.dataset.manifest.shards)  # it streamed through


_CHILD = textwrap.dedent(
    """
    import json, sys
    from stoker.shards import ShardDataset
    ds = ShardDataset(sys.argv[1], cache_dir=sys.argv[2])
    ds.shards.prefetch(workers=4)
    print(json.dumps(ds.shards.cache.downloads))
    """
)


def test_two_processes_share_one_cache(s3_server: str, bucket: str, small_pack: Path, tmp_path: Path) -> None:
    url = upload_folder(small_pack, f"{bucket}/packed")
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path("src").resolve()), os.environ.get("PYTHONPATH", "")])}
    children = [
        subprocess.Popen([sys.executable, "-c", _CHILD, url, str(cache)], stdout=subprocess.PIPE, env=env)
        for _ in range(2)
    ]
    counts = []
    for child in children:
        out, _ = child.communicate(timeout=180)
        assert child.returncode == 0
        counts.append(json.loads(out))
    shards = len(ShardDataset(small_pack).manifest.shards)
    assert sum(counts) == shards  # each shard downloaded once, by one of them
    assert len(list((cache / "sha256").glob("*/*.arrow"))) == shards
    shutil.rmtree(cache)


def test_a_remote_stream_resumes_like_a_local_one(small_pack: Path, tmp_path: Path) -> None:
    url = _memory_copy(small_pack, "resume")
    remote = ShardStream(url, cache_dir=tmp_path / "cache", shuffle_buffer=5, read_rows=3, fetch_ahead=2)
    local = ShardStream(small_pack, shuffle_buffer=5, read_rows=3)
    def items(stream: Any) -> list[bytes]:
        return [image.numpy().tobytes() for image, _ in stream]

    everything = items(local)
    assert items(remote) == everything
    for start in (0, 4, 9, 39):
        assert items(remote.iter_from(start)) == everything[start:]
