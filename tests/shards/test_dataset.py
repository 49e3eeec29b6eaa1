"""ShardDataset: batch reads equal sample reads, and it works with make_loader and torch's DataLoader."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from stoker.errors import ConfigError
from stoker.loading import make_loader
from stoker.shards import ShardBatch, ShardDataset


@pytest.fixture(params=["encoded", "pixels"])
def root(request: pytest.FixtureRequest, packed: Callable[..., Path]) -> Path:
    return packed(store=request.param, size=(8, 8), shard_samples=7, valid=0.25)


def test_a_batch_read_equals_reading_one_sample_at_a_time(root: Path) -> None:
    ds = ShardDataset(root)
    order = np.random.default_rng(0).permutation(len(ds))
    for indices in (order[:16], np.arange(3, 10), np.arange(len(ds)), order[:1]):
        batch = ds.__getitems__(indices)
        assert isinstance(batch, ShardBatch) and len(batch) == len(indices)
        assert batch.images.dtype == torch.uint8 and tuple(batch.images.shape) == (len(indices), 3, 8, 8)
        for j, i in enumerate(indices.tolist()):
            image, label = ds[i]
            assert torch.equal(batch.images[j], image) and batch.labels[j] == label == ds.labels[i]
    assert ds.__getitems__([]).labels.shape == (0,)
    with pytest.raises(IndexError):
        ds[len(ds)]
    with pytest.raises(IndexError):
        ds.__getitems__([0, len(ds)])
    assert ds[-1][1] == ds[len(ds) - 1][1]


def test_metadata(root: Path) -> None:
    ds = ShardDataset(root, "valid")
    assert len(ds) == 10 and ds.split == "valid" and ds.num_classes == 3 and ds.image_size == (8, 8)
    assert "valid" in repr(ds)
    with pytest.raises(ConfigError, match="no split 'test'"):
        ShardDataset(root, "test")
    with pytest.raises(ConfigError):
        ShardDataset(root, on_error="ignore")  # type: ignore[arg-type]


@pytest.mark.parametrize(("backend", "workers"), [("process", 0), ("thread", 2), ("process", 2)])
def test_make_loader_gives_every_sample_once(root: Path, backend: str, workers: int) -> None:
    ds = ShardDataset(root)
    loader = make_loader(ds, batch_size=8, num_workers=workers, backend=backend, device="cpu",  # type: ignore[arg-type]
                         persistent_workers=False)
    seen_images, seen_labels = [], []
    for images, labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 8, 8)
        seen_images.append(images)
        seen_labels.append(labels)
    images, labels = torch.cat(seen_images), torch.cat(seen_labels)
    assert len(labels) == len(ds)
    all_images = ds.__getitems__(np.arange(len(ds))).images
    # The same multiset of samples (the loader shuffled them).
    key = lambda t: sorted(bytes(x.numpy().tobytes()) for x in t)  # noqa: E731
    assert key(images) == key(all_images)
    assert sorted(labels.tolist()) == sorted(ds.labels.tolist())


def test_plain_torch_dataloader_with_default_collate_works(root: Path) -> None:
    ds = ShardDataset(root)
    images, labels = next(iter(DataLoader(ds, batch_size=5)))
    expected = ds.__getitems__(np.arange(5))
    assert torch.equal(images, expected.images) and torch.equal(labels, expected.labels)
    images, labels = next(iter(DataLoader(ds, batch_size=5, collate_fn=ds.collate_fn))).data
    assert torch.equal(images, expected.images)


def test_transform_is_applied_per_sample(packed: Callable[..., Path]) -> None:
    ds = ShardDataset(packed(store="pixels", size=(8, 8), shard_samples=7, valid=0.25), transform=lambda x: x.float() / 255)
    batch = ds.__getitems__([0, 1])
    images, labels = ds.collate_fn(batch).data
    assert images.dtype == torch.float32 and images.shape == (2, 3, 8, 8) and float(images.max()) <= 1.0


def test_pickles_without_open_files(root: Path) -> None:
    ds = ShardDataset(root)
    first = ds[0]
    copy = pickle.loads(pickle.dumps(ds))
    assert all(f is None for f in copy.shards._files)
    assert torch.equal(copy[0][0], first[0])


def test_encoded_without_size_reads_each_file_at_its_size(packed: Callable[..., Path]) -> None:
    ds = ShardDataset(packed(store="encoded", shard_samples=7))
    assert ds.image_size is None
    image, _ = ds[0]
    assert tuple(image.shape) == (3, 12, 10)


def test_loader_defaults_follow_the_storage_mode(packed: Callable[..., Path]) -> None:
    pixels = ShardDataset(packed(store="pixels", size=(8, 8), shard_samples=7, valid=0.25))
    assert pixels.loader_defaults == {"backend": "process", "num_workers": 0}
    encoded = ShardDataset(packed(store="encoded", shard_samples=7))
    assert "num_workers" not in encoded.loader_defaults  # the machine's share (stoker.loading.workers)
    images, _ = next(iter(make_loader(pixels, batch_size=4, device="cpu", **pixels.loader_defaults)))
    assert images.shape == (4, 3, 8, 8)


def test_encoded_shards_of_mixed_sizes_stop_at_the_first_batch_naming_two_files(tmp_path: Path) -> None:
    """Own-size encoded shards whose images differ: the promised error (two files, what to do), not torch's."""
    from PIL import Image

    from stoker.errors import DataError
    from stoker.packer import pack

    for i, (height, width) in enumerate([(12, 10), (12, 10), (9, 7), (12, 10)]):
        (tmp_path / "src" / str(i % 2)).mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (width, height), (i * 40, 0, 0)).save(tmp_path / "src" / str(i % 2) / f"{i}.png")
    pack(tmp_path / "src", tmp_path / "p", store="encoded", shuffle=False, progress=False, workers=0)
    ds = ShardDataset(tmp_path / "p")
    with pytest.raises(DataError, match=r"differ in size.*--image-size.*--size") as caught:
        next(iter(make_loader(ds, batch_size=len(ds), shuffle=False, num_workers=0, device="cpu")))
    message = str(caught.value)
    assert "12x10" in message and "9x7" in message and message.count(".png") == 2
