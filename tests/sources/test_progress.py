"""Indexing a folder says what it is doing once it takes a while, and nothing for a quick one."""

from __future__ import annotations

from pathlib import Path

import pytest

import stoker.sources.index as index_module
from stoker import ClassFolderDataset
from stoker.data import open_data


def _folders(root: Path, n: int = 30) -> Path:
    for i in range(n):
        folder = root / str(i % 3)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i}.png").write_bytes(b"")  # indexing lists names; it reads no image
    return root


def test_a_quick_index_prints_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # Quick: well inside the delay, even on a machine that stalls for seconds (a CI run once took
    # 5 s to list these 30 names and printed the counter under the default 1.5 s delay).
    monkeypatch.setattr(index_module, "PROGRESS_DELAY_S", 60.0)
    assert len(ClassFolderDataset(_folders(tmp_path / "data"))) == 30
    assert capsys.readouterr().err == ""


def test_a_slow_index_shows_a_counter_of_the_files_found_on_stderr(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # As if every step ran past the delay: the counter a slow listing of 70,000 files shows within 2 s.
    monkeypatch.setattr(index_module, "PROGRESS_DELAY_S", 0.0)
    root = _folders(tmp_path / "data" / "train")
    _folders(tmp_path / "data" / "val", 9)
    splits = open_data(tmp_path / "data")
    captured = capsys.readouterr()
    assert len(splits["train"]) == 30 and captured.out == ""
    assert f"indexing {root}: 30 files" in captured.err
    assert f"indexing {tmp_path / 'data' / 'val'}: 9 files" in captured.err


def test_the_counter_shows_within_two_seconds() -> None:
    bar = index_module.indexing_progress("somewhere")
    try:
        assert 1.0 <= bar.delay == index_module.PROGRESS_DELAY_S < 2.0
    finally:
        bar.close()
