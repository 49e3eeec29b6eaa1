"""Loader settings that leave the workers out follow the machine's share, as make_loader does."""

from __future__ import annotations

from pathlib import Path

import pytest

from stoker import ClassFolderDataset, make_loader
from stoker.bench.settings import LoaderSettings, load_settings, save_settings
from stoker.cores import CORES_ENV
from stoker.loading.workers import machine_workers


def test_settings_without_workers_leave_them_to_the_machine(tmp_path: Path, tiny: ClassFolderDataset,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CORES_ENV, "16")
    settings = LoaderSettings(backend="thread")
    assert settings.workers is None and "num_workers" not in settings.loader_kwargs()
    assert "workers" not in settings.data_table()
    path = save_settings(settings, tmp_path / "loader.toml")
    assert "workers" not in path.read_text() and load_settings(path) == settings
    loader = make_loader(tiny, batch_size=2, device="cpu", **settings.loader_kwargs())
    assert loader.num_workers == machine_workers(accelerator=False, backend="thread") == 8  # it was 2 on every machine
    loader.close()
    assert LoaderSettings(workers=3).loader_kwargs()["num_workers"] == 3
