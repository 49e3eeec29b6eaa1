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


def test_renamed_names_still_import_with_a_warning() -> None:
    """An old public name resolves to the renamed class and says the new name."""
    import importlib

    import pytest

    bench, train = importlib.import_module("stoker.bench"), importlib.import_module("stoker.train")
    for package, old, new in ((bench, "RunResult", "MethodResult"), (train, "RunResult", "TrainingResult")):
        assert new in package.__all__ and old not in package.__all__
        with pytest.warns(DeprecationWarning, match=f"{package.__name__}.{old} is now {package.__name__}.{new}"):
            assert getattr(package, old) is getattr(package, new)
