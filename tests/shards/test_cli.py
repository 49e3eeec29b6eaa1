"""``stoker pack``, ``stoker verify`` and ``stoker inspect`` (the click commands, run in-process)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from PIL import Image

from stoker.cli.inspect import inspect
from stoker.cli.pack import pack, parse_bytes, parse_size
from stoker.cli.verify import verify
from stoker.errors import StokerError
from stoker.shards import Manifest


def _run(command: click.Command, args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(command, args, catch_exceptions=True)
    if isinstance(result.exception, StokerError):  # the main group turns these into exit status 1
        return 1, f"error: {result.exception}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def test_pack_verify_inspect(digi: Path, celeb: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, output = _run(pack, [str(celeb), str(digi), str(out), "--store", "pixels", "--size", "8x6",
                               "--split", "valid=0.25", "--shard-samples", "10", "--workers", "0", "--quiet",
                               "--crop", "1,1,10,8"])
    assert code == 0, output
    assert "packed 64 samples (train 48, valid 16) into" in output and "pixels 8x6" in output
    manifest = Manifest.load(out)
    assert manifest.image_size == (8, 6) and manifest.sources[0].crop == (1, 1, 10, 8)

    code, output = _run(verify, [str(out), "--quiet", "--workers", "0"])
    assert code == 0 and "ok: 7 shards, 64 samples" in output

    grid = tmp_path / "grid.png"
    code, output = _run(inspect, [str(out), "--grid", str(grid), "--count", "5"])
    assert code == 0, output
    assert "pixels, 8x6 uint8 RGB CHW" in output and "train" in output and "valid" in output
    with Image.open(grid) as image:
        assert image.size[0] == 8 * 112

    code, output = _run(pack, [str(digi), str(out), "--quiet"])
    assert code == 1 and "--overwrite" in output


def test_pack_needs_a_source_and_an_output() -> None:
    code, output = _run(pack, ["only-one"])
    assert code == 2 and "SRC" in output


def test_pack_labels_option_picks_the_label_file(celeb: Path, tmp_path: Path) -> None:
    (celeb.parent / "celeb-notes").mkdir(exist_ok=True)
    code, output = _run(pack, [str(celeb), str(tmp_path / "o"), "--labels", str(celeb / "identity_CelebA.txt"), "--quiet",
                               "--workers", "0"])
    assert code == 0, output


def test_option_parsers() -> None:
    assert parse_bytes("256MB") == 256 * 2**20 and parse_bytes("1g") == 2**30 and parse_bytes("4096") == 4096
    assert parse_size("112x96") == (112, 96) and parse_size("64") == (64, 64)
    for bad in ("lots", "12 parsecs", "0"):
        with pytest.raises(click.BadParameter):
            parse_bytes(bad)
    with pytest.raises(click.BadParameter):
        parse_size("tall")


def test_inspect_of_a_folder_that_is_not_a_shard_set(tmp_path: Path, digi: Path) -> None:
    code, output = _run(inspect, [str(tmp_path)])
    assert code == 1 and "no class folders" in output
    code, output = _run(inspect, [str(digi)])  # any layout: what it is opened as, splits and class counts
    assert code == 0 and "(class_folders): 40 train samples, 3 classes" in output and "0: 14" in output


def test_repack_from_shards(packed: Callable[..., Path], tmp_path: Path) -> None:
    code, output = _run(pack, [str(packed(store="encoded", shard_samples=7)), str(tmp_path / "o"), "--store", "pixels",
                               "--quiet", "--workers", "0"])
    assert code == 0 and "pixels 12x10" in output


def test_pack_with_named_splits_keeps_one_label_mapping(digi: Path, tmp_path: Path) -> None:
    import shutil

    shutil.copytree(digi / "2", tmp_path / "val" / "2")  # validation holds only class 2
    out = tmp_path / "o"
    code, output = _run(pack, [f"train={digi}", f"valid={tmp_path / 'val'}", str(out), "--quiet", "--workers", "0"])
    assert code == 0, output
    from stoker.shards import ShardDataset

    valid = ShardDataset(out, "valid")
    assert valid.classes == ("0", "1", "2") and set(valid.labels.tolist()) == {2}
    assert len(ShardDataset(out, "train")) == 40
    code, output = _run(pack, [f"train={digi}", str(tmp_path / "val"), str(out)])
    assert code != 0 and "name every SRC" in output


def test_pack_a_split_folder_root_keeps_its_splits(digi: Path, tmp_path: Path) -> None:
    """``stoker pack ROOT OUT`` on train/ + val/ + test/ (ImageFolder style): three splits, one label mapping."""
    import shutil

    root = tmp_path / "tree"
    shutil.copytree(digi, root / "train")
    shutil.copytree(digi / "2", root / "val" / "2")  # validation holds only class 2
    shutil.copytree(digi / "0", root / "test" / "0")
    out = tmp_path / "o"
    code, output = _run(pack, [str(root), str(out), "--quiet", "--workers", "0"])
    assert code == 0, output
    from stoker.shards import Manifest, ShardDataset

    manifest = Manifest.load(out)
    assert {s.name for s in manifest.sources} == {"tree/train", "tree/val", "tree/test"}
    assert len(ShardDataset(out, "train")) == 40
    assert set(ShardDataset(out, "valid").labels.tolist()) == {2}
    assert set(ShardDataset(out, "test").labels.tolist()) == {0} and ShardDataset(out, "test").classes == ("0", "1", "2")
