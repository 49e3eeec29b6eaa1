"""Replacing a shard set in a bucket as safely as a local one, and one pack per prefix at a time.

Against moto's S3 server on 127.0.0.1: an interrupted ``--overwrite`` leaves the old set
readable and verifiable and the same command resumes it; only what stoker wrote is
removed (the user's own ``*.arrow`` tables under the prefix stay); a second pack into a
prefix while one runs is refused with one line naming the owner.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from stoker import pack, verify
from stoker.cli.main import main as cli
from stoker.errors import ConfigError, ShardError
from stoker.fs import RemoteLocation
from stoker.shards import ShardDataset
from stoker.shards.pack import packing as packing_module
from stoker.shards.pack import upload as upload_module
from stoker.shards.pack.replace import LOCK_NAME

_OLD: dict[str, Any] = {"store": "pixels", "shard_samples": 8, "progress": False, "workers": 0}
_NEW: dict[str, Any] = {**_OLD, "shard_samples": 16}
_USERS = {"mine.arrow": b"the user's own table", "results-00000.arrow": b"named like a shard", "notes/kept.arrow": b"below"}


def _objects(url: str) -> dict[str, bytes]:
    place = RemoteLocation(url)
    place.invalidate()
    return {name: place.read_bytes(name) for name in sorted(place.sizes())}


def _put_users(url: str) -> None:
    place = RemoteLocation(url)
    for name, data in _USERS.items():
        place.write_bytes(name, data)


def _users_intact(url: str) -> bool:
    place = RemoteLocation(url)
    place.invalidate()
    return all(place.read_bytes(name) == data for name, data in _USERS.items())


def test_an_interrupted_bucket_overwrite_keeps_the_old_set_and_resumes(
    s3_server: str, bucket: str, small_folders: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{bucket}/packed"
    old = pack(small_folders, url, cache_dir=tmp_path / "cache", **_OLD)
    _put_users(url)
    before = _objects(url)
    real_upload = packing_module.upload_shard
    uploads: list[str] = []

    def upload_then_die(place: RemoteLocation, staging: Path, info: Any) -> None:
        real_upload(place, staging, info)
        uploads.append(info.name)
        raise KeyboardInterrupt  # killed right after the new set's first upload

    monkeypatch.setattr(packing_module, "upload_shard", upload_then_die)
    with pytest.raises(KeyboardInterrupt):
        pack(small_folders, url, overwrite=True, cache_dir=tmp_path / "cache", **_NEW)
    left = _objects(url)
    assert {k: v for k, v in left.items() if k in before} == before  # nothing of the old set changed
    assert LOCK_NAME not in left and uploads[0] in left and uploads[0] not in before
    readable = ShardDataset(url, cache_dir=tmp_path / "read-cache")
    assert readable.manifest == old and len(readable) == 40
    report = verify(url, cache_dir=tmp_path / "verify-cache", workers=0)
    assert report.ok, report.summary()

    monkeypatch.setattr(packing_module, "upload_shard", lambda *a: (uploads.append(a[2].name), real_upload(*a)))
    new = pack(small_folders, url, overwrite=True, cache_dir=tmp_path / "cache", **_NEW)  # the same command resumes
    assert len(uploads) == len(new.shards) and len(set(uploads)) == len(uploads)  # the first upload was not sent again
    local = pack(small_folders, tmp_path / "local", **_NEW)
    after = _objects(url)
    assert [after[i.name] for i in new.shards] == [(tmp_path / "local" / i.name).read_bytes() for i in local.shards]
    assert [(i.split, i.samples, i.sha256) for i in new.shards] == [(i.split, i.samples, i.sha256) for i in local.shards]
    assert set(after) == {i.name for i in new.shards} | {"manifest.json", "mine.arrow", "results-00000.arrow"}
    assert _users_intact(url)
    assert len(ShardDataset(url, cache_dir=tmp_path / "read-cache")) == 40


def test_overwrite_removes_only_what_stoker_wrote(s3_server: str, bucket: str, small_folders: Path, tmp_path: Path) -> None:
    url = f"{bucket}/mixed"
    _put_users(url)
    RemoteLocation(url).write_bytes("train-00000.arrow", b"the user's, named like our first shard")
    first = pack(small_folders, url, overwrite=True, cache_dir=tmp_path / "cache", **_OLD)
    assert first.shards[0].name != "train-00000.arrow"  # the user's object keeps its name; ours takes another
    second = pack(small_folders, url, overwrite=True, cache_dir=tmp_path / "cache", **_NEW)
    third = pack(small_folders, url, overwrite=True, cache_dir=tmp_path / "cache", **_OLD)
    objects = _objects(url)
    assert set(objects) == {i.name for i in third.shards} | {"manifest.json", "mine.arrow", "results-00000.arrow", "train-00000.arrow"}
    assert objects["train-00000.arrow"] == b"the user's, named like our first shard" and _users_intact(url)
    assert {i.name for i in second.shards}.isdisjoint(objects)  # the replaced sets are gone
    assert [i.sha256 for i in third.shards] == [i.sha256 for i in first.shards]
    assert verify(url, cache_dir=tmp_path / "verify-cache", workers=0).ok


def test_a_second_pack_into_a_prefix_is_refused_while_one_runs(
    s3_server: str, bucket: str, small_folders: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{bucket}/busy"
    real_upload = packing_module.upload_shard
    uploading, go_on = threading.Event(), threading.Event()
    outcome: list[object] = []

    def slow_upload(place: RemoteLocation, staging: Path, info: Any) -> None:
        uploading.set()
        if not go_on.wait(60):
            raise TimeoutError("the test never let the first pack go on")
        real_upload(place, staging, info)

    def first_pack() -> None:
        try:
            outcome.append(pack(small_folders, url, cache_dir=tmp_path / "first", **_OLD))
        except BaseException as exc:  # noqa: BLE001  (reported by the assertion below)
            outcome.append(exc)

    monkeypatch.setattr(packing_module, "upload_shard", slow_upload)
    thread = threading.Thread(target=first_pack)
    thread.start()
    try:
        assert uploading.wait(60), "the first pack never started uploading"
        with pytest.raises(ConfigError, match=r"another `stoker pack` \(host .+ pid \d+\) is writing into this prefix"):
            pack(small_folders, url, overwrite=True, cache_dir=tmp_path / "second", **_NEW)
        monkeypatch.setenv("STOKER_CACHE", str(tmp_path / "cli"))
        result = CliRunner().invoke(cli, ["pack", str(small_folders), url, "--workers", "0", "--quiet", "--overwrite"])
        assert result.exit_code == 1
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "wait for it to finish" in lines[0], result.output
    finally:
        go_on.set()
        thread.join(120)
    assert len(outcome) == 1 and not isinstance(outcome[0], BaseException), outcome
    objects = _objects(url)
    assert LOCK_NAME not in objects and ShardDataset(url, cache_dir=tmp_path / "read").manifest == outcome[0]


def test_an_overwrite_interrupted_after_its_manifest_finishes_its_cleanup_when_run_again(
    s3_server: str, bucket: str, small_folders: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{bucket}/late"
    old = pack(small_folders, url, cache_dir=tmp_path / "cache", **_OLD)
    monkeypatch.setattr(packing_module, "upload_shard", _die_after_first_upload(packing_module.upload_shard))
    with pytest.raises(KeyboardInterrupt):
        pack(small_folders, url, overwrite=True, cache_dir=tmp_path / "cache", **_NEW)
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="unfinished `--overwrite`"):
        pack(small_folders, url, cache_dir=tmp_path / "cache", **_NEW)  # the same pack without --overwrite
    real_remove = upload_module.RemoteOut._remove

    def die_removing(self: Any, names: Any) -> None:
        if set(names) & {i.name for i in old.shards}:
            raise KeyboardInterrupt  # killed just after the new manifest went up
        real_remove(self, names)

    monkeypatch.setattr(upload_module.RemoteOut, "_remove", die_removing)
    with pytest.raises(KeyboardInterrupt):
        pack(small_folders, url, overwrite=True, cache_dir=tmp_path / "cache", **_NEW)
    monkeypatch.undo()
    new = ShardDataset(url, cache_dir=tmp_path / "read").manifest  # the new set is the set already
    assert {i.name for i in old.shards} <= set(_objects(url))
    assert pack(small_folders, url, overwrite=True, cache_dir=tmp_path / "cache", **_NEW) == new  # nothing re-sent
    assert set(_objects(url)) == {i.name for i in new.shards} | {"manifest.json"}


def _die_after_first_upload(real_upload: Any) -> Any:
    def upload(place: RemoteLocation, staging: Path, info: Any) -> None:
        real_upload(place, staging, info)
        raise KeyboardInterrupt

    return upload


def test_overwrite_of_a_set_whose_manifest_is_damaged_removes_the_shards_it_lists(
    s3_server: str, bucket: str, small_folders: Path, tmp_path: Path
) -> None:
    url = f"{bucket}/damaged"
    old = pack(small_folders, url, cache_dir=tmp_path / "cache", **_OLD)
    place = RemoteLocation(url)
    damaged = place.read_bytes("manifest.json").replace(b'"samples": 8', b'"samples": 0', 1)
    place.write_bytes("manifest.json", damaged)
    with pytest.raises(ShardError):
        ShardDataset(url, cache_dir=tmp_path / "read")
    new = pack(small_folders, url, overwrite=True, cache_dir=tmp_path / "cache", **_NEW)
    assert set(_objects(url)) == {i.name for i in new.shards} | {"manifest.json"}
    assert {i.name for i in old.shards}.isdisjoint(_objects(url))
