"""Packing to a URL (``stoker pack SRC s3://bucket/out``): the remote output of a pack.

A remote pack is as safe as a local one, in the same order:

1. claim the output: empty, this same pack half done (its ``pack-plan.json`` or
   manifest carries the same plan fingerprint), or ``overwrite``; a finished manifest of
   a pack being resumed is deleted first, so the output never looks finished early;
2. upload ``pack-plan.json``;
3. each shard is written whole to a local staging folder (under the cache folder),
   hashed, then uploaded (an object appears only once complete), and a small local
   record of the upload is kept so that a resumed pack skips it;
4. ``manifest.json`` is uploaded last, then ``pack-plan.json`` is removed.

The shards depend only on the pack's arguments, so re-running gives identical objects.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from stoker.errors import ConfigError, ShardError
from stoker.fs import Location
from stoker.shards.cache import default_cache_dir
from stoker.shards.format import MANIFEST_NAME, PLAN_NAME, SHARD_SUFFIX, TMP_SUFFIX
from stoker.shards.manifest import Manifest, ShardInfo, write_json_atomic
from stoker.shards.plan import PackPlan, ShardPlan, read_plan_fingerprint
from stoker.sources.index import Source

__all__ = ["RemoteOut", "record_upload"]

_RECORD_SUFFIX = ".uploaded.json"


def _is_ours(name: str) -> bool:
    return name in (MANIFEST_NAME, PLAN_NAME) or name.endswith(SHARD_SUFFIX)


def record_upload(staging: Path, info: ShardInfo) -> None:
    """Note in the staging folder that shard ``info`` is uploaded (a resumed pack skips it)."""
    body = {"name": info.name, "split": info.split, "samples": info.samples, "bytes": info.bytes, "sha256": info.sha256}
    write_json_atomic(staging / (info.name + _RECORD_SUFFIX), json.dumps(body).encode())


def upload_shard(place: Location, staging: Path, info: ShardInfo) -> None:
    """Upload a finished staged shard, record it, and delete the local copy."""
    path = staging / info.name
    place.upload(path, info.name)
    record_upload(staging, info)
    path.unlink(missing_ok=True)


class RemoteOut:
    """The output URL of one pack and its local staging folder.

    Args:
        place: where the shard set goes.
        cache_dir: the folder holding the staging folder (default: the shard cache's).
    """

    def __init__(self, place: Location, cache_dir: str | Path | None = None) -> None:
        self.place = place
        root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.staging = root / "pack" / hashlib.sha256(place.url.encode()).hexdigest()[:20]

    def claim(self, sources: Sequence[Source], fingerprint: str, overwrite: bool) -> tuple[Manifest | None, dict[str, str]]:
        """Make the output ready for this pack (see the module docs).

        Returns:
            ``(manifest, known)``: the manifest when this same pack is complete there
            already, and the SHA-256 of each shard a previous run recorded.

        Raises:
            ConfigError: the output holds something else (without ``overwrite``).
        """
        for src in sources:
            if src.root.rstrip("/") == self.place.url or self.place.url.startswith(src.root.rstrip("/") + "/"):
                raise ConfigError(f"{self.place.url}: is inside the source {src.root}; write the shards outside it")
        self.place.invalidate()
        sizes = self.place.sizes()
        if overwrite:
            for name in sizes:
                if _is_ours(name):
                    self.place.remove(name)
            shutil.rmtree(self.staging, ignore_errors=True)
            self._fresh_staging(keep_records=False)
            return None, {}
        if not sizes:
            self._fresh_staging(keep_records=False)
            return None, {}
        previous: Manifest | None = None
        if MANIFEST_NAME in sizes:
            try:
                previous = Manifest.load(self.place)
            except ShardError:
                previous = None
            if previous is not None and previous.made_by.get("plan") != fingerprint:
                previous = None
        if previous is not None and all(sizes.get(i.name) == i.bytes for i in previous.shards):
            return previous, {}
        if previous is not None or self._remote_plan_fingerprint(sizes) == fingerprint:
            self.place.remove(MANIFEST_NAME)  # resuming: it must not look finished meanwhile
            self._fresh_staging(keep_records=True)
            return None, {i.name: i.sha256 for i in previous.shards} if previous is not None else {}
        names = sorted(sizes)
        shown = ", ".join(names[:4]) + (" ..." if len(names) > 4 else "")
        what = "a different shard set or pack" if any(_is_ours(n) for n in names) else "other files"
        raise ConfigError(
            f"{self.place.url}: is not empty ({shown}): it holds {what}; pass --overwrite (overwrite=True) "
            "to replace the shard set there, or choose an empty prefix"
        )

    def _remote_plan_fingerprint(self, sizes: dict[str, int]) -> str | None:
        if PLAN_NAME not in sizes or sizes[PLAN_NAME] > 1 << 26:
            return None
        self.staging.mkdir(parents=True, exist_ok=True)
        (self.staging / PLAN_NAME).write_bytes(self.place.read_bytes(PLAN_NAME))
        return read_plan_fingerprint(self.staging)

    def _fresh_staging(self, keep_records: bool) -> None:
        self.staging.mkdir(parents=True, exist_ok=True)
        for path in self.staging.iterdir():
            if path.is_file() and (not keep_records or not path.name.endswith(_RECORD_SUFFIX)):
                path.unlink()

    def start(self, plan: PackPlan) -> None:
        """Upload ``pack-plan.json`` (before any shard)."""
        plan.save(self.staging)
        self.place.upload(self.staging / PLAN_NAME, PLAN_NAME)

    def reuse(self, plan: ShardPlan, known_sha: str | None, remote_sizes: dict[str, int]) -> ShardInfo | None:
        """The info of a shard an earlier run of this pack uploaded, if its object is there unchanged in size."""
        record = self.staging / (plan.name + _RECORD_SUFFIX)
        try:
            obj = json.loads(record.read_bytes())
            info = ShardInfo(obj["name"], obj["split"], int(obj["samples"]), int(obj["bytes"]), obj["sha256"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        same = (
            info.name == plan.name and info.split == plan.split and info.samples == len(plan.rows)
            and remote_sizes.get(plan.name) == info.bytes and (known_sha is None or known_sha == info.sha256)
        )
        if not same:
            record.unlink(missing_ok=True)
            return None
        return info

    def finish(self, manifest: Manifest) -> None:
        """Upload ``manifest.json`` (last), remove ``pack-plan.json`` and the staging folder."""
        manifest.save(self.staging)
        self.place.upload(self.staging / MANIFEST_NAME, MANIFEST_NAME)
        self.place.remove(PLAN_NAME)
        shutil.rmtree(self.staging, ignore_errors=True)
        self.place.invalidate()

    def clean_temporary(self) -> None:
        """Delete half-written staged shards of an interrupted run."""
        if self.staging.is_dir():
            for path in self.staging.glob(f"*{TMP_SUFFIX}"):
                path.unlink(missing_ok=True)
