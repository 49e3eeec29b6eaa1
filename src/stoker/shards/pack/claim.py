"""The output folder of a pack: claim it, and reuse what an interrupted run of the same pack left.

A folder is packed into only when it is new or empty, when it holds a run of this same
pack (the plan fingerprint in ``pack-plan.json`` or in the manifest matches), or when the
caller says ``overwrite``. A shard an earlier run finished is reused only if it holds
exactly the planned rows (and, when the earlier run recorded it, the same SHA-256).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from stoker.errors import ConfigError, ShardError
from stoker.fs import local_path
from stoker.shards.format.manifest import Manifest, ShardInfo
from stoker.shards.format.schema import MANIFEST_NAME, TMP_SUFFIX, shard_schema
from stoker.shards.pack.plan import ShardPlan, read_plan_fingerprint
from stoker.shards.pack.replace import LOCK_NAME, is_ours
from stoker.shards.pack.rows import RowSource
from stoker.sources.index import Source

__all__ = ["check_place", "claim", "reuse_finished"]


def _same_pack(out: Path, fingerprint: str) -> Manifest | None:
    """The manifest in ``out`` if it was written by a pack with this fingerprint."""
    try:
        manifest = Manifest.load(out)
    except ShardError:
        return None
    return manifest if manifest.made_by.get("plan") == fingerprint else None


def _all_in_place(out: Path, manifest: Manifest) -> bool:
    for info in manifest.shards:
        try:
            if (out / info.name).stat().st_size != info.bytes:
                return False
        except OSError:
            return False
    return True


def check_place(out: Path, sources: Sequence[Source]) -> None:
    """``out`` can hold a shard set: not inside a source, not a file.

    Raises:
        ConfigError: it cannot.
    """
    resolved = out.resolve()
    for src in sources:
        root = local_path(src.root)  # None for a URL: never inside a local out
        if root is not None and (resolved == root.resolve() or root.resolve() in resolved.parents):
            raise ConfigError(f"{out}: is inside the source {src.root}; write the shards to a folder outside it")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a folder; choose another output folder")


def claim(out: Path, sources: Sequence[Source], fingerprint: str, overwrite: bool) -> tuple[Manifest | None, dict[str, str]]:
    """Make ``out`` ready for this pack.

    Returns:
        ``(manifest, known)``: the manifest when this same pack is already complete
        (nothing to do), and the SHA-256 of each shard a previous run of this pack
        recorded (shards of a resumed pack must match them to be kept).
    """
    check_place(out, sources)
    out.mkdir(parents=True, exist_ok=True)
    entries = sorted(e.name for e in os.scandir(out) if e.name != LOCK_NAME)
    if overwrite:  # only what stoker wrote goes; other files stay
        for name in entries:
            if is_ours(name) and (out / name).is_file():
                (out / name).unlink()
        return None, {}
    if not entries:
        return None, {}
    previous = _same_pack(out, fingerprint)
    if previous is not None and _all_in_place(out, previous):
        return previous, {}
    if previous is not None or read_plan_fingerprint(out) == fingerprint:
        # This same pack, interrupted or with shards deleted since: resume it.
        for name in entries:
            if name.endswith(TMP_SUFFIX) and is_ours(name):  # what the interrupted run left half written
                (out / name).unlink(missing_ok=True)
        (out / MANIFEST_NAME).unlink(missing_ok=True)
        return None, {info.name: info.sha256 for info in previous.shards} if previous is not None else {}
    shown = ", ".join(entries[:4]) + (" ..." if len(entries) > 4 else "")
    what = "a different shard set or pack" if any(is_ours(n) for n in entries) else "other files"
    raise ConfigError(
        f"{out}: is not empty ({shown}): it holds {what}; pass --overwrite (overwrite=True) to replace "
        "the shard set there, or choose an empty folder"
    )


def reuse_finished(
    out: Path, plan: ShardPlan, rows: RowSource, store: str, size: tuple[int, int] | None, known_sha: str | None,
    channels: int = 3,
) -> ShardInfo | None:
    """The info of a shard an earlier run finished, if it holds exactly the planned rows.

    A shard file only ever gets its final name when complete, so checking its structure
    and rows is enough; when the earlier run recorded the shard's SHA-256 it must match too.
    """
    path = out / plan.name
    if not path.is_file():
        return None
    try:
        with pa.memory_map(str(path), "r") as source:
            reader = pa.ipc.open_file(source)
            if not reader.schema.equals(shard_schema(store, size, channels), check_metadata=True):
                return None
            table = reader.read_all()
            table.validate(full=True)
            same = (
                table.num_rows == len(plan.rows)
                and table.column("key").to_pylist() == rows.keys[plan.rows].tolist()
                and np.array_equal(table.column("label").to_numpy(), rows.labels[plan.rows])
            )
    except (pa.ArrowException, OSError, ValueError):
        same = False
    if not same:
        path.unlink()
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    if known_sha is not None and digest.hexdigest() != known_sha:
        path.unlink()
        return None
    return ShardInfo(plan.name, plan.split, len(plan.rows), path.stat().st_size, digest.hexdigest())
