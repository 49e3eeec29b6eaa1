"""What ``pack`` reads from: the rows of a file data set or of an existing shard set, behind one face."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np
import pyarrow as pa
import torch

from stoker.errors import ConfigError, DataError
from stoker.fs import where
from stoker.shards.format.schema import ROW_COLUMNS
from stoker.shards.read.dataset import ShardDataset, load_shard_image
from stoker.sources.dataset import FileDataset
from stoker.sources.index import Source

__all__ = ["FileRows", "RowSource", "ShardRows", "as_rows", "row_values"]


class RowSource(Protocol):
    """The rows of one split that ``pack`` writes (numpy columns, plus two readers).

    It has one array per column of :data:`~stoker.shards.format.schema.ROW_COLUMNS`, named by
    the column's ``rows``.
    """

    keys: np.ndarray  # str
    labels: np.ndarray  # int64
    source_names: np.ndarray  # str
    files: np.ndarray  # str, relative to the source root
    sources: tuple[Source, ...]
    classes: tuple[str, ...]

    def __len__(self) -> int: ...

    def encoded_sizes(self) -> np.ndarray:
        """Bytes of each row's encoded image (``int64``)."""

    def read_encoded(self, i: int) -> bytes | np.ndarray:
        """Row ``i``'s original file bytes."""

    def read_pixels(self, i: int) -> torch.Tensor:
        """Row ``i`` decoded to uint8 RGB CHW, after its source's crop."""


def row_values(rows: RowSource, i: int) -> dict[str, object]:
    """Row ``i``'s value of every column a row source gives, by column name (what :meth:`ShardWriter.write_row` takes).

    Example:
        >>> from stoker import ClassFolderDataset
        >>> rows = as_rows(ClassFolderDataset("data/digiface"))
        >>> {name: str(value) for name, value in row_values(rows, 0).items()}
        {'key': '0/0.png', 'label': '0', 'source': 'digiface', 'file': '0/0.png'}
    """
    return {column.name: getattr(rows, column.rows)[i] for column in ROW_COLUMNS}  # type: ignore[arg-type]


def _relative(path: str, root: str) -> str:
    for prefix in (root.rstrip("/") + "/", root.rstrip(os.sep) + os.sep):
        if path.startswith(prefix):
            return path[len(prefix) :]
    return path


def _file_size(path: str) -> int:
    size = where(path).size()  # a local path or a URL (stoker.fs)
    if size is None:
        raise DataError(f"{path}: file not found (moved or deleted since the index was built?)")
    return size


class FileRows:
    """The rows of a :class:`~stoker.sources.FileDataset` (any layout, or several concatenated)."""

    def __init__(self, dataset: FileDataset) -> None:
        index = dataset.index
        self.dataset = dataset
        self.keys = index.keys
        self.labels = index.labels
        self.sources = index.sources
        self.classes = index.classes
        names = np.asarray([s.name for s in index.sources], dtype=str)
        self.source_names = names[index.source_ids]
        roots = [s.root for s in index.sources]
        self.files = np.asarray(
            [_relative(str(p), roots[int(s)]) for p, s in zip(index.paths, index.source_ids, strict=True)], dtype=str
        )

    def __len__(self) -> int:
        return len(self.keys)

    def encoded_sizes(self) -> np.ndarray:
        paths = [str(p) for p in self.dataset.index.paths]
        with ThreadPoolExecutor(8) as pool:
            return np.fromiter(pool.map(_file_size, paths, chunksize=256), dtype=np.int64, count=len(paths))

    def read_encoded(self, i: int) -> bytes:
        return self.dataset.read_bytes(i)

    def read_pixels(self, i: int) -> torch.Tensor:
        return self.dataset.load_image(i)


class ShardRows:
    """The rows of one split of an existing shard set (to re-pack it in another mode or size)."""

    keys: np.ndarray
    labels: np.ndarray
    source_names: np.ndarray
    files: np.ndarray

    def __init__(self, dataset: ShardDataset) -> None:
        self.dataset = dataset
        shards = dataset.shards
        files = [shards.file(s) for s in range(len(shards.infos))]
        for column in ROW_COLUMNS:  # every column the rows were written from, read back
            if column.name == "label":
                values = np.concatenate([f.labels for f in files]).astype(np.int64)  # read when the shard opened
            else:
                dtype = np.int64 if pa.types.is_integer(column.type) else str
                values = np.asarray([v for f in files for v in f.column(column.name)], dtype=dtype)
            setattr(self, column.rows, values)  # type: ignore[arg-type]
        self.sources = dataset.manifest.sources
        self.classes = dataset.classes
        self._sizes = np.concatenate([f.encoded_sizes() for f in files]) if dataset.store == "encoded" else None

    def __len__(self) -> int:
        return len(self.keys)

    def encoded_sizes(self) -> np.ndarray:
        if self._sizes is None:
            raise ConfigError(
                f"{self.dataset.root}: pixel shards keep no encoded files; re-pack from the original files instead"
            )
        return self._sizes

    def read_encoded(self, i: int) -> bytes:
        if self.dataset.store != "encoded":
            raise ConfigError(f"{self.dataset.root}: pixel shards keep no encoded files; re-pack from the original files")
        data, _, _ = self.dataset.shards.read_encoded(i)
        return data.tobytes()

    def read_pixels(self, i: int) -> torch.Tensor:
        if self.dataset.store == "pixels":
            return load_shard_image(self.dataset.shards, i)
        # Encoded shards: decode and crop, but leave the resizing to the new pack.
        shards = self.dataset.shards
        shard, rows = shards.locate(np.asarray([i], dtype=np.int64))
        return shards.decode(int(shard[0]), int(rows[0]), resized=False)


def as_rows(dataset: FileDataset | ShardDataset) -> RowSource:
    """Wrap a data set as rows ``pack`` can write."""
    if isinstance(dataset, ShardDataset):
        return ShardRows(dataset)
    if isinstance(dataset, FileDataset):
        return FileRows(dataset)
    raise ConfigError(f"pack reads stoker file data sets or shard sets, got {type(dataset).__name__}")
