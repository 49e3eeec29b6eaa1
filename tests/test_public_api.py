"""The package's face: explicit, sorted re-exports that all resolve."""

from __future__ import annotations

import stoker


def test_all_is_sorted_and_resolves() -> None:
    assert stoker.__all__ == sorted(stoker.__all__)
    for name in stoker.__all__:
        assert getattr(stoker, name) is not None, name


def test_issue_names_are_public() -> None:
    for name in ("IdDataset", "LabelFileDataset", "ClassFolderDataset", "concat", "Pipe", "make_loader", "StokerError"):
        assert name in stoker.__all__
