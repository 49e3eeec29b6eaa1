"""Offline from cache: a fully cached set reads, inspects and verifies with its store down; `verify URL` reads the store."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from stoker.cli.main import main as cli
from stoker.errors import NetworkError
from stoker.fs import RemoteLocation
from stoker.shards import ShardDataset, ShardStream, verify
from stoker.shards.cache.store import ShardCache
from stoker.shards.format.manifest import Manifest

from .conftest import _ENV, _free_port, _wait_for, upload_folder


@dataclass
class _Server:
    """A moto S3 server of this test's own, which the test may stop."""

    endpoint: str
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@pytest.fixture
def own_s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Server]:
    """A fresh S3 API server on 127.0.0.1, the environment pointed at it (fsspec's cached filesystems forgotten)."""
    s3fs = pytest.importorskip("s3fs", reason="the S3 tests need s3fs: pip install 'stoker[test]'")
    pytest.importorskip("moto.server", reason="the S3 tests need moto's server: pip install 'stoker[test]'")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = _Server(f"http://127.0.0.1:{port}", proc)
    try:
        _wait_for(port, proc)
        for key, value in {**_ENV, "AWS_ENDPOINT_URL": server.endpoint}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("STOKER_CACHE", str(tmp_path / "cache"))
        monkeypatch.setenv("STOKER_NET_RETRIES", "0")  # a stopped server refuses at once: no pauses either way
        s3fs.S3FileSystem.clear_instance_cache()
        s3fs.S3FileSystem(skip_instance_cache=True).mkdir("offline")
        yield server
    finally:
        server.stop()
        s3fs.S3FileSystem.clear_instance_cache()


def _train(url: str, log_dir: Path) -> list[str]:
    """``stoker train`` one epoch of ``url``; the output's lines."""
    result = CliRunner().invoke(cli, [
        "train", "--data", url, "--model", "small_cnn", "--epochs", "1", "--batch-size", "8", "--workers", "0",
        "--no-progress", "--set", f"run.log_dir={log_dir}", "--set", "run.device=cpu",
    ])
    assert "Traceback" not in result.output
    return [str(result.exit_code), *result.output.strip().splitlines()]


def _read_all(url: str) -> list[int]:
    data = ShardDataset(url)
    return data.__getitems__(list(range(len(data)))).labels.tolist()


def test_a_fully_cached_set_reads_inspects_and_verifies_with_the_store_down(
    own_s3: _Server, small_pack: Path, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    url = upload_folder(small_pack, "s3://offline/packed")
    first = _read_all(url)  # epoch 1: every shard fetched into the cache
    assert first == _read_all(str(small_pack))
    own_s3.stop()
    with caplog.at_level(logging.WARNING, logger="stoker"):
        assert _read_all(url) == first  # epoch 2, from the cache
        assert _read_all(url) == first
    notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("offline:")]
    assert len(notes) == 1, notes  # said once
    assert url in notes[0] and "last checked against the store 20" in notes[0] and "ago" in notes[0]
    report = verify(url, workers=0)
    assert report.ok, report.summary()
    assert "offline: checked the cached copies, not the store" in report.summary()
    result = CliRunner().invoke(cli, ["verify", url, "--quiet", "--workers", "0"])
    assert result.exit_code == 1 and "pass --accept-cache" in result.output  # verify checked the cache, not the store
    for command in (["inspect", url], ["verify", url, "--quiet", "--workers", "0", "--accept-cache"]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 0, result.output
        assert "Traceback" not in result.output
    status, *lines = _train(url, tmp_path / "runs")
    assert status == "0", lines


def test_a_torchrun_run_says_it_is_offline_once_not_once_per_rank(own_s3: _Server, small_pack: Path, tmp_path: Path) -> None:
    url = upload_folder(small_pack, "s3://offline/ranks")
    _read_all(url)  # every shard in the cache, which both ranks share
    own_s3.stop()
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2] / "src"), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "stoker", "train",
         "--data", url, "--model", "small_cnn", "--epochs", "1", "--batch-size", "8", "--workers", "0", "--device", "cpu",
         "--no-progress", "--no-adapt", "--log-dir", str(tmp_path / "runs"), "--name", "ranks"],
        env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    notes = [line for line in (done.stdout + done.stderr).splitlines() if "offline: " in line]
    assert len(notes) == 1 and url in notes[0], notes


def test_a_stream_runs_its_second_epoch_from_the_cache_after_the_server_stops(own_s3: _Server, small_pack: Path) -> None:
    url = upload_folder(small_pack, "s3://offline/stream")
    stream = ShardStream(url, seed=3)
    first = sorted(label for _, label in stream)  # type: ignore[misc]
    own_s3.stop()
    stream.set_epoch(1)
    second = sorted(label for _, label in stream)  # type: ignore[misc]
    assert second == first and len(second) == 40


def test_a_set_not_fully_cached_stops_with_one_line(own_s3: _Server, small_pack: Path, tmp_path: Path) -> None:
    url = upload_folder(small_pack, "s3://offline/partial")
    _read_all(url)
    own_s3.stop()
    manifest = Manifest.load(url)  # from the cache
    os.remove(ShardCache().path_of(manifest.shards[2]))
    with pytest.raises(NetworkError, match=rf"{url}: the store cannot be reached and 1 of the 5 shards of split 'train' "
                                           rf"are not in the cache \(train-00002.arrow\)") as info:
        ShardDataset(url)
    assert "\n" not in str(info.value)
    status, *lines = _train(url, tmp_path / "runs")
    assert status == "1" and lines[-1].startswith("error: ") and "1 of the 5 shards" in lines[-1], lines
    result = CliRunner().invoke(cli, ["verify", url, "--quiet", "--workers", "0"])
    assert result.exit_code == 1 and result.output.strip().splitlines()[-1].startswith(f"error: {url}: the store cannot")


def test_a_cached_manifest_that_was_edited_is_not_used(own_s3: _Server, small_pack: Path) -> None:
    url = upload_folder(small_pack, "s3://offline/edited")
    _read_all(url)
    own_s3.stop()
    (entry,) = (Path(os.environ["STOKER_CACHE"]) / "manifests").glob("*.json")
    entry.write_text(entry.read_text().replace('\\"samples\\": 8', '\\"samples\\": 9', 1))
    with pytest.raises(NetworkError, match="connection refused.*no copy of its manifest is in the cache"):
        ShardDataset(url)


def test_verify_url_reads_the_store_and_names_a_shard_changed_after_caching(own_s3: _Server, small_pack: Path) -> None:
    url = upload_folder(small_pack, "s3://offline/changed")
    assert verify(url, workers=0).ok  # everything is cached now
    place = RemoteLocation(url)
    data = bytearray(place.read_bytes("train-00003.arrow"))
    data[len(data) // 2] ^= 0xFF  # same size: only reading (or the store's checksum) can tell
    place.write_bytes("train-00003.arrow", bytes(data))
    result = CliRunner().invoke(cli, ["verify", url, "--quiet", "--workers", "0"])
    assert result.exit_code == 1, result.output
    assert "fault: train-00003.arrow: the object in the store does not match the manifest's SHA-256" in result.output
    assert "checked the store: read 5 objects" in result.output
    assert result.output.count("fault:") == 1


def test_verify_url_compares_the_stores_own_sha256_where_it_keeps_one(own_s3: _Server, small_pack: Path) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    for path in sorted(small_pack.iterdir()):
        fs.call_s3("put_object", Bucket="offline", Key=f"sums/{path.name}", Body=path.read_bytes(), ChecksumAlgorithm="SHA256")
    url = "s3://offline/sums"
    assert verify(url, workers=0).ok  # first: downloaded into the cache
    report = verify(url, workers=0)
    assert report.ok and "compared 5 store SHA-256 checksums" in report.checked, report.summary()


def test_a_copied_warm_cache_is_recognised_offline_by_its_content(
    own_s3: _Server, small_pack: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cp -a`` of a warm cache keeps the bytes but not the stamps (new inodes): offline, each copy is hashed once."""
    import shutil

    url = upload_folder(small_pack, "s3://offline/copied")
    first = _read_all(url)
    own_s3.stop()
    copied = tmp_path / "copied-cache"
    shutil.copytree(tmp_path / "cache", copied, copy_function=shutil.copy2)
    monkeypatch.setenv("STOKER_CACHE", str(copied))
    manifest = Manifest.load(url)  # the copy's cached manifest
    assert not any(ShardCache().has(info) for info in manifest.shards)  # the stamps do not match the new files
    assert _read_all(url) == first
    assert all(ShardCache().has(info) for info in manifest.shards)  # stamped anew after one SHA-256 each


def test_offline_over_the_limit_says_so_once(
    own_s3: _Server, small_pack: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = upload_folder(small_pack, "s3://offline/overlimit")
    first = _read_all(url)
    own_s3.stop()
    held = ShardCache().size_bytes()
    monkeypatch.setenv("STOKER_CACHE_LIMIT", str(held // 2))
    with caplog.at_level(logging.WARNING, logger="stoker"):
        assert _read_all(url) == first
        assert _read_all(url) == first
    notes = [r.getMessage() for r in caplog.records if "over its limit" in r.getMessage()]
    assert len(notes) == 1, notes
    assert notes[0].startswith("offline: the cache ") and url in notes[0]
    assert ShardCache().size_bytes() == held  # nothing the reads need was deleted
