"""The index of samples: one list that every reader starts from.

A :class:`SampleIndex` says, for every sample, its key, where its bytes are, its label
and which source it came from (and so which crop box applies). The file datasets, the
streaming Pipe, the packer and the benchmark all start from the same index, so they
compare like with like. Columns are numpy arrays, not lists of Python objects, so that
an index of a million samples is cheap to copy into worker processes.

Listing a large folder can take a while (70,000 files on a busy machine took 33 s):
:func:`indexing_progress` is the counter every lister shows on stderr while it works.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from stoker.decode.image import Box
from stoker.errors import ConfigError, DataError, LabelError
from stoker.terminal import LogCounter, bar_disable

__all__ = ["PROGRESS_DELAY_S", "SampleIndex", "Source", "indexing_progress"]

# A counter appears only once a step has run this long: a small set indexes in silence
# (the tests, a notebook), a slow one shows within 2 s, on a terminal or in a job's log.
PROGRESS_DELAY_S = 1.5


def indexing_progress(where: str, unit: str = "files") -> tqdm | LogCounter:
    """A counter on stderr (``indexing data/train: 12,345 files``) shown once indexing takes over
    :data:`PROGRESS_DELAY_S`; use it as a context manager and ``update(n)`` as items are found.

    On a terminal it is a bar; in a log (stderr not a terminal) plain lines, no redraws;
    under ``--quiet`` nothing.

    Example:
        >>> with indexing_progress("data/digiface") as bar:
        ...     _ = bar.update(40)
    """
    disable = bar_disable()
    if disable is None and not sys.stderr.isatty():
        return LogCounter(f"indexing {where}", f" {unit}", delay=PROGRESS_DELAY_S, file=sys.stderr)
    return tqdm(desc=f"indexing {where}", unit=f" {unit}", unit_scale=False, file=sys.stderr, disable=disable,
                delay=PROGRESS_DELAY_S, dynamic_ncols=True, mininterval=0.5)


@dataclass(frozen=True)
class Source:
    """Where a group of samples came from, and what applies to all of them.

    Args:
        name: a short name (for example ``"celeba"``), kept in shards for tracing.
        root: the folder or URL the sample paths are under.
        crop: ``(top, left, height, width)`` applied to every image of the source.
        links: folders outside ``root`` its files may also be read from: the targets
            of symbolic links to class folders followed on request (``follow_links=True``).
            A local file opened outside ``root`` and these is refused at read time.
    """

    name: str
    root: str
    crop: Box | None = None
    links: tuple[str, ...] = ()


@dataclass(frozen=True)
class SampleIndex:
    """Columns describing every sample of a data set (all arrays of equal length).

    Attributes:
        keys: unique key per sample (relative file name or id), ``str`` array.
        paths: absolute path or URL of the sample's file, ``str`` array.
        labels: integer label per sample, ``int64`` array.
        source_ids: index into :attr:`sources` per sample, ``int32`` array.
        sources: the sources, in order.
        classes: class names; ``classes[label]`` names a label.
    """

    keys: np.ndarray
    paths: np.ndarray
    labels: np.ndarray
    source_ids: np.ndarray
    sources: tuple[Source, ...]
    classes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        n = len(self.keys)
        for name in ("paths", "labels", "source_ids"):
            if len(getattr(self, name)) != n:
                raise ConfigError(f"SampleIndex: column {name!r} has {len(getattr(self, name))} rows, keys has {n}")
        if n and (self.labels.min() < 0 or self.labels.max() >= max(len(self.classes), 1)):
            raise ConfigError(
                f"SampleIndex: labels span {self.labels.min()}..{self.labels.max()} "
                f"but there are {len(self.classes)} classes"
            )

    @classmethod
    def build(
        cls,
        keys: Sequence[str],
        paths: Sequence[str],
        labels: Sequence[int] | np.ndarray,
        source: Source,
        classes: Sequence[str] | None = None,
    ) -> SampleIndex:
        """Build the index of one source; ``classes`` defaults to ``0..max(label)``.

        Raises:
            LabelError: a label is negative or not below :data:`~stoker.sources.untrusted.MAX_CLASSES`.
        """
        from stoker.sources.untrusted import MAX_CLASSES

        try:
            label_array = np.asarray(labels, dtype=np.int64)
        except OverflowError:
            raise LabelError(f"{source.root}: a label is larger than {MAX_CLASSES - 1:,}; labels are class numbers") from None
        if len(label_array) and (label_array.min() < 0 or label_array.max() >= MAX_CLASSES):
            bad = int(label_array[(label_array < 0) | (label_array >= MAX_CLASSES)][0])
            raise LabelError(
                f"{source.root}: label {bad} is outside 0..{MAX_CLASSES - 1:,}; labels are class numbers >= 0"
            )
        if classes is None:
            classes = [str(i) for i in range(int(label_array.max()) + 1)] if len(label_array) else []
        return cls(
            keys=np.asarray(keys, dtype=str),
            paths=np.asarray(paths, dtype=str),
            labels=label_array,
            source_ids=np.zeros(len(label_array), dtype=np.int32),
            sources=(source,),
            classes=tuple(classes),
        )

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def num_classes(self) -> int:
        """Number of classes (labels are ``0 .. num_classes - 1``)."""
        return len(self.classes)

    def crop_of(self, i: int) -> Box | None:
        """The crop box of sample ``i``'s source."""
        return self.sources[int(self.source_ids[i])].crop

    def take(self, indices: Sequence[int] | np.ndarray) -> SampleIndex:
        """A new index with only the given rows, in the given order."""
        rows = np.asarray(indices, dtype=np.int64)
        return SampleIndex(
            keys=self.keys[rows],
            paths=self.paths[rows],
            labels=self.labels[rows],
            source_ids=self.source_ids[rows],
            sources=self.sources,
            classes=self.classes,
        )

    def with_label_offset(self, offset: int) -> SampleIndex:
        """Shift every label by ``offset``; class names below the offset are placeholders."""
        if offset < 0:
            raise ConfigError(f"label_offset must be >= 0, got {offset}")
        if offset == 0:
            return self
        return SampleIndex(
            keys=self.keys,
            paths=self.paths,
            labels=self.labels + offset,
            source_ids=self.source_ids,
            sources=self.sources,
            classes=tuple(f"unused-{i}" for i in range(offset)) + self.classes,
        )

    @staticmethod
    def concat(indices: Sequence[SampleIndex], offsets: Sequence[int]) -> SampleIndex:
        """Lay several indices side by side, shifting each one's labels by its offset."""
        if not indices:
            raise ConfigError("concat needs at least one data set")
        num_classes = max(off + idx.num_classes for idx, off in zip(indices, offsets, strict=True))
        classes = [f"unused-{i}" for i in range(num_classes)]
        sources: list[Source] = []
        source_ids = []
        for idx, off in zip(indices, offsets, strict=True):
            for label, name in enumerate(idx.classes):
                classes[off + label] = name
            source_ids.append(idx.source_ids + len(sources))
            sources.extend(idx.sources)
        keys = np.concatenate([idx.keys for idx in indices])
        if len(np.unique(keys)) != len(keys):
            # Keys must stay unique to trace a sample back; prefix with the source name.
            keys = np.concatenate(
                [np.char.add(f"{idx.sources[0].name}/", idx.keys) for idx in indices]
            )
            if len(np.unique(keys)) != len(keys):
                raise DataError("concat: two data sets share sample keys and source names; give the sources distinct names")
        return SampleIndex(
            keys=keys,
            paths=np.concatenate([idx.paths for idx in indices]),
            labels=np.concatenate([idx.labels + off for idx, off in zip(indices, offsets, strict=True)]),
            source_ids=np.concatenate(source_ids).astype(np.int32),
            sources=tuple(sources),
            classes=tuple(classes),
        )
