"""The three data layouts, concat and split, on small data the tests write themselves."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from stoker import (
    ClassFolderDataset,
    ConfigError,
    DataError,
    DecodeError,
    IdDataset,
    LabelError,
    LabelFileDataset,
    MissingFileError,
    StokerError,
    concat,
)


def _image(label: int, mode: str = "RGB", size: tuple[int, int] = (20, 16)) -> Image.Image:
    """A small image whose red channel encodes its label (so tests can check pixels)."""
    rng = np.random.default_rng(label)
    pixels = rng.integers(0, 255, size=(size[1], size[0], 4), dtype=np.uint8)
    pixels[..., 0] = label * 10
    pixels[..., 3] = 255
    return Image.fromarray(pixels, "RGBA").convert(mode)


def _class_folders(root: Path, names: list[str], per_class: int = 3, mode: str = "RGB", ext: str = "png") -> Path:
    for i, name in enumerate(names):
        (root / name).mkdir(parents=True)
        for j in range(per_class):
            _image(i, mode).save(root / name / f"{j}.{ext}")
    return root


def _label_file_set(root: Path, n: int = 6) -> tuple[Path, Path]:
    img = root / "img"
    img.mkdir(parents=True)
    lines = []
    for i in range(n):
        _image(i % 3 + 1).save(img / f"{i:06d}.jpg", quality=95)
        lines.append(f"{i:06d}.jpg {i % 3 + 1}")
    label_file = root / "identity.txt"
    label_file.write_text("\n".join(lines) + "\n")
    return img, label_file


# -- class folders -------------------------------------------------------------------
def test_class_folders_numeric_labels_and_rgba_becomes_rgb(tmp_path: Path) -> None:
    ds = ClassFolderDataset(_class_folders(tmp_path / "d", ["0", "1", "5"], mode="RGBA"))
    assert len(ds) == 9
    assert ds.num_classes == 6  # numeric names are labels; 2..4 unused
    assert sorted(set(ds.labels.tolist())) == [0, 1, 5]
    image, label = ds[0]
    assert image.dtype == torch.uint8 and image.shape == (3, 16, 20)
    assert label == 0


def test_class_folders_sorted_names_and_grayscale(tmp_path: Path) -> None:
    ds = ClassFolderDataset(_class_folders(tmp_path / "d", ["dog", "cat"], mode="L"))
    assert ds.classes == ("cat", "dog")
    image, label = ds[len(ds) - 1]
    assert image.shape[0] == 3 and label == 1
    assert torch.equal(image[0], image[1])  # gray repeated


def test_class_folders_label_offset_and_concat(tmp_path: Path) -> None:
    a = ClassFolderDataset(_class_folders(tmp_path / "a", ["0", "1"]))
    b = ClassFolderDataset(_class_folders(tmp_path / "b", ["x", "y", "z"]))
    both = concat(a, b)
    assert both.num_classes == 5
    assert len(both) == len(a) + len(b)
    assert sorted(set(both.labels.tolist())) == [0, 1, 2, 3, 4]
    assert both[len(a)][1] == 2  # first sample of b shifted past a's two classes
    shifted = ClassFolderDataset(tmp_path / "b", label_offset=10)
    assert set(shifted.labels.tolist()) == {10, 11, 12}
    kept = concat(a, shifted, offsets=None)
    assert kept.num_classes == 13
    assert set(kept.labels.tolist()) == {0, 1, 10, 11, 12}


def test_concat_same_keys_are_prefixed(tmp_path: Path) -> None:
    a = ClassFolderDataset(_class_folders(tmp_path / "a", ["0", "1"]), name="a")
    b = ClassFolderDataset(_class_folders(tmp_path / "b", ["0", "1"]), name="b")
    both = concat(a, b)
    assert len(set(both.index.keys.tolist())) == len(both)
    assert both.index.keys[0].startswith("a/")


def test_split_is_seeded_stratified_and_disjoint(tmp_path: Path) -> None:
    ds = ClassFolderDataset(_class_folders(tmp_path / "d", ["0", "1"], per_class=10))
    train, valid = ds.split(valid=0.2, seed=3)
    assert len(train) + len(valid) == len(ds)
    assert set(train.index.keys.tolist()).isdisjoint(valid.index.keys.tolist())
    assert np.bincount(valid.labels).tolist() == [2, 2]
    again, _ = ds.split(valid=0.2, seed=3)
    assert again.index.keys.tolist() == train.index.keys.tolist()
    with pytest.raises(ConfigError):
        ds.split(valid=1.5)


# -- label file ----------------------------------------------------------------------
def test_label_file_labels_and_crop(tmp_path: Path) -> None:
    img, labels = _label_file_set(tmp_path)
    ds = LabelFileDataset(img, labels)
    assert [ds[i][1] for i in range(len(ds))] == [1, 2, 3, 1, 2, 3]
    assert ds[0][0].shape == (3, 16, 20)
    cropped = LabelFileDataset(img, labels, crop=(2, 4, 10, 8))
    full, part = ds[1][0], cropped[1][0]
    assert part.shape == (3, 10, 8)
    assert torch.equal(part, full[:, 2:12, 4:12])


def test_label_file_bad_crop_names_file(tmp_path: Path) -> None:
    img, labels = _label_file_set(tmp_path)
    ds = LabelFileDataset(img, labels, crop=(0, 0, 100, 100))
    with pytest.raises(DecodeError, match="000000.jpg.*crop box"):
        ds[0]


@pytest.mark.parametrize(
    ("line", "message"),
    [("000001.jpg", "has no label"), ("000001.jpg seven", "not an integer"), ("000001.jpg -1", "negative")],
)
def test_label_file_bad_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    img, labels = _label_file_set(tmp_path)
    labels.write_text("000000.jpg 1\n" + line + "\n")
    with pytest.raises(LabelError, match=rf"identity.txt:2: .*{message}"):
        LabelFileDataset(img, labels)


def test_label_file_duplicate_and_missing_image(tmp_path: Path) -> None:
    img, labels = _label_file_set(tmp_path)
    labels.write_text("000000.jpg 1\n000000.jpg 2\n")
    with pytest.raises(LabelError, match=r"identity.txt:2: .*listed again"):
        LabelFileDataset(img, labels)
    labels.write_text("000000.jpg 1\nnot-there.jpg 2\n")
    with pytest.raises(MissingFileError, match="not-there.jpg"):
        LabelFileDataset(img, labels)


# -- ids -----------------------------------------------------------------------------
def _ids_set(root: Path) -> tuple[Path, dict, dict]:
    data = root / "data"
    data.mkdir(parents=True)
    torch.save(torch.full((3, 8, 8), 7, dtype=torch.uint8), data / "a.pt")
    np.save(data / "b.npy", np.full((8, 8, 3), 9, dtype=np.uint8))  # HWC array
    _image(2).save(data / "c.png")
    _image(3).save(data / "d.jpg")
    partition = {"train": ["a", "b", "c"], "validation": ["d"]}
    labels = {"a": 0, "b": 1, "c": 2, "d": 3}
    return data, partition, labels


def test_ids_from_dicts_json_and_csv(tmp_path: Path) -> None:
    data, partition, labels = _ids_set(tmp_path)
    ds = IdDataset(data, partition, labels, split="train")
    assert len(ds) == 3 and ds.num_classes == 4
    a, b = ds[0], ds[1]
    assert a[0].shape == (3, 8, 8) and int(a[0][0, 0, 0]) == 7 and a[1] == 0
    assert b[0].shape == (3, 8, 8) and int(b[0][2, 0, 0]) == 9 and b[1] == 1
    (tmp_path / "ids.json").write_text(json.dumps({"partition": partition, "labels": labels}))
    valid = IdDataset.from_json(tmp_path / "ids.json", split="validation")
    assert len(valid) == 1 and valid[0][1] == 3
    rows = ["id,label,split"] + [f"{i},{labels[i]},{p}" for p, ids in partition.items() for i in ids]
    (tmp_path / "ids.csv").write_text("\n".join(rows) + "\n")
    assert IdDataset.from_csv(tmp_path / "ids.csv", split="train").index.keys.tolist() == ["a", "b", "c"]


def test_ids_errors(tmp_path: Path) -> None:
    data, partition, labels = _ids_set(tmp_path)
    with pytest.raises(MissingFileError, match="'zz'"):
        IdDataset(data, {"train": ["a", "zz"]}, {**labels, "zz": 1})
    with pytest.raises(LabelError, match="'a'.*twice"):
        IdDataset(data, {"train": ["a", "a"]}, labels)
    with pytest.raises(LabelError, match="both 'train' and"):
        IdDataset(data, {"train": ["a"], "validation": ["a"]}, labels)
    with pytest.raises(LabelError, match="no label"):
        IdDataset(data, {"train": ["a", "b"]}, {"a": 0})
    with pytest.raises(LabelError, match="not an integer"):
        IdDataset(data, {"train": ["a"]}, {"a": "cat"})
    with pytest.raises(ConfigError, match="'test'"):
        IdDataset(data, partition, labels, split="test")
    (tmp_path / "dup.json").write_text('{"partition": {"train": ["a"]}, "labels": {"a": 0, "a": 1}}')
    with pytest.raises(LabelError, match="dup.json.*'a' appears twice"):
        IdDataset.from_json(tmp_path / "dup.json", root=data)
    (tmp_path / "dup.csv").write_text("id,label,split\na,0,train\na,1,train\n")
    with pytest.raises(LabelError, match=r"dup.csv:3: .*twice"):
        IdDataset.from_csv(tmp_path / "dup.csv", root=data)


def test_pt_file_with_code_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    torch.save({"not": "a tensor", "obj": Path("x")}, data / "a.pt")
    ds = IdDataset(data, {"train": ["a"]}, {"a": 0})
    with pytest.raises(DecodeError, match="a.pt"):
        ds[0]


# -- bad input -----------------------------------------------------------------------
def test_missing_and_empty_folders(tmp_path: Path) -> None:
    with pytest.raises(MissingFileError, match="not-here"):
        ClassFolderDataset(tmp_path / "not-here")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingFileError, match="no class folders"):
        ClassFolderDataset(tmp_path / "empty")
    (tmp_path / "empty" / "3").mkdir()
    with pytest.raises(DataError, match="hold no images"):
        ClassFolderDataset(tmp_path / "empty")


def test_corrupt_image_raises_or_is_skipped(tmp_path: Path) -> None:
    root = _class_folders(tmp_path / "d", ["0", "1"], per_class=2)
    (root / "1" / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    ds = ClassFolderDataset(root)
    bad = int(np.flatnonzero(ds.index.keys == "1/1.png")[0])
    with pytest.raises(DecodeError, match=r"1/1.png.*on_error='skip'"):
        ds[bad]
    skipping = ClassFolderDataset(root, on_error="skip")
    marker = skipping[bad]
    assert not isinstance(marker, tuple) and marker.key == "1/1.png"


def test_every_error_is_a_stoker_error() -> None:
    for cls in (ConfigError, DataError, DecodeError, LabelError, MissingFileError):
        assert issubclass(cls, StokerError)


def test_mixed_image_sizes_name_two_files_at_the_first_batch(tmp_path: Path) -> None:
    from PIL import Image

    import stoker
    from stoker.errors import DataError

    for label, size in (("0", (8, 8)), ("1", (12, 10))):
        (tmp_path / label).mkdir()
        Image.new("RGB", size).save(tmp_path / label / "a.png")
    for workers in (0, 2):
        loader = stoker.make_loader(stoker.open_data(tmp_path, "train"), batch_size=2, shuffle=False,
                                    num_workers=workers, device="cpu")
        with pytest.raises(DataError, match=r"0/a.png is 8x8.*1/a.png is 10x12.*--image-size"):
            next(iter(loader))
    resized = stoker.make_loader(stoker.open_data(tmp_path, "train", image_size=8), batch_size=2, num_workers=0, device="cpu")
    images, _ = next(iter(resized))
    assert tuple(images.shape) == (2, 3, 8, 8)
