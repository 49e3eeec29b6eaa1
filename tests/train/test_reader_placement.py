"""``stoker train`` places its readers on an accelerator by default; the flag decides; run.json says what was applied."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from stoker.cli.train import train


def test_the_key_the_flag_and_the_record(tmp_path: Path, folders: Path) -> None:
    config = tmp_path / "t.toml"
    config.write_text(f'[data]\npath = "{folders}"\nbatch_size = 32\nworkers = 1\nvalid = 0.25\n[model]\nname = "small_cnn"\n'
                      f'[run]\nlog_dir = "{tmp_path / "runs"}"\ndevice = "cpu"\nepochs = 1\nadapt = false\n')
    # On the CPU the default is off (the model's threads share the cores); --place-readers turns it on.
    for flags, name, expected in (((), "default", None), (("--place-readers",), "on", True), (("--no-place-readers",), "off", False)):
        result = CliRunner().invoke(train, [str(config), *flags, "--name", name, "--no-progress"])
        assert result.exit_code == 0, result.output
        record = json.loads((tmp_path / "runs" / name / "run.json").read_text())
        assert record["config"]["data"]["place_readers"] is expected
        placement = record["reader_placement"]
        assert set(placement) == {"nice", "cpus", "threads_nice", "reason"}
        if expected:
            assert placement["nice"] > 0 or "not Linux" in placement["reason"]
        else:
            said = "--no-place-readers" if expected is False else "trains on the CPU"
            assert placement["nice"] == 0 and placement["cpus"] is None and said in placement["reason"]
    assert "--place-readers / --no-place-readers" in CliRunner().invoke(train, ["--help"]).output
