"""The shard columns are one table: the schema, the writer, the reader and the row sources follow it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from stoker.errors import ConfigError
from stoker.shards import ShardWriter
from stoker.shards.format import schema as shard_format
from stoker.shards.format.schema import COLUMN_INDEX, COLUMNS, ROW_COLUMNS, shard_schema
from stoker.shards.pack.rows import row_values


def test_the_schema_is_the_table_in_order() -> None:
    for store, size in (("encoded", None), ("pixels", (2, 3))):
        assert shard_schema(store, size).names == [c.name for c in COLUMNS]
    assert [COLUMN_INDEX[c.name] for c in COLUMNS] == list(range(len(COLUMNS)))
    assert [c.name for c in ROW_COLUMNS] == ["key", "label", "source", "file"]
    for column in COLUMNS:  # the module's table of columns documents every one
        assert f"``{column.name}``" in (shard_format.__doc__ or "")


class _Rows:
    keys = np.asarray(["a", "b"])
    labels = np.asarray([1, 0], dtype=np.int64)
    source_names = np.asarray(["s", "t"])
    files = np.asarray(["x/a.png", "y/b.png"])


def test_write_row_takes_the_row_sources_values_by_column(tmp_path: Path) -> None:
    rows = _Rows()
    with ShardWriter(tmp_path / "train-00000.arrow", "train", "encoded", None) as writer:
        for i in range(2):
            writer.write_row(row_values(rows, i), b"img%d" % i)  # type: ignore[arg-type]
    table = pa.ipc.open_file(pa.memory_map(str(tmp_path / "train-00000.arrow"))).read_all()
    for column in ROW_COLUMNS:
        assert table.column(column.name).to_pylist() == getattr(rows, column.rows).tolist()
    assert table.column("image").to_pylist() == [b"img0", b"img1"]
    with pytest.raises(ConfigError, match="needs a value for file"):
        with ShardWriter(tmp_path / "train-00001.arrow", "train", "encoded", None) as writer:
            writer.write_row({"key": "a", "label": 0, "source": "s"}, b"")
