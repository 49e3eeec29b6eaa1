"""stoker keeps the GPU fed: load, pack, stream, train and benchmark image data sets.

Every public name is listed in ``__all__`` and has its home module in ``_HOMES``. The
names are imported on first use (PEP 562), so ``import stoker`` and ``stoker --help``
do not pay for importing torch until something needs it.

Example:
    >>> import stoker
    >>> ds = stoker.ClassFolderDataset("data/digiface")
    >>> loader = stoker.make_loader(ds, batch_size=8, num_workers=2)
    >>> images, labels = next(iter(loader))
    >>> images.dtype, tuple(images.shape), labels.dtype
    (torch.uint8, (8, 3, 112, 112), torch.int64)
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from stoker._lazy import lazy_names
from stoker.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    DecodeError,
    LabelError,
    MissingFileError,
    NetworkError,
    ShardError,
    StokerError,
    TrainingError,
)

if TYPE_CHECKING:
    from stoker.bench import bench, tune
    from stoker.data import DataSplits, open_data
    from stoker.loading import EqualSteps, Loader, make_loader
    from stoker.mixing import shuffle_quality
    from stoker.packer import pack
    from stoker.pipes import Pipe, register_stage
    from stoker.shards import Manifest, ShardDataset, ShardStream, verify
    from stoker.sources import ClassFolderDataset, FileDataset, IdDataset, LabelFileDataset, SampleIndex, Source, concat
    from stoker.train import Scenario, fit

try:
    __version__ = version("stoker")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

# Public name -> the module it lives in (imported on first use).
_HOMES: dict[str, str] = {
    "ClassFolderDataset": "stoker.sources",
    "DataSplits": "stoker.data",
    "EqualSteps": "stoker.loading",
    "FileDataset": "stoker.sources",
    "IdDataset": "stoker.sources",
    "LabelFileDataset": "stoker.sources",
    "Loader": "stoker.loading",
    "Manifest": "stoker.shards",
    "Pipe": "stoker.pipes",
    "SampleIndex": "stoker.sources",
    "Scenario": "stoker.train",
    "ShardDataset": "stoker.shards",
    "ShardStream": "stoker.shards",
    "Source": "stoker.sources",
    "bench": "stoker.bench",
    "concat": "stoker.sources",
    "fit": "stoker.train",
    "make_loader": "stoker.loading",
    "open_data": "stoker.data",
    "pack": "stoker.packer",
    "register_stage": "stoker.pipes",
    "shuffle_quality": "stoker.mixing",
    "tune": "stoker.bench",
    "verify": "stoker.shards",
}


__all__ = [
    "CheckpointError",
    "ClassFolderDataset",
    "ConfigError",
    "DataError",
    "DataSplits",
    "DecodeError",
    "EqualSteps",
    "FileDataset",
    "IdDataset",
    "LabelError",
    "LabelFileDataset",
    "Loader",
    "Manifest",
    "MissingFileError",
    "NetworkError",
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
    "open_data",
    "pack",
    "register_stage",
    "shuffle_quality",
    "tune",
    "verify",
]

__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals(), __all__)
