"""Synthetic data sets: layouts, balance, determinism, learnability and `stoker make-data`."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from stoker.cli.main import main
from stoker.errors import ConfigError
from stoker.sources.synthetic import (
    _balanced_labels,
    _validation_mask,
    make_celeba,
    make_data,
    make_digiface,
    make_ids,
    render,
)


def _files(root: Path) -> dict[str, bytes]:
    """Every file under root, by relative path, with its bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _celeba_labels(root: Path) -> list[tuple[str, int]]:
    lines = (root / "identity_CelebA.txt").read_text().splitlines()
    return [(name, int(label)) for name, label in (line.split() for line in lines)]


def test_celeba_layout(tmp_path: Path) -> None:
    root = make_celeba(tmp_path / "celeba", n=30, seed=0, classes=3, progress=False)

    names = sorted(p.name for p in (root / "img").iterdir())
    assert root == tmp_path / "celeba"
    assert names == [f"{i:06d}.jpg" for i in range(1, 31)]
    for name in names[:5]:
        with Image.open(root / "img" / name) as image:
            assert (image.format, image.mode, image.size) == ("JPEG", "RGB", (178, 218))
    mean_kb = np.mean([(root / "img" / n).stat().st_size for n in names]) / 1024
    assert 5 <= mean_kb <= 20

    pairs = _celeba_labels(root)
    assert [name for name, _ in pairs] == names
    labels = [label for _, label in pairs]
    assert Counter(labels) == {1: 10, 2: 10, 3: 10}  # 1-based identities, balanced
    assert labels != sorted(labels)  # numbering is not grouped by class


def test_digiface_layout(tmp_path: Path) -> None:
    root = make_digiface(tmp_path / "digiface", n=25, seed=0, classes=4, progress=False)

    folders = sorted((p.name for p in root.iterdir()), key=int)
    assert folders == ["0", "1", "2", "3"]
    counts = [len(list((root / f).iterdir())) for f in folders]
    assert counts == [7, 6, 6, 6]
    assert sorted(p.name for p in (root / "3").iterdir()) == ["0.png", "1.png", "2.png", "3.png", "4.png", "5.png"]
    with Image.open(root / "0" / "0.png") as image:
        assert (image.format, image.mode, image.size) == ("PNG", "RGBA", (112, 112))
        pixels = np.asarray(image)
    assert (pixels[..., 3] == 255).all()
    assert pixels[..., :3].std() > 10  # textured, not flat


def test_ids_layout(tmp_path: Path) -> None:
    root = make_ids(tmp_path / "ids", n=50, seed=0, classes=5, progress=False)

    ids = [f"id-{i:05d}" for i in range(1, 51)]
    assert sorted(p.name for p in (root / "data").iterdir()) == [f"{i}.pt" for i in ids]
    tensor = torch.load(root / "data" / "id-00007.pt", weights_only=True)
    assert (tensor.dtype, tuple(tensor.shape)) == (torch.uint8, (3, 64, 64))
    assert tensor.is_contiguous()

    table = json.loads((root / "ids.json").read_text())
    train, validation = table["partition"]["train"], table["partition"]["validation"]
    labels = table["labels"]
    assert sorted(train + validation) == ids and not set(train) & set(validation)
    assert len(validation) == 10
    assert Counter(labels[i] for i in validation) == {c: 2 for c in range(5)}  # stratified
    assert Counter(labels.values()) == {c: 10 for c in range(5)}  # 0-based, balanced
    assert list(labels.values()) != sorted(labels.values())

    with (root / "ids.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["id", "label", "split"]
    assert {r["id"]: int(r["label"]) for r in rows} == labels
    assert [r["id"] for r in rows if r["split"] == "validation"] == validation
    assert {r["split"] for r in rows} == {"train", "validation"}


@pytest.mark.parametrize("kind", ["celeba", "digiface", "ids"])
def test_same_seed_same_bytes_whatever_the_workers(tmp_path: Path, kind: str) -> None:
    one = _files(make_data(kind, tmp_path / "one", n=24, seed=3, classes=3, workers=1, progress=False))
    two = _files(make_data(kind, tmp_path / "two", n=24, seed=3, classes=3, workers=2, progress=False))
    other = _files(make_data(kind, tmp_path / "other", n=24, seed=4, classes=3, workers=1, progress=False))

    assert one == two
    assert one.keys() == other.keys()
    samples = [k for k in one if k.endswith((".jpg", ".png", ".pt"))]
    assert len(samples) == 24
    assert all(one[k] != other[k] for k in samples)


def test_classes_are_learnable_from_mean_colour(tmp_path: Path) -> None:
    # nearest class mean on the mean colour, fitted on seed 0 and scored on seed 1
    def mean_colours(seed: int) -> tuple[np.ndarray, np.ndarray]:
        root = make_ids(tmp_path / f"seed{seed}", n=200, seed=seed, classes=10, progress=False)
        labels = json.loads((root / "ids.json").read_text())["labels"]
        tensors = [torch.load(root / "data" / f"{i}.pt", weights_only=True) for i in labels]
        x = np.stack([t.float().mean((1, 2)).numpy() for t in tensors])  # (n, 3) mean colour
        return x, np.array(list(labels.values()))

    x_train, y_train = mean_colours(0)
    x_test, y_test = mean_colours(1)
    means = np.stack([x_train[y_train == c].mean(0) for c in range(10)])
    predicted = ((x_test[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (predicted == y_test).mean() > 0.6  # chance is 0.1


def test_render() -> None:
    rgb = render(3, 40, 30, seed=1, index=2)
    rgba = render(3, 40, 30, seed=1, index=2, channels=4)
    assert (rgb.shape, rgb.dtype) == ((40, 30, 3), np.uint8)
    assert np.array_equal(rgba[..., :3], rgb) and (rgba[..., 3] == 255).all()
    assert np.array_equal(render(3, 40, 30, seed=1, index=2), rgb)
    assert not np.array_equal(render(3, 40, 30, seed=1, index=3), rgb)
    with pytest.raises(ConfigError, match="channels"):
        render(3, 40, 30, channels=2)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"n": 0}, "n must"),
        ({"n": True}, "n must"),
        ({"classes": 1}, "classes must"),
        ({"n": 5, "classes": 6}, "classes (6) is more than n (5)"),
        ({"seed": -1}, "seed must"),
        ({"workers": 0}, "workers must"),
        ({"kind": "imagenet"}, "kind must"),
    ],
)
def test_bad_arguments_raise_before_writing(tmp_path: Path, arguments: dict, named: str) -> None:
    call = {"kind": "ids", "root": tmp_path / "out", "n": 10, "seed": 0, "classes": 2, "progress": False}
    with pytest.raises(ConfigError) as raised:
        make_data(**{**call, **arguments})
    assert named in str(raised.value)
    assert not (tmp_path / "out").exists()


def test_refuses_non_empty_folder_and_overwrite_replaces_only_its_files(tmp_path: Path) -> None:
    root = make_celeba(tmp_path, n=12, classes=2, progress=False)
    (root / "notes.txt").write_text("mine")

    with pytest.raises(ConfigError) as raised:
        make_celeba(root, n=6, classes=2, progress=False)
    assert str(root) in str(raised.value) and "--overwrite" in str(raised.value)

    make_celeba(root, n=6, classes=2, progress=False, overwrite=True)
    assert len(list((root / "img").iterdir())) == 6
    assert len(_celeba_labels(root)) == 6
    assert (root / "notes.txt").read_text() == "mine"


def test_progress_bar_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A bar only where asked and only on a terminal (a log gets no frames: stoker.terminal)."""
    import io
    import sys

    class _Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    make_ids(tmp_path / "quiet", n=300, classes=2, progress=False)
    assert capsys.readouterr().err == ""
    make_ids(tmp_path / "log", n=300, classes=2, progress=True)  # stderr is not a terminal here
    assert capsys.readouterr().err == ""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    make_ids(tmp_path / "loud", n=300, classes=2, progress=True)
    assert "make ids" in terminal.getvalue()


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 400).flatmap(lambda n: st.tuples(st.just(n), st.integers(2, n), st.integers(0, 2**32))))
def test_labels_balanced_and_split_stratified(case: tuple[int, int, int]) -> None:
    n, classes, seed = case
    labels = _balanced_labels(n, classes, seed)
    counts = np.bincount(labels, minlength=classes)
    assert counts.max() - counts.min() <= 1 and counts.sum() == n

    validation = _validation_mask(labels, seed)
    assert validation.sum() == min(max(round(0.2 * n), 1), n - 1)
    per_class = np.bincount(labels[validation], minlength=classes)
    assert per_class.max() - per_class.min() <= 1


def test_cli_end_to_end(tmp_path: Path) -> None:
    runner = CliRunner()
    root = tmp_path / "digiface"
    args = ["make-data", "digiface", str(root), "--n", "20", "--classes", "4", "--seed", "1"]

    made = runner.invoke(main, args)
    assert made.exit_code == 0, made.output
    assert f"made digiface: 20 images, 4 classes, seed 1 in {root}" in made.output
    assert "ClassFolderDataset" in made.output
    assert sorted(p.name for p in root.iterdir()) == ["0", "1", "2", "3"]

    refused = runner.invoke(main, args)
    assert refused.exit_code == 1
    assert str(root) in refused.output and "--overwrite" in refused.output

    bad = runner.invoke(main, ["make-data", "ids", str(tmp_path / "ids"), "--n", "3", "--classes", "4"])
    assert bad.exit_code == 1 and "classes (4) is more than n (3)" in bad.output

    again = runner.invoke(main, [*args[:5], "--classes", "2", "--overwrite"])  # stale class folders go
    assert again.exit_code == 0, again.output
    assert sorted(p.name for p in root.iterdir()) == ["0", "1"]


def test_cli_help_explains_layouts() -> None:
    shown = CliRunner().invoke(main, ["make-data", "--help"])
    assert shown.exit_code == 0
    for piece in ("identity_CelebA.txt", "RGBA", "<class>/<i>.png", "ids.json", "id,label,split"):
        assert piece in shown.output
