"""The loading methods the benchmark compares, each built from the same samples.

Every method starts from one :class:`~stoker.sources.FileDataset` (its index says the
samples, their files and labels) and returns a loader: an iterable whose every pass is
one epoch of ``(images, labels)`` batches, images uint8 ``[B, 3, H, W]``.

* ``files``: the map-style data set, one file read and decoded per sample (torch's
  DataLoader workers, or threads).
* ``pipe``: a streaming :class:`~stoker.pipes.Pipe` over the same samples in index
  order (as a file listing gives them), through a shuffle buffer, sharded by worker.
* ``shards-encoded``: packed Arrow shards of the original encoded bytes, decoded when read.
* ``shards-pixels``: packed Arrow shards of decoded pixels: nothing to decode.

A method is a :class:`Method`: a name, the work it does per image (for its limit) and a
``build`` function. Pass your own to :func:`~stoker.bench.bench` to time it next to these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from stoker.bench.limits import Work
from stoker.bench.settings import LoaderSettings
from stoker.decode import resize
from stoker.errors import ConfigError
from stoker.loading import make_loader
from stoker.sources.dataset import FileDataset

__all__ = ["BUILTIN_METHODS", "PACK_SPLIT", "BenchData", "Method", "resolve_methods", "shard_store_of"]

PACK_SPLIT = "train"  # the benchmark packs every sample into this one split


@dataclass
class BenchData:
    """The one set of samples every method is built from.

    Attributes:
        dataset: the samples as a file data set; its transform resizes to ``size``.
        size: ``(height, width)`` every image is resized to, or ``None`` to keep sizes.
        packed: shard sets by store (``"encoded"``, ``"pixels"``): their folders.
        batch_size: samples per batch.
        device: where batches are delivered (``"auto"``, ``"cpu"``, ``"cuda"``...).
        seed: seed of every shuffle.
        shuffle_buffer: items the Pipe's shuffle buffer holds.
        persistent_workers: keep workers between epochs (the tuner's many short epochs);
            by default each loader runs one epoch and its workers go when it ends.
    """

    dataset: FileDataset
    size: tuple[int, int] | None = None
    packed: dict[str, Path] = field(default_factory=dict)
    batch_size: int = 256
    device: str | None = "auto"
    seed: int = 0
    shuffle_buffer: int = 10_000
    persistent_workers: bool = False

    @classmethod
    def of(cls, dataset: FileDataset, size: tuple[int, int] | None = None, **kwargs: Any) -> BenchData:
        """Wrap ``dataset`` with a resize to ``size`` as its only transform."""
        transform = partial(resize, size=size) if size is not None else None
        return cls(FileDataset(dataset.index, transform, dataset.on_error), size, **kwargs)


Build = Callable[[BenchData, LoaderSettings], Iterable[Any]]


@dataclass(frozen=True)
class Method:
    """A way of loading the data that the benchmark can time.

    Attributes:
        name: the column name in the table.
        work: ``"decode"`` when images are decoded on the way, ``"pixels"`` when not;
            it picks the limit the method is measured against.
        build: ``build(data, settings)`` returns the loader for those settings.
        backends: the loader backends the method can run on.
        store: the shard store it needs packed first, if any.
    """

    name: str
    work: Work
    build: Build
    backends: tuple[str, ...] = ("process", "thread")
    store: str | None = None


def _loader_args(data: BenchData, settings: LoaderSettings) -> dict[str, Any]:
    return dict(
        batch_size=data.batch_size,
        device=data.device,
        seed=data.seed,
        persistent_workers=data.persistent_workers,
        **settings.loader_kwargs(),
    )


def build_files(data: BenchData, settings: LoaderSettings) -> Iterable[Any]:
    """The map-style file data set, shuffled by the loader's sampler."""
    return make_loader(data.dataset, shuffle=True, **_loader_args(data, settings))


def build_pipe(data: BenchData, settings: LoaderSettings) -> Iterable[Any]:
    """A Pipe over the samples in index order: shuffle buffer, shard by worker, load."""
    from stoker.pipes import Pipe

    pipe = (
        Pipe.from_iterable(range(len(data.dataset)))
        .shuffle(data.shuffle_buffer, seed=data.seed)
        .shard()
        .map(data.dataset.__getitem__)
    )
    return make_loader(pipe, shuffle=False, **_loader_args(data, settings))


def build_shards(store: str, data: BenchData, settings: LoaderSettings) -> Iterable[Any]:
    """A shard set of ``store`` (packed from this data, one split) read a batch of rows at a time."""
    from stoker.shards.dataset import ShardDataset

    root = data.packed.get(store)
    if root is None:
        raise ConfigError(f"shards-{store}: no packed shard set; pack the data first or pass --packed DIR")
    dataset = ShardDataset(root, split=PACK_SPLIT)
    return make_loader(dataset, shuffle=True, **_loader_args(data, settings))


def shard_store_of(method: str) -> str | None:
    """The shard store a built-in method name reads (``"encoded"``, ``"pixels"``), or None."""
    return method.removeprefix("shards-") if method.startswith("shards-") else None


BUILTIN_METHODS: dict[str, Method] = {
    "files": Method("files", "decode", build_files),
    "pipe": Method("pipe", "decode", build_pipe, backends=("process",)),
    "shards-encoded": Method("shards-encoded", "decode", partial(build_shards, "encoded"), store="encoded"),
    "shards-pixels": Method("shards-pixels", "pixels", partial(build_shards, "pixels"), store="pixels"),
}


def resolve_methods(methods: Iterable[str | Method]) -> list[Method]:
    """Built-in methods by name, and :class:`Method` objects as they are.

    Raises:
        ConfigError: an unknown name, or two methods of one name.
    """
    out: list[Method] = []
    for method in methods:
        if isinstance(method, Method):
            out.append(method)
        elif method in BUILTIN_METHODS:
            out.append(BUILTIN_METHODS[method])
        else:
            raise ConfigError(f"unknown method {method!r}; choose from {', '.join(BUILTIN_METHODS)}")
    names = [m.name for m in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"methods must have distinct names, got {', '.join(names)}")
    if not out:
        raise ConfigError("no methods to benchmark; pass at least one, e.g. --methods files")
    return out
