"""``ShardWriter``: write one shard file, atomically, hashing it on the way out."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from stoker.errors import ConfigError, DataError
from stoker.shards.format.manifest import ShardInfo
from stoker.shards.format.schema import (
    COLUMNS,
    RECORD_BATCH_BYTES,
    ROW_COLUMNS,
    TMP_SUFFIX,
    image_row_bytes,
    shard_schema,
)

__all__ = ["ShardWriter", "WrittenShard", "say_resized"]

log = logging.getLogger("stoker")

Image = bytes | bytearray | memoryview | np.ndarray | torch.Tensor


class _HashingFile(io.RawIOBase):
    """A write-only file that feeds every byte it writes to a SHA-256."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "wb")
        self.sha256 = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        self.sha256.update(view)
        self._file.write(view)
        self.size += len(view)
        return len(view)

    def sync_and_close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        super().close()


class ShardWriter:
    """Write the rows of one shard to ``<path>.tmp``; :meth:`close` renames it to ``path``.

    A shard never appears under its final name until it is complete and synced to disk,
    so an interrupted pack leaves only ``.tmp`` files behind, and a finished shard is
    never half written. Rows are buffered into Arrow record batches of about
    ``record_batch_bytes`` and written as they fill.

    Args:
        path: the final file name (``OUT/train-00000.arrow``).
        split: the split the shard belongs to (recorded in the returned :class:`ShardInfo`).
        store: ``"encoded"`` (images are the files' bytes) or ``"pixels"`` (uint8 CHW arrays).
        image_size: ``(height, width)``; required for ``"pixels"``.
        record_batch_bytes: about how many image bytes go into one Arrow record batch.

    Example:
        >>> Path("out").mkdir()
        >>> with ShardWriter("out/train-00000.arrow", "train", "encoded", None) as w:
        ...     w.write("0/0.png", 0, "digiface", "0/0.png", Path("data/digiface/0/0.png").read_bytes())
        >>> w.info.samples, len(w.info.sha256), sorted(p.name for p in Path("out").iterdir())
        (1, 64, ['train-00000.arrow'])
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        split: str,
        store: str,
        image_size: tuple[int, int] | None,
        record_batch_bytes: int = RECORD_BATCH_BYTES,
        channels: int = 3,
    ) -> None:
        self.path = Path(path)
        self.split = split
        self.store = store
        self.channels = channels
        self.schema = shard_schema(store, image_size, channels)
        self.tmp_path = self.path.with_name(self.path.name + TMP_SUFFIX)
        self.info: ShardInfo | None = None
        self._image_size = image_size
        self._row_bytes = image_row_bytes(image_size, channels) if store == "pixels" else 0  # type: ignore[arg-type]
        self._batch_bytes = max(int(record_batch_bytes), 1)
        self._rows_per_batch = max(self._batch_bytes // self._row_bytes, 1) if self._row_bytes else 0
        self._file = _HashingFile(self.tmp_path)
        self._writer = pa.ipc.new_file(self._file, self.schema)
        self._samples = 0
        # Row values are kept as Python ints (integer columns) or strings (the rest).
        self._converters: list[tuple[str, type[int] | type[str]]] = [
            (column.name, int if pa.types.is_integer(column.type) else str) for column in ROW_COLUMNS
        ]
        self._reset()

    def _reset(self) -> None:
        self._values: dict[str, list[object]] = {column.name: [] for column in ROW_COLUMNS}
        self._encoded: list[bytes] = []
        self._crcs: list[int] = []
        self._pending_bytes = 0
        self._pixels = np.empty((self._rows_per_batch, self._row_bytes), dtype=np.uint8) if self._row_bytes else None

    def write(self, key: str, label: int, source: str, file: str, image: Image) -> None:
        """Add one row.

        Args:
            key: the sample's key in its source.
            label: its class, an integer >= 0.
            source: the name of its source.
            file: its file, relative to the source root.
            image: the file's bytes (``encoded``), or a uint8 ``3 x H x W`` array (``pixels``).

        Raises:
            ConfigError: the writer is closed.
            DataError: a negative label, or pixels of the wrong shape or type.
        """
        self.write_row({"key": key, "label": label, "source": source, "file": file}, image)

    def write_row(self, values: Mapping[str, Any], image: Image) -> None:
        """Add one row: ``values`` by column name (every column of :data:`~stoker.shards.format.schema.ROW_COLUMNS`), and its image.

        Raises:
            ConfigError: the writer is closed, or a column's value is missing.
            DataError: a negative label, or pixels of the wrong shape or type.
        """
        if self.info is not None or self._file.closed:
            raise ConfigError(f"{self.path.name}: the shard writer is closed")
        missing = [column.name for column in ROW_COLUMNS if column.name not in values]
        if missing:
            raise ConfigError(f"{self.path.name}: a row needs a value for {', '.join(missing)}")
        key = str(values["key"])
        label = int(values["label"])
        if label < 0:
            raise DataError(f"{key}: label {label} is negative; labels must be integers >= 0")
        n = len(self._crcs)
        if self._row_bytes:
            row = self._pixel_row(key, image)
            self._pixels[n] = row  # type: ignore[index]
            # ndarray has the buffer protocol; numpy's stubs declare __buffer__ only for Python >= 3.12
            self._crcs.append(zlib.crc32(row))  # type: ignore[arg-type]
            self._pending_bytes += self._row_bytes
        else:
            if isinstance(image, torch.Tensor):
                data = image.contiguous().numpy().tobytes()
            elif isinstance(image, np.ndarray):
                data = image.tobytes()
            else:
                data = bytes(image)
            self._encoded.append(data)
            self._crcs.append(zlib.crc32(data))
            self._pending_bytes += len(data)
        for name, convert in self._converters:
            self._values[name].append(convert(values[name]))
        if (self._row_bytes and len(self._crcs) == self._rows_per_batch) or self._pending_bytes >= self._batch_bytes:
            self._flush()

    def _pixel_row(self, key: str, image: Image) -> np.ndarray:
        height, width = self._image_size  # type: ignore[misc]
        if isinstance(image, torch.Tensor):
            if image.dtype != torch.uint8:
                raise DataError(f"{key}: pixels must be uint8, got {image.dtype}; convert the images or store='encoded'")
            array = image.contiguous().numpy()
        elif isinstance(image, np.ndarray):
            if image.dtype != np.uint8:
                raise DataError(f"{key}: pixels must be uint8, got {image.dtype}; convert the images or store='encoded'")
            array = np.ascontiguousarray(image)
        else:
            array = np.frombuffer(image, dtype=np.uint8)
        if array.size != self._row_bytes or (array.ndim == 3 and array.shape != (self.channels, height, width)):
            raise DataError(
                f"{key}: expected a uint8 image of shape {self.channels}x{height}x{width}, got {tuple(array.shape)}; "
                "resize it to the shard set's image size"
            )
        return array.reshape(-1)

    def _flush(self) -> None:
        n = len(self._crcs)
        if n == 0:
            return
        if self._row_bytes:
            buffer = pa.py_buffer(self._pixels[:n].reshape(-1))  # type: ignore[index]
            images = pa.FixedSizeBinaryArray.from_buffers(self.schema.field("image").type, n, [None, buffer])
        else:
            images = pa.array(self._encoded, type=pa.binary())
        made = {"crc32": pa.array(np.asarray(self._crcs, dtype=np.uint32)), "image": images}
        arrays = [made[c.name] if c.rows is None else pa.array(self._values[c.name], type=c.type) for c in COLUMNS]
        self._writer.write_batch(pa.record_batch(arrays, schema=self.schema))
        self._samples += n
        self._reset()

    def close(self) -> ShardInfo:
        """Flush, sync, and rename the shard to its final name; returns its :class:`ShardInfo`."""
        if self.info is not None:
            return self.info
        self._flush()
        self._writer.close()
        self._file.sync_and_close()
        os.replace(self.tmp_path, self.path)
        self.info = ShardInfo(self.path.name, self.split, self._samples, self._file.size, self._file.sha256.hexdigest())
        return self.info

    def abort(self) -> None:
        """Give up: close and delete the temporary file (the final name is never touched)."""
        if self.info is not None:
            return
        try:
            self._file.close()
        finally:
            self.tmp_path.unlink(missing_ok=True)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


@dataclass(frozen=True)
class WrittenShard(ShardInfo):
    """A shard just written, and how many of its images were resized to the set's size (for the one note)."""

    resized: int = 0


def say_resized(resized: int, written: int, size: tuple[int, int], size_given: bool) -> None:
    """The one note of a pixel pack that resized images: to which size, how many, and how to choose."""
    height, width = size
    why = "the size given" if size_given else "the first image's size"
    log.warning(
        "pack: resized %d of %d images to %dx%d (%s): their sizes differ; %s",
        resized, written, height, width, why,
        "choose another with --size HEIGHTxWIDTH (size=(height, width))" if not size_given
        else "--size HEIGHTxWIDTH (size=) chose it",
    )
