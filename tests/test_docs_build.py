"""The API reference and the user docs build offline, warnings as errors (`mkdocs build --strict`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import stoker

ROOT = Path(__file__).resolve().parents[1]


def test_docs_build_strict(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    errors = (tmp_path / "site" / "api" / "errors" / "index.html").read_text(encoding="utf-8")
    for name in ("StokerError", "ShardError", "NetworkError", "├── ConfigError"):
        assert name in errors  # the exceptions page draws the tree and documents every class


def test_public_face_page_names_every_public_name() -> None:
    page = (ROOT / "docs" / "api" / "stoker.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| \[`(\w+)`\]", page, flags=re.M))
    assert listed == set(stoker.__all__) - {"__version__"}
