"""load_image's bad-file policy: raise by default, or skip, count and report."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stoker import DecodeError, Pipe, make_loader
from stoker.loading.skips import Skipped


def _folder(tmp_path: Path) -> Path:
    for i in range(4):
        Image.fromarray(np.full((6, 5, 3), i, dtype=np.uint8)).save(tmp_path / f"{i}.png")
    (tmp_path / "2.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    return tmp_path


def test_bad_file_raises_by_default(tmp_path: Path) -> None:
    pipe = Pipe.list_files(_folder(tmp_path), masks="*.png").load_image()
    with pytest.raises(DecodeError, match="2.png"):
        list(pipe)


def test_skip_leaves_a_marker_and_reports(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pipe = Pipe.list_files(_folder(tmp_path), masks="*.png").load_image(keep_path=True, on_error="skip").map(lambda x: x)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        items = list(pipe)
    markers = [item for item in items if isinstance(item, Skipped)]
    assert [Path(p).name for p, _ in (i for i in items if not isinstance(i, Skipped))] == ["0.png", "1.png", "3.png"]
    assert len(markers) == 1 and markers[0].key.endswith("2.png")  # map passed the marker on
    assert "skipped 1 bad file(s)" in caplog.text and "2.png" in caplog.text


@pytest.mark.parametrize("workers", [0, 2])
def test_skips_of_a_pipe_are_counted_by_the_loader(tmp_path: Path, workers: int, caplog: pytest.LogCaptureFixture) -> None:
    pipe = Pipe.list_files(_folder(tmp_path), masks="*.png").shard().load_image(keep_path=False, on_error="skip")
    loader = make_loader(pipe, batch_size=2, num_workers=workers, device="cpu")
    with caplog.at_level(logging.WARNING, logger="stoker"):
        images = [image for batch in loader for image in batch]
    assert len(images) == 3
    assert len(loader.skipped) == 1 and loader.skipped[0].key.endswith("2.png")
    assert "skipped 1 bad sample(s) in epoch 1" in caplog.text  # epochs counted from 1, as fit counts them
