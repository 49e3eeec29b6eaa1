"""tune: measured settings that make_loader takes and a training config accepts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from stoker import ClassFolderDataset, ConfigError, MissingFileError, make_loader
from stoker.bench import LoaderSettings, load_settings, save_settings, search_settings, tune


@pytest.fixture(scope="module")
def tuned(tiny_root: Path):
    # The budget is time on a shared machine: generous enough for two trials under load.
    return search_settings(ClassFolderDataset(tiny_root), budget_s=8, storages=["files"], batch_size=8,
                           max_workers=1, device="cpu")


def test_tune_measures_and_returns_valid_loader_arguments(tuned, tiny: ClassFolderDataset) -> None:
    assert len(tuned.trials) >= 2 and all(t.settings.method == "files" for t in tuned.trials)
    assert tuned.settings.img_per_s and tuned.settings.img_per_s > 0
    assert "chose:" in tuned.report() and tuned.reason
    loader = make_loader(tiny, batch_size=8, device="cpu", **tuned.settings.loader_kwargs())
    assert sum(len(labels) for _, labels in loader) == len(tiny)


def test_the_settings_file_round_trips_and_merges_into_a_train_config(tuned, tiny_root: Path, tmp_path: Path) -> None:
    path = save_settings(tuned.settings, tmp_path / "loader.toml", comment="test")
    again = load_settings(path)
    assert again == tuned.settings and again.method == "files" and again.img_per_s == pytest.approx(tuned.settings.img_per_s, abs=0.1)
    from stoker.train.config import DataConfig, parse_config

    known = {f.name for f in dataclasses.fields(DataConfig)}
    missing = set(tuned.settings.data_table()) - known
    if missing:
        pytest.skip(f"the train config's [data] table does not take {', '.join(sorted(missing))} yet")
    config = parse_config({"data": {"path": str(tiny_root), **tuned.settings.data_table()}})
    assert config.data.workers == tuned.settings.workers and config.data.backend == tuned.settings.backend


def test_bad_settings_and_files_are_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="workers"):
        LoaderSettings(workers=-1)
    with pytest.raises(ConfigError, match="backend"):
        LoaderSettings(backend="gpu")
    bad = tmp_path / "bad.toml"
    bad.write_text("[data]\nworkers = 'many'\n")
    with pytest.raises(ConfigError, match="bad.toml: data.workers"):
        load_settings(bad)
    with pytest.raises(MissingFileError, match="stoker tune"):
        load_settings(tmp_path / "none.toml")
    with pytest.raises(ConfigError, match="too short"):
        tune(tmp_path, budget_s=1)
