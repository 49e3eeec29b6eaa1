"""Golden bytes: the manifest format and the shard schema are pinned, byte for byte."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from stoker.errors import ConfigError, ShardError
from stoker.shards import Manifest, ShardInfo, ShardWriter
from stoker.shards.format.schema import FORMAT_NAME, FORMAT_VERSION, is_shard_name, shard_name, shard_schema
from stoker.sources import Source

GOLDEN_MANIFEST = """\
{
  "format": "stoker-shards",
  "version": 1,
  "store": "pixels",
  "image_size": [2, 3],
  "schema": [
    {"name": "key", "type": "string"},
    {"name": "label", "type": "int64"},
    {"name": "source", "type": "string"},
    {"name": "file", "type": "string"},
    {"name": "crc32", "type": "uint32"},
    {"name": "image", "type": "fixed_size_binary[18]"}
  ],
  "classes": ["cat", "dog"],
  "sources": [
    {"name": "pets", "root": "/data/pets", "crop": [1, 2, 2, 3]}
  ],
  "splits": {"train": {"samples": 3, "shards": 1}, "valid": {"samples": 1, "shards": 1}},
  "shards": [
    {"name": "train-00000.arrow", "split": "train", "samples": 3, "bytes": 1234, "sha256": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"},
    {"name": "valid-00000.arrow", "split": "valid", "samples": 1, "bytes": 567, "sha256": "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"}
  ],
  "made_by": {"tool": "stoker", "stoker_version": "0.1.0", "source": ["/data/pets"], "seed": 0, "valid": 0.25, "shard_samples": 3, "shard_bytes": 1048576, "plan": "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"},
  "checksum": "sha256:d92dc96242e444e6c76c79d5737c664b36dc2369285f4b0474cfe8baa711586b"
}
"""


def golden() -> Manifest:
    return Manifest(
        store="pixels",
        image_size=(2, 3),
        classes=("cat", "dog"),
        sources=(Source("pets", "/data/pets", (1, 2, 2, 3)),),
        shards=(
            ShardInfo("train-00000.arrow", "train", 3, 1234, "a" * 64),
            ShardInfo("valid-00000.arrow", "valid", 1, 567, "b" * 64),
        ),
        made_by={
            "tool": "stoker",
            "stoker_version": "0.1.0",
            "source": ["/data/pets"],
            "seed": 0,
            "valid": 0.25,
            "shard_samples": 3,
            "shard_bytes": 1048576,
            "plan": "c" * 64,
        },
    )


def test_manifest_bytes_are_pinned() -> None:
    assert golden().to_bytes().decode() == GOLDEN_MANIFEST


def test_golden_manifest_loads_back_equal(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(GOLDEN_MANIFEST)
    loaded = Manifest.load(tmp_path)
    assert loaded == golden()
    assert loaded.split_samples("train") == 3 and loaded.samples == 4 and loaded.bytes == 1234 + 567
    assert list(loaded.splits) == ["train", "valid"]


def test_whitespace_does_not_matter_but_content_does() -> None:
    reformatted = GOLDEN_MANIFEST.replace("\n    ", "\n").replace(", ", ",")
    assert Manifest.from_bytes(reformatted.encode()) == golden()
    with pytest.raises(ShardError, match="checksum mismatch"):
        Manifest.from_bytes(GOLDEN_MANIFEST.replace('"cat"', '"cow"').encode())


def test_shard_schema_is_pinned() -> None:
    pixels = shard_schema("pixels", (2, 3))
    assert [(f.name, str(f.type), f.nullable) for f in pixels] == [
        ("key", "string", False),
        ("label", "int64", False),
        ("source", "string", False),
        ("file", "string", False),
        ("crc32", "uint32", False),
        ("image", "fixed_size_binary[18]", False),
    ]
    assert pixels.metadata == {
        b"stoker.format": b"stoker-shards/1",
        b"stoker.store": b"pixels",
        b"stoker.image_size": b"2x3",
        b"stoker.pixel_layout": b"uint8 RGB CHW",
    }
    encoded = shard_schema("encoded", None)
    assert str(encoded.field("image").type) == "binary"
    assert encoded.metadata[b"stoker.image_size"] == b""
    assert (FORMAT_NAME, FORMAT_VERSION) == ("stoker-shards", 1)


def test_a_shard_is_a_plain_arrow_file_anyone_can_read(tmp_path: Path) -> None:
    with ShardWriter(tmp_path / "train-00000.arrow", "train", "pixels", (2, 3)) as writer:
        writer.write("a.png", 1, "pets", "dog/a.png", bytes(range(18)))
        writer.write("b.png", 0, "pets", "cat/b.png", bytes(range(18, 36)))
    table = pa.ipc.open_file(pa.memory_map(str(tmp_path / "train-00000.arrow"))).read_all()
    assert table.column("key").to_pylist() == ["a.png", "b.png"]
    assert table.column("label").to_pylist() == [1, 0]
    assert table.column("file").to_pylist() == ["dog/a.png", "cat/b.png"]
    assert table.column("image").to_pylist() == [bytes(range(18)), bytes(range(18, 36))]
    assert writer.info is not None and writer.info.samples == 2
    assert writer.info.bytes == (tmp_path / "train-00000.arrow").stat().st_size


def test_names() -> None:
    assert shard_name("train", 3) == "train-00003.arrow"
    assert is_shard_name("valid-00012.arrow")
    for bad in ("../train-00000.arrow", "/etc/passwd", "train-1.arrow", "train-00000.arrow/x", ".x-00000.arrow"):
        assert not is_shard_name(bad)
    with pytest.raises(ConfigError):
        shard_name("../up", 0)
    with pytest.raises(ConfigError):
        shard_schema("pickle", None)
    with pytest.raises(ConfigError):
        shard_schema("pixels", None)


def test_an_interrupted_json_write_keeps_the_old_file_and_leaves_no_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write cancelled between the temporary file and the rename (a Ray task interrupted) cleans up after itself."""
    import os

    from stoker.shards.format.manifest import write_json_atomic

    path = write_json_atomic(tmp_path / "record.json", b'{"old": 1}')

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_json_atomic(path, b'{"new": 2}')
    assert path.read_bytes() == b'{"old": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]
