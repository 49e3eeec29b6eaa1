"""The map-style Dataset over an index of sample files, and the bad-sample policy."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import Dataset

from stoker.decode.image import decode_sample
from stoker.errors import ConfigError, DataError, MissingFileError
from stoker.fs import is_url, local_path, where
from stoker.fs.local import read_inside, read_inside_array
from stoker.loading.contract import MapReader
from stoker.loading.skips import OnError, Skipped
from stoker.sources.index import SampleIndex, Source
from stoker.sources.splitting import stratified_split
from stoker.types import Transform

__all__ = ["FileDataset", "OnError", "Skipped", "read_file_bytes"]

#: The largest sample file read (1 GiB): anything larger is not one image.
MAX_FILE_BYTES = 1 << 30


def read_file_bytes(path: str, inside: Sequence[str] | None = None) -> bytes:
    """Read a whole sample file, local (a regular file only: a FIFO never blocks) or at a URL such as ``s3://...``.

    ``inside``: resolved folders a local file opened must lie in (the source's root; see
    :func:`stoker.fs.local.read_inside`), checked on the open file, so a symbolic link
    swapped in after the index was built is refused, never read.

    Raises:
        MissingFileError: the file is gone.
        DataError: it is not a regular file, is larger than 1 GiB, cannot be read, or is outside ``inside``.
    """
    try:
        local = local_path(path) if inside is not None else None
        if inside is not None and local is not None:
            return read_inside(str(local), path, inside, MAX_FILE_BYTES)
        return where(path).read_bytes(max_bytes=MAX_FILE_BYTES)
    except MissingFileError:
        raise MissingFileError(f"{path}: {_GONE}") from None


_GONE = "file not found (moved or deleted since the index was built?)"


def _folders_of(source: Source) -> tuple[str, ...] | None:
    """The resolved folders a local source's files may be opened in (its root, and followed links); None at a URL."""
    root = local_path(source.root)
    if root is None:
        return None
    return tuple(dict.fromkeys(os.path.realpath(folder) for folder in (str(root), *source.links)))


def _size(shape: torch.Size) -> str:
    return "x".join(str(v) for v in shape[-2:]) + (f" ({shape[0]} channels)" if len(shape) == 3 else "")


class FileDataset(Dataset, MapReader):
    """A map-style torch Dataset that reads and decodes one file per sample.

    Every layout (:class:`IdDataset`, :class:`LabelFileDataset`,
    :class:`ClassFolderDataset`, :func:`concat`) is a ``FileDataset`` over its own
    :class:`SampleIndex`. A sample is ``(image, label)``: a uint8 RGB CHW tensor after the
    source's crop, or whatever ``transform`` returns for it.

    Args:
        index: the samples.
        transform: applied to the uint8 image tensor.
        on_error: ``"raise"`` (default) stops at the first bad sample with an error
            naming the file; ``"skip"`` returns a :class:`Skipped` marker instead, which
            stoker's loader drops, counts and reports at the end of the epoch.
    """

    def __init__(self, index: SampleIndex, transform: Transform | None = None, on_error: OnError = "raise") -> None:
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if len(index) == 0:
            raise DataError("the data set has no samples; check the folder, label file or partition")
        self.index = index
        self.transform = transform
        self.on_error: OnError = on_error
        # Where each source's local files may be opened, resolved now (next to indexing), checked at every read.
        self._inside = [_folders_of(source) for source in index.sources]
        # A source under a plain local folder names its files by plain paths: read as they are, no URL parsing per sample.
        self._plain = [inside is not None and not is_url(source.root) for inside, source in zip(
            self._inside, index.sources, strict=True)]

    # -- the torch Dataset protocol -------------------------------------------------
    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> tuple[Any, int] | Skipped:
        try:
            image = self.load_image(i)
        except DataError as exc:
            if self.on_error == "raise":
                raise
            return Skipped(str(self.index.keys[i]), str(exc))
        label = int(self.index.labels[i])
        return (self.transform(image) if self.transform is not None else image), label

    def __getitems__(self, indices: list[int]) -> list[tuple[Any, int] | Skipped]:
        """A batch's samples (torch's DataLoader and the thread backend call this).

        Raises:
            DataError: two images of the batch differ in size (they cannot be stacked);
                the message names both files and says to resize.
        """
        samples = [self[i] for i in indices]
        first: tuple[int, torch.Size] | None = None
        for i, sample in zip(indices, samples, strict=True):
            if isinstance(sample, Skipped) or not isinstance(sample[0], torch.Tensor):
                continue
            if first is None:
                first = (i, sample[0].shape)
            elif sample[0].shape != first[1]:
                raise DataError(
                    f"{self.index.paths[first[0]]} is {_size(first[1])} but {self.index.paths[i]} is "
                    f"{_size(sample[0].shape)}: images of a batch must share one size; resize them all "
                    "with --image-size N (image_size=N for open_data, or a transform)"
                )
        return samples

    # -- building blocks other readers (packer, benchmark) use ----------------------
    def read_bytes(self, i: int) -> bytes:
        """The raw bytes of sample ``i``'s file."""
        return read_file_bytes(str(self.index.paths[i]), self._inside[int(self.index.source_ids[i])])

    def load_image(self, i: int) -> torch.Tensor:
        """Sample ``i`` decoded to a uint8 RGB CHW tensor, after its source's crop."""
        path, source = str(self.index.paths[i]), int(self.index.source_ids[i])
        inside = self._inside[source]
        if self._plain[source]:  # the same checks as read_bytes, into memory the decoder takes without a copy
            try:
                data: bytes | np.ndarray = read_inside_array(path, path, cast(Sequence[str], inside), MAX_FILE_BYTES)
            except MissingFileError:
                raise MissingFileError(f"{path}: {_GONE}") from None
        else:
            data = read_file_bytes(path, inside)
        return decode_sample(data, path, self.index.sources[source].crop)

    @property
    def labels(self) -> np.ndarray:
        """Every sample's label, in order (``int64``)."""
        return self.index.labels

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names; ``classes[label]`` names a label."""
        return self.index.classes

    @property
    def num_classes(self) -> int:
        """Number of classes."""
        return self.index.num_classes

    def subset(self, indices: np.ndarray | list[int]) -> FileDataset:
        """A new data set with the given rows of this one (same transform and policy)."""
        return FileDataset(self.index.take(indices), self.transform, self.on_error)

    def split(self, valid: float = 0.1, seed: int = 0) -> tuple[FileDataset, FileDataset]:
        """A seeded, class-stratified train/validation split for sources that have none.

        Args:
            valid: fraction of each class that goes to validation (``0 < valid < 1``).
            seed: the same seed always gives the same split.

        Returns:
            ``(train, valid)`` data sets.

        Example:
            >>> from stoker.sources import ClassFolderDataset
            >>> train, valid = ClassFolderDataset("data/digiface").split(valid=0.1, seed=0)
            >>> len(train), len(valid)
            (36, 4)
        """
        train_rows, valid_rows = stratified_split(self.labels, valid, seed)
        return self.subset(train_rows), self.subset(valid_rows)

    def __repr__(self) -> str:
        names = ",".join(s.name for s in self.index.sources)
        return f"{type(self).__name__}({names}: {len(self)} samples, {self.num_classes} classes)"
