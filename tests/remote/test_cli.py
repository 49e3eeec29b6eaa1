"""``stoker verify`` and ``stoker inspect`` on a URL: the manifest first, then what would be downloaded."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from stoker.cli.main import main as cli
from stoker.fs import RemoteLocation
from stoker.shards import verify

from .conftest import upload_folder


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STOKER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_verify_a_bucket(s3_server: str, bucket: str, small_pack: Path, cache: Path) -> None:
    url = upload_folder(small_pack, f"{bucket}/packed")
    result = CliRunner().invoke(cli, ["verify", url, "--quiet", "--workers", "0"])
    assert result.exit_code == 0, result.output
    assert "5 shards" in result.output and "to download into" in result.output
    assert f"ok: 5 shards, 40 samples verified in {url}" in result.output
    again = CliRunner().invoke(cli, ["verify", url, "--quiet", "--workers", "0"])
    assert " 0.0 MiB to download" in again.output


def test_verify_names_a_damaged_object(s3_server: str, bucket: str, small_pack: Path, cache: Path) -> None:
    url = upload_folder(small_pack, f"{bucket}/packed")
    place = RemoteLocation(url)
    data = bytearray(place.read_bytes("train-00004.arrow"))
    data[-100] ^= 1
    place.write_bytes("train-00004.arrow", bytes(data))
    report = verify(url, workers=0)
    assert not report.ok and report.first_fault is not None
    assert report.first_fault.shard == "train-00004.arrow" and "SHA-256 does not match" in report.first_fault.problem
    assert report.shards == 5
    result = CliRunner().invoke(cli, ["verify", url, "--quiet", "--workers", "0"])
    assert result.exit_code == 1 and "FAULTY" in result.output


def test_inspect_a_bucket(s3_server: str, bucket: str, small_pack: Path, cache: Path) -> None:
    url = upload_folder(small_pack, f"{bucket}/packed")
    result = CliRunner().invoke(cli, ["inspect", url])
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first.startswith(f"{url}: 5 shards") and "to download" in first
    assert "shuffle quality" in result.output


def test_tune_a_bucket(s3_server: str, bucket: str, small_folders: Path, cache: Path, tmp_path: Path) -> None:
    url = upload_folder(small_folders, f"{bucket}/folders")
    out = tmp_path / "loader.toml"
    result = CliRunner().invoke(cli, ["tune", url, "--budget", "20s", "--out", str(out), "--batch-size", "8",
                                      "--max-workers", "1", "--storages", "files", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert f'data = "{url}"' in out.read_text()  # tuned for this bucket: used on other storage, it says so


def test_cache_dir_flag_says_where_a_bucket_is_cached(s3_server: str, bucket: str, small_pack: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOKER_CACHE", str(tmp_path / "from-env"))  # restored after the test, which the flag changes
    url = upload_folder(small_pack, f"{bucket}/packed")
    chosen = tmp_path / "chosen"
    result = CliRunner().invoke(cli, ["--cache-dir", str(chosen), "verify", url, "--quiet", "--workers", "0"])
    assert result.exit_code == 0, result.output
    assert any(p.name.endswith(".arrow") for p in chosen.rglob("*")) and not (tmp_path / "from-env").exists()
