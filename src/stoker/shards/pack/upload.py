"""Packing to a URL (``stoker pack SRC s3://bucket/out``): the remote output of a pack.

A bucket pack is as safe as a local one. Under the prefix's lock object
(:mod:`stoker.shards.pack.bucket_lock`), in this order: claim the prefix (empty, this same
pack half done, or ``overwrite``); upload ``pack-plan.json``; write each shard whole to a
local staging folder, hash it, upload it (an object appears only once complete); upload
``manifest.json`` last, the moment the new set becomes the set; then remove the old set's
shards and the plan.

Replacing a set never destroys it before the new one is complete: the new shards go up
under new object names (a generation offset of 100,000,000 in the shard number), and only
what stoker wrote is ever removed. A pack into an empty prefix writes byte for byte the
objects of a local pack. The object-store guide (``docs/guides/remote.md``, "Packing to a
URL, step by step") says more.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from stoker.errors import ConfigError, ShardError
from stoker.fs import Location
from stoker.shards.cache.store import default_cache_dir
from stoker.shards.format.manifest import Manifest, ShardInfo, write_json_atomic
from stoker.shards.format.schema import MANIFEST_NAME, PLAN_NAME, SHARD_SUFFIX, TMP_SUFFIX, is_shard_name, shard_name
from stoker.shards.pack.bucket_lock import LEASE_S, BucketLock
from stoker.shards.pack.plan import PackPlan, ShardPlan
from stoker.shards.pack.replace import LOCK_NAME
from stoker.sources.index import Source

__all__ = ["GENERATION", "RemoteOut", "generation_name", "record_upload", "upload_shard"]

GENERATION = 10**8  # shard numbers of generation g are offset by g * GENERATION
_GENERATIONS = 10  # numbers have at most 9 digits
_RECORD_SUFFIX = ".uploaded.json"
_MAX_PLAN_BYTES = 1 << 26


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


def generation_name(name: str, generation: int) -> str:
    """The object name of plan shard ``name`` in ``generation``: ``train-00003.arrow``, 1 -> ``train-100000003.arrow``."""
    split, rest = name.rsplit("-", 1)
    number = int(rest[: -len(SHARD_SUFFIX)]) % GENERATION
    return shard_name(split, generation * GENERATION + number)


@dataclass(frozen=True)
class _Staged:
    """What a ``pack-plan.json`` in the bucket says: its fingerprint, its shards, the set it replaces."""

    fingerprint: str
    shards: tuple[tuple[str, str, int], ...]  # (object name, split, samples)
    replaces: tuple[str, ...]

    @property
    def names(self) -> set[str]:
        return {name for name, _, _ in self.shards}


def _parse_staged(data: bytes) -> _Staged | None:
    """A remote plan, or None when it is not one (its names are checked: they come from the bucket)."""
    try:
        obj = json.loads(data)
        fingerprint = obj["fingerprint"]
        shards = tuple((str(s["name"]), str(s["split"]), int(s["samples"])) for s in obj["shards"])
        replaces = tuple(str(n) for n in obj.get("replaces", []))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    if not isinstance(fingerprint, str) or not all(is_shard_name(n) for n, _, _ in shards):
        return None
    return _Staged(fingerprint, shards, tuple(n for n in replaces if is_shard_name(n)))


def _named(plan: PackPlan, shards: Sequence[tuple[str, str, int]]) -> PackPlan | None:
    """``plan`` with the object names of ``shards`` (an earlier run's), if they are its shards in order."""
    if len(shards) != len(plan.shards):
        return None
    if any(split != p.split or samples != len(p.rows) for (_, split, samples), p in zip(shards, plan.shards, strict=True)):
        return None
    return PackPlan(tuple(ShardPlan(name, p.split, p.rows) for (name, _, _), p in zip(shards, plan.shards, strict=True)), plan.fingerprint)


class RemoteOut:
    """The output URL of one pack, its lock and its local staging folder.

    Use :meth:`claim`, :meth:`start` and :meth:`finish` while holding :attr:`lock`
    (``with out.lock:``).

    Args:
        place: where the shard set goes.
        cache_dir: the folder holding the staging folder (default: the shard cache's).
        lease_s: the lease of the prefix's lock object (see :mod:`stoker.shards.pack.bucket_lock`).
    """

    def __init__(self, place: Location, cache_dir: str | Path | None = None, lease_s: float = LEASE_S) -> None:
        self.place = place
        root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.staging = root / "pack" / hashlib.sha256(place.url.encode()).hexdigest()[:20]
        self.lock = BucketLock(place, lease_s)
        self.replaces: tuple[str, ...] = ()  # the old set's shards, removed once the new manifest is up

    # -- 1. claim -------------------------------------------------------------------------
    def claim(self, sources: Sequence[Source], plan: PackPlan, overwrite: bool) -> tuple[Manifest | None, dict[str, str], PackPlan]:
        """Make the output ready for this pack (see the module docs).

        Returns:
            ``(manifest, known, plan)``: the manifest when this same pack is complete there
            already; the SHA-256 of each shard an earlier run recorded; ``plan`` with the
            object name of each shard.

        Raises:
            ConfigError: the output holds something else (without ``overwrite``).
        """
        for src in sources:
            if src.root.rstrip("/") == self.place.url or self.place.url.startswith(src.root.rstrip("/") + "/"):
                raise ConfigError(f"{self.place.url}: is inside the source {src.root}; write the shards outside it")
        self.place.invalidate()
        sizes = self.place.sizes()
        sizes.pop(LOCK_NAME, None)
        manifest = self._manifest(sizes)
        staged = self._staged(sizes)
        fingerprint = plan.fingerprint
        mine = manifest if manifest is not None and manifest.made_by.get("plan") == fingerprint else None
        mine_staged = staged if staged is not None and staged.fingerprint == fingerprint else None
        if mine is not None and all(sizes.get(i.name) == i.bytes for i in mine.shards) and (mine_staged is not None or not overwrite):
            if mine_staged is not None:  # finished, interrupted while removing the set it replaced
                self._remove((mine_staged.names | set(mine_staged.replaces)) - {i.name for i in mine.shards})
                self.place.remove(PLAN_NAME)
            return mine, {}, plan
        if mine_staged is not None and (named := _named(plan, mine_staged.shards)) is not None:
            if manifest is not None and mine is None and not overwrite:
                raise ConfigError(
                    f"{self.place.url}: holds a shard set and an unfinished `--overwrite` pack of these same "
                    "arguments; pass --overwrite (overwrite=True) again to resume it, or choose an empty prefix"
                )
            if mine is not None:
                self.place.remove(MANIFEST_NAME)  # resuming: it must not look finished meanwhile
            current = {i.name for i in manifest.shards} if manifest is not None else set()
            self.replaces = tuple(sorted((set(mine_staged.replaces) | current) - mine_staged.names))
            self._fresh_staging(keep_records=True)
            return None, {}, named
        if mine is not None and not overwrite and (named := _named(plan, [(i.name, i.split, i.samples) for i in mine.shards])):
            self.place.remove(MANIFEST_NAME)  # this pack's set with shards missing: write them again, same names
            self._fresh_staging(keep_records=True)
            return None, {i.name: i.sha256 for i in mine.shards}, named
        if overwrite:
            return None, {}, self._replacing(plan, sizes, manifest, staged)
        if not sizes:
            self._fresh_staging(keep_records=False)
            return None, {}, plan
        names = sorted(sizes)
        shown = ", ".join(names[:4]) + (" ..." if len(names) > 4 else "")
        what = "a different shard set or pack" if MANIFEST_NAME in sizes or PLAN_NAME in sizes else "other files"
        raise ConfigError(
            f"{self.place.url}: is not empty ({shown}): it holds {what}; pass --overwrite (overwrite=True) "
            "to replace the shard set there (objects stoker did not write are kept), or choose an empty prefix"
        )

    def _replacing(self, plan: PackPlan, sizes: dict[str, int], manifest: Manifest | None, staged: _Staged | None) -> PackPlan:
        """Prepare a new set beside the old one: remove an abandoned pack's leftovers, pick free names."""
        old = {i.name for i in manifest.shards} if manifest is not None else self._names_in_damaged_manifest(sizes)
        if staged is not None:  # another pack's unfinished run: its shards (and what it replaced) are stoker's
            leftovers = (staged.names | set(staged.replaces)) - old
            self._remove(leftovers)
            self.place.remove(PLAN_NAME)
            taken = set(sizes) - leftovers - {PLAN_NAME}
        else:
            taken = set(sizes)
        for generation in range(_GENERATIONS):
            names = [generation_name(s.name, generation) for s in plan.shards]
            if not taken.intersection(names):
                break
        else:
            raise ConfigError(f"{self.place.url}: every name this pack's shards could take is in use; choose an empty prefix")
        self.replaces = tuple(sorted(old))
        shutil.rmtree(self.staging, ignore_errors=True)
        self._fresh_staging(keep_records=False)
        return PackPlan(tuple(ShardPlan(n, s.split, s.rows) for n, s in zip(names, plan.shards, strict=True)), plan.fingerprint)

    def _manifest(self, sizes: dict[str, int]) -> Manifest | None:
        if MANIFEST_NAME not in sizes:
            return None
        try:
            return Manifest.load(self.place)
        except ShardError:
            return None  # damaged: it names no set that could still be read

    def _names_in_damaged_manifest(self, sizes: dict[str, int]) -> set[str]:
        """The shard names a manifest that does not load still lists (they are stoker's to replace)."""
        if MANIFEST_NAME not in sizes or sizes[MANIFEST_NAME] > _MAX_PLAN_BYTES:
            return set()
        try:
            shards = json.loads(self.place.read_bytes(MANIFEST_NAME, max_bytes=_MAX_PLAN_BYTES))["shards"]
            names = {s["name"] for s in shards if isinstance(s, dict)}
        except (ValueError, KeyError, TypeError, RecursionError):
            return set()
        return {n for n in names if is_shard_name(n) and n in sizes}

    def _staged(self, sizes: dict[str, int]) -> _Staged | None:
        if PLAN_NAME not in sizes or sizes[PLAN_NAME] > _MAX_PLAN_BYTES:
            return None
        return _parse_staged(self.place.read_bytes(PLAN_NAME, max_bytes=_MAX_PLAN_BYTES))

    def _remove(self, names: Iterable[str]) -> None:
        for name in sorted(names):
            self.place.remove(name)

    def _fresh_staging(self, keep_records: bool) -> None:
        self.staging.mkdir(parents=True, exist_ok=True)
        for path in self.staging.iterdir():
            if path.is_file() and (not keep_records or not path.name.endswith(_RECORD_SUFFIX)):
                path.unlink()

    # -- 2 and 3. the plan, the shards ------------------------------------------------------
    def start(self, plan: PackPlan) -> None:
        """Upload ``pack-plan.json`` (before any shard), with the names of the set it replaces."""
        path = plan.save(self.staging)
        body = json.loads(path.read_bytes())
        body["replaces"] = list(self.replaces)
        write_json_atomic(path, (json.dumps(body, indent=1) + "\n").encode())
        self.place.upload(path, PLAN_NAME)

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

    # -- 4 and 5. the manifest, then the old set goes ----------------------------------------
    def finish(self, manifest: Manifest) -> None:
        """Upload ``manifest.json`` (last; the lock confirmed first), then remove the old set's
        shards, ``pack-plan.json`` and the staging folder."""
        manifest.save(self.staging)
        self.lock.confirm()
        self.place.upload(self.staging / MANIFEST_NAME, MANIFEST_NAME)
        self._remove(set(self.replaces) - {i.name for i in manifest.shards})
        self.place.remove(PLAN_NAME)
        shutil.rmtree(self.staging, ignore_errors=True)
        self.place.invalidate()

    def clean_temporary(self) -> None:
        """Delete half-written staged shards of an interrupted run."""
        if self.staging.is_dir():
            for path in self.staging.glob(f"*{TMP_SUFFIX}"):
                path.unlink(missing_ok=True)
