"""`stoker demo` end to end on a small generated set, and the top-level help."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from stoker.cli.main import main


def test_help_lists_every_command() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for command in ("make-data", "demo", "pack", "verify", "inspect", "train", "compare", "bench", "tune"):
        assert command in result.output


def test_demo_help() -> None:
    result = CliRunner().invoke(main, ["demo", "--help"])
    assert result.exit_code == 0 and "--dir" in result.output


def test_demo_runs_every_step(tmp_path: Path) -> None:
    root = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", "--dir", str(root), "--n", "120", "--classes", "4"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "verify: ok" in out
    assert "best valid accuracy" in out
    assert "| workers | files | pipe | shards-encoded | shards-pixels |" in out
    runs = [p for p in (root / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1
    for name in ("metrics.csv", "run.json", "best.pt", "last.pt", "curves.png"):
        assert (runs[0] / name).is_file(), name
    assert (root / "packed" / "pixels" / "manifest.json").is_file()


def test_stoker_errors_become_one_line_and_exit_1(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["verify", str(tmp_path / "nothing-here")])
    assert result.exit_code != 0
    assert "Traceback" not in result.output


def test_make_data_kinds_match_the_generator() -> None:
    from stoker.cli.make_data import _KINDS
    from stoker.sources.synthetic import KINDS

    assert _KINDS == KINDS


def test_help_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys; from stoker.cli.main import main; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr
