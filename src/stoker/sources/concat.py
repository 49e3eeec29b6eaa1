"""Combine data sets by laying their label spaces side by side."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from stoker.errors import ConfigError
from stoker.loading.skips import OnError
from stoker.sources.dataset import FileDataset
from stoker.sources.index import SampleIndex
from stoker.types import Transform

__all__ = ["concat"]


def concat(
    *datasets: FileDataset,
    offsets: Literal["auto"] | Sequence[int] | None = "auto",
    transform: Transform | None = None,
    on_error: OnError | None = None,
) -> FileDataset:
    """Concatenate data sets into one, without label clashes.

    Args:
        datasets: the data sets, in order.
        offsets: ``"auto"`` shifts each data set's labels past the previous ones (the
            class count is the sum); ``None`` keeps labels as they are (for sources made
            with their own ``label_offset``); or one explicit offset per data set.
        transform: the transform of the result (default: the first data set's).
        on_error: the bad-sample policy (default: the first data set's).

    Example:
        >>> from stoker.sources import ClassFolderDataset, LabelFileDataset
        >>> celeba = LabelFileDataset("data/celeba/img", "data/celeba/identity_CelebA.txt")
        >>> digiface = ClassFolderDataset("data/digiface")
        >>> both = concat(celeba, digiface)
        >>> both.num_classes == celeba.num_classes + digiface.num_classes, len(both) == len(celeba) + len(digiface)
        (True, True)
    """
    if not datasets:
        raise ConfigError("concat needs at least one data set")
    for ds in datasets:
        if not isinstance(ds, FileDataset):
            raise ConfigError(f"concat takes stoker data sets, got {type(ds).__name__}")
    if offsets == "auto":
        shifts, total = [], 0
        for ds in datasets:
            shifts.append(total)
            total += ds.num_classes
    elif offsets is None:
        shifts = [0] * len(datasets)
    else:
        shifts = [int(o) for o in offsets]
        if len(shifts) != len(datasets) or any(o < 0 for o in shifts):
            raise ConfigError(f"offsets must be 'auto', None or {len(datasets)} integers >= 0, got {offsets!r}")
    index = SampleIndex.concat([ds.index for ds in datasets], shifts)
    first = datasets[0]
    return FileDataset(index, transform if transform is not None else first.transform, on_error or first.on_error)
