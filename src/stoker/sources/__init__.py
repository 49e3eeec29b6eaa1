"""Where samples come from: the index, the three file layouts, and concatenation."""

from __future__ import annotations

from stoker.loading.skips import Skipped
from stoker.sources.class_folders import ClassFolderDataset
from stoker.sources.concat import concat
from stoker.sources.dataset import FileDataset
from stoker.sources.ids import IdDataset
from stoker.sources.index import SampleIndex, Source
from stoker.sources.label_file import LabelFileDataset

__all__ = [
    "ClassFolderDataset",
    "FileDataset",
    "IdDataset",
    "LabelFileDataset",
    "SampleIndex",
    "Skipped",
    "Source",
    "concat",
]
