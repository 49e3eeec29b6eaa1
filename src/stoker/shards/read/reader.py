"""Read shards: one memory-mapped, checked file (:class:`ShardFile`) and one split of a set (:class:`ShardSet`).

Reading is by the batch: a call takes an array of row numbers and fills one output
array, so the Python work per batch is a handful of numpy calls, not one per sample.
Pixel rows are copied exactly once, from the memory-mapped file into the batch tensor;
in the training process a batch from any number of shards is one numpy fancy index
(:meth:`ShardSet.gather_pixels`, over :class:`stoker.shards.read.gather.RowSpan`).

Files open lazily, in the process that reads them, and are dropped when the reader is
pickled, so a reader can be handed to DataLoader worker processes.
"""

from __future__ import annotations

import logging
import os
import threading
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from stoker.decode.image import Box
from stoker.decode.jpeg import decode_stored
from stoker.errors import ConfigError, DecodeError, ShardError
from stoker.fs import Location, PathOrURL, where
from stoker.shards.cache.entries import Holder, entry_cost
from stoker.shards.cache.manifests import offline_since, require_cached
from stoker.shards.cache.store import ShardCache
from stoker.shards.format.manifest import Manifest
from stoker.shards.format.schema import MANIFEST_NAME, image_row_bytes, shard_schema
from stoker.shards.read.gather import BatchBuffers, RowSpan, idle_copy_threads, split_copy
from stoker.shards.read.shard_file import ShardFile, gather_span, repair_hint

__all__ = ["ShardFile", "ShardSet", "repair_hint"]

log = logging.getLogger("stoker")


def _manifest_stamp(root: Path) -> tuple[int, int, int, int] | None:
    """What identifies the manifest file on disk without reading it (device, inode, size, mtime)."""
    try:
        st = (root / MANIFEST_NAME).stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _list_early(remote: Location | None) -> Future[dict[str, int]] | None:
    """A remote set's listing (the sizes of its files), asked for on a thread of its own; None for a local set or offline.

    Opening a remote set reads its manifest, then compares every shard's size with a
    listing: asked for side by side, the two round trips to the store take about as long as one.
    """
    if remote is None or offline_since(remote.url) is not None:  # offline, check_sizes lists nothing
        return None
    listing: Future[dict[str, int]] = Future()

    def run() -> None:
        if listing.set_running_or_notify_cancel():
            try:
                listing.set_result(remote.sizes())
            except BaseException as exc:  # raised where check_sizes takes the result
                listing.set_exception(exc)

    # A daemon thread: found offline meanwhile, check_sizes never takes the result, and the
    # process must not wait at exit for the network layer's retries (a pool's thread is joined).
    threading.Thread(target=run, name="stoker-list", daemon=True).start()
    return listing


class ShardSet:
    """The shards of one split of a shard set, read a batch of rows at a time.

    Opening reads and checks the manifest and compares every shard's size on disk with
    it (cheap: no data is read); a missing, truncated or grown shard raises
    :class:`ShardError` at once. Shard files are memory-mapped on first use, in the
    process that uses them.

    A remote set (an fsspec URL) is read through a verified local cache
    (:mod:`stoker.shards.cache.store`): each shard is downloaded once, checked against the
    manifest's SHA-256, and memory-mapped from there.

    Args:
        root: the shard set folder, or its URL (``s3://bucket/packed``).
        split: which split to read.
        cache_dir: the cache folder of a remote set (default: ``STOKER_CACHE``, else
            ``~/.cache/stoker``).
        cache_limit: the most disk bytes the cache folder takes (``"50GB"``; default
            ``$STOKER_CACHE_LIMIT``); least recently used shards no reader holds are
            evicted. Random reads over a split larger than it let go of each shard after
            the read that needed it (and fetch it again when it is needed again).
        storage_options: passed to the fsspec filesystem (credentials, endpoint).

    Raises:
        ShardError: the manifest or a shard is missing, damaged or edited.
        ConfigError: the set has no such split, or the URL's filesystem is not installed.
    """

    def __init__(
        self,
        root: PathOrURL,
        split: str = "train",
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        place = where(root, storage_options)
        local = place.local_path  # shards are memory-mapped: a set at a URL goes through the verified cache first
        self.remote: Location | None = place if local is None else None
        self.cache: ShardCache | None = ShardCache(cache_dir, cache_limit) if self.remote is not None else None
        self.root: Path | str = place.url if local is None else local
        self.split = split
        # Before loading: a change in between is caught later. (A remote set is read through
        # the verified cache: a re-packed shard fails its SHA-256 there.)
        self._stamp = _manifest_stamp(local) if local is not None else None
        listing = _list_early(self.remote)  # check_sizes' listing, asked for while the manifest is read
        self.manifest = Manifest.load(place, cache_dir=cache_dir)  # offline: the cached copy (stoker.shards.cache.manifests)
        self.infos = self.manifest.shards_of(split)
        self.schema = shard_schema(self.manifest.store, self.manifest.image_size, self.manifest.channels)
        self.starts = np.cumsum([0] + [info.samples for info in self.infos])
        self.crops = {s.name: s.crop for s in self.manifest.sources}
        self.channels = self.manifest.channels
        self.row_bytes = (
            image_row_bytes(self.manifest.image_size, self.channels) if self.manifest.store == "pixels" else 0  # type: ignore[arg-type]
        )
        # Copying threads of gather_pixels and read_pixels; None: 1 or 2 by the machine's load (idle_copy_threads).
        self.gather_threads: int | None = None
        self.reduced_jpeg = True  # JPEGs by the fast path (stoker.decode.jpeg), to the full path's pixels
        # Set by a reader that lets go of each shard by its own plan (ShardStream): reads
        # then keep what they open, even when the split is larger than the cache.
        self.streaming = False
        self.in_blocks = False  # set by a block shuffle (ShardDataset.shuffle_blocks): its order fetches each shard once
        self.keep: set[int] = set()  # shards a read of a split larger than its cache keeps open (see done_with)
        self._warned_tight = False
        self._tight: bool | None = None
        self._waiting = 0  # reads of this set waiting for room in the cache
        self._lock = threading.Lock()
        self._reset()
        self.check_sizes(listing)

    @property
    def cache_bytes(self) -> int:
        """Disk bytes every shard of the split takes in the cache (its stamps included)."""
        return sum(entry_cost(info.bytes) for info in {i.sha256: i for i in self.infos}.values())

    @property
    def tight(self) -> bool:
        """True for a remote split that does not fit in its cache's limit at once."""
        if self._tight is None:
            room = self.cache.shard_room if self.cache is not None else None
            self._tight = room is not None and self.cache_bytes > room
        return self._tight

    def _reset(self) -> None:
        self._pins: dict[int, Holder] = {}
        self._files: list[ShardFile | None] = [None] * len(self.infos)
        self._segment_starts: np.ndarray | None = None
        self._segment_views: list[np.ndarray] = []
        self._span: RowSpan | None = None
        self._labels: np.ndarray | None = None
        self._buffers = BatchBuffers()  # gather_pixels' batches, reused once nothing holds them

    def check_sizes(self, listing: Future[dict[str, int]] | None = None) -> None:
        """Compare every shard's size on disk (or in the bucket: one listing) with the manifest (no data is read).

        ``listing``: a remote set's listing (:meth:`Location.sizes`) asked for already.
        """
        if self.remote is not None:
            if offline_since(self.remote.url) is not None and self.cache is not None:  # the store is unreachable
                # check_entry: a copied cache (same bytes, new stamps) is recognised by its SHA-256, once
                require_cached(self.remote.url, self.split, self.infos, self.cache.check_entry)
                self.cache.say_if_over_limit(self.remote.url)
                return
            sizes = listing.result() if listing is not None else self.remote.sizes()
            for info in self.infos:
                if info.name not in sizes:  # not listed (an HTTP server may not list): ask for it alone
                    size = self.remote.size(info.name)
                    if size is not None:
                        sizes[info.name] = size
                if info.name not in sizes:
                    raise ShardError(f"shard {info.name}: {self.remote.url_of(info.name)} is missing; {repair_hint(self.root)}")
                if sizes[info.name] != info.bytes:
                    raise ShardError(
                        f"shard {info.name}: {sizes[info.name]} bytes in {self.remote.url}, the manifest says "
                        f"{info.bytes} (truncated or changed); {repair_hint(self.root)}"
                    )
            return
        for info in self.infos:
            try:
                size = (Path(self.root) / info.name).stat().st_size
            except FileNotFoundError:
                raise ShardError(f"shard {info.name}: file is missing; {repair_hint(self.root)}") from None
            except OSError as exc:
                raise ShardError(f"shard {info.name}: cannot read ({exc.strerror}); {repair_hint(self.root)}") from None
            if size != info.bytes:
                raise ShardError(
                    f"shard {info.name}: {size} bytes on disk, the manifest says {info.bytes} "
                    f"(truncated or changed); {repair_hint(self.root)}"
                )

    def __len__(self) -> int:
        return int(self.starts[-1])

    def file(self, shard: int) -> ShardFile:
        """Shard number ``shard`` of this split, opened (and checked) on first use."""
        opened = self._files[shard]
        if opened is None and self.remote is not None:
            fresh = self._open(shard)  # may download: outside the lock, so the fetches ahead go on meanwhile
            with self._lock:
                opened = self._files[shard]
                if opened is None:
                    self._files[shard] = opened = fresh
                    return opened
            fresh.close()  # another thread opened it first
            return opened
        if opened is None:
            with self._lock:
                opened = self._files[shard]
                if opened is None:
                    opened = self._open(shard)
                    try:
                        self._check_same_set()
                    except ShardError:
                        opened.close()
                        raise
                    self._files[shard] = opened
        return opened

    def _check_same_set(self) -> None:
        """The set on disk is still the one opened: a shard opened after a re-pack must not mix in.

        A pack's identity is its manifest (it lists every shard's SHA-256). The check
        runs after a shard is opened, so a re-pack that swaps the set in between is seen.
        """
        if self.remote is not None:
            return
        stamp = _manifest_stamp(Path(self.root))
        if stamp == self._stamp:
            return
        try:
            current = Manifest.load(self.root)
        except ShardError:
            current = None
        if current != self.manifest:
            raise ShardError(
                f"{self.root}: the shard set was re-packed or replaced while it was open (its manifest changed); "
                "open it again to read the new set"
            )
        self._stamp = stamp

    def _open(self, shard: int) -> ShardFile:
        info = self.infos[shard]
        if self.remote is None or self.cache is None:
            return ShardFile(self.root, info, self.schema, len(self.manifest.classes))
        holder = self._pins.pop(shard, None)
        if holder is not None and not self.cache.has(info):  # changed since it was pinned: check it again
            holder.close()
            holder = None
        if holder is None:
            held = self.cache.hold(self.remote, info, wait=False)  # checked, or downloaded and verified, and held
            if held is None:  # no room: let go of what this reader holds for later first, then wait for room
                self._waiting += 1  # and pin nothing ahead meanwhile (fetch)
                try:
                    self._let_go_but(shard)
                    held = self.cache.hold(self.remote, info)
                finally:
                    self._waiting -= 1
            if held is None:  # only a hold that does not wait gives None
                raise ShardError(f"shard {info.name}: no room in the cache {self.cache.root}")
            holder = held[1]
        try:
            return ShardFile(self.root, info, self.schema, len(self.manifest.classes), path=self.cache.path_of(info), holder=holder)
        except BaseException:
            holder.close()
            raise

    def is_open(self, shard: int) -> bool:
        """True when shard number ``shard`` is open (memory-mapped) in this process."""
        return self._files[shard] is not None

    def _let_go_but(self, shard: int) -> None:
        """Let go of every pinned shard and (a split larger than its cache, read a shard at a time) every open one but ``shard``.

        What a read does before it waits for room, so that readers waiting for each
        other never hold the room they wait for.
        """
        with self._lock:
            pins, self._pins = self._pins, {}
            others = [s for s, f in enumerate(self._files) if f is not None and s != shard] if self.tight else []
        for pin in pins.values():
            pin.close()
        for s in others:
            self.release(s)

    def local_path(self, shard: int) -> Path:
        """Where shard ``shard``'s bytes are on this machine: its file, or (a remote set) its verified cache copy, fetched if need be.

        The copy is not pinned: a reader that must keep it opens the shard instead.
        """
        info = self.infos[shard]
        if self.remote is None or self.cache is None:
            return Path(self.root) / info.name
        self.fetch(shard, pin=False)
        return self.cache.path_of(info)

    def fetch(self, shard: int, wait: bool = True, pin: bool = True) -> bool:
        """Make sure shard number ``shard`` is on local disk, and (a remote set) held in the cache until read.

        A remote shard is checked or downloaded into the cache and pinned there: no
        reader evicts it until this set opens it or lets go of it (:meth:`release`).

        Args:
            wait: wait for room in the cache's limit; False returns False instead.
            pin: hold it until read; False only downloads it (evictable, least recently used last).

        Returns:
            True when the shard is there (and pinned); False when ``wait`` is False and
            the cache has no room for it now.
        """
        info = self.infos[shard]
        if self.remote is None or self.cache is None:
            return True
        with self._lock:
            if self._files[shard] is not None or shard in self._pins:
                return True
        if not wait and self._waiting:  # a read of this set waits for room: it pins nothing meanwhile
            return False
        held = self.cache.hold(self.remote, info, wait=wait)
        if held is None:
            return False
        if not pin:
            held[1].close()
            return True
        with self._lock:
            if self._files[shard] is None and shard not in self._pins:
                self._pins[shard] = held[1]
                return True
        held[1].close()  # another thread got there first
        return True

    def prefetch(self, shards: list[int] | None = None, workers: int = 4) -> None:
        """Fetch several shards of a remote set into the cache at once (all of the split by default), pinned there.

        Nothing is fetched when they do not fit in the cache's limit together (each is
        fetched when first read instead).
        """
        if self.remote is None or self.cache is None:
            return
        todo = list(range(len(self.infos))) if shards is None else shards
        room = self.cache.shard_room
        if room is not None and sum(entry_cost(self.infos[s].bytes) for s in todo) > room:
            return  # they would evict each other
        todo = [s for s in todo if not self.is_open(s)]  # an open shard is held already (a stream's fetch threads open them)
        if workers <= 1 or len(todo) <= 1:
            for s in todo:
                self.fetch(s)
            return
        with ThreadPoolExecutor(min(workers, len(todo)), thread_name_prefix="stoker-fetch") as pool:
            for _ in pool.map(self.fetch, todo):
                pass

    def release(self, shard: int, done: bool = False) -> None:
        """Close shard number ``shard`` (and let go of its cache entry) if it is not laid out for random reads.

        ``done``: this reader will not read it again (a remote set's cache evicts it first).
        """
        if done and self.cache is not None and self.tight:
            self.cache.mark_done(self.infos[shard])
        with self._lock:
            pin = self._pins.pop(shard, None)
            opened = self._files[shard]
            if opened is not None and self._segment_starts is None:
                self._files[shard] = None
            else:
                opened = None
        if pin is not None:
            pin.close()
        if opened is not None:
            opened.close()

    def done_with(self, shard: int) -> None:
        """After a read of a remote split larger than its cache took what it needs of ``shard``: let go of it, unless kept.

        A split larger than its cache is read a shard at a time (so a read never holds
        more than one shard), and each shard is let go after its part of the read unless
        it is in :attr:`keep` (a stream keeps the shards it reads again soon). So random
        reads hold the cache's limit too; the first time, a warning says which limit
        would hold the whole split.
        """
        if not self.tight:
            return
        quiet = self.streaming or self.in_blocks
        if not quiet and not self._warned_tight and self.cache is not None and self.cache.limit is not None:
            self._warned_tight = True
            log.warning(
                "%s: the split %r takes %s bytes in the cache, more than its limit of %s: random reads fetch "
                "shards again each time they come back; the smallest limit that fetches each shard once is %s "
                "(--cache-limit, STOKER_CACHE_LIMIT), or shuffle it in blocks the cache holds (shuffle_scope='auto' or "
                "'blocks', --shuffle-scope), or read it with ShardStream",
                self.root, self.split, f"{self.cache_bytes:,}", f"{self.cache.limit:,}", f"{self.cache_bytes:,}",
            )
        if shard not in self.keep:
            self.release(shard)

    def download_bytes(self) -> int:
        """Bytes reading this split would download (0 for a local set)."""
        if self.cache is None:
            return 0
        return self.cache.missing_bytes(self.infos)

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard number, row within the shard) of each sample index.

        Raises:
            IndexError: an index is outside ``0 .. len - 1``.
        """
        n = len(self)
        if len(indices) and (indices.min() < 0 or indices.max() >= n):
            bad = int(indices[(indices < 0) | (indices >= n)][0])
            raise IndexError(f"sample index {bad} is out of range for split {self.split!r} of {n} samples")
        shard = np.searchsorted(self.starts, indices, side="right") - 1
        return shard, indices - self.starts[shard]

    def _one_shard(self, indices: np.ndarray) -> tuple[int, np.ndarray] | None:
        """``(shard, rows)`` when every index is in one shard (sequential reading), else None."""
        shard, rows = self.locate(indices)
        if len(indices) and shard[0] == shard[-1] and (shard == shard[0]).all():
            return int(shard[0]), rows
        return None

    def _open_all(self) -> None:
        """Open every shard and lay their record batches end to end (for random reads)."""
        if self._segment_starts is not None:
            return
        self.prefetch()  # a remote set: download the missing shards side by side
        starts, views, labels = [], [], []
        for s in range(len(self.infos)):
            opened = self.file(s)
            first_rows, pixels = opened.pixel_segments
            if pixels:
                starts.extend((first_rows + self.starts[s]).tolist())
                views.extend(pixels)
            labels.append(opened.labels)
        self._labels = np.concatenate(labels)
        self._segment_views = views
        self._span = RowSpan(views, self.row_bytes) if any(len(v) for v in views) else None
        self._segment_starts = np.asarray(starts, dtype=np.int64)

    def read_batch(self, indices: np.ndarray, threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(read_labels(indices), gather_pixels(indices, threads))``, with one look-up of where the samples are.

        What a batch read in the training process calls: the look-up (range check, shard
        of each sample) is done once for both.
        """
        if not self.row_bytes:
            raise ConfigError("this shard set stores encoded images; decode them with read_encoded")
        one = self._one_shard(indices)  # checks the indices
        return self._labels_of(indices, one), self._pixels_of(indices, one, threads)

    def read_labels(self, indices: np.ndarray) -> np.ndarray:
        """The labels of the given samples (``int64``)."""
        return self._labels_of(indices, self._one_shard(indices))

    def _labels_of(self, indices: np.ndarray, one: tuple[int, np.ndarray] | None) -> np.ndarray:
        """:meth:`read_labels`, where ``one`` is what :meth:`_one_shard` found for ``indices``."""
        if one is not None:
            return self.file(one[0]).labels[one[1]]
        if len(indices) == 0:
            return np.zeros(0, dtype=np.int64)
        if self._by_shard():
            shard, rows = self.locate(indices)  # a remote stream: open only the shards it reads
            out = np.empty(len(indices), dtype=np.int64)
            for s in np.unique(shard).tolist():
                mask = shard == s
                out[mask] = self.file(s).labels[rows[mask]]
            return out
        self._open_all()
        return self._labels[indices]  # type: ignore[index]

    def read_pixels(self, indices: np.ndarray, out: np.ndarray, threads: int | None = None) -> None:
        """Copy the pixel rows of the given samples into ``out`` (``len(indices) x 3*H*W`` uint8).

        Every row is copied once, straight from the memory-mapped shard into ``out``. A
        batch is cut into parts of about :data:`GATHER_SPLIT_BYTES` that up to ``threads``
        threads copy at the same time (numpy and torch release the GIL while they copy), so a
        gather is not bound by one core's copy rate.

        Args:
            indices: sample numbers of this split, any order, repeats allowed.
            out: ``uint8 [len(indices), 3*H*W]``, filled in the order of ``indices``.
            threads: copying threads; ``None`` takes :attr:`gather_threads` (``None``: :func:`idle_copy_threads`).
        """
        if not self.row_bytes:
            raise ConfigError("this shard set stores encoded images; decode them with read_encoded")
        if len(indices) == 0:
            return
        threads = self._copy_threads(threads)
        one = self._one_shard(indices)
        if one is not None:
            shard, rows = one
            opened = self.file(shard)
            split_copy(len(rows), threads, self.row_bytes, lambda lo, hi: opened.take_pixels(rows[lo:hi], out[lo:hi]))
            return
        if self._by_shard():
            views, segment, local = self._open_segments(indices)  # a remote set: open only the shards it reads
            span = RowSpan(views, self.row_bytes)
        else:
            segment, local = self._segments(indices)
            span = cast(RowSpan, self._span)  # _segments opened every shard and made it
        span.take(segment, local, out, threads)

    def gather_pixels(self, indices: np.ndarray, threads: int | None = None) -> np.ndarray:
        """The pixel rows of the given samples as a ``uint8 [len(indices), 3*H*W]`` array, in the order of ``indices``.

        The fastest read in the training process. Rows from any number of shards and
        record batches are reached through one span of their memory maps
        (:class:`RowSpan`). Where every row sits a whole number of rows from the first
        (one record batch, or maps that line up), ``np.take`` copies them, on up to
        ``threads`` threads, into a buffer this set hands out again once nothing holds it
        (:class:`BatchBuffers`: a fresh buffer per batch costs a kernel-zeroed page per 4
        KiB); otherwise, on one thread, one numpy fancy index copies them into a new array, at
        parity with one fancy index over a single memory-mapped array, and on several,
        ``torch.index_select`` parts copy them into the reused buffer. A returned batch that is still
        referenced (the array, a view of it, a tensor made from it) is never overwritten.
        Use :meth:`read_pixels` to fill a buffer of your own (a worker's shared memory).

        Args:
            indices: sample numbers of this split, any order, repeats allowed.
            threads: copying threads; ``None`` takes :attr:`gather_threads` (``None``: :func:`idle_copy_threads`).
        """
        if not self.row_bytes:
            raise ConfigError("this shard set stores encoded images; decode them with read_encoded")
        return self._pixels_of(indices, self._one_shard(indices), threads)  # _one_shard checks the indices

    def _pixels_of(self, indices: np.ndarray, one: tuple[int, np.ndarray] | None, threads: int | None) -> np.ndarray:
        """:meth:`gather_pixels`, where ``one`` is what :meth:`_one_shard` found for ``indices`` (checked)."""
        threads = self._copy_threads(threads)
        if len(indices) == 0:
            return self._buffers.take((0, self.row_bytes))
        if one is not None:  # one shard (a sequential read): the indices already located
            return self.file(one[0]).gather_pixels(one[1], self._buffers.take, threads)
        if self._by_shard():  # a remote set: only the shards it reads
            views, segment, local = self._open_segments(indices)
            span = RowSpan(views, self.row_bytes)
        else:
            segment, local = self._segments(indices)
            span = cast(RowSpan, self._span)  # _segments opened every shard and made it
        return gather_span(span, segment, local, self._buffers.take, threads)

    def _copy_threads(self, threads: int | None) -> int:
        """The copying threads of one read: as asked, else :attr:`gather_threads`, else as the machine's load allows."""
        chosen = threads if threads is not None else self.gather_threads
        return idle_copy_threads() if chosen is None else max(1, int(chosen))

    def _by_shard(self) -> bool:
        """True while a remote set is read only from the shards each read needs.

        That is until every shard is open (a stream's first epoch), unless the split is
        larger than its cache; then the shards are laid end to end, as a local set's are.
        """
        if self.remote is None or self._segment_starts is not None:
            return False
        if self.tight or any(f is None for f in self._files):
            return True
        self._open_all()
        return False

    def _open_segments(self, indices: np.ndarray) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """(record batch views, record batch of each sample, row within it) over only the shards the samples are in.

        What a remote set reads with instead of laying every shard end to end (which
        would hold every shard in the cache at once).
        """
        shard_ids, rows = self.locate(indices)
        views: list[np.ndarray] = []
        segment = np.empty(len(indices), dtype=np.int64)
        local = np.empty(len(indices), dtype=np.int64)
        for s in np.unique(shard_ids).tolist():
            first_rows, pixels = self.file(s).pixel_segments
            mask = shard_ids == s
            r = rows[mask]
            chunk = np.searchsorted(first_rows, r, side="right") - 1
            segment[mask] = chunk + len(views)
            local[mask] = r - first_rows[chunk]
            views.extend(pixels)
        return views, segment, local

    def _segments(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(record batch, row within it) of each sample, every shard open and laid end to end."""
        self._open_all()
        starts = cast(np.ndarray, self._segment_starts)  # set by _open_all
        segment = np.searchsorted(starts, indices, side="right") - 1
        return segment, indices - starts[segment]

    def checked_bytes(self, shard: int, row: int) -> tuple[np.ndarray, str, Box | None]:
        """Row ``row`` of shard ``shard``: its encoded bytes (checked against their CRC-32), a name for messages, its crop box.

        Raises:
            DecodeError: the bytes do not match their CRC-32 (the shard is damaged).
            ShardError: the row names a source the manifest does not list.
        """
        opened = self.file(shard)
        source, file = opened.origin(row)
        if source not in self.crops:
            raise ShardError(
                f"shard {opened.info.name} row {row}: source {source!r} is not in the manifest; {repair_hint(self.root)}"
            )
        data = opened.encoded(row)
        name = f"shard {opened.info.name} row {row}: {source}/{file}"
        # Check the bytes before a decoder sees them: damaged bytes are an error here, not a
        # crash in the image library (torchvision's PNG decoder segfaults on some).
        # ndarray has the buffer protocol; numpy's stubs declare __buffer__ only for Python >= 3.12
        if zlib.crc32(data) != int(opened.crc32()[row]):  # type: ignore[arg-type]
            raise DecodeError(f"{name}: image bytes do not match their CRC-32 (the shard is damaged); {repair_hint(self.root)}")
        return data, name, self.crops[source]

    def decode(self, shard: int, row: int, resized: bool = True) -> torch.Tensor:
        """Row ``row`` of shard number ``shard``, decoded, cropped and (``resized``) resized to the set's image size.

        Raises:
            DecodeError: the image does not decode (the message names shard, row and file).
            ShardError: the row names a source the manifest does not list.
        """
        data, name, box = self.checked_bytes(shard, row)
        size = self.manifest.image_size if resized else None
        return decode_stored(data, name, box, size, self.reduced_jpeg)  # the decode `stoker verify` checks

    def decode_checked(self, data: np.ndarray, name: str, box: Box | None, resized: bool = True) -> torch.Tensor:
        """Bytes :meth:`checked_bytes` returned, decoded by the full path, cropped and (``resized``) resized.

        Raises:
            DecodeError: the image does not decode (the message names ``name``).
        """
        return decode_stored(data, name, box, self.manifest.image_size if resized else None, reduced=False)

    def read_encoded(self, index: int) -> tuple[np.ndarray, int, int]:
        """One sample's encoded bytes (a read-only view), its shard number and its row."""
        shard, rows = self.locate(np.asarray([index], dtype=np.int64))
        s, r = int(shard[0]), int(rows[0])
        return self.file(s).encoded(r), s, r

    def row_info(self, index: int) -> dict[str, Any]:
        """Where sample ``index`` is and where it came from: shard, row, key, source, file, label."""
        shard, rows = self.locate(np.asarray([index], dtype=np.int64))
        s, r = int(shard[0]), int(rows[0])
        opened = self.file(s)
        source, file = opened.origin(r)
        return {
            "shard": self.infos[s].name,
            "row": r,
            "key": opened.value("key", r),
            "source": source,
            "file": file,
            "label": int(opened.labels[r]),
        }

    def all_labels(self) -> np.ndarray:
        """Every sample's label, in order (opens every shard of the split; a split larger than its cache one at a time)."""
        if self.tight and self._segment_starts is None:
            labels = []
            for s in range(len(self.infos)):
                labels.append(self.file(s).labels.copy())
                self.release(s)
            return np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)
        self._open_all()
        return self._labels  # type: ignore[return-value]

    def close(self) -> None:
        """Unmap every open shard (and let go of every shard held in the cache)."""
        files, pins = self._files, self._pins
        self._reset()
        for pin in pins.values():
            pin.close()
        for opened in files:
            if opened is not None:
                opened.close()

    def __getstate__(self) -> dict[str, Any]:
        # Memory maps do not cross processes: the copy reopens the files where it runs.
        state = {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_files", "_pins", "_segment_starts", "_segment_views", "_span", "_labels", "_buffers")}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._reset()
