"""Stages registered by name, and the built-in load_image stage."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from stoker.errors import ConfigError, DecodeError, MissingFileError
from stoker.pipes import Pipe, register_stage, registered_stages, registry


@register_stage("test_pairs")
def pairs(items: Iterator[int], fill: int = -1) -> Iterator[tuple[int, int]]:
    items = iter(items)
    for first in items:
        yield first, next(items, fill)


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_STAGES", dict(registry._STAGES))


def test_a_registered_stage_is_a_pipe_method() -> None:
    assert list(Pipe.from_iterable(range(5)).test_pairs(fill=9)) == [(0, 1), (2, 3), (4, 9)]
    assert registered_stages()["test_pairs"] is pairs
    assert "load_image" in registered_stages()


def test_registering_a_taken_name_raises(clean_registry: None) -> None:
    def other(items: Iterator[int]) -> Iterator[int]:
        yield from items

    with pytest.raises(ConfigError, match="registered already"):
        register_stage("test_pairs")(other)
    with pytest.raises(ConfigError, match="is a Pipe method"):
        register_stage("map")
    with pytest.raises(ConfigError, match="is a Pipe method"):
        register_stage("shuffle", replace=True)
    register_stage("test_pairs", replace=True)(other)
    assert list(Pipe.from_iterable([1, 2]).test_pairs()) == [1, 2]


def test_registering_the_same_function_again_is_no_clash(clean_registry: None) -> None:
    assert register_stage("test_pairs")(pairs) is pairs


@pytest.mark.parametrize("name", ["", "_private", "not an identifier", "class", 3])
def test_registering_a_bad_name_raises(name: object) -> None:
    with pytest.raises(ConfigError, match="not a valid stage name"):
        register_stage(name)  # type: ignore[arg-type]


def test_an_unknown_stage_is_an_attribute_error_with_a_hint() -> None:
    with pytest.raises(AttributeError, match=r"@register_stage\('no_such_stage'\)"):
        Pipe.from_iterable([1]).no_such_stage()


RGB = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)  # HWC


def test_load_image_decodes_listed_files_to_rgb(tmp_path: Path) -> None:
    Image.fromarray(RGB).save(tmp_path / "a.png")
    Image.fromarray(np.dstack([RGB, np.full((4, 5), 128, np.uint8)])).save(tmp_path / "b.png")  # RGBA
    pairs = list(Pipe.list_files(tmp_path, masks="*.png").load_image())
    assert [Path(path).name for path, _ in pairs] == ["a.png", "b.png"]
    expected = torch.from_numpy(RGB).permute(2, 0, 1)  # CHW
    for _, image in pairs:
        assert image.dtype == torch.uint8
        assert torch.equal(image, expected)  # alpha dropped
    images = list(Pipe.list_files(tmp_path, masks="*.png").load_image(keep_path=False))
    assert all(torch.equal(image, expected) for image in images)


def test_load_image_names_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(MissingFileError, match="gone.png: file not found"):
        list(Pipe.from_iterable([str(tmp_path / "gone.png")]).load_image())
    (tmp_path / "bad.png").write_bytes(b"not a png")
    with pytest.raises(DecodeError, match="bad.png"):
        list(Pipe.from_iterable([tmp_path / "bad.png"]).load_image())
