"""load_image's bad-file policy: raise by default, or skip, count and report."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stoker import DecodeError, Pipe


def _folder(tmp_path: Path) -> Path:
    for i in range(4):
        Image.fromarray(np.full((6, 5, 3), i, dtype=np.uint8)).save(tmp_path / f"{i}.png")
    (tmp_path / "2.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    return tmp_path


def test_bad_file_raises_by_default(tmp_path: Path) -> None:
    pipe = Pipe.list_files(_folder(tmp_path), masks="*.png").load_image()
    with pytest.raises(DecodeError, match="2.png"):
        list(pipe)


def test_skip_drops_counts_and_reports(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pipe = Pipe.list_files(_folder(tmp_path), masks="*.png").load_image(keep_path=True, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="stoker"):
        kept = [Path(p).name for p, _ in pipe]
    assert kept == ["0.png", "1.png", "3.png"]
    assert "skipped 1 bad file(s)" in caplog.text and "2.png" in caplog.text
