"""The one state contract, run over every reader stoker's loader wraps.

For each reader (class folders, a concatenation, a pixel and an encoded shard set, a
``ShardStream`` read item by item and one whose reads are the batches, a ``Pipe``), with 0 and 2 workers and each backend:

* every sample comes exactly once per epoch, in a new order each epoch;
* ``state_dict()`` taken after ``k`` batches, loaded into a NEW loader (as after a
  restart, through JSON to prove it is plain data), continues with exactly the rest of
  that epoch and then the next epoch, as the uninterrupted loader does.

Like torchdata's one save/load helper run over every node, :func:`check_state_contract`
is the contract; the parametrisation lists the readers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from stoker import ClassFolderDataset, Pipe, make_loader
from stoker.sources import concat

N_A, N_B, SIZE, BATCH = 18, 12, 6, 4  # 30 samples: 8 batches of 4 (the last short)


def _write(root: Path, ids: range, classes: int = 3) -> Path:
    """PNGs whose first pixel encodes the sample's id (R = id % 256, G = id // 256)."""
    for i in ids:
        folder = root / f"c{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = np.full((SIZE, SIZE, 3), 7, dtype=np.uint8)
        pixels[0, 0] = (i % 256, i // 256, 0)
        Image.fromarray(pixels, "RGB").save(folder / f"{i:04d}.png", compress_level=1)
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from stoker.packer import pack

    a = _write(tmp_path_factory.mktemp("a"), range(N_A))
    b = _write(tmp_path_factory.mktemp("b"), range(1000, 1000 + N_B))
    both = tmp_path_factory.mktemp("both")
    for src in (a, b):
        for path in src.rglob("*.png"):
            (both / path.parent.name).mkdir(exist_ok=True)
            (both / path.parent.name / path.name).write_bytes(path.read_bytes())
    out = {"a": a, "b": b, "both": both}
    for store in ("pixels", "encoded"):
        out[store] = tmp_path_factory.mktemp(store)
        pack(both, out[store], store=store, shard_samples=7, progress=False, workers=0)
    return out


def _image(item: Any) -> Any:
    return item


def _readers() -> dict[str, Callable[[dict[str, Path]], Any]]:
    from stoker.shards import ShardDataset, ShardStream

    return {
        "class_folders": lambda d: ClassFolderDataset(d["both"]),
        "concat": lambda d: concat(ClassFolderDataset(d["a"]), ClassFolderDataset(d["b"])),
        "shards_pixels": lambda d: ShardDataset(d["pixels"]),
        "shards_encoded": lambda d: ShardDataset(d["encoded"]),
        "shard_stream": lambda d: ShardStream(d["pixels"], shuffle_buffer=5, read_rows=3),  # read item by item
        "shard_stream_whole_batches": lambda d: ShardStream(d["pixels"], shuffle_buffer=5, read_rows=BATCH),
        "pipe": lambda d: (
            Pipe.list_files(d["both"], masks="*.png", recursive=True).shuffle(64, seed=4).shard()
            .load_image(keep_path=False).map(_image)
        ),
    }


CASES = [
    pytest.param(reader, workers, backend, id=f"{reader}-{workers}w-{backend}")
    for reader in _readers()
    for workers, backend in ((0, "process"), (2, "process"), (2, "thread"))
]


def _ids(batch: Any) -> list[int]:
    images = batch[0] if isinstance(batch, (tuple, list)) else batch  # uint8 [B, 3, H, W]
    return (images[:, 0, 0, 0].long() + 256 * images[:, 1, 0, 0].long()).tolist()


def _epoch(batches: Any) -> list[list[int]]:
    return [_ids(batch) for batch in batches]


def _state_after(loader: Any, k: int) -> tuple[list[list[int]], dict[str, Any]]:
    """The ids of the first ``k`` batches of ``loader``'s next epoch, and its state after them (as plain data)."""
    batches = iter(loader)
    seen = [_ids(next(batches)) for _ in range(k)]
    state = json.loads(json.dumps(loader.state_dict()))  # plain data, as in a checkpoint
    del batches
    return seen, state


def check_state_contract(new_loader: Callable[[], Any], expected_ids: list[int], k: int) -> None:
    """Exactly once per epoch, a new order each epoch, and resume after ``k`` batches is exact."""
    straight = new_loader()
    first, second = _epoch(straight), _epoch(straight)
    for epoch in (first, second):
        assert sorted(i for batch in epoch for i in batch) == expected_ids  # exactly once
    assert first != second  # a new order each epoch
    assert 0 < k < len(first)

    interrupted = new_loader()
    seen, state = _state_after(interrupted, k)
    interrupted.close()
    assert seen == first[:k]

    resumed = new_loader()  # a new process would build a new loader
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    assert _epoch(resumed) == first[k:]
    assert _epoch(resumed) == second  # the next epoch, as if nothing had happened
    assert resumed.epoch == 2


@pytest.mark.parametrize(("reader", "workers", "backend"), CASES)
def test_every_reader_keeps_the_state_contract(data: dict[str, Path], reader: str, workers: int, backend: str) -> None:
    make = _readers()[reader]
    expected = sorted([*range(N_A), *range(1000, 1000 + N_B)])

    def new_loader() -> Any:
        return make_loader(make(data), batch_size=BATCH, num_workers=workers, backend=backend, device="cpu", seed=11)

    check_state_contract(new_loader, expected, k=3)


@pytest.mark.parametrize("reader", ["class_folders", "pipe"])
def test_resume_in_a_later_epoch_and_at_a_worker_boundary(data: dict[str, Path], reader: str) -> None:
    make = _readers()[reader]

    def new_loader() -> Any:
        return make_loader(make(data), batch_size=BATCH, num_workers=2, device="cpu", seed=2)

    straight = new_loader()
    epochs = [_epoch(straight) for _ in range(3)]
    for k in (1, 6):  # an odd and an even count: the next batch comes from either worker
        interrupted = new_loader()
        _epoch(interrupted)
        _, state = _state_after(interrupted, k)
        resumed = new_loader()
        resumed.load_state_dict(state)
        assert state["epoch"] == 1 and state["batches"] == k
        assert _epoch(resumed) == epochs[1][k:]
        assert _epoch(resumed) == epochs[2]


def test_skips_so_far_are_part_of_the_state(tmp_path: Path, data: dict[str, Path]) -> None:
    root = tmp_path / "broken"
    for path in data["both"].rglob("*.png"):
        (root / path.parent.name).mkdir(parents=True, exist_ok=True)
        (root / path.parent.name / path.name).write_bytes(path.read_bytes())
    for name in ("c0/0000.png", "c1/1000.png", "c2/0017.png"):
        (root / name).write_bytes(b"\x89PNG\r\n\x1a\n broken")

    def new_loader() -> Any:
        pipe = Pipe.list_files(root, masks="*.png", recursive=True).shuffle(64, seed=1).shard().load_image(
            keep_path=False, on_error="skip"
        )
        return make_loader(pipe, batch_size=BATCH, num_workers=2, device="cpu", seed=0)

    straight = new_loader()
    first = _epoch(straight)
    assert len(straight.skipped) == 3 and sum(map(len, first)) == 27
    for k in range(1, len(first), 2):
        _, state = _state_after(new_loader(), k)
        resumed = new_loader()
        resumed.load_state_dict(state)
        assert _epoch(resumed) == first[k:]
        assert sorted(s.key for s in resumed.skipped) == sorted(s.key for s in straight.skipped)


def test_a_state_from_another_loader_is_refused(data: dict[str, Path]) -> None:
    from stoker import ConfigError

    state = make_loader(ClassFolderDataset(data["a"]), batch_size=4, device="cpu", num_workers=0).state_dict()
    with pytest.raises(ConfigError, match="batch_size=4 but this loader has batch_size=8"):
        make_loader(ClassFolderDataset(data["a"]), batch_size=8, device="cpu", num_workers=0).load_state_dict(state)
    # An iterable that splits itself between workers (no shard() for the loader to cut) keeps its worker count.
    pipe_state = make_loader(Pipe.from_iterable(range(8)), batch_size=4, device="cpu", num_workers=2).state_dict()
    with pytest.raises(ConfigError, match="same num_workers"):
        make_loader(Pipe.from_iterable(range(8)), batch_size=4, device="cpu", num_workers=0).load_state_dict(pipe_state)
    cut_state = make_loader(Pipe.from_iterable(range(8)).shard(), batch_size=4, device="cpu", num_workers=2).state_dict()
    make_loader(Pipe.from_iterable(range(8)).shard(), batch_size=4, device="cpu", num_workers=0).load_state_dict(cut_state)
    with pytest.raises(ConfigError, match="not a stoker-loader/2"):
        make_loader(ClassFolderDataset(data["a"]), batch_size=4, device="cpu", num_workers=0).load_state_dict({"epoch": 1})
    old = {**state, "format": "stoker-loader/1"}  # the version before the one order module: other epoch orders
    with pytest.raises(ConfigError, match="earlier stoker .* epoch boundary"):
        make_loader(ClassFolderDataset(data["a"]), batch_size=4, device="cpu", num_workers=0).load_state_dict(old)


def test_a_generic_iterable_resumes_by_reading_and_discarding() -> None:
    class Numbers(torch.utils.data.IterableDataset):
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(range(10))

    straight = [b.tolist() for b in make_loader(Numbers(), batch_size=3, num_workers=0, device="cpu")]
    interrupted = make_loader(Numbers(), batch_size=3, num_workers=0, device="cpu")
    batches = iter(interrupted)
    next(batches)
    resumed = make_loader(Numbers(), batch_size=3, num_workers=0, device="cpu")
    resumed.load_state_dict(interrupted.state_dict())
    assert [b.tolist() for b in resumed] == straight[1:]


def test_a_distributed_sampler_resumes_too(data: dict[str, Path], tmp_path: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        def new_loader() -> Any:
            loader = make_loader(ClassFolderDataset(data["both"]), batch_size=BATCH, num_workers=0, device="cpu", seed=5)
            assert loader._distributed  # the rank split (EpochSampler)
            return loader

        check_state_contract(new_loader, sorted([*range(N_A), *range(1000, 1000 + N_B)]), k=2)
    finally:
        dist.destroy_process_group()


def test_shard_stream_iter_from_is_the_rest_of_the_stream(data: dict[str, Path]) -> None:
    from stoker.shards import ShardStream

    stream = ShardStream(data["encoded"], shuffle_buffer=4, read_rows=4, seed=3)
    stream.set_epoch(1)
    everything = _ids_of_items(iter(stream))
    for start in (0, 1, 4, 7, len(everything)):
        assert _ids_of_items(stream.iter_from(start)) == everything[start:]


def _ids_of_items(items: Any) -> list[int]:
    return [int(image[0, 0, 0]) + 256 * int(image[1, 0, 0]) for image, _ in items]


CLAIMS = {  # reader -> the contract protocol its class names (stoker.loading.contract)
    "class_folders": "MapReader", "concat": "MapReader", "shards_pixels": "MapReader", "shards_encoded": "MapReader",
    "shard_stream": "StreamReader", "shard_stream_whole_batches": "StreamReader", "pipe": "StreamReader",
}


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_every_reader_conforms_to_the_contract_it_claims(data: dict[str, Path], name: str) -> None:
    from stoker.loading import contract

    reader = _readers()[name](data)
    claimed = getattr(contract, CLAIMS[name])
    assert claimed in type(reader).__mro__  # named in its class line, so mypy checks the signatures
    assert isinstance(reader, claimed)
    parts = [p for p in claimed.__mro__[1:] if getattr(p, "_is_protocol", False) and p.__module__ == contract.__name__]
    assert parts and all(isinstance(reader, part) for part in parts)
    if claimed is contract.StreamReader:
        reader.set_epoch(1)
        first = [_first_pixel(item) for item in reader]
        reader.set_epoch(1)
        assert [_first_pixel(item) for item in reader.iter_from(2)] == first[2:]
    else:
        assert reader.on_error in ("raise", "skip") and len(reader.__getitems__([0, 1])) == 2


def test_the_loader_asks_the_contract_not_the_class() -> None:
    class Counting(torch.utils.data.IterableDataset):  # conforms by shape only (names no protocol)
        def __init__(self) -> None:
            self.epochs: list[int] = []
            self.starts: list[int] = []

        def set_epoch(self, epoch: int) -> None:
            self.epochs.append(epoch)

        def iter_from(self, start: int) -> Any:
            self.starts.append(start)
            return iter(range(start, 10))

        def __iter__(self) -> Any:
            return self.iter_from(0)

    data = Counting()
    loader = make_loader(data, batch_size=4, num_workers=0, device="cpu")
    first = next(iter(loader))
    state = loader.state_dict()
    fresh = make_loader(data, batch_size=4, num_workers=0, device="cpu")
    fresh.load_state_dict(state)
    rest = [b.tolist() for b in fresh]
    assert first.tolist() == [0, 1, 2, 3] and rest == [[4, 5, 6, 7], [8, 9]]
    assert data.epochs and set(data.epochs) == {0}  # set_epoch before the epoch (by the loader and in its worker)
    assert data.starts == [0, 4]  # resumed by iter_from, not by reading and dropping


def _first_pixel(item: Any) -> int:
    image = item[0] if isinstance(item, tuple | list) else item  # (image, label), or an image alone
    return int(image[0, 0, 0]) + 256 * int(image[1, 0, 0])
