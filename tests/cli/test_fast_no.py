"""Help, argument errors and mistyped paths are answered before anything heavy is imported.

Each command line runs in a fresh interpreter (the test process has torch loaded already),
and what is checked is which modules it imported, not how long it took: torch,
torchvision, pyarrow, matplotlib and tensorboard are each seconds on a cold start.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "torchvision", "pyarrow", "matplotlib", "tensorboard")

# Runs every command line in one interpreter, in order, and says after each what heavy modules had been imported.
_RUNNER = """
import json, sys
from click.testing import CliRunner
from stoker.cli.main import main
heavy = {heavy!r}
out = []
for args in json.loads(sys.argv[1]):
    result = CliRunner().invoke(main, args)
    out.append({{"args": args, "code": result.exit_code, "output": result.output,
                 "heavy": sorted(m for m in heavy if m in sys.modules)}})
print(json.dumps(out))
"""


def _run(lines: list[list[str]], cwd: Path) -> list[dict[str, object]]:
    done = subprocess.run([sys.executable, "-c", _RUNNER.format(heavy=HEAVY), json.dumps(lines)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return list(json.loads(done.stdout))


def test_help_of_every_command_imports_nothing_heavy(tmp_path: Path) -> None:
    from stoker.cli.main import main

    lines = [["--help"]] + [[name, "--help"] for name in main.commands]
    for result in _run(lines, tmp_path):
        assert result["code"] == 0, result
        assert result["heavy"] == [], f"stoker {' '.join(result['args'])} imported {result['heavy']}"  # type: ignore[arg-type]


def test_a_mistyped_path_is_answered_before_torch_with_the_nearest_name(tmp_path: Path) -> None:
    for split in ("train", "test"):
        (tmp_path / "fmnist" / split).mkdir(parents=True)
    lines = [
        ["train", "--data", "fmnsit", "--log-dir", "runs"],
        ["train", "--data", "fmnist/trian", "--log-dir", "runs"],
        ["train", "--data", "fmnist", "--valid", "fmnist/tset", "--log-dir", "runs"],
        ["pack", "fmnsit", "out"],
        ["bench", "fmnsit"],
        ["tune", "fmnsit"],
        ["inspect", "fmnsit"],
        ["verify", "fmnsit"],
    ]
    for result in _run(lines, tmp_path):
        args = " ".join(result["args"])  # type: ignore[arg-type]
        assert result["code"] == 1 and "not found" in str(result["output"]), (args, result["output"])
        assert "did you mean fmnist" in str(result["output"]), args
        assert result["heavy"] == [], f"stoker {args} imported {result['heavy']} before saying no"
    assert "did you mean fmnist/train?" in str(_run([lines[1]], tmp_path)[0]["output"])
    assert "--valid fmnist/tset: not found" in str(_run([lines[2]], tmp_path)[0]["output"])


def test_a_share_given_to_valid_names_valid_share(tmp_path: Path) -> None:
    (tmp_path / "fmnist").mkdir()
    [result] = _run([["train", "--data", "fmnist", "--valid", "0.2", "--log-dir", "runs"]], tmp_path)
    assert result["code"] == 1 and "--valid-share 0.2" in str(result["output"]), result["output"]
    assert result["heavy"] == []


def test_a_bad_flag_value_is_answered_before_torch(tmp_path: Path) -> None:
    (tmp_path / "fmnist").mkdir()
    lines = [["train", "--data", "fmnist", "--epochs", "zero"], ["train", "--data", "fmnist", "--no-such-flag"],
             ["train", "--data", "fmnist", "--set", "optim.nope=1"]]
    for result in _run(lines, tmp_path):
        assert result["code"] in (1, 2), result
        assert result["heavy"] == [], f"stoker {' '.join(result['args'])} imported {result['heavy']}"  # type: ignore[arg-type]
