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
    from stoker.train.runner.config import DataConfig, parse_config

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


def _tuned_for(path: Path, method: str, data: Path) -> Path:
    settings = LoaderSettings(workers=0, method=method, img_per_s=2000.0, data=str(data.resolve()), layout="class_folders")
    return save_settings(settings, path)


def test_settings_tuned_for_pixel_shards_stop_a_run_on_the_raw_folder(tiny_root: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from stoker.cli.main import main

    path = _tuned_for(tmp_path / "loader.toml", "shards-pixels", tiny_root)
    result = CliRunner().invoke(main, ["train", "--data", str(tiny_root), "--loader-config", str(path), "--epochs", "1",
                                       "--model", "small_cnn", "--device", "cpu", "--log-dir", str(tmp_path / "runs")])
    assert result.exit_code == 1, result.output
    assert f"tuned for shards-pixels of {tiny_root.resolve()} (class_folders, 2,000 img/s)" in result.output
    assert f"{tiny_root} is files" in result.output and "stoker tune" in result.output
    assert not (tmp_path / "runs").exists()  # stopped before training


def test_the_storage_must_match_and_other_data_of_that_storage_warns(tiny_root: Path, tmp_path: Path) -> None:
    from stoker.bench.settings import check_tuned_for
    from stoker.packer import pack

    pack(tiny_root, tmp_path / "pixels", store="pixels", progress=False, workers=0)
    pixels = load_settings(_tuned_for(tmp_path / "a.toml", "shards-pixels", tiny_root))
    assert check_tuned_for(pixels, [tmp_path / "pixels"], "a.toml") == []  # the pack of the data it was tuned on
    files = load_settings(_tuned_for(tmp_path / "b.toml", "files", tiny_root))
    assert check_tuned_for(files, [tiny_root], "b.toml") == []
    with pytest.raises(ConfigError, match=r"tuned for files .* is shards-pixels.*--storages shards-pixels"):
        check_tuned_for(files, [tmp_path / "pixels"], "b.toml")
    other = load_settings(_tuned_for(tmp_path / "c.toml", "files", tmp_path / "elsewhere"))
    (warning,) = check_tuned_for(other, [tiny_root], "c.toml")
    assert "other data of the same storage" in warning and f"stoker tune {tiny_root}" in warning
    # settings that say nothing of what they were tuned for (hand-written) are not checked
    assert check_tuned_for(LoaderSettings(workers=0), [tmp_path / "pixels"]) == []
