"""One shard of a set, memory-mapped and checked: :class:`ShardFile` (what :class:`~stoker.shards.read.reader.ShardSet` opens).

Opening a shard checks its size, schema, record batches and row count against the
manifest, so a damaged file is a :class:`~stoker.errors.ShardError`, never a crash;
rows are then read by the batch straight from the memory map.
"""

from __future__ import annotations

import bisect
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from stoker.errors import ShardError
from stoker.shards.cache.entries import Holder
from stoker.shards.format.manifest import ShardInfo
from stoker.shards.format.schema import COLUMN_INDEX
from stoker.shards.read.gather import RowSpan, take_rows

__all__ = ["ShardFile", "gather_span", "repair_hint"]


def _numbers(column: pa.Array) -> np.ndarray:
    """A column of fixed-width integers without nulls as a numpy view of its data buffer.

    ``Array.to_numpy`` imports pandas the first time (a quarter of a second in every process
    that opens a shard); it stays the way for anything else (nulls, another type).
    """
    if column.null_count == 0 and pa.types.is_integer(column.type):
        dtype = np.dtype(column.type.to_pandas_dtype()).newbyteorder("<")
        return np.frombuffer(column.buffers()[1], dtype=dtype, count=len(column), offset=column.offset * dtype.itemsize)
    return column.to_numpy()


# Column positions in the schema (see stoker.shards.format.schema.COLUMNS).
_LABEL, _CRC32, _IMAGE = COLUMN_INDEX["label"], COLUMN_INDEX["crc32"], COLUMN_INDEX["image"]


def repair_hint(root: str | os.PathLike[str]) -> str:
    """What a shard error tells the user to do."""
    return f"run `stoker verify {root}` to check every shard, or re-pack with `stoker pack`"


class ShardFile:
    """One shard, memory-mapped and checked against the manifest and the schema.

    Opening checks the file size, the schema, the structure of every record batch
    (``validate(full=True)``: offsets in bounds, no nulls) and the row count, so that
    reading a row of a damaged file raises :class:`ShardError` rather than crashing.
    It does not hash the file; ``stoker verify`` does.

    Attributes:
        info: the manifest's entry for this shard.
        labels: every row's label (``int64``).
    """

    def __init__(
        self,
        root: Path | str,
        info: ShardInfo,
        schema: pa.Schema,
        num_classes: int,
        path: Path | None = None,
        holder: Holder | None = None,
    ) -> None:
        self.info = info
        # holder: a remote set's hold on its cache entry (eviction skips it), let go by close().
        self.holder = holder
        # path: where the bytes are when not root/name (a remote set's verified cache copy).
        self.path = path if path is not None else Path(root) / info.name
        where = f"shard {info.name}"
        hint = repair_hint(root)
        _check_regular(self.path, where, hint)  # memory-mapping a FIFO would block forever
        try:
            self._mmap = pa.memory_map(str(self.path), "r")
        except FileNotFoundError:
            raise ShardError(f"{where}: file is missing; {hint}") from None
        except (OSError, pa.ArrowException) as exc:
            raise ShardError(f"{where}: cannot open ({exc}); {hint}") from None
        try:
            size = self._mmap.size()
            if size != info.bytes:
                raise ShardError(
                    f"{where}: {size} bytes on disk, the manifest says {info.bytes} (truncated or changed); {hint}"
                )
            reader = pa.ipc.open_file(self._mmap)
            if not reader.schema.equals(schema, check_metadata=True):
                raise ShardError(f"{where}: its schema does not match the manifest ({reader.schema}); {hint}")
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            for batch in batches:
                batch.validate(full=True)
                if any(column.null_count for column in batch.columns):
                    raise ShardError(f"{where}: has null values, which stoker never writes; {hint}")
        except ShardError:
            self._mmap.close()
            raise
        except (pa.ArrowException, OSError, ValueError, IndexError) as exc:
            self._mmap.close()
            raise ShardError(f"{where}: not a readable Arrow file ({_short(exc)}); {hint}") from None
        counts = [batch.num_rows for batch in batches]
        if sum(counts) != info.samples:
            self._mmap.close()
            raise ShardError(f"{where}: holds {sum(counts)} rows, the manifest says {info.samples}; {hint}")
        self._batches = batches
        self._starts = np.cumsum([0] + counts)
        self._start_list = self._starts.tolist()
        self.labels = np.concatenate([_numbers(b.column(_LABEL)) for b in batches]) if batches else np.zeros(0, np.int64)
        if len(self.labels) and (self.labels.min() < 0 or self.labels.max() >= num_classes):
            row = int(np.flatnonzero((self.labels < 0) | (self.labels >= num_classes))[0])
            self._mmap.close()
            raise ShardError(
                f"{where} row {row}: label {int(self.labels[row])} is outside the {num_classes} classes; {hint}"
            )
        self._origins: tuple[list[str], list[str]] | None = None
        self._crc32 = (
            np.concatenate([_numbers(b.column(_CRC32)) for b in batches]) if batches else np.zeros(0, np.uint32)
        )
        image_type = schema.field("image").type
        self._pixels: list[np.ndarray] = []
        self._span: RowSpan | None = None  # pixel_span, made on first use
        self._encoded: list[tuple[np.ndarray, np.ndarray]] = []
        for batch in batches:
            column = batch.column(_IMAGE)
            buffers = column.buffers()
            n = len(column)
            if pa.types.is_fixed_size_binary(image_type):
                width = image_type.byte_width
                data = _as_uint8(buffers[1], column.offset * width, n * width)
                self._pixels.append(data.reshape(n, width))
            else:
                offsets = np.frombuffer(buffers[1], dtype=np.int32, count=n + 1, offset=4 * column.offset)
                self._encoded.append((offsets, _as_uint8(buffers[2], 0, None)))

    def __len__(self) -> int:
        return self.info.samples

    def _locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(record batch, row within it) of each row."""
        chunk = np.searchsorted(self._starts, rows, side="right") - 1
        return chunk, rows - self._starts[chunk]

    def take_pixels(self, rows: np.ndarray, out: np.ndarray) -> None:
        """Copy pixel rows (checked to be in range) into ``out``, one copy per row."""
        chunk, local = self._locate(rows)
        if chunk[0] == chunk[-1] and (chunk == chunk[0]).all():
            # mode="clip" skips numpy's buffering of out= (rows are already in range).
            np.take(self._pixels[int(chunk[0])], local, axis=0, out=out, mode="clip")
            return
        self.pixel_span().take(chunk, local, out)  # in C, not a Python loop per row

    def pixel_span(self) -> RowSpan:
        """This shard's pixel rows of every record batch, reachable by one fancy index (made on first use)."""
        if self._span is None:
            self._span = RowSpan(self._pixels, self._pixels[0].shape[1])
        return self._span

    def gather_pixels(self, rows: np.ndarray, take: Callable[[tuple[int, int]], np.ndarray], threads: int = 1) -> np.ndarray:
        """The pixel rows ``rows`` (checked to be in range) as an array: ``take(shape)``'s buffer filled, or a new one.

        Rows of one record batch are copied by ``np.take`` into the buffer, on up to
        ``threads`` threads; rows of several through :meth:`pixel_span` (:func:`gather_span`).
        """
        if len(self._pixels) == 1:
            out = take((len(rows), self._pixels[0].shape[1]))
            take_rows(self._pixels[0], rows, out, threads)
            return out
        return gather_span(self.pixel_span(), *self._locate(rows), take, threads)

    @property
    def pixel_segments(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """(first row of each record batch, its pixels as a ``rows x 3*H*W`` view)."""
        return self._starts[:-1], self._pixels

    def pixel_row(self, row: int) -> np.ndarray:
        """A read-only view of one row's pixels (flat, ``3*H*W`` bytes)."""
        if len(self._pixels) == 1:
            return self._pixels[0][row]
        chunk = bisect.bisect_right(self._start_list, row) - 1
        return self._pixels[chunk][row - self._start_list[chunk]]

    def encoded(self, row: int) -> np.ndarray:
        """A read-only view of one row's encoded bytes."""
        if len(self._encoded) == 1:
            offsets, data = self._encoded[0]
            return data[offsets[row] : offsets[row + 1]]
        chunk = bisect.bisect_right(self._start_list, row) - 1
        offsets, data = self._encoded[chunk]
        r = row - self._start_list[chunk]
        return data[offsets[r] : offsets[r + 1]]

    def origin(self, row: int) -> tuple[str, str]:
        """``(source, file)`` of a row (both columns are read once, on first use)."""
        if self._origins is None:
            self._origins = (self.column("source"), self.column("file"))
        return self._origins[0][row], self._origins[1][row]

    def crc32(self) -> np.ndarray:
        """Every row's recorded CRC-32 of its image bytes (``uint32``)."""
        return self._crc32

    def image_bytes(self, row: int) -> np.ndarray:
        """A read-only view of one row's image bytes, whatever the store."""
        return self.pixel_row(row) if self._pixels else self.encoded(row)

    def encoded_sizes(self) -> np.ndarray:
        """Bytes of every row's encoded image."""
        return np.concatenate([np.diff(offsets) for offsets, _ in self._encoded]).astype(np.int64)

    def column(self, name: str) -> list[Any]:
        """A whole string column (``"key"``, ``"source"`` or ``"file"``) as Python strings."""
        return [value for batch in self._batches for value in batch.column(name).to_pylist()]

    def value(self, name: str, row: int) -> Any:
        """One cell of a column."""
        chunk, local = self._locate(np.asarray([row]))
        return self._batches[int(chunk[0])].column(name)[int(local[0])].as_py()

    def close(self) -> None:
        """Drop the views, unmap the file and let go of its cache entry."""
        self._pixels, self._encoded, self._batches, self._span = [], [], [], None
        self._mmap.close()
        if self.holder is not None:
            self.holder.close()


def gather_span(
    span: RowSpan, segment: np.ndarray, local: np.ndarray, take: Callable[[tuple[int, int]], np.ndarray], threads: int
) -> np.ndarray:
    """Rows of a span: copied into ``take(shape)``'s buffer where it is contiguous or several threads copy, else one fancy index.

    On one thread the fancy index into a new array is numpy's fastest gather from a
    strided source: measured with the last batch still held (as a loader's user holds
    it), ``torch.index_select`` into a reused buffer was 0.7-0.9x it, the fresh array's
    page faults included. Split over two threads (:meth:`RowSpan.take`) it was 1.1-1.2x
    (``benchmarks/bench_decode.py --only gather``, 2 quiet cores).
    """
    if not span.contiguous and threads <= 1:
        return span.gather(segment, local)
    out = take((len(segment), span.rows.shape[1]))
    span.take(segment, local, out, threads)
    return out


def _check_regular(path: Path, where: str, hint: str) -> None:
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ShardError(f"{where}: file is missing; {hint}") from None
    except OSError as exc:
        raise ShardError(f"{where}: cannot open ({exc.strerror or exc}); {hint}") from None
    if not stat.S_ISREG(mode):
        raise ShardError(f"{where}: not a regular file (a FIFO, device or folder); {hint}")


def _as_uint8(buffer: pa.Buffer | None, offset: int, count: int | None) -> np.ndarray:
    if buffer is None:
        return np.zeros(0, dtype=np.uint8)
    return np.frombuffer(buffer, dtype=np.uint8, count=-1 if count is None else count, offset=offset)


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."

