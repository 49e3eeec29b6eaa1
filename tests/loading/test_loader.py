"""make_loader: every sample once per epoch, seeded order, bad samples counted, backends agree."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from stoker import ClassFolderDataset, ConfigError, make_loader


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("folders")
    rng = np.random.default_rng(0)
    for label in range(3):
        (root / str(label)).mkdir()
        for j in range(7):
            pixels = rng.integers(0, 255, size=(12, 10, 4), dtype=np.uint8)
            Image.fromarray(pixels, "RGBA").save(root / str(label) / f"{j}.png")
    return root


def _epoch(loader) -> tuple[list[int], int]:
    labels, count = [], 0
    for images, batch_labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 12, 10)
        labels.extend(batch_labels.tolist())
        count += len(images)
    return labels, count


@pytest.mark.parametrize(("workers", "backend"), [(0, "process"), (2, "process"), (2, "thread")])
def test_every_sample_once_per_epoch(folders: Path, workers: int, backend: str) -> None:
    ds = ClassFolderDataset(folders)
    loader = make_loader(ds, batch_size=4, shuffle=True, num_workers=workers, device="cpu", backend=backend, seed=1)
    first, n1 = _epoch(loader)
    second, n2 = _epoch(loader)
    assert n1 == n2 == len(ds) == 21
    assert sorted(first) == sorted(second) == sorted(ds.labels.tolist())
    assert loader.epoch == 2
    assert len(loader) == 6


def test_order_is_fixed_by_seed_and_epoch(folders: Path) -> None:
    ds = ClassFolderDataset(folders)
    a = make_loader(ds, batch_size=5, num_workers=0, device="cpu", seed=7)
    b = make_loader(ds, batch_size=5, num_workers=2, device="cpu", seed=7)
    a_epochs = [_epoch(a)[0] for _ in range(2)]
    b.set_epoch(1)  # a resumed run jumps straight to epoch 1
    assert _epoch(b)[0] == a_epochs[1]
    assert a_epochs[0] != a_epochs[1]


def test_drop_last_and_no_shuffle(folders: Path) -> None:
    ds = ClassFolderDataset(folders)
    loader = make_loader(ds, batch_size=4, shuffle=False, num_workers=0, device=None, drop_last=True)
    labels, count = _epoch(loader)
    assert count == 20 and labels == ds.labels.tolist()[:20]


def test_bad_samples_are_skipped_counted_and_reported(tmp_path: Path, folders: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "copy"
    for label in range(3):
        (root / str(label)).mkdir(parents=True)
        for f in (folders / str(label)).iterdir():
            (root / str(label) / f.name).write_bytes(f.read_bytes())
    (root / "2" / "3.png").write_bytes(b"not an image at all")
    (root / "0" / "0.png").write_bytes(b"")
    ds = ClassFolderDataset(root, on_error="skip")
    for workers in (0, 2):
        loader = make_loader(ds, batch_size=4, num_workers=workers, device="cpu")
        with caplog.at_level(logging.WARNING, logger="stoker"):
            _, count = _epoch(loader)
        assert count == 19
        assert sorted(s.key for s in loader.skipped) == ["0/0.png", "2/3.png"]
        assert "skipped 2 bad sample(s)" in caplog.text
        caplog.clear()


def test_bad_arguments() -> None:
    ds = torch.utils.data.TensorDataset(torch.zeros(4, 3))
    with pytest.raises(ConfigError, match="batch_size"):
        make_loader(ds, batch_size=0)
    with pytest.raises(ConfigError, match="backend"):
        make_loader(ds, backend="gpu")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="device"):
        make_loader(ds, device="tpu:9")


@pytest.mark.parametrize("workers", [0, 2])
def test_pipe_inside_make_loader_sees_every_sample_once(workers: int) -> None:
    from stoker import Pipe

    pipe = Pipe.from_iterable(range(50)).shuffle(buffer_size=8, seed=3).shard().map(lambda i: torch.tensor(i))
    loader = make_loader(pipe, batch_size=6, num_workers=workers, device="cpu")
    epochs = [sorted(int(v) for batch in loader for v in batch) for _ in range(2)]
    assert epochs[0] == epochs[1] == list(range(50))


def test_a_shard_set_picks_its_fastest_loader_settings(folders: Path, tmp_path: Path) -> None:
    from stoker import ShardDataset, pack

    pack(folders, tmp_path / "pixels", store="pixels", progress=False, workers=0)
    shards = ShardDataset(tmp_path / "pixels")
    loader = make_loader(shards, batch_size=8, device="cpu")
    assert (loader.num_workers, loader.backend) == (0, "process")  # measured fastest for pixels
    assert loader.num_workers == shards.loader_defaults["num_workers"]
    labels, count = _epoch(loader)
    assert count == 21 and sorted(labels) == sorted(ClassFolderDataset(folders).labels.tolist())
    assert make_loader(shards, batch_size=8, num_workers=2, device="cpu").num_workers == 2  # explicit wins


def test_a_worker_error_comes_back_as_the_same_one_line_error(tmp_path: Path, folders: Path) -> None:
    from stoker import DecodeError

    root = tmp_path / "copy"
    (root / "0").mkdir(parents=True)
    for f in (folders / "0").iterdir():
        (root / "0" / f.name).write_bytes(f.read_bytes())
    (root / "0" / "3.png").write_bytes(b"garbage")
    loader = make_loader(ClassFolderDataset(root), batch_size=4, num_workers=2, device="cpu")
    with pytest.raises(DecodeError) as caught:
        _epoch(loader)
    message = str(caught.value)
    assert "0/3.png" in message and "worker" in message
    assert "Traceback" not in message and "\n" not in message


def test_a_worker_error_stops_the_workers_at_once_and_the_next_epoch_starts_new_ones(
    tmp_path: Path, folders: Path
) -> None:
    # Left to the garbage collector (the error's traceback holds the DataLoader's iterator), torch's
    # clean-up waited 5 s per worker: a caught error stalled a later gc.collect() for 10 s.
    import multiprocessing

    from stoker import DecodeError

    root = tmp_path / "copy"
    shutil.copytree(folders, root)
    good = (root / "0" / "3.png").read_bytes()
    (root / "0" / "3.png").write_bytes(b"garbage")
    loader = make_loader(ClassFolderDataset(root), batch_size=4, num_workers=2, device="cpu", backend="process")
    assert loader.persistent_workers
    with pytest.raises(DecodeError, match="3.png"):
        _epoch(loader)
    assert multiprocessing.active_children() == []  # joined already, not at some later collection
    (root / "0" / "3.png").write_bytes(good)
    labels, count = _epoch(loader)  # the same loader, new workers
    assert count == 21 and sorted(labels) == sorted([0] * 7 + [1] * 7 + [2] * 7)
    assert len(multiprocessing.active_children()) == 2  # persistent, for the next epoch
    loader.close()  # this frame is in a cycle (the error's traceback): close, not the garbage collector
    assert multiprocessing.active_children() == []


def test_thread_backend_threads_go_with_the_loader(folders: Path) -> None:
    import gc
    import threading

    def pool_threads() -> int:
        return sum(t.name.startswith("stoker-loader") for t in threading.enumerate())

    before = pool_threads()
    loader = make_loader(ClassFolderDataset(folders), batch_size=4, num_workers=2, device="cpu", backend="thread")
    _epoch(loader)
    assert pool_threads() > before
    del loader
    gc.collect()
    for _ in range(50):
        if pool_threads() == before:
            break
        threading.Event().wait(0.05)
    assert pool_threads() == before


class _MixedSizes(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Four images, the third one row taller: a batch of them cannot be stacked."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.zeros(3, 4 + (i == 2), 4, dtype=torch.uint8), i


@pytest.mark.parametrize("workers", [0, 1])
def test_images_of_different_sizes_stop_with_the_clear_message(workers: int) -> None:
    """collate checks sizes only once torch fails to stack: the message is still stoker's, in a worker too."""
    from stoker.errors import DataError

    loader = make_loader(_MixedSizes(), batch_size=4, shuffle=False, num_workers=workers, device="cpu")
    with pytest.raises(DataError, match=r"differ in size \(3x4x4 and 3x5x4\).*--image-size"):
        next(iter(loader))
