"""Re-packing over a set never destroys it; readers notice a re-pack; one pack per folder; a full disk says how much."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from stoker.errors import ConfigError, ShardError
from stoker.packer import pack
from stoker.shards import Manifest, verify
from stoker.shards.pack.replace import pack_lock, staging_dir
from stoker.shards.pack.writer import ShardWriter
from stoker.shards.read.reader import ShardSet

from .conftest import write_png


@pytest.fixture
def packed(tmp_path: Path) -> Path:
    for i in range(24):
        write_png(tmp_path / "cls" / str(i % 3) / f"{i:03d}.png", seed=i)
    pack(tmp_path / "cls", tmp_path / "set", shard_samples=6, workers=0, progress=False)
    return tmp_path / "set"


def _interrupt_after(monkeypatch: pytest.MonkeyPatch, shards: int) -> None:
    original = ShardWriter.close
    calls = {"n": 0}

    def close(self: ShardWriter) -> object:
        if calls["n"] >= shards:
            raise KeyboardInterrupt  # as a Ctrl-C (or a kill) half way through the pack
        calls["n"] += 1
        return original(self)

    monkeypatch.setattr(ShardWriter, "close", close)


def test_interrupted_in_place_repack_leaves_the_old_set_whole(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = {p.name: p.read_bytes() for p in packed.iterdir()}
    _interrupt_after(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        pack(packed, packed, store="pixels", overwrite=True, shard_samples=6, workers=0, progress=False)
    assert {p.name: p.read_bytes() for p in packed.iterdir()} == before
    assert verify(packed, workers=0).ok
    monkeypatch.undo()
    # The suggested re-run works, resumes the staged shards, and swaps in the new set.
    manifest = pack(packed, packed, store="pixels", overwrite=True, shard_samples=6, workers=0, progress=False)
    assert manifest.store == "pixels" and Manifest.load(packed).store == "pixels"
    assert verify(packed, workers=0).ok
    assert not staging_dir(packed).exists()
    assert not any(p.name.endswith(".tmp") for p in packed.iterdir())


def test_overwrite_removes_only_files_stoker_wrote(packed: Path) -> None:
    (packed / "notes.txt").write_text("mine")
    (packed / "table.arrow").write_bytes(b"not a shard of stoker's")
    (packed / "sub").mkdir()
    (packed / "sub" / "x.txt").write_text("mine too")
    pack(packed.parent / "cls", packed, overwrite=True, shard_samples=100, workers=0, progress=False)
    assert (packed / "notes.txt").read_text() == "mine"
    assert (packed / "table.arrow").read_bytes() == b"not a shard of stoker's"
    assert (packed / "sub" / "x.txt").read_text() == "mine too"
    assert len(Manifest.load(packed).shards) == 1 and verify(packed, workers=0).ok


def test_reader_open_during_a_repack_gets_a_clear_error_not_a_mix(packed: Path) -> None:
    reader = ShardSet(packed, "train")
    assert len(reader.infos) >= 2
    first = reader.read_labels(np.arange(3))
    pack(packed, packed, overwrite=True, seed=1, shard_samples=6, workers=0, progress=False)
    assert (reader.read_labels(np.arange(3)) == first).all()  # the open shard still reads the old set
    last = np.asarray([len(reader) - 1])
    with pytest.raises(ShardError, match="re-packed or replaced while it was open"):
        reader.read_labels(last)
    reader.close()
    assert len(ShardSet(packed, "train")) == len(reader)  # reopened, it reads the new set


def test_second_pack_into_the_same_folder_is_refused(packed: Path) -> None:
    with pack_lock(packed):
        with pytest.raises(ConfigError, match="another `stoker pack` .* is writing into this folder"):
            pack(packed.parent / "cls", packed, overwrite=True, workers=0, progress=False)
    assert verify(packed, workers=0).ok


def test_the_lock_covers_the_swap_a_pack_started_after_the_exchange_is_refused(packed: Path) -> None:
    """The swap exchanges the folders: a lock inside OUT would leave with the old one, unlocking the new OUT."""
    with pack_lock(packed):
        moved = packed.parent / "old-set"
        os.rename(packed, moved)  # what the exchange does to the folder the first pack locked
        packed.mkdir()
        with pytest.raises(ConfigError, match="another `stoker pack` .* is writing into this folder"):
            pack(moved, packed, overwrite=True, workers=0, progress=False)
        packed.rmdir()
        os.rename(moved, packed)
    assert verify(packed, workers=0).ok


def test_full_disk_while_packing_says_how_much_space_is_needed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(6):
        write_png(tmp_path / "cls" / str(i % 2) / f"{i}.png", seed=i)

    def write(self: ShardWriter, *args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ShardWriter, "write_row", write)
    with pytest.raises(ShardError, match=r"the disk is full: the pack needs about .* MiB .* re-run the same command"):
        pack(tmp_path / "cls", tmp_path / "out", workers=0, progress=False)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_interrupted_pack_leaves_no_stray_tmp_after_the_rerun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(12):
        write_png(tmp_path / "cls" / str(i % 2) / f"{i}.png", seed=i)
    out = tmp_path / "out"
    out.mkdir()
    _interrupt_after(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        pack(tmp_path / "cls", out, shard_samples=4, workers=0, progress=False)
    (out / "train-00002.arrow.tmp").write_bytes(b"half a shard")  # what a kill -9 leaves
    (out / "keep.tmp").write_bytes(b"the user's")
    monkeypatch.undo()
    pack(tmp_path / "cls", out, shard_samples=4, workers=0, progress=False)
    assert [p.name for p in out.iterdir() if p.name.endswith(".tmp")] == ["keep.tmp"]  # only the user's stays
    assert verify(out, workers=0).ok


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _restore(folder: Path, files: dict[str, bytes]) -> None:
    import shutil

    shutil.rmtree(folder)
    shutil.rmtree(staging_dir(folder), ignore_errors=True)
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)


def _kill_at(monkeypatch: pytest.MonkeyPatch, out: Path, point: str, count: int) -> None:
    """Raise KeyboardInterrupt (a kill) at one point of the swap: before or after the exchange, after ``count`` removals
    of the old set's files, after moving the user's file, or before removing the emptied folder."""
    from stoker.shards.pack import replace

    staging = staging_dir(out)
    exchange, unlink, rename, rmdir = replace._exchange, Path.unlink, os.rename, Path.rmdir
    done = {"n": 0}

    def kill_exchange(a: Path, b: Path) -> bool:
        if point == "after the exchange":
            exchange(a, b)
        raise KeyboardInterrupt

    def kill_unlink(self: Path, missing_ok: bool = False) -> None:
        unlink(self, missing_ok=missing_ok)
        if self.parent == staging:
            done["n"] += 1
            if done["n"] == count:
                raise KeyboardInterrupt

    def kill_rename(a: object, b: object) -> None:
        rename(a, b)  # type: ignore[arg-type]
        if Path(a).parent == staging:  # type: ignore[arg-type]
            raise KeyboardInterrupt

    def kill_rmdir(self: Path) -> None:
        if self == staging:
            raise KeyboardInterrupt
        rmdir(self)

    if point in ("before the exchange", "after the exchange"):
        monkeypatch.setattr(replace, "_exchange", kill_exchange)
    elif point == "after removals":
        monkeypatch.setattr(Path, "unlink", kill_unlink)
    elif point == "after moving the user's file":
        monkeypatch.setattr(replace.os, "rename", kill_rename)
    else:
        monkeypatch.setattr(Path, "rmdir", kill_rmdir)


KILL_POINTS = [("before the exchange", 0), ("after the exchange", 0)] + [("after removals", k) for k in range(1, 6)] + [
    ("after moving the user's file", 0), ("before removing the folder", 0)]


def test_an_in_place_repack_killed_at_any_swap_point_and_rerun_gives_the_uninterrupted_shards(
    packed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: a re-run after the exchange read the new set and shuffled it again (another order).
    (packed / "notes.txt").write_text("mine")
    old = _files(packed)
    assert len(Manifest.load(packed).shards) == 4  # the old set's manifest and 4 shards: 5 removals in the swap

    def repack() -> Manifest:
        return pack(packed, packed, overwrite=True, shard_samples=6, workers=0, progress=False)

    repack()
    expected = _files(packed)
    assert expected != old and expected["notes.txt"] == b"mine"
    assert repack() is not None and _files(packed) == expected  # the same command again: the same shards
    for point, count in KILL_POINTS:
        _restore(packed, old)
        with monkeypatch.context() as patch:
            _kill_at(patch, packed, point, count)
            with pytest.raises(KeyboardInterrupt):
                repack()
        repack()
        assert _files(packed) == expected, (point, count)
        assert not staging_dir(packed).exists(), (point, count)
        assert verify(packed, workers=0).ok
