"""``manifest.json``: what a shard set holds, how it was made, and a checksum over it all.

The manifest is plain JSON, written last by ``stoker pack`` (so a set without one is not
finished). It lists every shard with its split, sample count, byte size and SHA-256, the
class names, the sources samples came from, and the pack arguments. Its last field is a
SHA-256 of the rest, so an edited manifest is caught when it is opened rather than
misreading the shards it describes::

    {
      "format": "stoker-shards",
      "version": 1,
      "store": "pixels",
      "image_size": [112, 112],
      "schema": [{"name": "key", "type": "string"}, ...],
      "classes": ["0", "1", ...],
      "sources": [{"name": "digiface", "root": "/data/digiface", "crop": null}],
      "splits": {"train": {"samples": 900, "shards": 1}, "valid": {"samples": 100, "shards": 1}},
      "shards": [{"name": "train-00000.arrow", "split": "train", "samples": 900,
                  "bytes": 33884440, "sha256": "..."}, ...],
      "made_by": {"tool": "stoker", "stoker_version": "0.1.0", "seed": 0, ...},
      "checksum": "sha256:..."
    }

Loading is strict: any field of the wrong type, an unknown format or version, a shard
name that is not a plain file name, or a checksum mismatch raises :class:`ShardError`.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stoker.errors import ConfigError, DataError, MissingFileError, NetworkError, ShardError
from stoker.fs import Location, where
from stoker.fs.network import ADVICE
from stoker.shards.cache import manifests as manifest_cache
from stoker.shards.format.schema import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    PLAN_NAME,
    STORES,
    check_split_name,
    is_shard_name,
    shard_schema,
)
from stoker.sources.index import Source

__all__ = ["Manifest", "ShardInfo", "write_json_atomic"]

_SHA_RE = re.compile(r"[0-9a-f]{64}")
_MAX_MANIFEST_BYTES = 1 << 30


@dataclass(frozen=True)
class ShardInfo:
    """One shard as the manifest lists it.

    Attributes:
        name: file name inside the shard set folder (``train-00000.arrow``).
        split: the split the shard belongs to.
        samples: rows in the shard.
        bytes: size of the file.
        sha256: hex SHA-256 of the file.
    """

    name: str
    split: str
    samples: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """What a shard set holds; :meth:`load` reads and checks ``manifest.json``, :meth:`save` writes it.

    Attributes:
        store: ``"encoded"`` (original file bytes) or ``"pixels"`` (decoded uint8 CHW).
        image_size: ``(height, width)`` of every image when read, or ``None`` (encoded
            shards read back at each file's own size).
        classes: class names; ``classes[label]`` names a label.
        sources: where the samples came from (name, root, crop box).
        shards: every shard, in order; a split's samples are its shards' rows in order.
        made_by: how the set was made (tool, version, source, seed, sizes, plan).

    Example:
        >>> m = Manifest.load("packed")
        >>> m.split_samples("train"), m.store, m.image_size
        (36, 'pixels', (32, 32))
    """

    store: str
    image_size: tuple[int, int] | None
    classes: tuple[str, ...]
    sources: tuple[Source, ...]
    shards: tuple[ShardInfo, ...]
    made_by: Mapping[str, Any] = field(default_factory=dict)
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION
    channels: int = 3  # pixels: 3 (RGB) or 1 (gray); recorded only when it is 1

    # -- views ----------------------------------------------------------------------
    @property
    def splits(self) -> dict[str, tuple[ShardInfo, ...]]:
        """Each split's shards, splits in the order they first appear."""
        out: dict[str, list[ShardInfo]] = {}
        for info in self.shards:
            out.setdefault(info.split, []).append(info)
        return {name: tuple(infos) for name, infos in out.items()}

    def split_samples(self, split: str) -> int:
        """Number of samples in ``split`` (0 if there is no such split)."""
        return sum(info.samples for info in self.shards if info.split == split)

    @property
    def samples(self) -> int:
        """Number of samples in all splits."""
        return sum(info.samples for info in self.shards)

    @property
    def bytes(self) -> int:
        """Bytes of all shard files."""
        return sum(info.bytes for info in self.shards)

    def shards_of(self, split: str) -> tuple[ShardInfo, ...]:
        """The shards of ``split``; ConfigError naming the splits there are if it has none."""
        infos = self.splits.get(split)
        if not infos:
            raise ConfigError(f"the shard set has no split {split!r}; it has: {', '.join(self.splits)}")
        return infos

    # -- to and from JSON -----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The manifest as JSON-ready data, without the checksum."""
        schema = shard_schema(self.store, self.image_size, self.channels)
        gray = {"channels": self.channels} if self.channels != 3 else {}  # default sets keep their bytes
        return {
            "format": self.format,
            "version": self.version,
            "store": self.store,
            "image_size": list(self.image_size) if self.image_size is not None else None,
            **gray,
            "schema": [{"name": f.name, "type": str(f.type)} for f in schema],
            "classes": list(self.classes),
            "sources": [
                {"name": s.name, "root": s.root, "crop": list(s.crop) if s.crop is not None else None}
                for s in self.sources
            ],
            "splits": {
                name: {"samples": sum(i.samples for i in infos), "shards": len(infos)}
                for name, infos in self.splits.items()
            },
            "shards": [
                {"name": i.name, "split": i.split, "samples": i.samples, "bytes": i.bytes, "sha256": i.sha256}
                for i in self.shards
            ],
            "made_by": dict(self.made_by),
        }

    def to_bytes(self) -> builtins.bytes:  # builtins.: the ``bytes`` property shadows the type here
        """The exact bytes of ``manifest.json``: indented JSON, checksum last, newline at the end."""
        body = self.to_dict()
        body["checksum"] = _checksum(body)
        return _render(body).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: builtins.bytes, where: str = MANIFEST_NAME) -> Manifest:
        """Parse and check manifest bytes; every problem is a :class:`ShardError` naming ``where``."""
        try:
            text = data.decode("utf-8")
            obj = json.loads(text, parse_constant=_reject_constant)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ShardError(f"{where}: not valid JSON ({_short(exc)}); {_REPACK_HINT}") from None
        return _parse(obj, where)

    def save(self, root: str | os.PathLike[str]) -> Path:
        """Write ``root/manifest.json`` atomically (a temporary file, then a rename)."""
        return write_json_atomic(Path(root) / MANIFEST_NAME, self.to_bytes())

    @classmethod
    def load(
        cls,
        root: str | os.PathLike[str] | Location,
        storage_options: dict[str, Any] | None = None,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> Manifest:
        """Read and check ``root/manifest.json`` (``root`` a folder, or a URL such as ``s3://bucket/packed``).

        A manifest read from a URL is kept in the shard cache (``cache_dir``, default
        :func:`~stoker.shards.cache.store.default_cache_dir`); when the store cannot be reached,
        that copy is read instead, saying once that the set is read offline
        (:mod:`stoker.shards.cache.manifests`).

        Raises:
            ShardError: the manifest is missing, unreadable, edited or malformed.
            ConfigError: the URL's filesystem is not installed, or the store denied access (401, 403).
            NetworkError: the store cannot be reached and no copy of the manifest is cached, or it
                answered with an error (HTTP 503): a store that answers is never read offline.
        """
        place = where(root, storage_options)
        if place.is_local:
            return _load(place)
        return _load_remote(place, cache_dir)


_REPACK_HINT = "the manifest was edited or damaged; restore it or re-pack with `stoker pack`"


def _no_manifest(where: str, has_plan: bool, exists: bool, what: str) -> ShardError:
    """The error for a shard set without ``manifest.json``: a pack half done, nothing there, or not a set."""
    if has_plan:
        return ShardError(
            f"{where}: the pack did not finish (no {MANIFEST_NAME}, a {PLAN_NAME} is there); "
            "re-run the same `stoker pack` command to resume it"
        )
    if not exists:
        return ShardError(f"{where}: not found; pass {what} `stoker pack` wrote")
    return ShardError(f"{where}: no {MANIFEST_NAME}, so this is not a shard set; make one with `stoker pack`")


def _load_remote(place: Location, cache_dir: str | os.PathLike[str] | None) -> Manifest:
    """``Manifest.load`` of a URL: from the store (then kept in the cache), else, offline, the cached copy."""
    try:
        data = _read(place)
    except NetworkError as exc:
        if not exc.unreachable:  # the store answered (HTTP 503, a refused request): an error, not offline
            raise
        cached = manifest_cache.recall(place.url, cache_dir)
        if cached is None:
            raise NetworkError(
                f"{str(exc).removesuffix('; ' + ADVICE)}; no copy of its manifest is in the cache "
                f"{manifest_cache.cache_root(cache_dir)}, so it cannot be read offline; {ADVICE}"
            ) from None
        data, checked_at = cached
        manifest = Manifest.from_bytes(data, f"the cached manifest of {place.url}")
        manifest_cache.use_offline(place.url, checked_at, exc, cache_dir)
        return manifest
    manifest = Manifest.from_bytes(data, place.url_of(MANIFEST_NAME))
    manifest_cache.remember(place.url, data, cache_dir)
    manifest_cache.mark_online(place.url)
    return manifest


def _load(place: Location) -> Manifest:
    """``Manifest.load``: a folder or a URL, read the same way (the manifest first, nothing else)."""
    return Manifest.from_bytes(_read(place), place.url_of(MANIFEST_NAME))


def _read(place: Location) -> bytes:
    """The bytes of ``place/manifest.json``; every problem but an unreachable store is a ShardError."""
    try:
        data = place.read_bytes(MANIFEST_NAME, max_bytes=_MAX_MANIFEST_BYTES)
    except MissingFileError:
        what = "the folder" if place.is_local else "the URL"
        raise _no_manifest(place.url, place.exists(PLAN_NAME), place.is_dir(), what) from None
    except DataError as exc:  # too large, not a regular file, or unreadable
        raise ShardError(f"{exc}; this is not a stoker manifest") from None
    except (NetworkError, ConfigError):  # the store cannot be reached (one line already), or access is denied
        raise
    except OSError as exc:
        raise ShardError(f"{place.url_of(MANIFEST_NAME)}: cannot read ({exc})") from None
    return data


def write_json_atomic(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file, fsync and rename; an interrupted write leaves no ``.tmp``."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # an interrupt (a cancelled Ray task) included
        tmp.unlink(missing_ok=True)
        raise
    return path


def _render(body: Mapping[str, Any]) -> str:
    """One top-level field per line; a list of objects one object per line; the rest inline."""

    def inline(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)

    lines = []
    for key, value in body.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            items = ",\n".join(f"    {inline(v)}" for v in value)
            lines.append(f"  {inline(key)}: [\n{items}\n  ]")
        else:
            lines.append(f"  {inline(key)}: {inline(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _checksum(body: Mapping[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return "sha256:" + hashlib.sha256(canonical.encode("ascii")).hexdigest()


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not allowed")


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 120 else text[:117] + "..."


# -- strict parsing ---------------------------------------------------------------------


class _Fields:
    """Typed access to one JSON object, raising ShardError that names the field."""

    def __init__(self, obj: object, where: str, path: str) -> None:
        if not isinstance(obj, dict):
            raise ShardError(f"{where}: {path or 'the top level'} must be a JSON object; {_REPACK_HINT}")
        self.obj, self.where, self.path = obj, where, path

    def fail(self, key: str, expected: str) -> ShardError:
        value = self.obj.get(key, "<missing>")
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        return ShardError(f"{self.where}: field {self.path}{key} must be {expected}, got {shown}; {_REPACK_HINT}")

    def get(self, key: str) -> object:
        if key not in self.obj:
            raise self.fail(key, "present")
        return self.obj[key]

    def text(self, key: str) -> str:
        value = self.get(key)
        if not isinstance(value, str):
            raise self.fail(key, "a string")
        return value

    def integer(self, key: str, minimum: int = 0) -> int:
        value = self.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise self.fail(key, f"an integer >= {minimum}")
        return value

    def items(self, key: str) -> list[object]:
        value = self.get(key)
        if not isinstance(value, list):
            raise self.fail(key, "a list")
        return value

    def ints(self, key: str, count: int, minimum: int) -> tuple[int, ...]:
        value = self.get(key)
        if (
            not isinstance(value, list)
            or len(value) != count
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in value)
        ):
            raise self.fail(key, f"a list of {count} integers >= {minimum}")
        return tuple(value)


def _parse(obj: object, where: str) -> Manifest:
    top = _Fields(obj, where, "")
    fmt = top.text("format")
    if fmt != FORMAT_NAME:
        raise ShardError(f"{where}: format is {fmt!r}, not {FORMAT_NAME!r}; this is not a stoker shard set")
    version = top.integer("version", 1)
    if version > FORMAT_VERSION:
        raise ShardError(
            f"{where}: format version {version} is newer than this stoker reads ({FORMAT_VERSION}); upgrade stoker"
        )
    if version != FORMAT_VERSION:
        raise ShardError(f"{where}: format version {version} is not supported; re-pack with `stoker pack`")
    checksum = top.text("checksum")
    body = {k: v for k, v in top.obj.items() if k != "checksum"}
    try:
        expected = _checksum(body)
    except (TypeError, ValueError, RecursionError) as exc:  # unencodable values cannot match anyway
        raise ShardError(f"{where}: cannot check the checksum ({_short(exc)}); {_REPACK_HINT}") from None
    if checksum != expected:
        raise ShardError(f"{where}: checksum mismatch; {_REPACK_HINT}")

    store = top.text("store")
    if store not in STORES:
        raise top.fail("store", f"one of {', '.join(STORES)}")
    size_value = top.get("image_size")
    image_size = None if size_value is None else top.ints("image_size", 2, 1)
    channels = top.obj.get("channels", 3)  # present only in gray (1 channel) pixel sets
    if channels not in (1, 3) or isinstance(channels, bool):
        raise top.fail("channels", "1 or 3")
    try:
        schema = shard_schema(store, image_size, channels)  # type: ignore[arg-type]
    except ConfigError as exc:
        raise ShardError(f"{where}: {exc}; {_REPACK_HINT}") from None
    expected_schema = [{"name": f.name, "type": str(f.type)} for f in schema]
    if top.get("schema") != expected_schema:
        raise top.fail("schema", f"{expected_schema}")

    classes = top.items("classes")
    if not all(isinstance(c, str) for c in classes):
        raise top.fail("classes", "a list of strings")

    sources = []
    for i, entry in enumerate(top.items("sources")):
        f = _Fields(entry, where, f"sources[{i}].")
        crop = None if f.get("crop") is None else f.ints("crop", 4, 0)
        sources.append(Source(f.text("name"), f.text("root"), crop))  # type: ignore[arg-type]
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise top.fail("sources", "sources with distinct names")

    shards = []
    for i, entry in enumerate(top.items("shards")):
        f = _Fields(entry, where, f"shards[{i}].")
        name = f.text("name")
        if not is_shard_name(name):
            raise f.fail("name", "a plain shard file name like 'train-00000.arrow'")
        split = f.text("split")
        try:
            check_split_name(split)
        except ConfigError:
            raise f.fail("split", "a split name of letters, digits and '_'") from None
        sha = f.text("sha256")
        if not _SHA_RE.fullmatch(sha):
            raise f.fail("sha256", "64 lowercase hex digits")
        shards.append(ShardInfo(name, split, f.integer("samples", 1), f.integer("bytes", 1), sha))
    if not shards:
        raise top.fail("shards", "a non-empty list")
    if len({s.name for s in shards}) != len(shards):
        raise top.fail("shards", "shards with distinct names")

    made_by = top.get("made_by")
    if not isinstance(made_by, dict):
        raise top.fail("made_by", "a JSON object")
    manifest = Manifest(store, image_size, tuple(classes), tuple(sources), tuple(shards), made_by,  # type: ignore[arg-type]
                        channels=channels)
    if top.get("splits") != manifest.to_dict()["splits"]:
        raise top.fail("splits", "the per-split totals of the shards")
    return manifest
