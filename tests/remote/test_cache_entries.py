"""Cache entries are checked before they are served; partial downloads and oversized claims never fill the disk."""

from __future__ import annotations

import dataclasses
import io
import logging
import multiprocessing
import os
from pathlib import Path
from typing import Any

import click
import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from stoker.errors import NetworkError, ShardError
from stoker.fs import RemoteLocation
from stoker.shards import ShardDataset
from stoker.shards.cache.entries import entry_cost, read_stamp
from stoker.shards.cache.store import ShardCache

from .conftest import upload_folder

TB10 = 10 * 2**40


def _copy(local: Path, name: str) -> str:
    url = f"memory://stoker-entries-test/{name}"
    place = RemoteLocation(url)
    if place.exists():
        place.fs.rm(place.path, recursive=True)
    return upload_folder(local, url)


def _every(ds: ShardDataset) -> Any:
    return ds.__getitems__(list(range(len(ds)))).images


def test_a_same_size_change_to_a_cached_entry_is_found_removed_and_fetched_again(
    small_pack: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = _copy(small_pack, "tamper")
    ShardDataset(url, cache_dir=tmp_path / "c").shards.prefetch()
    cache = ShardCache(tmp_path / "c")
    info = ShardDataset(small_pack).manifest.shards[1]
    entry = cache.path_of(info)
    assert read_stamp(entry) is not None
    stat = entry.stat()
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    os.utime(entry, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even with the mtime put back
    with caplog.at_level(logging.WARNING, logger="stoker"):
        again = ShardDataset(url, cache_dir=tmp_path / "c")
        assert _every(again).equal(_every(ShardDataset(small_pack)))  # the bad copy is never served
    assert again.shards.cache is not None and again.shards.cache.downloads == 1  # that one shard, again
    assert sum("changed or damaged" in r.getMessage() for r in caplog.records) == 1  # said once
    assert entry.read_bytes() != bytes(data)


def test_a_planted_wrong_size_entry_is_replaced(small_pack: Path, tmp_path: Path) -> None:
    url = _copy(small_pack, "plant")
    info = ShardDataset(small_pack).manifest.shards[0]
    entry = ShardCache(tmp_path / "c").path_of(info)
    entry.parent.mkdir(parents=True)
    entry.write_bytes(b"not a shard")
    ds = ShardDataset(url, cache_dir=tmp_path / "c")
    assert _every(ds).equal(_every(ShardDataset(small_pack)))
    assert entry.stat().st_size == info.bytes


def _dead_pid() -> int:
    child = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    child.start()
    child.join()
    assert child.pid is not None
    return child.pid


def _dead_partial(folder: Path, info: Any) -> Path:
    """A partial download of ``info`` in ``folder`` left by a process that is gone."""
    folder.mkdir(parents=True)
    dead = folder / f"{info.sha256}.{_dead_pid()}.1.{info.bytes}.tmp"
    dead.write_bytes(b"x" * 100_000)
    return dead


def test_partial_downloads_of_dead_processes_are_removed_and_live_ones_count(small_pack: Path, tmp_path: Path) -> None:
    url = _copy(small_pack, "tmp")
    info = ShardDataset(small_pack).manifest.shards[0]
    folder = tmp_path / "c" / "tmp"
    dead = _dead_partial(folder, info)
    live = folder / f"{info.sha256}.{os.getpid()}.1.{info.bytes}.tmp"
    live.write_bytes(b"")
    cache = ShardCache(tmp_path / "c")
    assert cache.size_bytes() == entry_cost(info.bytes)  # the live one reserves its whole shard; the dead one is gone
    assert not dead.exists() and live.exists()
    live.unlink()
    ds = ShardDataset(url, cache_dir=tmp_path / "c")
    _every(ds)
    assert not list(folder.iterdir())  # nothing left behind


def test_a_cache_without_a_limit_still_removes_the_partial_downloads_of_dead_processes(
    small_pack: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STOKER_CACHE_LIMIT", raising=False)
    url = _copy(small_pack, "tmp-unlimited")
    info = ShardDataset(small_pack).manifest.shards[0]
    folder = tmp_path / "c" / "tmp"
    _dead_partial(folder, info)
    ds = ShardDataset(url, cache_dir=tmp_path / "c")
    assert ds.shards.cache is not None and ds.shards.cache.limit is None  # no size count per download
    assert _every(ds).equal(_every(ShardDataset(small_pack)))
    assert not list(folder.iterdir())  # the dead one is gone, and nothing is left behind


class _Claims(MemoryFileSystem):
    """A memory filesystem whose objects claim 10 TB (a lying Content-Length) and read as many bytes as asked."""

    protocol = "stoker-claims"
    opened: list[str] = []

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        type(self).opened.append(path)
        handle = io.BytesIO(b"\0" * (1 << 20))
        handle.size = TB10  # type: ignore[attr-defined]
        return handle


def test_a_claimed_size_larger_than_the_manifest_is_refused_before_the_first_byte(small_pack: Path, tmp_path: Path) -> None:
    fsspec.register_implementation("stoker-claims", _Claims, clobber=True)
    info = ShardDataset(small_pack).manifest.shards[0]
    cache = ShardCache(tmp_path / "c")
    with pytest.raises(ShardError, match=r"claims 10,995,116,277,760 bytes, the manifest says"):
        cache.fetch(RemoteLocation("stoker-claims://x/packed"), info)
    assert not list((tmp_path / "c" / "tmp").iterdir())


def test_a_manifest_claiming_10_tb_is_refused_for_free_space_and_for_the_limit(small_pack: Path, tmp_path: Path) -> None:
    fsspec.register_implementation("stoker-claims", _Claims, clobber=True)
    huge = dataclasses.replace(ShardDataset(small_pack).manifest.shards[0], bytes=TB10)
    remote = RemoteLocation("stoker-claims://x/packed")
    _Claims.opened.clear()
    with pytest.raises(ShardError, match=r"needs 10,995,116,277,760 bytes in the cache folder .* only [0-9,]+ are free"):
        ShardCache(tmp_path / "c").fetch(remote, huge)
    with pytest.raises(ShardError, match=r"do not fit in the cache limit of 1,048,576 bytes"):
        ShardCache(tmp_path / "c", "1MB").fetch(remote, huge)
    assert _Claims.opened == []  # refused before a request


class _Unreachable(MemoryFileSystem):
    protocol = "stoker-unreachable"
    attempts = 0

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        type(self).attempts += 1
        raise NetworkError(f"stoker-unreachable://{path}: the host cannot be reached (test)")


def test_a_network_error_is_not_retried_again(small_pack: Path, tmp_path: Path) -> None:
    fsspec.register_implementation("stoker-unreachable", _Unreachable, clobber=True)
    _Unreachable.attempts = 0
    info = ShardDataset(small_pack).manifest.shards[0]
    with pytest.raises(NetworkError, match="cannot be reached"):
        ShardCache(tmp_path / "c", retries=2).fetch(RemoteLocation("stoker-unreachable://x/packed"), info)
    assert _Unreachable.attempts == 1
    assert not list((tmp_path / "c" / "tmp").iterdir())


def test_the_limit_defaults_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STOKER_CACHE_LIMIT", "3MB")
    assert ShardCache(tmp_path).limit == 3 * 2**20
    assert ShardCache(tmp_path, limit="1GB").limit == 2**30


def test_cache_limit_is_a_global_option(monkeypatch: pytest.MonkeyPatch, small_pack: Path) -> None:
    from click.testing import CliRunner

    from stoker.cli.main import main

    monkeypatch.delenv("STOKER_CACHE_LIMIT", raising=False)
    bad = CliRunner().invoke(main, ["--cache-limit", "lots", "inspect", str(small_pack)])
    assert bad.exit_code == 1 and "'lots' is not a size" in bad.output
    ok = CliRunner().invoke(main, ["--cache-limit", "2MB", "inspect", str(small_pack)])
    assert ok.exit_code == 0, ok.output

    @click.command("env-probe")
    def probe() -> None:  # what a command (and the workers it starts) sees
        click.echo(f"{os.environ.get('STOKER_CACHE_LIMIT')} {os.environ.get('STOKER_CACHE')}")

    monkeypatch.setitem(main.commands, "env-probe", probe)
    seen = CliRunner().invoke(main, ["--cache-limit", "2MB", "--cache-dir", str(small_pack.parent / "c"), "env-probe"])
    assert seen.output.split() == [str(2 * 2**20), str(small_pack.parent / "c")], seen.output
    # ... for the command's time only: one run in-process (CliRunner, a notebook) leaves nothing for the next
    assert "STOKER_CACHE_LIMIT" not in os.environ
    monkeypatch.setenv("STOKER_CACHE", "/before")
    CliRunner().invoke(main, ["--cache-dir", str(small_pack.parent / "c"), "env-probe"])
    assert os.environ["STOKER_CACHE"] == "/before"


def test_a_lock_held_too_long_names_who_to_ask_and_never_says_delete(tmp_path: Path) -> None:
    import fcntl

    from stoker.shards.cache.entries import flock

    path = tmp_path / "shard.use"
    held = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)  # a live holder: the only way a flock outlasts the timeout
    try:
        with pytest.raises(ShardError) as caught:
            flock(path, fcntl.LOCK_EX, 0.05, "shard a.arrow")
    finally:
        os.close(held)
    message = str(caught.value)
    assert message.startswith("shard a.arrow:") and f"fuser {path}" in message and "lock_timeout_s" in message
    assert "delete the lock" not in message  # deleting a held lock's file lets a second process in
    again = flock(path, fcntl.LOCK_EX, 0.05, "shard a.arrow")  # released with its holder
    assert again is not None
    os.close(again)
