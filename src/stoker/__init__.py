"""stoker keeps the GPU fed: load, pack, stream, train and benchmark image data sets.

Example:
    >>> import stoker
    >>> ds = stoker.ClassFolderDataset("digiface")  # doctest: +SKIP
    >>> loader = stoker.make_loader(ds, batch_size=256, num_workers=2)  # doctest: +SKIP
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from stoker.bench import bench, shuffle_quality, tune
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
from stoker.shards import Manifest, ShardDataset, ShardStream, pack, verify
from stoker.sources import (
    ClassFolderDataset,
    FileDataset,
    IdDataset,
    LabelFileDataset,
    SampleIndex,
    Source,
    concat,
)
from stoker.train import Scenario, fit

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
    "Manifest",
    "MissingFileError",
    "Pipe",
    "SampleIndex",
    "Scenario",
    "ShardDataset",
    "ShardError",
    "ShardStream",
    "Source",
    "StokerError",
    "TrainingError",
    "__version__",
    "bench",
    "concat",
    "fit",
    "make_loader",
    "pack",
    "register_stage",
    "shuffle_quality",
    "tune",
    "verify",
]
