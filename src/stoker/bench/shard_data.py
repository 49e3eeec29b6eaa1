"""Benchmarking a shard set as it is (a folder or a URL), and shard sets passed with ``--packed``.

``stoker bench DATA`` usually starts from files and packs them; when DATA is itself a
shard set (``stoker pack``'s output, local or in a bucket) the benchmark times the
method that reads its store (``shards-pixels`` or ``shards-encoded``) on it directly.
Nothing is downloaded before the plan is known to run: only the manifest is read to
decide, and the shards are fetched into the verified cache as the runs read them (a
map-style epoch reads every shard, so the labels that check each epoch come from the
same downloads).

The limits of a shard set are measured on it: decoding (encoded shards), memory copy,
and reading: for a URL the download rate of the shards fetched (the network is the
storage), then the page cache's rate over the same files.

Example:
    >>> shards = open_shard_set("packed")  # a folder or a URL (s3://bucket/packed)
    >>> shards.store
    'pixels'
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from stoker.bench.limits import Limits, _memcpy_rate, measure_sequential_reads
from stoker.bench.methods import PACK_SPLIT, Method
from stoker.cores import usable_cores
from stoker.errors import ConfigError
from stoker.fs import PathOrURL, where
from stoker.shards.format.manifest import MANIFEST_NAME
from stoker.shards.read.dataset import ShardDataset

__all__ = ["check_packed", "fetch_all", "measure_shard_limits", "open_shard_set", "shard_methods"]


def open_shard_set(path: PathOrURL) -> ShardDataset | None:
    """The shard set at ``path`` (its manifest read, no shard downloaded), or None when it is not one."""
    place = where(path)
    if not place.is_file(MANIFEST_NAME):
        return None
    from stoker.shards.format.manifest import Manifest

    splits = Manifest.load(place).splits
    if PACK_SPLIT not in splits:
        raise ConfigError(
            f"{place.url_of()}: the benchmark reads a shard set's {PACK_SPLIT!r} split, and this one has only "
            f"{', '.join(repr(s) for s in splits)}; repack it with that split as {PACK_SPLIT}"
        )
    return ShardDataset(path, PACK_SPLIT)


def shard_methods(methods: Sequence[Method], store: str, where_: str) -> None:
    """Check that some method of ``methods`` reads a shard set of ``store``, before anything is downloaded.

    Raises:
        ConfigError: none does (the message names the one that would).
    """
    if not any(m.store == store for m in methods):
        raise ConfigError(
            f"{where_}: is a shard set of {store} shards, and no method asked for reads them "
            f"(asked: {', '.join(m.name for m in methods)}); pass --methods shards-{store}, or bench the "
            f"folder it was packed from to compare every method"
        )


def check_packed(packed: PathOrURL, store: str) -> str:
    """``packed/store`` as a path or URL, checked to hold a shard set of ``store`` (its manifest only).

    Raises:
        ConfigError: there is no shard set there, or it holds another store.
    """
    target = where(packed).child(store)
    if not target.is_file(MANIFEST_NAME):
        raise ConfigError(
            f"{packed}: no {store}/ shard set inside (no {target.url_of(MANIFEST_NAME)}); "
            f"pack one with `stoker pack DATA {target.url_of()} --store {store}`"
        )
    from stoker.shards.format.manifest import Manifest

    found = Manifest.load(target).store
    if found != store:
        raise ConfigError(f"{target.url_of()}: holds {found} shards, not {store}; repack it with --store {store}")
    return target.url_of() if target.local_path is None else str(target.local_path)


def measure_shard_limits(
    dataset: ShardDataset,
    size: tuple[int, int] | None,
    time_s: float = 1.0,
    download_bytes_per_s: float | None = None,
    max_samples: int = 64,
    seed: int = 0,
) -> Limits:
    """The decode, memory-copy and read limits of this machine for a shard set.

    Args:
        dataset: the shard set (its shards already fetched for a URL).
        size: ``(height, width)`` images are resized to, as the benchmark does.
        time_s: about how long each measurement runs.
        download_bytes_per_s: for a URL, the rate its shards were downloaded at: the
            storage read limit (the page cache's rate is measured on the cached files).
        max_samples: the most samples decoded for the decode test.
        seed: which samples are picked.
    """
    shards = dataset.shards
    paths = [str(shards.local_path(s)) for s in range(len(shards.infos))]
    disk, cached = measure_sequential_reads(paths, time_s, cold=download_bytes_per_s is None)
    read = download_bytes_per_s if download_bytes_per_s is not None else disk
    rows = np.random.default_rng(seed).permutation(len(dataset))[:max_samples]
    decoded_bytes = 0.0
    decode_ips = 0.0  # pixel shards: nothing to decode
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        from stoker.decode.image import resize

        done, start = 0, time.perf_counter()
        while True:
            for i in rows:
                image = resize(dataset[int(i)][0], size)  # type: ignore[index]
                decoded_bytes += image.numel() * image.element_size()
                done += 1
            elapsed = time.perf_counter() - start
            if elapsed >= time_s or dataset.store == "pixels":
                break
        if dataset.store != "pixels":
            decode_ips = done / max(elapsed, 1e-9)
    finally:
        torch.set_num_threads(threads)
    stored = sum(info.bytes for info in shards.infos) / max(len(shards), 1)
    return Limits(
        cores=usable_cores(),
        decode_img_per_s=decode_ips,
        memcpy_bytes_per_s=_memcpy_rate(time_s / 2),
        read_bytes_per_s=read,
        read_cold=download_bytes_per_s is not None,
        encoded_bytes_per_img=stored,
        decoded_bytes_per_img=decoded_bytes / max(done, 1),
        sequential_read_bytes_per_s=read,
        cached_read_bytes_per_s=cached,
        cached_sequential_read_bytes_per_s=cached,
        shards_downloaded=download_bytes_per_s is not None,
        files_read=False,
    )


def fetch_all(dataset: ShardDataset) -> tuple[np.ndarray, float | None]:
    """Every label of the set (fetching its shards into the cache, as the runs will read them)
    and, for a URL, the rate the missing shards were downloaded at (bytes per second)."""
    missing = dataset.shards.download_bytes()
    start = time.perf_counter()
    labels = np.asarray(dataset.labels)
    elapsed = time.perf_counter() - start
    if dataset.shards.remote is None or missing == 0:
        return labels, None
    return labels, missing / max(elapsed, 1e-9)
