"""Packed shards: write a data set into checksummed Arrow files, read them fast, verify and inspect them.

``stoker.pack`` (in :mod:`stoker.packer`) opens data at any path and calls
:func:`write_shards`; this package never opens paths of other layouts itself.

Example:
    >>> import stoker
    >>> from stoker.shards import ShardDataset, verify
    >>> manifest = stoker.pack("data/digiface", "packed-here", store="pixels", size=(32, 32), valid=0.1, progress=False)
    >>> train = ShardDataset("packed-here", split="train")
    >>> len(train), verify("packed-here").ok
    (36, True)
"""

from __future__ import annotations

from stoker.shards.cache.store import ShardCache
from stoker.shards.check.summary import ShardSetSummary, SplitSummary, summarize, write_grid
from stoker.shards.check.verification import Fault, VerifyReport, verify
from stoker.shards.format.manifest import Manifest, ShardInfo
from stoker.shards.pack.packing import write_shards
from stoker.shards.pack.writer import ShardWriter
from stoker.shards.read.dataset import ShardBatch, ShardDataset, collate_shard_batch
from stoker.shards.read.stream import ShardStream, stream_order

__all__ = [
    "Fault",
    "Manifest",
    "ShardBatch",
    "ShardCache",
    "ShardDataset",
    "ShardInfo",
    "ShardSetSummary",
    "ShardStream",
    "ShardWriter",
    "SplitSummary",
    "VerifyReport",
    "collate_shard_batch",
    "stream_order",
    "summarize",
    "verify",
    "write_grid",
    "write_shards",
]
