"""docs/guides/lightning.md: its example runs as written (Lightning, stoker's loaders, the thread choice)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "lightning.md"


def _example() -> str:
    [code] = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    return code


def test_the_guide_has_one_example_that_uses_the_thread_choice() -> None:
    code = _example()
    assert "ComputeThreads(" in code and "trainer.fit(" in code and "make_loader(" in code


def test_the_lightning_example_trains_one_epoch_with_stoker_trains_threads(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    done = subprocess.run([sys.executable, "-c", _example()], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("torch threads ") and "left to the train loader's process workers" in lines[0], lines
    accuracy = float(lines[-1].removeprefix("valid accuracy "))
    assert 0.0 <= accuracy <= 1.0
