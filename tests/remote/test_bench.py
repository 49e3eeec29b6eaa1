"""``stoker bench`` on shard sets in a bucket: a set as it is, and ``--packed URL``, downloading only what runs read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from stoker import pack
from stoker.cli.main import main as cli

from .conftest import upload_folder


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STOKER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def both_stores(tmp_path_factory: pytest.TempPathFactory, small_folders: Path) -> Path:
    """``small_folders`` packed as ``encoded/`` and ``pixels/`` side by side (what ``--packed`` takes)."""
    out = tmp_path_factory.mktemp("both") / "packed"
    for store in ("encoded", "pixels"):
        pack(small_folders, out / store, store=store, shard_samples=8, workers=0, progress=False)
    return out


def _cached_bytes(cache: Path) -> int:
    return sum(p.stat().st_size for p in cache.rglob("*.arrow")) if cache.exists() else 0


def _bench(*args: str) -> tuple[int, str, dict]:
    out = Path(args[args.index("--out") + 1])
    result = CliRunner().invoke(cli, ["bench", *args, "--workers", "0", "--batch-size", "8", "--device", "cpu",
                                      "--limit-seconds", "0.05"])
    report = json.loads((out / "bench.json").read_text()) if (out / "bench.json").exists() else {}
    return result.exit_code, result.output, report


def test_bench_a_shard_set_in_a_bucket_as_it_is(s3_server: str, bucket: str, both_stores: Path, cache: Path,
                                                tmp_path: Path) -> None:
    url = upload_folder(both_stores / "pixels", f"{bucket}/pixels")
    code, output, report = _bench(url, "--out", str(tmp_path / "out"))
    assert code == 0, output
    runs = {r["method"]: r for r in report["runs"]}
    assert runs["shards-pixels"]["status"] == "ok" and runs["shards-pixels"]["samples"] == 40
    assert runs["files"]["status"] == "unsupported" and "DATA is a shard set" in runs["files"]["reason"]
    assert "files: not run (files reads files, and DATA is a shard set" in output
    # the storage of a set in a bucket is the network: its limit is the rate the shards were downloaded at
    assert "MB/s downloading shards" in output and "file by file" not in output
    assert _cached_bytes(cache) == sum(p.stat().st_size for p in (both_stores / "pixels").glob("*.arrow"))


def test_a_shard_set_no_asked_method_reads_stops_before_a_download(s3_server: str, bucket: str, both_stores: Path,
                                                                   cache: Path, tmp_path: Path) -> None:
    url = upload_folder(both_stores / "pixels", f"{bucket}/pixels")
    code, output, _ = _bench(url, "--methods", "files,shards-encoded", "--out", str(tmp_path / "out"))
    assert code != 0 and "is a shard set of pixels shards" in output and "--methods shards-pixels" in output
    assert _cached_bytes(cache) == 0


def test_packed_url_downloads_only_the_stores_the_methods_read(s3_server: str, bucket: str, small_folders: Path,
                                                              both_stores: Path, cache: Path, tmp_path: Path) -> None:
    url = upload_folder(both_stores, f"{bucket}/packed")
    code, output, report = _bench(str(small_folders), "--packed", url, "--methods", "files,shards-pixels",
                                  "--out", str(tmp_path / "out"))
    assert code == 0, output
    assert {r["method"]: r["status"] for r in report["runs"]} == {"files": "ok", "shards-pixels": "ok"}
    assert report["packed_reused"] is True
    assert _cached_bytes(cache) == sum(p.stat().st_size for p in (both_stores / "pixels").glob("*.arrow"))


def test_packed_url_without_the_store_is_one_line_naming_the_manifest(s3_server: str, bucket: str, small_folders: Path,
                                                                      cache: Path, tmp_path: Path) -> None:
    code, output, _ = _bench(str(small_folders), "--packed", f"{bucket}/nothing", "--methods", "shards-pixels",
                             "--out", str(tmp_path / "out"))
    assert code != 0 and "Traceback" not in output
    assert f"no pixels/ shard set inside (no {bucket}/nothing/pixels/manifest.json)" in output
