"""One packing advice: inspect, bench and tune name the same command, --channels 1 for gray data;
a tune file records its batch size, and train warns when used at another."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from stoker import ClassFolderDataset
from stoker.bench.advice import looks_gray, pack_command
from stoker.bench.settings import LoaderSettings, check_tuned_for, describe_loader, load_settings, save_settings
from stoker.cli.main import main


@pytest.fixture(scope="module")
def gray_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 classes x 8 gray 12x12 PNGs (mode L, as Fashion-MNIST's)."""
    root = tmp_path_factory.mktemp("gray")
    rng = np.random.default_rng(1)
    for label in range(2):
        (root / str(label)).mkdir()
        for j in range(8):
            Image.fromarray(rng.integers(0, 255, (12, 12), dtype=np.uint8), "L").save(root / str(label) / f"{j}.png")
    return root


def test_gray_data_is_told_apart_from_colour(gray_root: Path, tiny_root: Path) -> None:
    assert looks_gray(ClassFolderDataset(gray_root))
    assert not looks_gray(ClassFolderDataset(tiny_root))


def test_pack_command_is_pixels_with_channels_for_gray() -> None:
    assert pack_command("d", (28, 28), gray=True) == "`stoker pack d OUT --store pixels --size 28x28 --channels 1`"
    assert pack_command() == "`stoker pack DATA OUT --store pixels`"


def test_inspect_gives_the_pixels_advice_and_names_channels_for_gray_data(gray_root: Path, tiny_root: Path) -> None:
    gray = CliRunner().invoke(main, ["inspect", str(gray_root)])
    assert gray.exit_code == 0, gray.output
    assert f"`stoker pack {gray_root} OUT --store pixels --channels 1`" in gray.output
    colour = CliRunner().invoke(main, ["inspect", str(tiny_root)])
    assert colour.exit_code == 0, colour.output
    assert f"`stoker pack {tiny_root} OUT --store pixels`" in colour.output and "--channels" not in colour.output


def test_the_bench_advice_names_channels_for_gray_data(gray_root: Path, tmp_path: Path) -> None:
    from stoker.bench import BenchPlan, run_bench
    from stoker.bench.report import _pixels_command

    plan = BenchPlan(str(gray_root), methods=["files"], workers=[0], batch_size=8, limits_time_s=0.1, progress=False)
    result = run_bench(plan)
    assert result.gray
    assert _pixels_command(result) == "`stoker pack DATA OUT --store pixels --channels 1`"  # one size: no --size


def test_a_tune_file_records_its_batch_size_and_another_is_warned(tiny_root: Path, tmp_path: Path) -> None:
    settings = LoaderSettings(workers=0, method="files", data=str(tiny_root.resolve()), img_per_s=100.0, batch_size=256)
    path = save_settings(settings, tmp_path / "loader.toml")
    assert "batch_size = 256" in path.read_text() and load_settings(path).batch_size == 256
    assert check_tuned_for(load_settings(path), [str(tiny_root)], str(path), batch_size=256) == []
    [warning] = check_tuned_for(load_settings(path), [str(tiny_root)], str(path), batch_size=64)
    assert "tuned at batch size 256, and this run uses 64" in warning and "--batch-size 256" in warning
    assert f"--batch-size 64 --out {path}" in warning
    result = CliRunner().invoke(main, ["train", "--data", str(tiny_root), "--loader-config", str(path), "--epochs", "1",
                                       "--batch-size", "8", "--image-size", "16", "--no-progress", "--no-adapt",
                                       "--device", "cpu", "--log-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert "tuned at batch size 256, and this run uses 8" in result.output


def test_no_workers_are_described_without_a_prefetch_depth() -> None:
    assert describe_loader(0, "process", 2) == "no workers (loads in the training process)"
    assert describe_loader(1, "thread", 4) == "1 thread worker, prefetch 4"
