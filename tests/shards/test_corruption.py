"""Damaged shard sets: each kind of damage gives the right error, and fuzzed bytes only ever give StokerError."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stoker.cli.verify import verify as verify_command
from stoker.errors import ShardError, StokerError
from stoker.shards import Manifest, ShardDataset, ShardStream, summarize, verify

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _read_everything(root: Path) -> None:
    """Open every split and read every sample, map-style and streaming, one by one and batched."""
    manifest = Manifest.load(root)
    for split in manifest.splits:
        ds = ShardDataset(root, split)
        ds.__getitems__(np.arange(len(ds)))
        for i in range(len(ds)):
            ds[i]
            ds.trace(i)
        list(ShardStream(root, split, shuffle_buffer=3))


@pytest.fixture()
def damaged(packed: Callable[..., Path], copy_of: Callable[[Path, Path], Path], tmp_path: Path) -> Path:
    return copy_of(packed(store="encoded", shard_samples=10), tmp_path / "copy")


def _verify_cli(root: Path) -> tuple[int, str]:
    result = CliRunner().invoke(verify_command, [str(root), "--quiet", "--workers", "0"])
    return result.exit_code, result.output


def test_a_good_set_verifies(damaged: Path) -> None:
    assert verify(damaged, workers=0).ok
    code, output = _verify_cli(damaged)
    assert code == 0 and "ok: 4 shards, 40 samples" in output


def test_truncated_shard(damaged: Path) -> None:
    path = damaged / "train-00001.arrow"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ShardError, match=r"shard train-00001\.arrow: .*truncated or changed.*stoker verify"):
        ShardDataset(damaged)
    report = verify(damaged, workers=0)
    assert not report.ok and report.first_fault is not None and report.first_fault.shard == "train-00001.arrow"
    code, output = _verify_cli(damaged)
    assert code == 1 and "train-00001.arrow" in output


def test_flipped_byte_names_shard_and_row(damaged: Path) -> None:
    path = damaged / "train-00002.arrow"
    row4 = ShardDataset(damaged).shards.file(2).encoded(4).tobytes()
    data = bytearray(path.read_bytes())
    data[data.find(row4) + len(row4) // 2] ^= 0x55  # a byte in the middle of row 4's image
    path.write_bytes(bytes(data))
    ShardDataset(damaged)  # the size is right: opening is cheap and does not notice
    report = verify(damaged, workers=0)
    assert not report.ok
    assert report.faults[0].shard == "train-00002.arrow" and "SHA-256" in report.faults[0].problem
    assert report.first_bad_row is not None and report.first_bad_row.row == 4
    code, output = _verify_cli(damaged)
    assert code == 1 and "train-00002.arrow row 4" in output


def test_missing_shard(damaged: Path) -> None:
    (damaged / "train-00003.arrow").unlink()
    with pytest.raises(ShardError, match=r"train-00003\.arrow: file is missing"):
        ShardDataset(damaged)
    assert _verify_cli(damaged)[0] == 1


def test_edited_manifest(damaged: Path) -> None:
    text = (damaged / "manifest.json").read_text()
    (damaged / "manifest.json").write_text(text.replace('"samples": 10', '"samples": 11', 1))
    with pytest.raises(ShardError, match="manifest.json: checksum mismatch.*re-pack"):
        ShardDataset(damaged)
    code, output = _verify_cli(damaged)
    assert code == 1 and "checksum mismatch" in output


def test_missing_manifest(damaged: Path) -> None:
    (damaged / "manifest.json").unlink()
    with pytest.raises(ShardError, match="not a shard set"):
        ShardDataset(damaged)
    assert _verify_cli(damaged)[0] == 1


def test_manifest_of_a_newer_format(damaged: Path) -> None:
    obj = json.loads((damaged / "manifest.json").read_text())
    obj["version"] = 99
    (damaged / "manifest.json").write_text(json.dumps(obj))
    with pytest.raises(ShardError, match="newer than this stoker reads"):
        ShardDataset(damaged)


def _mutate(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    out = bytearray(data)
    for position, value in edits:
        out[position % len(out)] = value
    if cut is not None:
        out = out[: cut % (len(out) + 1)]
    return bytes(out)


@FUZZ
@given(
    edits=st.lists(st.tuples(st.integers(min_value=0, max_value=10**6), st.integers(0, 255)), max_size=6),
    cut=st.none() | st.integers(min_value=0, max_value=10**6),
)
def test_fuzzed_manifest_bytes_only_raise_shard_error(
    packed: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory, edits: list[tuple[int, int]], cut: int | None
) -> None:
    original = (packed(store="encoded", shard_samples=10) / "manifest.json").read_bytes()
    mutated = _mutate(original, edits, cut)
    if mutated == original:
        return
    try:
        manifest = Manifest.from_bytes(mutated)
    except ShardError:
        return
    # Read through only when JSON sees no change (a byte of whitespace between tokens made another whitespace).
    assert manifest == Manifest.from_bytes(original)
    assert json.loads(mutated) == json.loads(original)


def _json_values() -> st.SearchStrategy[object]:
    scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
               | st.text(max_size=8))
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)


def _restamped(root: Path, obj: dict[str, object], out: Path) -> Path:
    """``out``: the shards of ``root`` (linked) under ``obj`` as the manifest, with a right checksum for it."""
    from stoker.shards.format.manifest import _checksum

    obj = {k: v for k, v in obj.items() if k != "checksum"}
    obj["checksum"] = _checksum(obj)
    for shard in root.glob("*.arrow"):
        (out / shard.name).symlink_to(shard)
    (out / "manifest.json").write_text(json.dumps(obj))
    return out


def test_a_restamped_manifest_left_as_it_was_reads_through(packed: Callable[..., Path], tmp_path: Path) -> None:
    root = packed(store="pixels", size=(4, 4), shard_samples=10)
    out = _restamped(root, json.loads((root / "manifest.json").read_text()), tmp_path)
    _read_everything(out)
    assert summarize(out).splits


@FUZZ
@given(data=st.data())
def test_fuzzed_manifest_fields_with_a_valid_checksum_only_raise_stoker_error(
    packed: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """A manifest re-stamped with a right checksum, one field replaced at random: opening the set, reading
    every sample (both ways) and summarizing it either work, or stop with a StokerError that says where
    (the manifest, or a shard and its row). Never another exception, never for an unchanged manifest, and
    never at the checksum: the checks behind it are what this fuzzes."""
    root = packed(store="pixels", size=(4, 4), shard_samples=10)
    original = json.loads((root / "manifest.json").read_text())
    obj = json.loads((root / "manifest.json").read_text())
    parent: dict[str, object] | list[object] = obj
    key: object = data.draw(st.sampled_from(sorted(k for k in obj if k != "checksum")))
    while isinstance(child := parent[key], (dict, list)) and child and data.draw(st.booleans()):  # type: ignore[index]
        parent, key = child, data.draw(st.sampled_from(sorted(child) if isinstance(child, dict) else list(range(len(child)))))
    parent[key] = data.draw(_json_values())  # type: ignore[index]
    out = _restamped(root, obj, tmp_path_factory.mktemp("fuzzm"))
    try:
        _read_everything(out)
        summarize(out)
    except StokerError as exc:
        # compared as JSON text: True == 1 in Python, but a version of true is not the version 1
        assert json.dumps(obj, sort_keys=True) != json.dumps(original, sort_keys=True), f"the unchanged manifest was refused: {exc}"
        assert "checksum" not in str(exc), f"the re-stamped checksum was refused, so no field check ran: {exc}"
        assert "manifest.json" in str(exc) or ".arrow" in str(exc), f"the error says neither manifest nor shard: {exc}"


@FUZZ
@given(
    store=st.sampled_from(["encoded", "pixels"]),
    edits=st.lists(st.tuples(st.integers(min_value=0, max_value=10**7), st.integers(0, 255)), min_size=1, max_size=8),
    cut=st.none() | st.integers(min_value=0, max_value=10**7),
)
def test_fuzzed_shard_bytes_only_raise_stoker_error(
    packed: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory, store: str, edits: list[tuple[int, int]], cut: int | None
) -> None:
    """Mutated shards (sizes kept in the manifest, so the checks go past the size test) never crash a reader."""
    root = packed(store=store, size=(4, 4), shard_samples=40)
    shard = root / "train-00000.arrow"
    mutated = _mutate(shard.read_bytes(), edits, cut)
    out = tmp_path_factory.mktemp("fuzzs")
    (out / "train-00000.arrow").write_bytes(mutated)
    manifest = Manifest.load(root)
    info = manifest.shards[0]
    fixed = type(info)(info.name, info.split, info.samples, len(mutated), info.sha256)
    Manifest(manifest.store, manifest.image_size, manifest.classes, manifest.sources, (fixed,), manifest.made_by).save(out)
    try:
        _read_everything(out)
    except StokerError:
        pass
    report = verify(out, workers=0)
    assert report.ok == (mutated == shard.read_bytes())
