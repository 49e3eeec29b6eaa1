"""A crop box is checked against every image at pack time (every store); verify counts every bad row and names the fix;
a run with no readable batch says so."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from stoker.cli.main import main
from stoker.errors import DecodeError
from stoker.packer import pack
from stoker.shards import verify

from .conftest import write_png


def _folder(root: Path, n: int = 8) -> Path:
    for i in range(n):
        write_png(root / str(i % 2) / f"{i:02d}.png", seed=i, size=(12, 10))
    return root


def _garbage(root: Path, n: int) -> Path:
    for i in range(n):
        path = root / str(i % 2) / f"{i:02d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(300))  # no image header: packs (encoded), never decodes
    return root


@pytest.mark.parametrize("store", ["encoded", "pixels"])
def test_a_crop_box_that_fits_no_image_is_refused_at_pack_time(tmp_path: Path, store: str) -> None:
    # Before: the encoded pack exited 0 and every row of the result was unreadable.
    src = _folder(tmp_path / "src")
    with pytest.raises(DecodeError, match=r"00\.png: crop box \(top=0, left=0, height=1000, width=1000\) does not fit "
                                          r"in the 12x10 image; fix the crop box of this source \(--crop, crop=\)"):
        pack(src, tmp_path / "out", store=store, size=(8, 8), crop=(0, 0, 1000, 1000), workers=0, progress=False,
             shuffle=False)
    pack(src, tmp_path / "ok", store=store, size=(8, 8), crop=(1, 1, 10, 8), workers=0, progress=False)
    assert verify(tmp_path / "ok", workers=0).ok


def test_the_cli_pack_refuses_the_box_in_one_line(tmp_path: Path) -> None:
    src = _folder(tmp_path / "src")
    result = CliRunner().invoke(main, ["pack", str(src), str(tmp_path / "out"), "--crop", "0,0,1000,1000",
                                       "--workers", "0"])
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output and "does not fit in the 12x10 image" in result.output


def test_verify_counts_every_bad_row_and_says_the_same_pack_would_write_them_again(tmp_path: Path) -> None:
    # Before: at most 11 problems per shard, and the advice to re-run the same pack (which rebuilds the same rows).
    src = _garbage(tmp_path / "src", 30)
    pack(src, tmp_path / "set", size=(8, 8), workers=0, progress=False)
    report = verify(tmp_path / "set", workers=0)
    assert len(report.faults) == 30 and all(f.row is not None and f.decodes_badly for f in report.faults)
    summary = report.summary()
    assert "30 problem(s)" in summary and "(30 bad row(s) in 1 shard(s))" in summary
    assert "30 row(s) do not decode as training reads them, and the same `stoker pack` command would write them " \
           "again" in summary
    assert "Delete the damaged shards" not in summary


def test_a_run_with_no_readable_batch_says_so_not_non_finite_loss(tmp_path: Path) -> None:
    src = _garbage(tmp_path / "src", 12)
    pack(src, tmp_path / "set", size=(8, 8), workers=0, progress=False)
    result = CliRunner().invoke(main, ["train", "--data", str(tmp_path / "set"), "--on-error", "skip", "--epochs", "1",
                                       "--batch-size", "4", "--workers", "0", "--log-dir", str(tmp_path / "runs")])
    assert result.exit_code != 0
    assert "non-finite loss" not in result.output, result.output
    assert "(no readable batch)" in result.output
    assert "no readable batch: all 10 sample(s) the train loader read were skipped as bad" in result.output
