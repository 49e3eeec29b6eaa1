"""tune's GPU decode method: recorded as decoder = "nvjpeg", applied by a run, refused where there is no CUDA.

On this CPU machine the method itself is skipped (said why); the file's round trip, the
refusal and a recorded decoder reaching the run's data sets are tested here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from stoker import ClassFolderDataset, ConfigError
from stoker.bench import LoaderSettings, load_settings, save_settings, search_settings
from stoker.bench.methods import METHODS, cuda_available
from stoker.bench.settings import DECODERS, load_data_table
from stoker.cli.main import main
from stoker.shards.read.dataset import DECODERS as SHARD_DECODERS
from stoker.train.runner.config import DECODERS as CONFIG_DECODERS
from stoker.train.runner.config import DataConfig, parse_config
from stoker.train.runner.data import build_data

pytestmark = pytest.mark.skipif(cuda_available(), reason="the refusal and the skip are what a machine without CUDA does")


def _gpu_settings(data: Path) -> LoaderSettings:
    """What `stoker tune` writes where the GPU decode of encoded shards was fastest."""
    method = METHODS["shards-encoded-gpu"]
    return LoaderSettings(workers=1, backend=method.backends[0], method=method.name, decoder=method.decoder,
                          img_per_s=30000.0, data=str(data.resolve()), layout="class_folders", batch_size=8)


def test_the_decoders_are_one_list() -> None:
    assert DECODERS == SHARD_DECODERS == CONFIG_DECODERS


def test_the_gpu_decode_round_trips_through_the_tune_file_and_is_refused_without_cuda(tiny_root: Path,
                                                                                     tmp_path: Path) -> None:
    settings = _gpu_settings(tiny_root)
    path = save_settings(settings, tmp_path / "loader.toml")
    text = path.read_text()
    assert 'decoder = "nvjpeg"' in text and 'storage = "shards-encoded-gpu"' in text
    again = LoaderSettings.from_toml(text, str(path))
    assert again == settings and again.decoder == "nvjpeg" and again.method == "shards-encoded-gpu"
    for read in (load_settings, load_data_table):
        with pytest.raises(ConfigError, match=rf"{path}: decoder = 'nvjpeg' decodes on the GPU.*no CUDA device here"):
            read(path)


def test_stoker_train_refuses_a_gpu_tune_file_in_one_line(tiny_root: Path, tmp_path: Path) -> None:
    path = save_settings(_gpu_settings(tiny_root), tmp_path / "loader.toml")
    result = CliRunner().invoke(main, ["train", "--data", str(tiny_root), "--loader-config", str(path), "--epochs", "1",
                                       "--device", "cpu", "--log-dir", str(tmp_path / "runs")])
    assert result.exit_code != 0
    said = [line for line in result.output.splitlines() if "no CUDA device here" in line]
    assert len(said) == 1 and str(path) in said[0] and "stoker tune" in said[0]
    assert not (tmp_path / "runs").exists()


def test_a_recorded_decoder_reaches_the_runs_shard_sets(tiny_root: Path, tmp_path: Path) -> None:
    from stoker.packer import pack

    pack(tiny_root, tmp_path / "encoded", store="encoded", progress=False, workers=0)
    save_settings(LoaderSettings(workers=0, method="shards-encoded", decoder="full"), tmp_path / "loader.toml")
    table = load_data_table(tmp_path / "loader.toml")
    assert table["decoder"] == "full"
    config = parse_config({"data": {"path": [str(tmp_path / "encoded")], "valid": 0.25, **table}})
    data = build_data(config.data)
    assert data.train.decoder == data.valid.decoder == "full"  # type: ignore[attr-defined]
    assert build_data(parse_config({"data": {"path": [str(tmp_path / "encoded")]}}).data).train.decoder == "auto"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="data.decoder = 'full' decodes shard sets of encoded images"):
        build_data(DataConfig(path=[str(tiny_root)], decoder="full"))


def test_tune_skips_the_gpu_decode_without_cuda_and_says_why(tiny_root: Path) -> None:
    result = search_settings(ClassFolderDataset(tiny_root), budget_s=8, storages=["files", "shards-encoded-gpu"],
                             batch_size=8, max_workers=1, device="auto")
    assert all(t.settings.method == "files" for t in result.trials)
    assert "shards-encoded-gpu: decodes on the GPU, and torch sees no CUDA device here" in result.skipped
    assert result.settings.decoder is None
