"""``ShardDataset``: a map-style torch Dataset over one split of a shard set, read a batch at a time."""

from __future__ import annotations

import copy
import logging
import math
import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate, get_worker_info

from stoker.decode.device import Ready, device_decoder
from stoker.decode.image import is_png, png_decoder
from stoker.decode.jpeg import decode_batch_on_device, decode_jpeg_resized, decode_jpegs_into, is_jpeg
from stoker.errors import ConfigError, DataError
from stoker.fs import PathOrURL
from stoker.loading.collate import Batch, collate
from stoker.loading.contract import (
    MapReader,
    SupportsCollate,
    SupportsEpoch,
    SupportsLoaderDefaults,
    SupportsShuffleBlocks,
)
from stoker.loading.skips import OnError, Skipped
from stoker.loading.workers import machine_workers
from stoker.order import ShuffleBlocks, ShuffleScope
from stoker.shards.cache.entries import entry_cost
from stoker.shards.format.manifest import Manifest
from stoker.shards.read.reader import ShardSet
from stoker.types import Transform

__all__ = ["DECODERS", "Decoder", "SNIFF_ROWS", "ShardBatch", "ShardDataset", "collate_shard_batch", "load_shard_image"]
Decoder = Literal["auto", "full", "nvjpeg"]
DECODERS: tuple[Decoder, ...] = ("auto", "full", "nvjpeg")  # how encoded shards decode (ShardDataset's decoder=)
SNIFF_ROWS = 16  # rows read to tell what an encoded set holds (ShardDataset.mostly_jpeg)
GPU_TRIALS = 2  # timed decodes of the first batch on each side when decoder="auto" has a CUDA device

log = logging.getLogger(__name__)
_choosing = threading.Lock()  # one measurement per data set, whichever loader thread gets the first batch
_said_no_cuda = threading.Event()  # decoder="nvjpeg" on a CUDA device this torch lacks: said once per process


def _empty_uint8(shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialised uint8 tensor for a batch.

    In a DataLoader worker it is made in shared memory, as torch's own collate does, so
    sending it to the main process copies nothing more. Elsewhere numpy allocates it:
    numpy asks the kernel for huge pages for large arrays, which halves the cost of
    touching a fresh batch-sized buffer.
    """
    if get_worker_info() is not None and hasattr(torch.UntypedStorage, "_new_shared"):
        storage = torch.UntypedStorage._new_shared(math.prod(shape))
        return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)
    return torch.from_numpy(np.empty(shape, dtype=np.uint8))


def load_shard_image(shards: ShardSet, index: int) -> torch.Tensor:
    """Sample ``index`` as a uint8 RGB CHW tensor: pixels as stored, or decoded, cropped and resized.

    Raises:
        DecodeError: an encoded image does not decode (the message names shard, row and file).
        ShardError: the row names a source the manifest does not list.
    """
    if shards.row_bytes:
        height, width = shards.manifest.image_size  # type: ignore[misc]
        out = torch.empty((1, shards.channels, height, width), dtype=torch.uint8)
        shards.read_pixels(np.asarray([index], dtype=np.int64), out.numpy().reshape(1, -1))
        return out[0]
    shard, rows = shards.locate(np.asarray([index], dtype=np.int64))
    return shards.decode(int(shard[0]), int(rows[0]))


class ShardBatch(Sequence[Any]):
    """The samples of one batch, gathered by one call; a sequence of ``(image, label)``.

    :meth:`ShardDataset.collate_fn` turns it into a batch without copying again; any
    other collate function (torch's ``default_collate``) sees an ordinary sequence of
    samples and works, only slower.

    Attributes:
        images: ``uint8 [n, 3, H, W]`` when the images share a size and there is no
            per-sample transform, else a list of per-sample results.
        labels: ``int64 [n]``.
        skipped: bad samples dropped under ``on_error="skip"``.
        ready: for images decoded on a CUDA device, the event they are ready at
            (:class:`stoker.decode.device.Ready`); reading :attr:`images` waits for it on the
            reader's stream, and stoker's loader waits for it on the consumer's.
    """

    def __init__(
        self, images: torch.Tensor | list[Any], labels: torch.Tensor, skipped: list[Skipped], ready: Ready | None = None
    ) -> None:
        self._images = images
        self.labels = labels
        self.skipped = skipped
        self.ready = ready

    @property
    def images(self) -> torch.Tensor | list[Any]:
        """The images, once ready on the current stream (see ``ready``)."""
        if self.ready is not None:
            self.ready.wait()
        return self._images

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, j: int) -> tuple[Any, int]:  # type: ignore[override]
        return self.images[j], int(self.labels[j])

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        # All the views in one call and all the labels in one call: a stream hands its samples out
        # one by one through this, and indexing the two tensors per sample was about a third of a
        # pass over pixel shards (2,000 samples of 32x32: ~4 of 13 ms).
        images = self.images.unbind(0) if isinstance(self.images, torch.Tensor) else self.images
        return zip(images, self.labels.tolist(), strict=True)


def collate_shard_batch(samples: Any) -> Batch:
    """Collate for shard data sets: a :class:`ShardBatch` passes through, anything else is collated.

    Returns a stoker :class:`~stoker.loading.collate.Batch` whose ``data`` is
    ``(images, labels)``; stoker's loader unwraps it and counts skipped samples.
    """
    if not isinstance(samples, ShardBatch):
        return collate(samples)
    if len(samples) == 0:
        return Batch(None, 0, samples.skipped)
    images = samples._images  # not waited for here: the loader waits on the consumer's stream (Batch.ready)
    if isinstance(images, list):
        images = default_collate(images)
    return Batch((images, samples.labels), len(samples), samples.skipped, samples.ready)


class ShardDataset(Dataset, MapReader, SupportsEpoch, SupportsCollate, SupportsLoaderDefaults, SupportsShuffleBlocks):
    """A map-style torch Dataset over one split of a shard set made by ``stoker pack``.

    Under :func:`stoker.make_loader` (or any torch DataLoader) the sampler shuffles exactly
    over the whole split, and :meth:`__getitems__` gathers a batch's rows straight from the
    memory-mapped shards (pixel shards decode nothing; encoded ones decode, crop and resize).
    Opening checks the manifest (with its checksum) and every shard's size, and runs no code.

    Args:
        root, split: the folder ``stoker pack`` wrote (or its URL), and which split to read.
        transform: applied to each uint8 CHW image (per sample); leave it out for the fastest path.
        on_error: ``"raise"`` (default) or ``"skip"`` samples that fail to decode (counted by the loader).
        cache_dir, cache_limit, storage_options: for a set at a URL: the verified local cache,
            its size limit (``"50GB"``) and the fsspec options (:class:`~stoker.shards.read.reader.ShardSet`).
        decoder, decode_device: how encoded images decode: ``"auto"`` (default; tries the GPU when the loader's
            batches go to CUDA), ``"full"`` (the reference) or ``"nvjpeg"`` on ``decode_device`` (guides/shards.md).

    Raises:
        ShardError: the manifest or a shard is missing, edited, truncated or grown.
        ConfigError: the set has no such split.

    Example:
        >>> from stoker import make_loader
        >>> images, labels = next(iter(make_loader(ShardDataset("packed", split="train"), batch_size=8)))
        >>> images.shape, images.dtype, labels.dtype
        (torch.Size([8, 3, 32, 32]), torch.uint8, torch.int64)
    """

    def __init__(
        self,
        root: PathOrURL,
        split: str = "train",
        transform: Transform | None = None,
        on_error: OnError = "raise",
        *,
        decoder: Decoder = "auto",
        decode_device: str | torch.device = "cuda",
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if decoder not in DECODERS:
            raise ConfigError(f"decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
        self.shards = ShardSet(
            root, split, cache_dir=cache_dir, cache_limit=cache_limit, storage_options=storage_options
        )
        self.shards.reduced_jpeg = decoder != "full"
        self.transform = transform
        self.on_error: OnError = on_error
        self.decoder: Decoder = decoder
        self.decode_device = str(decode_device)
        self._rows: np.ndarray | None = None  # a view of some rows of the split (subset, split)
        self._mostly_jpeg: bool | None = None  # what the shards hold (mostly_jpeg), once known
        self._mostly_spng: bool | None = None  # mostly JPEG or PNG, with libspng for the PNGs (decodes_on_threads)
        self._choice: dict[str, Any] | None = None  # decoder="auto" on a CUDA device: what it measured and chose
        self._said_blocks = False  # the block shuffle is said once (shuffle_blocks)
        self._read_for: frozenset[str] = frozenset()  # the device types the loaders made over it send batches to

    # -- what the set holds ---------------------------------------------------------
    @property
    def root(self) -> str:
        """The shard set folder."""
        return str(self.shards.root)

    @property
    def split(self) -> str:
        """The split this data set reads."""
        return self.shards.split

    @property
    def manifest(self) -> Manifest:
        """The shard set's manifest."""
        return self.shards.manifest

    @property
    def store(self) -> str:
        """``"encoded"`` or ``"pixels"``."""
        return self.shards.manifest.store

    @property
    def channels(self) -> int:
        """Channels of every image read: 3 (RGB), or 1 for a gray pixels set (``--channels 1``)."""
        return self.shards.channels

    @property
    def image_size(self) -> tuple[int, int] | None:
        """``(height, width)`` of every image read, or ``None`` (encoded, each at its own size)."""
        return self.shards.manifest.image_size

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names; ``classes[label]`` names a label."""
        return self.shards.manifest.classes

    @property
    def num_classes(self) -> int:
        """Number of classes."""
        return len(self.shards.manifest.classes)

    @property
    def labels(self) -> np.ndarray:
        """Every sample's label, in order (``int64``)."""
        labels = self.shards.all_labels()
        return labels if self._rows is None else labels[self._rows]

    def subset(self, indices: Sequence[int] | np.ndarray) -> ShardDataset:
        """A view of the given samples of this data set, in that order (no copy of the shards).

        The view keeps everything the full set has — storage mode, loader defaults,
        transform, bad-sample policy — so a loader reads it as fast as the whole set.
        """
        rows = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"subset: sample indices must be in 0..{len(self) - 1}")
        view = copy.copy(self)
        view._rows = rows if self._rows is None else self._rows[rows]
        return view

    def with_decoder(self, decoder: Decoder) -> ShardDataset:
        """This data set read with another ``decoder`` (what a ``stoker tune`` file recorded), the rest as it is.

        Raises:
            ConfigError: not one of :data:`DECODERS`.
        """
        if decoder not in DECODERS:
            raise ConfigError(f"decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
        view = copy.copy(self)
        view.decoder, view._choice = decoder, None
        if (decoder != "full") != self.shards.reduced_jpeg:  # the shard set's own switch: on a copy of it
            view.shards = copy.copy(self.shards)
            view.shards.reduced_jpeg = decoder != "full"
        return view

    @property
    def loader_defaults(self) -> dict[str, Any]:
        """The loader settings that measured fastest for this storage mode (``docs/benchmarks.md``).

        Pixel shards are read in the training process itself (``num_workers=0``): a batch is
        one numpy fancy index over the memory-mapped files (:meth:`ShardSet.gather_pixels`),
        and shipping it from a worker process costs more than reading it. Encoded shards use
        the machine's share of loader workers (:mod:`stoker.loading.workers`): threads where
        the decoder releases the GIL (JPEGs, and PNGs under libspng: :func:`stoker.decode.image.png_decoder`; judged from
        the first rows, :meth:`decodes_on_threads`), else worker processes, as with a
        per-sample ``transform`` (it holds the GIL). ``decoder="nvjpeg"`` decodes on the GPU
        from one loader thread.

        Example:
            >>> from stoker import make_loader
            >>> ds = ShardDataset("packed", split="train")
            >>> ds.loader_defaults  # a pixel shard set
            {'backend': 'process', 'num_workers': 0}
            >>> loader = make_loader(ds, batch_size=8, **ds.loader_defaults)
        """
        if self.store == "pixels":
            return {"backend": "process", "num_workers": 0}
        if self.decoder == "nvjpeg":
            return {"backend": "thread", "num_workers": 1}
        # A per-sample Python transform holds the GIL: then worker processes, as before.
        backend = "thread" if self.transform is None and self.decodes_on_threads() else "process"
        return {"backend": backend}  # the workers: the machine's share (make_loader's rule)

    @property
    def decode_choice(self) -> dict[str, Any] | None:
        """What ``decoder="auto"`` chose on a CUDA device, and the rates it measured; None until it chose.

        ``{"decoder": "gpu" or "cpu", "gpu_img_per_s", "cpu_img_per_s", "cpu_threads", "engine", "device",
        "batch", "reason"}``, set when the first batch is read; it stays None where there is nothing to
        choose (no CUDA device, not mostly JPEG, another ``decoder``).
        """
        return self._choice

    def read_for(self, device: torch.device) -> None:
        """Where the batches of a loader made over this set go (:func:`~stoker.make_loader` says, for every loader).

        ``decoder="auto"`` may decode on the GPU only while every loader made over the set sends its batches to a
        CUDA device (a run that trains on the CPU never decodes on the GPU and copies back). Loaders that disagree (a
        CUDA one and a CPU one) all decode on the CPU from then on, said once; a set read by no loader may try the GPU.
        """
        kind, before = torch.device(device).type, self._read_for
        self._read_for = before | {kind}
        mixed = "cuda" in self._read_for and len(self._read_for) > 1
        if mixed and not ("cuda" in before and len(before) > 1):
            log.warning(
                "%s split %r: loaders over this data set send their batches to %s, so decoder='auto' decodes on the "
                "CPU for all of them; to decode on the GPU for the CUDA loader, give each loader its own "
                "ShardDataset", self.root, self.split, " and ".join(sorted(self._read_for)),
            )

    def _on_gpu(self, blobs: list[np.ndarray], boxes: list[Any], size: tuple[int, int]) -> bool:
        """``decoder="auto"``: whether this batch decodes on the GPU (measured on the first batch, once).

        Only in the process that trains: a DataLoader worker process never starts CUDA; and only for batches that
        go to a CUDA device, for every loader made over the set (:meth:`read_for`).
        """
        if self.decoder != "auto" or get_worker_info() is not None:
            return False
        if self._read_for and self._read_for != {"cuda"}:
            return False
        if self._choice is None:
            device = torch.device(self.decode_device)
            if device.type != "cuda" or not torch.cuda.is_available() or not self.mostly_jpeg():
                return False
            with _choosing:
                if self._choice is None:
                    self._choice = self._measure_decoders(blobs, boxes, size, device)
        return self._choice["decoder"] == "gpu"

    def _measure_decoders(
        self, blobs: list[np.ndarray], boxes: list[Any], size: tuple[int, int], device: torch.device
    ) -> dict[str, Any]:
        """Decode one batch on the CPU path and on the GPU (after a warm-up); the GPU is chosen when it decodes
        at least as fast as the CPU path on all the loader threads the set would use (cores per thread as measured).
        """
        from stoker.decode.device import device_decoder

        def blank(k: int) -> torch.Tensor:  # the rows the device refuses cost the same either way: not timed
            return torch.zeros((3, *size), dtype=torch.uint8)

        out = torch.empty((len(blobs), 3, *size), dtype=torch.uint8)
        cpu_s = gpu_s = math.inf
        for _ in range(GPU_TRIALS):
            start = time.perf_counter()
            decode_jpegs_into(blobs, boxes, size, out)
            cpu_s = min(cpu_s, time.perf_counter() - start)
        try:
            decoder = device_decoder(device)
            for trial in range(GPU_TRIALS + 1):  # the first call starts the decoder and its CUDA context: not timed
                start = time.perf_counter()
                decoded = decoder.decode(blobs, boxes, size, blank)
                if decoded.ready is not None:
                    decoded.ready.event.synchronize()
                if trial:
                    gpu_s = min(gpu_s, time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 - a device that cannot decode (driver, memory): the CPU path, said so
            reason = f"the GPU decode failed on {device} ({type(exc).__name__}: {exc})"
            log.warning("decoder='auto' decodes %s on the CPU: %s", self.root, reason)
            return {"decoder": "cpu", "gpu_img_per_s": None, "cpu_img_per_s": None, "cpu_threads": None,
                    "engine": None, "device": str(device), "batch": len(blobs), "reason": reason}
        threads = max(1, machine_workers(accelerator=True, backend="thread"))  # the CPU path's loader threads
        n = max(len(blobs), 1)
        gpu_rate, cpu_rate = n / max(gpu_s, 1e-9), n / max(cpu_s, 1e-9) * threads
        chosen = "gpu" if gpu_rate >= cpu_rate else "cpu"
        reason = (f"first batch: {gpu_rate:,.0f} img/s on {device} ({decoder.engine}) vs {cpu_rate:,.0f} img/s "
                  f"on {threads} CPU loader thread(s)")
        log.info("decoder='auto' decodes %s on the %s (%s)", self.root, chosen.upper(), reason)
        return {"decoder": chosen, "gpu_img_per_s": round(gpu_rate, 1), "cpu_img_per_s": round(cpu_rate, 1),
                "cpu_threads": threads, "engine": decoder.engine, "device": str(device), "batch": len(blobs),
                "reason": reason}

    def shuffle_blocks(self, scope: ShuffleScope) -> ShuffleBlocks | None:
        """How a shuffle of ``scope`` groups this split's shards (see :func:`stoker.order.block_permutation`).

        A split at a URL that does not fit its cache limit (:attr:`ShardSet.tight`) read in a
        plain shuffle meets each shard again and again, and fetches it each time. Its shuffle
        (``"auto"``, or ``"blocks"`` with any limit) goes instead in blocks of shards that take
        at most half the cache's room, so that the block being read and the next fit at once
        (ranks and workers reach a block's end apart): each shard is fetched once per epoch.
        The first time, a warning says the block size. ``"split"`` and a split the cache
        holds whole: None (one shuffle of the whole split). A view (:meth:`subset`, the
        training part of a split held out for validation) groups its own rows by shard.

        Raises:
            ConfigError: ``"blocks"`` for a local set or a cache without a limit.
        """
        if scope == "split":
            return None
        room = self.shards.cache.shard_room if self.shards.cache is not None else None
        if scope == "auto" and (room is None or not self.shards.tight):
            return None
        if room is None:
            raise ConfigError(
                f"{self.root} ({self.split}): shuffle_scope='blocks' (--shuffle-scope blocks) groups the shards a "
                "cache limit holds; this split is read without one: use 'auto' or 'split', or give a cache limit "
                "(cache_limit=, --cache-limit)"
            )
        infos = self.shards.infos
        costs = tuple(entry_cost(i.bytes) for i in infos)
        if self._rows is None:
            blocks = ShuffleBlocks(tuple(i.samples for i in infos), costs, max(1, room // 2))
        else:  # a view: its positions, grouped by the shard of the row each reads
            shard_of = self.shards.locate(self._rows)[0]
            sizes = np.bincount(shard_of, minlength=len(infos))
            blocks = ShuffleBlocks(tuple(int(k) for k in sizes), costs, max(1, room // 2),
                                   positions=np.argsort(shard_of, kind="stable"))
        self.shards.in_blocks = True
        if not self._said_blocks:
            self._said_blocks = True
            count = len(blocks.blocks(np.arange(len(infos))))
            unshuffled = self.manifest.made_by.get("shuffle") is False
            log.warning(
                "%s: the split %r takes %s bytes in the cache, its limit holds %s: it is shuffled in blocks of shards "
                "of at most %s bytes (%d blocks of about %d of its %d shards), each shard fetched once per epoch; "
                "%sshuffle_scope='split' (--shuffle-scope split) shuffles the whole split and fetches shards again, "
                "a larger limit (--cache-limit, STOKER_CACHE_LIMIT) makes larger blocks",
                self.root, self.split, f"{self.shards.cache_bytes:,}", f"{room:,}", f"{blocks.budget:,}", count,
                -(-len(infos) // max(count, 1)), len(infos),
                "it was packed unshuffled, so a block mixes only the classes of its shards (re-pack it shuffled); "
                if unshuffled else "",
            )
        return blocks

    def decodes_on_threads(self) -> bool:
        """Whether most stored images decode with the GIL released: JPEGs, and PNGs when libspng decodes them.

        Judged by the first :data:`SNIFF_ROWS` rows, as :meth:`mostly_jpeg`.
        """
        if self.store != "encoded" or self.shards.remote is not None or self.mostly_jpeg():
            return True
        if png_decoder() != "libspng":
            return False
        if self._mostly_spng is None:
            n = min(SNIFF_ROWS, len(self.shards))
            heads = [self.shards.read_encoded(i)[0] for i in range(n)]
            self._mostly_spng = 2 * sum(is_png(h) or is_jpeg(h) for h in heads) >= n
        return self._mostly_spng

    def mostly_jpeg(self) -> bool:
        """Whether most stored images are JPEGs, judged by the first :data:`SNIFF_ROWS` rows (read once).

        A packed set is shuffled, so its first rows stand for the rest. A remote set is
        not downloaded only to decide: it counts as JPEG (loader threads).
        """
        if self._mostly_jpeg is None:
            n = min(SNIFF_ROWS, len(self.shards))
            if self.store != "encoded" or self.shards.remote is not None or n == 0:
                self._mostly_jpeg = True
            else:
                jpegs = sum(is_jpeg(self.shards.read_encoded(i)[0]) for i in range(n))
                self._mostly_jpeg = 2 * jpegs >= n
        return self._mostly_jpeg

    def trace(self, i: int) -> dict[str, Any]:
        """Where sample ``i`` lives and came from: shard, row, key, source, file, label."""
        i = self._check_index(i)
        return self.shards.row_info(i if self._rows is None else int(self._rows[i]))

    # -- the torch Dataset protocol ---------------------------------------------------
    def __len__(self) -> int:
        return len(self.shards) if self._rows is None else len(self._rows)

    def _check_index(self, i: int) -> int:
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"sample index {i} is out of range for {len(self)} samples")
        return i

    def __getitem__(self, i: int) -> tuple[Any, int] | Skipped:
        batch = self.__getitems__([self._check_index(i)])
        if batch.skipped:
            return batch.skipped[0]
        return batch[0]

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> ShardBatch:
        """Gather a batch with one call (torch's DataLoader calls this for every batch)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if self._rows is not None:
            idx = self._rows[idx]
        if self.shards.tight:  # a remote split larger than its cache: a shard at a time (see ShardSet.done_with)
            return self._gather_by_shard(idx)
        return self._gather(idx)

    def _gather_by_shard(self, idx: np.ndarray) -> ShardBatch:
        """:meth:`_gather` of each shard's samples in turn, letting go of each shard after its part; in ``idx`` order."""
        shard_ids = self.shards.locate(idx)[0]
        order = np.argsort(shard_ids, kind="stable")
        parts: list[ShardBatch] = []
        for s in dict.fromkeys(shard_ids[order].tolist()):
            try:
                parts.append(self._gather(idx[shard_ids == s]))
            finally:
                self.shards.done_with(s)
        if len(parts) == 1:
            return parts[0]
        # numpy, not torch: torch's thread pool can hang in a forked worker (see _decode_batch)
        labels = np.concatenate([p.labels.numpy() for p in parts])
        skipped = [k for p in parts for k in p.skipped]
        tensors = [p.images for p in parts if isinstance(p.images, torch.Tensor) and p.images.device.type == "cpu"]
        if len(tensors) == len(parts) and len(labels) == len(idx):
            out = _empty_uint8((len(idx), *tensors[0].shape[1:]))
            out_array, in_order = out.numpy(), np.empty(len(idx), dtype=np.int64)
            at = 0
            for part in tensors:  # the parts hold idx[order], a shard after the other
                out_array[order[at : at + len(part)]] = part.numpy()
                at += len(part)
            in_order[order] = labels
            return ShardBatch(out, torch.from_numpy(in_order), skipped)
        images: list[Any] = [image for p in parts for image in p.images]  # skips or per-sample results: by shard
        return ShardBatch(images, torch.from_numpy(labels), skipped)

    def _gather(self, idx: np.ndarray) -> ShardBatch:
        if self.shards.row_bytes:
            height, width = self.image_size  # type: ignore[misc]
            shape = (len(idx), self.shards.channels, height, width)
            if get_worker_info() is None:  # a reused buffer, or one fancy index (ShardSet.read_batch)
                labels, pixels = self.shards.read_batch(idx)
                images = torch.from_numpy(pixels).view(shape)
            else:  # into a worker's shared memory
                labels = self.shards.read_labels(idx)
                images = _empty_uint8(shape)
                self.shards.read_pixels(idx, images.numpy().reshape(len(idx), self.shards.row_bytes))
            if self.transform is None:
                return ShardBatch(images, torch.from_numpy(labels), [])
            return ShardBatch([self.transform(image) for image in images], torch.from_numpy(labels), [])
        return self._decode_batch(idx, self.shards.read_labels(idx))

    def _decode_batch(self, idx: np.ndarray, labels: np.ndarray) -> ShardBatch:
        size = self.image_size
        if size is not None and self.transform is None and self.decoder != "full":
            return self._decode_batch_resized(idx, labels, size)
        shard_ids, rows = self.shards.locate(idx)
        # With a fixed size and no transform each image goes straight into the batch
        # tensor while it is still in the cache; otherwise they are collected.
        out = _empty_uint8((len(idx), 3, *size)) if size is not None and self.transform is None else None
        # numpy copies on this thread; torch would fan each small copy out to its thread
        # pool, which costs more than the copy (and much more on a busy machine).
        out_array = out.numpy() if out is not None else None
        good: list[Any] = []
        keep: list[int] = []
        skipped: list[Skipped] = []
        for j, (s, r) in enumerate(zip(shard_ids.tolist(), rows.tolist(), strict=True)):
            try:
                image = self.shards.decode(s, r)
            except DataError as exc:
                if self.on_error == "raise":
                    raise
                skipped.append(Skipped(f"{self.split}[{int(idx[j])}]", str(exc)))
                continue
            if out_array is not None:
                out_array[len(keep)] = image.numpy()
            else:
                good.append(self.transform(image) if self.transform is not None else image)
            keep.append(j)
        kept_labels = torch.from_numpy(labels[keep] if len(keep) != len(idx) else labels)
        if out is not None:
            return ShardBatch(out[: len(keep)], kept_labels, skipped)
        if self.transform is None and good:
            self._check_same_size(good, idx[keep])
            images = _empty_uint8((len(good), *good[0].shape))
            torch.stack(good, out=images)
            return ShardBatch(images, kept_labels, skipped)
        return ShardBatch(good, kept_labels, skipped)

    def _check_same_size(self, images: list[torch.Tensor], rows: np.ndarray) -> None:
        """Images of one batch that cannot be stacked: the promised error, naming two of them.

        Raises:
            DataError: two images differ in size; names both (shard, row, source file)
                and says to read them at one size (``--image-size``) or re-pack with ``--size``.
        """
        other = next((j for j, image in enumerate(images) if image.shape != images[0].shape), None)
        if other is None:
            return

        def name(j: int) -> str:
            info = self.shards.row_info(int(rows[j]))
            return f"{info['shard']} row {info['row']} ({info['source']}/{info['file']}, {images[j].shape[-2]}x{images[j].shape[-1]})"

        raise DataError(
            f"{self.root} split {self.split!r}: {name(0)} and {name(other)} differ in size, so a batch cannot be "
            "stacked; read the set at one size (stoker train --image-size N; image_size=N for open_data, or a "
            "resizing transform) or re-pack it at one size (stoker pack ... --size HxW)"
        )

    def _say_no_cuda(self) -> None:
        """``decoder="nvjpeg"`` asked for a CUDA device this torch does not have: the CPU decodes, said once per process."""
        with _choosing:
            if _said_no_cuda.is_set():
                return
            _said_no_cuda.set()
        log.warning(
            "%s split %r: decoder='nvjpeg' decodes on %s, but this torch sees no CUDA device "
            "(torch.cuda.is_available() is False), so every image is decoded on the CPU one at a time, slower than "
            "the CPU's batched path; use decoder='auto' (stoker train --decoder auto), which decodes on the GPU only "
            "where there is one, or install a CUDA build of torch", self.root, self.split, self.decode_device,
        )

    def _decode_batch_resized(self, idx: np.ndarray, labels: np.ndarray, size: tuple[int, int]) -> ShardBatch:
        """A batch at the set's image size: JPEGs decoded no more than needed and resized together.

        ``decoder="nvjpeg"`` decodes on the CUDA device (the batch comes back there);
        every image this path cannot take goes by the full path, one at a time.
        """
        shard_ids, rows = self.shards.locate(idx)
        blobs: list[np.ndarray] = []
        boxes: list[Any] = []
        names: list[str] = []
        keep: list[int] = []
        skipped: list[Skipped] = []

        def skip(j: int, exc: DataError) -> None:
            if self.on_error == "raise":
                raise exc
            skipped.append(Skipped(f"{self.split}[{int(idx[j])}]", str(exc)))

        for j, (s, r) in enumerate(zip(shard_ids.tolist(), rows.tolist(), strict=True)):
            try:
                data, name, box = self.shards.checked_bytes(s, r)
            except DataError as exc:
                skip(j, exc)
                continue
            blobs.append(data)
            boxes.append(box)
            names.append(name)
            keep.append(j)
        bad: list[int] = []  # positions in ``keep`` that fail by the full path too
        ready: Ready | None = None  # set when the batch was decoded on a CUDA device

        def full_path(k: int) -> torch.Tensor:  # the bytes were checked above: not again
            return self.shards.decode_checked(blobs[k], names[k], boxes[k])

        if self.decoder == "nvjpeg" or self._on_gpu(blobs, boxes, size):
            device = torch.device(self.decode_device)

            def on_cpu(k: int) -> torch.Tensor:  # the CPU's own path: the fast one where it can, else full
                image = decode_jpeg_resized(blobs[k], size, boxes[k])
                if image is not None:
                    return image
                try:
                    return full_path(k)
                except DataError as exc:
                    skip(keep[k], exc)
                    bad.append(k)
                    return torch.zeros((3, *size), dtype=torch.uint8)

            if device.type == "cuda" and torch.cuda.is_available():
                decoded = device_decoder(device).decode(blobs, boxes, size, on_cpu)
                images, ready = decoded.images, decoded.ready
            else:  # no CUDA: the CPU path, image by image
                if device.type == "cuda":
                    self._say_no_cuda()
                images = decode_batch_on_device(blobs, boxes, size, device, on_cpu)
        else:
            images = _empty_uint8((len(blobs), 3, *size))
            failed = decode_jpegs_into(blobs, boxes, size, images) if self.shards.reduced_jpeg else range(len(blobs))
            for k in failed:  # not JPEG, CMYK, corrupt: the full path decodes or names the file
                try:
                    images[k] = full_path(k)
                except DataError as exc:
                    skip(keep[k], exc)
                    bad.append(k)
        if bad:
            good = [k for k in range(len(keep)) if k not in set(bad)]
            if ready is not None:  # the copy of the good rows waits for the decode, on this thread's stream
                ready.wait()
                images = images[good]
                ready = Ready.now(images)
            else:
                images = images[good]
            keep = [keep[k] for k in good]
        kept_labels = torch.from_numpy(labels[keep] if len(keep) != len(idx) else labels)
        return ShardBatch(images, kept_labels, skipped, ready)

    # stoker's make_loader picks this up; torch's DataLoader takes it as collate_fn=.
    collate_fn = staticmethod(collate_shard_batch)

    def set_epoch(self, epoch: int) -> None:
        """Nothing to do: a map-style data set is shuffled by the loader's sampler."""

    def __repr__(self) -> str:
        size = f"{self.image_size[0]}x{self.image_size[1]}" if self.image_size else "own size"
        return (
            f"ShardDataset({self.root!r}, split={self.split!r}: {len(self)} samples, "
            f"{self.num_classes} classes, {self.store}, {size})"
        )
