"""Abuse of the command line ends in one line that says what to write: huge integers, a BOM, a negative crop box,
a huge retry count, a damaged run.json on --resume (never rewritten)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from stoker.cli.main import main
from stoker.errors import ConfigError
from stoker.fs.network import NetSettings
from stoker.train.runner.config import load_config

from .conftest import write_png


@pytest.fixture
def folders(tmp_path: Path) -> Path:
    for i in range(16):
        write_png(tmp_path / "data" / str(i % 2) / f"{i:02d}.png", seed=i, size=(12, 12))
    return tmp_path / "data"


def _one_line_error(args: list[str], env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output, result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


def test_a_batch_size_of_two_to_the_63_is_one_line(folders: Path, tmp_path: Path) -> None:
    # Before: a ValueError traceback from islice in loading/samplers.py.
    line = _one_line_error(["train", "--data", str(folders), "--batch-size", str(2**63), "--log-dir", str(tmp_path)])
    assert "--batch-size" in line and "must be a whole number from 1 to 2147483647" in line


def test_a_toml_file_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    # Before: "not valid TOML (Invalid statement (at line 1, column 1))".
    path = tmp_path / "train.toml"
    path.write_bytes("\ufeff[run]\nepochs = 3\n".encode())
    assert load_config(path).run.epochs == 3


def test_a_negative_crop_box_states_the_ranges(folders: Path, tmp_path: Path) -> None:
    line = _one_line_error(["train", "--data", str(folders), "--crop", "[-5,-5,50,50]", "--log-dir", str(tmp_path)])
    assert "--crop" in line and "top and left from 0, height and width from 1" in line
    result = CliRunner().invoke(main, ["pack", str(folders), str(tmp_path / "out"), "--crop", "-5,-5,50,50"])
    assert result.exit_code == 2 and "Traceback" not in result.output  # click's usage error, its one Error: line
    assert "Error: Invalid value: '-5,-5,50,50': write TOP,LEFT,HEIGHT,WIDTH in pixels (whole numbers: TOP and LEFT " \
           "from 0, HEIGHT and WIDTH from 1)" in result.output


@pytest.mark.parametrize(("name", "value", "words"), [
    ("STOKER_NET_RETRIES", "1000000000", "must be a whole number from 0 to 100"),
    ("STOKER_NET_TIMEOUT", "1e300", "must be a number of seconds > 0 and <= 86400"),
])
def test_network_settings_are_bounded(monkeypatch: pytest.MonkeyPatch, name: str, value: str, words: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=f"{name}='{value}': {words}"):
        NetSettings.from_env()


def test_a_damaged_run_json_on_resume_is_named_and_left_alone(folders: Path, tmp_path: Path) -> None:
    # Before: the run resumed with last.pt's own config and rewrote run.json, saying nothing.
    logs = tmp_path / "runs"
    common = ["--data", str(folders), "--log-dir", str(logs), "--name", "r", "--batch-size", "4", "--workers", "0",
              "--image-size", "12"]
    result = CliRunner().invoke(main, ["train", *common, "--epochs", "1"])
    assert result.exit_code == 0, result.output
    record = logs / "r" / "run.json"
    record.write_bytes(b"\x00garbage{")
    line = _one_line_error(["train", *common, "--epochs", "2", "--resume"])
    assert f"{record}: cannot resume: the run's record is damaged (not " in line
    assert "move run.json aside" in line and "another --name" in line
    assert record.read_bytes() == b"\x00garbage{"  # never rewritten
