"""The pack plan: which rows go to which shard, fixed before a byte is written.

Each split's rows are shuffled with a seeded permutation (:mod:`stoker.order`), then cut into shards of at most
``shard_samples`` rows and about ``shard_bytes`` bytes. Every shard's rows are known up
front, so shards are written independently (in any order, by any number of processes)
and the result depends only on the arguments. The plan's fingerprint (a SHA-256 of the
arguments, the sources and every shard's rows) is what lets an interrupted pack resume:
``pack-plan.json`` records it while the pack runs, the manifest keeps it afterwards.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stoker.order import PACK, permutation
from stoker.shards.format.manifest import write_json_atomic
from stoker.shards.format.schema import FORMAT_NAME, FORMAT_VERSION, PLAN_NAME, image_row_bytes, shard_name
from stoker.shards.pack.rows import RowSource

__all__ = ["PackPlan", "ShardPlan", "cut_shards", "make_plan", "read_plan_fingerprint", "shuffled_rows"]

_ROW_OVERHEAD_BYTES = 24  # label and offsets, per row


@dataclass(frozen=True)
class ShardPlan:
    """One shard to write: its file name, split and rows (indices into the split's rows)."""

    name: str
    split: str
    rows: np.ndarray


@dataclass(frozen=True)
class PackPlan:
    """Every shard of a pack, in manifest order, and the fingerprint of the whole."""

    shards: tuple[ShardPlan, ...]
    fingerprint: str

    def save(self, root: Path) -> Path:
        """Write ``root/pack-plan.json`` (the fingerprint and the shard list)."""
        body = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "fingerprint": self.fingerprint,
            "shards": [{"name": s.name, "split": s.split, "samples": len(s.rows)} for s in self.shards],
        }
        return write_json_atomic(root / PLAN_NAME, (json.dumps(body, indent=1) + "\n").encode())


def read_plan_fingerprint(root: Path) -> str | None:
    """The fingerprint in ``root/pack-plan.json``, or None when it is missing or unreadable."""
    try:
        obj = json.loads((root / PLAN_NAME).read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    value = obj.get("fingerprint") if isinstance(obj, dict) else None
    return value if isinstance(value, str) else None


def shuffled_rows(n: int, seed: int, split: str) -> np.ndarray:
    """The seeded order of a split's ``n`` rows (the same seed and split, the same order).

    :func:`stoker.order.permutation` of stream ``(PACK, crc32(split))``, epoch 0.

    Example:
        >>> shuffled_rows(5, seed=0, split="train").tolist() == shuffled_rows(5, seed=0, split="train").tolist()
        True
    """
    return permutation(n, seed, 0, PACK, zlib.crc32(split.encode()))


def cut_shards(row_bytes: np.ndarray, shard_samples: int, shard_bytes: int) -> list[tuple[int, int]]:
    """Cut rows (in write order) into ``(start, end)`` runs of at most ``shard_samples`` rows
    and at most ``shard_bytes`` bytes (a single larger row gets a shard of its own)."""
    cuts: list[tuple[int, int]] = []
    start, total = 0, 0
    for i, size in enumerate(row_bytes.tolist()):
        if i > start and (i - start >= shard_samples or total + size > shard_bytes):
            cuts.append((start, i))
            start, total = i, 0
        total += size
    if start < len(row_bytes):
        cuts.append((start, len(row_bytes)))
    return cuts


def _text_bytes(values: np.ndarray) -> np.ndarray:
    return np.char.str_len(values).astype(np.int64) if len(values) else np.zeros(0, np.int64)


def make_plan(
    splits: Mapping[str, RowSource],
    *,
    store: str,
    image_size: tuple[int, int] | None,
    seed: int,
    shard_samples: int,
    shard_bytes: int,
    settings: Mapping[str, Any],
    shuffle: bool = True,
    channels: int = 3,
) -> PackPlan:
    """Shuffle each split and cut it into shards; fingerprint the result.

    Args:
        splits: each split's rows, in the order the splits are written.
        store, image_size: the storage mode and size (pixel rows have a fixed size).
        seed: the shuffle seed.
        shard_samples, shard_bytes: the most rows and (about) bytes per shard.
        settings: everything else that decides the bytes written (joins the fingerprint).
        shuffle: False keeps each split's rows in source order.
    """
    digest = hashlib.sha256()
    digest.update(json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION, **settings}, sort_keys=True).encode())
    shards: list[ShardPlan] = []
    for split, rows in splits.items():
        order = shuffled_rows(len(rows), seed, split) if shuffle else np.arange(len(rows))
        image_bytes = (
            np.full(len(rows), image_row_bytes(image_size, channels), dtype=np.int64)  # type: ignore[arg-type]
            if store == "pixels"
            else rows.encoded_sizes()
        )
        row_bytes = image_bytes + _text_bytes(rows.keys) + _text_bytes(rows.files) + _text_bytes(rows.source_names)
        row_bytes = row_bytes + _ROW_OVERHEAD_BYTES
        ordered = row_bytes[order]
        for number, (start, end) in enumerate(cut_shards(ordered, shard_samples, shard_bytes)):
            picked = order[start:end]
            name = shard_name(split, number)
            shards.append(ShardPlan(name, split, picked))
            digest.update(name.encode())
            digest.update("\n".join(rows.keys[picked].tolist()).encode("utf-8", "surrogatepass"))
            digest.update(rows.labels[picked].astype("<i8").tobytes())
            digest.update(image_bytes[picked].astype("<i8").tobytes())
            places = (f"{s}/{f}" for s, f in zip(rows.source_names[picked].tolist(), rows.files[picked].tolist(), strict=True))
            digest.update("\n".join(places).encode("utf-8", "surrogatepass"))
    return PackPlan(tuple(shards), digest.hexdigest())
