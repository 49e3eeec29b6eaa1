"""`stoker demo` end to end on a small generated set, and the top-level help."""

from __future__ import annotations

import json
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
    # the benchmark leaves what `stoker bench` leaves, and the closing summary names each file
    summary = out[out.index("Everything is under"):]
    for name in ("bench.md", "bench.json", "bench.png"):
        path = root / "bench" / name
        assert path.is_file() and path.stat().st_size > 0, name
        assert str(path) in summary, name
    assert "| workers |" in (root / "bench" / "bench.md").read_text()
    assert json.loads((root / "bench" / "bench.json").read_text())["runs"]


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


def test_demo_says_what_it_does_before_the_slow_imports(tmp_path: Path) -> None:
    # Importing torch took over ten seconds on a busy machine: the first line must come before it.
    import subprocess
    import sys

    code = f"""
import os, sys
class _FirstTorchImport:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            print("<torch import starts>", flush=True)
            os._exit(0)
        return None
sys.meta_path.insert(0, _FirstTorchImport())
from stoker.cli.main import main
main(["demo", "--dir", {str(tmp_path / 'demo')!r}, "--n", "20"])
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = done.stdout.splitlines()
    assert "<torch import starts>" in lines, done.stdout + done.stderr
    first = lines.index("<torch import starts>")
    assert first >= 1 and lines[0].startswith("stoker demo: a guided tour under") and "loading torch" in lines[0]


def test_the_demo_explains_a_first_epoch_whose_valid_accuracy_is_far_above_train() -> None:
    from stoker.demo import accuracy_gap_note

    note = accuracy_gap_note(0.69, 0.99)
    assert note is not None and "valid accuracy 0.99 against train 0.69" in note and "while the model learns" in note
    assert accuracy_gap_note(0.80, 0.85) is None and accuracy_gap_note(0.8, float("nan")) is None
