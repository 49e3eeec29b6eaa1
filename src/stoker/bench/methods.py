"""The loading methods the benchmark compares: one registry, each built from the same samples.

Every method starts from one :class:`~stoker.sources.FileDataset` (its index says the
samples, their files and labels) and returns a loader: an iterable whose every pass is
one epoch of ``(images, labels)`` batches, images uint8 ``[B, 3, H, W]``.

* ``files``: the map-style data set, one file read and decoded per sample.
* ``pipe``: a streaming :class:`~stoker.pipes.Pipe` over the same samples, through a shuffle buffer.
* ``shards-encoded`` / ``shards-pixels``: packed Arrow shards of the encoded bytes
  (decoded when read) / of decoded pixels (nothing to decode).
* ``shards-encoded-gpu``: the encoded shards decoded on the CUDA device in batches (where CUDA is).

A method is a :class:`Method`: a name, the work it does per image, how it shuffles, and a
``build`` function. :data:`METHODS` is the one registry every part of stoker reads: adding
a method is one :func:`register_method` call. This module imports no torch (the CLI reads
the names for its help); the builders import what they need when they run.

Example:
    >>> from stoker.bench.methods import METHODS
    >>> list(method_names())
    ['files', 'pipe', 'shards-encoded', 'shards-pixels']
    >>> METHODS["shards-pixels"].store
    'pixels'
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from stoker.errors import ConfigError
from stoker.loading.backends import BACKENDS

if TYPE_CHECKING:
    from stoker.bench.settings import LoaderSettings
    from stoker.sources.dataset import FileDataset

__all__ = [
    "METHODS",
    "PACK_SPLIT",
    "SHUFFLES",
    "WORKS",
    "BenchData",
    "Method",
    "Shuffle",
    "Work",
    "cuda_available",
    "method_names",
    "register_method",
    "resolve_methods",
    "shard_store_of",
]

PACK_SPLIT = "train"  # the benchmark packs every sample into this one split

# What a method does to each image: it picks the limit the method is measured against.
Work = Literal["decode", "pixels"]
WORKS: tuple[str, ...] = ("decode", "pixels")
# How a method shuffles: the loader's sampler over the whole set, the Pipe's bounded
# buffer over the listed order, or the order the shards were packed in. A poor shuffle
# score is explained by it (a bigger buffer; a repack with shuffling).
Shuffle = Literal["sampler", "buffer", "pack"]
SHUFFLES: tuple[str, ...] = ("sampler", "buffer", "pack")


@dataclass
class BenchData:
    """The one set of samples every method is built from.

    Attributes:
        dataset: the samples as a file data set; its transform resizes to ``size``;
            ``None`` when the data is a shard set (only the shard methods run then).
        size: ``(height, width)`` every image is resized to, or ``None`` to keep sizes.
        packed: shard sets by store (``"encoded"``, ``"pixels"``): their folders or URLs.
        batch_size: samples per batch.
        device: where batches are delivered (``"auto"``, ``"cpu"``, ``"cuda"``...).
        seed: seed of every shuffle.
        shuffle_buffer: items the Pipe's shuffle buffer holds.
        persistent_workers: keep workers between epochs (the tuner's many short epochs);
            by default each loader runs one epoch and its workers go when it ends.
        shard_transform: applied to each image read from the shard sets (a resize of a
            shard set benchmarked as it is, to ``size``), or ``None``.
    """

    dataset: FileDataset | None
    size: tuple[int, int] | None = None
    packed: dict[str, Path | str] = field(default_factory=dict)
    batch_size: int = 256
    device: str | None = "auto"
    seed: int = 0
    shuffle_buffer: int = 10_000
    persistent_workers: bool = False
    shard_transform: Callable[[Any], Any] | None = None

    def files(self) -> FileDataset:
        """The file data set, or a ConfigError when the data is a shard set (no files to read)."""
        if self.dataset is None:
            raise ConfigError("this method reads files, and the data is a shard set; bench the folder it was packed from")
        return self.dataset

    @classmethod
    def of(cls, dataset: FileDataset, size: tuple[int, int] | None = None, **kwargs: Any) -> BenchData:
        """Wrap ``dataset`` with a resize to ``size`` as its only transform."""
        from stoker.decode.image import resize
        from stoker.sources.dataset import FileDataset

        transform = partial(resize, size=size) if size is not None else None
        return cls(FileDataset(dataset.index, transform, dataset.on_error), size, **kwargs)


Build = Callable[[BenchData, "LoaderSettings"], Iterable[Any]]


@dataclass(frozen=True)
class Method:
    """A way of loading the data that the benchmark can time.

    Attributes:
        name: the column name in the table (and the name ``--methods`` takes).
        work: ``"decode"`` when images are decoded on the way, ``"pixels"`` when not;
            it picks the limit the method is measured against.
        build: ``build(data, settings)`` returns the loader for those settings.
        backends: the loader backends the method can run on.
        store: the shard store it needs packed first, if any.
        shuffle: how it shuffles: ``"sampler"`` (the loader's, over the whole set),
            ``"buffer"`` (a bounded buffer over the listed order) or ``"pack"`` (the
            order the shards were packed in); the notes explain a poor mix by it.
        tunable: ``stoker tune`` considers it (its settings are ones ``stoker train``
            can use).
        needs_cuda: runs only where a CUDA device is available; left out of the
            default methods elsewhere (``stoker tune`` says it skipped it, and why).
        decoder: the :class:`~stoker.shards.ShardDataset` decoder it reads with, where not
            ``"auto"`` (``stoker tune`` records it with the settings, ``stoker train`` reads with it).
    """

    name: str
    work: Work
    build: Build
    backends: tuple[str, ...] = BACKENDS
    store: str | None = None
    shuffle: Shuffle = "sampler"
    tunable: bool = True
    needs_cuda: bool = False
    decoder: str | None = None

    def __post_init__(self) -> None:
        where = f"method {self.name!r}"
        if not isinstance(self.name, str) or not self.name or "," in self.name:
            raise ConfigError(f"{where}: a method's name must be a non-empty text without commas")
        if self.work not in WORKS:
            raise ConfigError(f"{where}: work must be one of {', '.join(WORKS)}; got {self.work!r}")
        unknown = [b for b in self.backends if b not in BACKENDS]
        if unknown or not self.backends:
            raise ConfigError(f"{where}: backends must be among {', '.join(BACKENDS)}; got {list(self.backends)!r}")
        if self.shuffle not in SHUFFLES:
            raise ConfigError(f"{where}: shuffle must be one of {', '.join(SHUFFLES)}; got {self.shuffle!r}")


# The registry: name -> method, in the order the table shows them.
METHODS: dict[str, Method] = {}


def register_method(method: Method, *, replace: bool = False) -> Method:
    """Add ``method`` to :data:`METHODS`, so that every part of stoker offers it by name.

    Args:
        method: the method; its ``name`` is the key.
        replace: allow replacing a method of the same name.

    Returns:
        ``method``, so the call can wrap a definition.

    Raises:
        ConfigError: a method of that name is already registered (and not ``replace``).

    Example:
        >>> _ = register_method(Method("files-again", "decode", build_files))
        >>> "files-again" in METHODS
        True
        >>> del METHODS["files-again"]  # (the registry is global)
    """
    if method.name in METHODS and not replace:
        raise ConfigError(f"a method named {method.name!r} is already registered; pass replace=True to replace it")
    METHODS[method.name] = method
    return method


def method_names(*, tunable: bool = False, cuda: bool = False) -> tuple[str, ...]:
    """The registered method names, in order; only those ``stoker tune`` considers when ``tunable``;
    those that need a CUDA device only with ``cuda``."""
    return tuple(
        name for name, method in METHODS.items() if (method.tunable or not tunable) and (cuda or not method.needs_cuda)
    )


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (torch imported only when asked)."""
    import torch

    return bool(torch.cuda.is_available())


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
    from stoker.loading import make_loader

    return make_loader(data.files(), shuffle=True, **_loader_args(data, settings))


def build_pipe(data: BenchData, settings: LoaderSettings) -> Iterable[Any]:
    """A Pipe over the samples in index order: shuffle buffer, shard by worker, load."""
    from stoker.loading import make_loader
    from stoker.pipes import Pipe

    files = data.files()
    pipe = (
        Pipe.from_iterable(range(len(files)))
        .shuffle(data.shuffle_buffer, seed=data.seed)
        .shard()
        .map(files.__getitem__)
    )
    return make_loader(pipe, shuffle=False, **_loader_args(data, settings))


def build_shards(store: str, data: BenchData, settings: LoaderSettings, decoder: str = "auto") -> Iterable[Any]:
    """A shard set of ``store`` (packed from this data, one split) read a batch of rows at a time.

    A set at a URL is read through the verified cache: a shard is downloaded when first read.
    ``decoder="nvjpeg"`` decodes on the CUDA device batches go to.
    """
    from stoker.loading import make_loader
    from stoker.shards.read.dataset import ShardDataset

    root = data.packed.get(store)
    if root is None:
        raise ConfigError(f"shards-{store}: no packed shard set; pack the data first or pass --packed DIR")
    device = data.device if data.device not in (None, "auto", "cpu") else "cuda"
    dataset = ShardDataset(root, split=PACK_SPLIT, transform=data.shard_transform, decoder=decoder,  # type: ignore[arg-type]
                           decode_device=device)
    return make_loader(dataset, shuffle=True, **_loader_args(data, settings))


def shard_store_of(method: str) -> str | None:
    """The shard store a registered method reads (``"encoded"``, ``"pixels"``), or None."""
    registered = METHODS.get(method)
    return registered.store if registered is not None else None


register_method(Method("files", "decode", build_files))
register_method(Method("pipe", "decode", build_pipe, backends=("process",), shuffle="buffer", tunable=False))
register_method(Method("shards-encoded", "decode", partial(build_shards, "encoded"), store="encoded", shuffle="pack"))
register_method(Method("shards-pixels", "pixels", partial(build_shards, "pixels"), store="pixels", shuffle="pack"))
# Tuned on a CUDA device: the tune file then says decoder = "nvjpeg", and a run reads with it (decoder="auto" would
# measure the GPU against the CPU path on its first batch instead).
register_method(Method("shards-encoded-gpu", "decode", partial(build_shards, "encoded", decoder="nvjpeg"),
                       backends=("thread",), store="encoded", shuffle="pack", needs_cuda=True, decoder="nvjpeg"))

def resolve_methods(methods: Iterable[str | Method] | None = None) -> list[Method]:
    """Registered methods by name (all of them for ``None``), and :class:`Method` objects as they are.

    Raises:
        ConfigError: an unknown name, or two methods of one name.
    """
    out: list[Method] = []
    cuda: bool | None = None
    for method in METHODS.values() if methods is None else methods:
        if isinstance(method, Method):
            out.append(method)
        elif method in METHODS:
            out.append(METHODS[method])
        else:
            raise ConfigError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
        if out[-1].needs_cuda:
            cuda = cuda_available() if cuda is None else cuda
            if not cuda and methods is None:
                out.pop()  # the default methods: those this machine can run
            elif not cuda:
                raise ConfigError(f"method {out[-1].name!r} decodes on a CUDA device, and torch sees none; "
                                  f"leave it out of --methods, or run on a machine with a GPU")
    names = [m.name for m in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"methods must have distinct names, got {', '.join(names)}")
    if not out:
        raise ConfigError("no methods to benchmark; pass at least one, e.g. --methods files")
    return out
