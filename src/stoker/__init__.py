"""stoker keeps the GPU fed: load, pack, stream, train and benchmark image data sets.

Example:
    >>> import stoker
    >>> ds = stoker.ClassFolderDataset("digiface")  # doctest: +SKIP
    >>> loader = stoker.make_loader(ds, batch_size=256, num_workers=2)  # doctest: +SKIP
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from stoker.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    DecodeError,
    LabelError,
    MissingFileError,
    ShardError,
    StokerError,
    TrainingError,
)
from stoker.loading import Loader, make_loader
from stoker.pipes import Pipe, register_stage
from stoker.sources import (
    ClassFolderDataset,
    FileDataset,
    IdDataset,
    LabelFileDataset,
    SampleIndex,
    Source,
    concat,
)

try:
    __version__ = version("stoker")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "CheckpointError",
    "ClassFolderDataset",
    "ConfigError",
    "DataError",
    "DecodeError",
    "FileDataset",
    "IdDataset",
    "LabelError",
    "LabelFileDataset",
    "Loader",
    "MissingFileError",
    "Pipe",
    "SampleIndex",
    "ShardError",
    "Source",
    "StokerError",
    "TrainingError",
    "__version__",
    "concat",
    "make_loader",
    "register_stage",
]
