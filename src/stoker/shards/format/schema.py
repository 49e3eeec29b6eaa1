"""The shard format: file names, the Arrow schema of a shard, and its golden constants.

A shard set is a folder::

    OUT/manifest.json          written last: what the set holds (see :mod:`stoker.shards.format.manifest`)
    OUT/train-00000.arrow      Arrow IPC files, one split per file name prefix
    OUT/valid-00000.arrow

Every shard has the same six columns, none nullable: ``key`` (string), ``label`` (int64),
``source`` and ``file`` (string), ``crc32`` (uint32, of the image bytes) and ``image``
(``binary`` for the ``encoded`` store, ``fixed_size_binary[C*H*W]`` for ``pixels``).
:data:`COLUMNS` is the one table of them that the schema, the writer, the reader and the
row sources read; the format spec (``docs/format.md``) gives each as a rule.

The files open with pyarrow (``pa.ipc.open_file``), pandas, polars or DuckDB. Nothing in a
shard or manifest is pickled: opening a shard set made by a stranger runs no code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

from stoker.errors import ConfigError

__all__ = [
    "CHANNELS",
    "COLUMNS",
    "COLUMN_INDEX",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "MAX_SIDE",
    "PLAN_NAME",
    "RECORD_BATCH_BYTES",
    "ROW_COLUMNS",
    "SHARD_SUFFIX",
    "STORES",
    "TMP_SUFFIX",
    "Column",
    "Store",
    "check_split_name",
    "image_row_bytes",
    "is_shard_name",
    "shard_name",
    "shard_schema",
]

FORMAT_NAME = "stoker-shards"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
PLAN_NAME = "pack-plan.json"  # present only while a pack is unfinished
SHARD_SUFFIX = ".arrow"
TMP_SUFFIX = ".tmp"  # a shard being written; renamed to its final name when complete
CHANNELS = 3  # pixels are RGB, unless a set is packed with channels=1 (gray)
PIXEL_CHANNELS: tuple[int, ...] = (1, 3)
MAX_SIDE = 16384  # largest image height or width a pixels shard may declare

# Rows are written in Arrow record batches of about this many bytes, so a writer never
# holds more than this in memory and a reader's per-batch lookup table stays short.
RECORD_BATCH_BYTES = 64 * 2**20

Store = Literal["encoded", "pixels"]
STORES: tuple[str, ...] = ("encoded", "pixels")



@dataclass(frozen=True)
class Column:
    """One column of every shard.

    Attributes:
        name: the column's name in the Arrow schema.
        type: its Arrow type; ``None`` for ``image``, whose type the store sets.
        rows: the array of a row source (:class:`~stoker.shards.pack.rows.RowSource`) that
            it is written from, one value per row; ``None`` when the writer makes it
            (``crc32``, from the image) or it is the image.
        doc: what it holds.
    """

    name: str
    type: pa.DataType | None
    rows: str | None
    doc: str


# The columns of every shard, in schema order. Adding one here adds it to the schema,
# the writer's rows (from the row sources' array ``rows``), ShardRows and the reader's
# positions; FileRows says where its values come from. The order is the on-disk format.
COLUMNS: tuple[Column, ...] = (
    Column("key", pa.string(), "keys", "the sample's key in its source"),
    Column("label", pa.int64(), "labels", "the class (``classes[label]``)"),
    Column("source", pa.string(), "source_names", "the source name (see the manifest)"),
    Column("file", pa.string(), "files", "the file, relative to the source root"),
    Column("crc32", pa.uint32(), None, "CRC-32 of the ``image`` bytes, so that ``stoker verify`` can name a bad row"),
    Column("image", None, None, "the file's original bytes (``encoded``) or decoded uint8 RGB CHW pixels (``pixels``)"),
)
COLUMN_INDEX: dict[str, int] = {column.name: i for i, column in enumerate(COLUMNS)}  # name -> position
ROW_COLUMNS: tuple[Column, ...] = tuple(column for column in COLUMNS if column.rows is not None)  # given per row

_SPLIT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]{0,63}")
_SHARD_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]{0,63}-[0-9]{5,9}\.arrow")


def check_split_name(split: str) -> str:
    """Return ``split`` if it can name a split (letters, digits, ``_``), else raise ConfigError."""
    if not isinstance(split, str) or not _SPLIT_RE.fullmatch(split):
        raise ConfigError(
            f"split name {split!r} is not allowed; use letters, digits and '_' (for example 'train', 'valid')"
        )
    return split


def shard_name(split: str, number: int) -> str:
    """The file name of shard ``number`` of ``split``: ``train-00000.arrow``."""
    return f"{check_split_name(split)}-{number:05d}{SHARD_SUFFIX}"


def is_shard_name(name: str) -> bool:
    """Whether ``name`` is a plain shard file name (no folders, no ``..``)."""
    return isinstance(name, str) and _SHARD_RE.fullmatch(name) is not None


def image_row_bytes(image_size: tuple[int, int], channels: int = CHANNELS) -> int:
    """Bytes of one decoded image of ``(height, width)`` with ``channels`` (3: RGB, 1: gray)."""
    height, width = image_size
    return channels * height * width


def check_channels(channels: object, store: str = "pixels") -> int:
    """``channels`` if a pixels shard set may store it (1 or 3), else a :class:`ConfigError`."""
    if channels not in PIXEL_CHANNELS or isinstance(channels, bool):
        raise ConfigError(f"channels must be 1 (gray) or 3 (RGB), got {channels!r}")
    if store != "pixels" and channels != CHANNELS:
        raise ConfigError("channels=1 applies to store='pixels'; encoded shards keep each file's own bytes")
    return int(channels)  # type: ignore[call-overload]


def shard_schema(store: str, image_size: tuple[int, int] | None, channels: int = CHANNELS) -> pa.Schema:
    """The Arrow schema of every shard of a set with this storage mode and image size.

    Args:
        store: ``"encoded"`` (original file bytes) or ``"pixels"`` (decoded uint8 CHW).
        image_size: ``(height, width)``; required for ``"pixels"``, optional for ``"encoded"``
            (where it is the size images are resized to when read).

    Raises:
        ConfigError: an unknown store, or a missing or impossible image size.
    """
    if store not in STORES:
        raise ConfigError(f"store must be one of {', '.join(STORES)}, got {store!r}")
    if image_size is not None:
        height, width = image_size
        if not (1 <= height <= MAX_SIDE and 1 <= width <= MAX_SIDE):
            raise ConfigError(f"image size {height}x{width} is out of range; each side must be 1..{MAX_SIDE}")
    if store == "pixels":
        if image_size is None:
            raise ConfigError("store='pixels' needs an image size (height, width)")
        image_type = pa.binary(image_row_bytes(image_size, check_channels(channels, store)))
    else:
        image_type = pa.binary()
    size_text = f"{image_size[0]}x{image_size[1]}" if image_size is not None else ""
    return pa.schema(
        [pa.field(c.name, image_type if c.type is None else c.type, nullable=False) for c in COLUMNS],
        metadata={
            "stoker.format": f"{FORMAT_NAME}/{FORMAT_VERSION}",
            "stoker.store": store,
            "stoker.image_size": size_text,
            "stoker.pixel_layout": ("uint8 RGB CHW" if channels == CHANNELS else "uint8 gray CHW (1 channel)")
            if store == "pixels" else "",
        },
    )
