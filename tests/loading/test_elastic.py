"""Elastic determinism: the batches a rank sees do not depend on the worker count or the backend.

For each reader (a map-style set, a ``Pipe`` with a filter after its cut, a ``ShardStream``
over pixel and over encoded shards, one read item by item), the sha256 of every batch
(its stacked pixels and labels) is the same with 0, 1, 2 and 3 workers, in worker
processes and on threads, under one rank and under two gloo ranks; and a mid-epoch state
taken with 2 workers resumes bit-exact with 0 and with 3.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from stoker import ClassFolderDataset, Pipe, make_loader
from stoker.errors import ConfigError

N, SIZE, BATCH, SEED = 23, 4, 3, 5  # 23 samples: 8 batches of 3 on one rank (the last short)
SETTINGS = [(workers, backend) for workers in (0, 1, 2, 3) for backend in ("process", "thread")]
MANY_WORKERS = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 3 processes on 2 cores


def _write(root: Path) -> Path:
    """Tiny PNGs whose first pixel is the sample's id, in 3 class folders."""
    for i in range(N):
        folder = root / f"c{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = np.random.default_rng(i).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
        pixels[0, 0] = (i, 0, 0)
        Image.fromarray(pixels, "RGB").save(folder / f"{i:03d}.png", compress_level=1)
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from stoker.packer import pack

    files = _write(tmp_path_factory.mktemp("files"))
    out = {"files": str(files)}
    for store in ("pixels", "encoded"):
        root = tmp_path_factory.mktemp(store)
        pack(files, root, store=store, shard_samples=5, progress=False, workers=0)
        out[store] = str(root)
    return out


def _not_id_7(sample: Any) -> bool:
    """Drops one sample after the Pipe's cut: its batch is one shorter, the others unmoved."""
    return int(sample[0][0, 0, 0]) != 7


def _with_label(sample: Any) -> Any:
    path, image = sample
    return image, int(Path(path).parent.name[1:])


def _readers() -> dict[str, Callable[[dict[str, str]], Any]]:
    from stoker.shards import ShardStream

    return {
        "map_style": lambda d: ClassFolderDataset(d["files"]),
        "pipe": lambda d: (
            Pipe.list_files(d["files"], masks="*.png", recursive=True).shuffle(8, seed=3).shard()
            .load_image().map(_with_label).filter(_not_id_7)
        ),
        "stream_pixels": lambda d: ShardStream(d["pixels"], shuffle_buffer=4),
        "stream_encoded": lambda d: ShardStream(d["encoded"], shuffle_buffer=4),
        "stream_item_by_item": lambda d: ShardStream(d["pixels"], shuffle_buffer=4, read_rows=2),
    }


def _digest(batch: Any) -> str:
    images, labels = batch
    return hashlib.sha256(images.contiguous().numpy().tobytes() + labels.numpy().tobytes()).hexdigest()


def _ids(batch: Any) -> list[int]:
    return batch[0][:, 0, 0, 0].tolist()


def _loader(data: dict[str, str], reader: str, workers: int, backend: str) -> Any:
    return make_loader(_readers()[reader](data), batch_size=BATCH, num_workers=workers, backend=backend,  # type: ignore[arg-type]
                       device="cpu", seed=SEED)


def _epochs(loader: Any, count: int = 2) -> list[list[tuple[str, list[int]]]]:
    """Each epoch as its batches' (digest, sample ids)."""
    return [[(_digest(batch), _ids(batch)) for batch in loader] for _ in range(count)]


@MANY_WORKERS
@pytest.mark.parametrize("reader", list(_readers()))
def test_batches_are_the_same_for_every_worker_count_and_backend(data: dict[str, str], reader: str) -> None:
    found = {(workers, backend): _epochs(_loader(data, reader, workers, backend)) for workers, backend in SETTINGS}
    first = found[0, "process"]
    for setting, epochs in found.items():
        assert epochs == first, setting
    ids = [[i for _, batch in epoch for i in batch] for epoch in first]
    expected = [i for i in range(N) if reader != "pipe" or i != 7]
    assert [sorted(epoch) for epoch in ids] == [expected, expected]  # exactly once per epoch
    assert ids[0] != ids[1] and ids[0] != sorted(ids[0])  # shuffled, and anew each epoch
    assert len(first[0]) == 8  # more batches than workers: every worker count deals several rounds
    if reader == "pipe":  # the cut is at shard(): the filter shortens one batch and moves no other
        assert sorted(len(batch) for _, batch in first[0]) == [2, 2, 3, 3, 3, 3, 3, 3]


@MANY_WORKERS
@pytest.mark.parametrize("reader", list(_readers()))
def test_a_state_taken_with_2_workers_resumes_with_0_and_with_3(data: dict[str, str], reader: str) -> None:
    straight = _epochs(_loader(data, reader, 0, "process"))
    for k in (3, 4):  # the next batch is worker 1's, then worker 0's, of the 2
        interrupted = _loader(data, reader, 2, "process")
        batches = iter(interrupted)
        assert [(_digest(b), _ids(b)) for b in (next(batches) for _ in range(k))] == straight[0][:k]
        state = json.loads(json.dumps(interrupted.state_dict()))  # plain data, as in a checkpoint
        del batches
        interrupted.close()
        for workers, backend in ((0, "process"), (3, "process"), (3, "thread")):
            resumed = _loader(data, reader, workers, backend)
            resumed.load_state_dict(state)
            assert _epochs(resumed) == [straight[0][k:], straight[1]], (k, workers, backend)


@MANY_WORKERS
@pytest.mark.parametrize("reader", ["pipe", "stream_encoded"])
def test_a_stream_changes_its_workers_mid_epoch_and_keeps_its_batches(data: dict[str, str], reader: str) -> None:
    straight = _epochs(_loader(data, reader, 0, "process"))
    loader = _loader(data, reader, 0, "process")
    settings = [("thread", 2), ("process", 3), ("process", 1)]
    got = []
    for _ in range(2):
        batches = iter(loader)
        epoch = []
        for backend, workers in settings:
            epoch += [(_digest(b), _ids(b)) for b in (next(batches) for _ in range(2))]
            position = loader.state_dict()
            batches.close()  # type: ignore[attr-defined]
            loader.reconfigure(backend=backend, num_workers=workers)  # type: ignore[arg-type]
            loader.load_state_dict(position)
            batches = iter(loader)
        got.append(epoch + [(_digest(b), _ids(b)) for b in batches])
    assert got == straight


def test_a_stream_state_without_the_batch_split_is_refused_mid_epoch(data: dict[str, str]) -> None:
    state = _loader(data, "pipe", 2, "process").state_dict()
    assert state["split"] == "batch"
    earlier = {key: value for key, value in state.items() if key != "split"} | {"batches": 2, "worker_batches": [1, 1]}
    with pytest.raises(ConfigError, match="earlier stoker, which split a Pipe between its workers item by item"):
        _loader(data, "pipe", 2, "process").load_state_dict(earlier)
    _loader(data, "pipe", 2, "process").load_state_dict({**earlier, "batches": 0, "worker_batches": [0, 0]})  # an epoch's start


def test_stages_that_regroup_after_the_cut_are_refused(data: dict[str, str]) -> None:
    pipe = Pipe.from_iterable(range(10)).shard().shuffle(4, seed=0)
    with pytest.raises(ConfigError, match="shuffle there would act within a batch; move it before shard"):
        make_loader(pipe, batch_size=2, num_workers=0, device="cpu")
    with pytest.raises(ConfigError, match="backend='thread' reads a Pipe only if it deals its order a batch at a time"):
        make_loader(Pipe.from_iterable(range(10)), batch_size=2, num_workers=2, backend="thread", device="cpu")


def _rank_main(rank: int, folder: str, data: dict[str, str]) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=2)
    try:
        found = {
            reader: {f"{workers}-{backend}": _epochs(_loader(data, reader, workers, backend))
                     for workers, backend in SETTINGS}
            for reader in _readers()
        }
        Path(folder, f"rank{rank}.json").write_text(json.dumps(found))
    finally:
        dist.destroy_process_group()


@MANY_WORKERS
def test_batches_are_the_same_for_every_worker_count_and_backend_under_two_ranks(
    tmp_path: Path, data: dict[str, str], forked_ranks: Callable[..., None]
) -> None:
    forked_ranks(_rank_main, str(tmp_path), data, timeout_s=300)
    found = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    for reader in _readers():
        for mine in found:
            first = mine[reader]["0-process"]
            assert all(epochs == first for epochs in mine[reader].values()), reader
            assert len(first[0]) >= 3  # several batches per rank: workers deal more than one round
        ids = [[i for _, batch in mine[reader]["0-process"][0] for i in batch] for mine in found]
        assert not set(ids[0]) & set(ids[1])  # the ranks' shares are disjoint
        # Equal steps: the ranks stop at the step where the first runs out (a map-style set drops the odd sample).
        assert len(found[0][reader]["0-process"][0]) == len(found[1][reader]["0-process"][0])
    assert torch.distributed.is_available()


def _fails_at_5(item: int) -> torch.Tensor:
    if item == 5:
        raise ConfigError("item 5 is bad")
    return torch.tensor(item)


def test_an_error_in_a_thread_reader_is_raised_and_an_abandoned_epoch_lets_its_threads_go() -> None:
    loader = make_loader(Pipe.from_iterable(range(40)).shard().map(_fails_at_5), batch_size=4, num_workers=2,
                         backend="thread", device="cpu")
    seen = []
    with pytest.raises(ConfigError, match="item 5 is bad"):
        for batch in loader:
            seen.append(batch.tolist())
    assert seen == [[0, 1, 2, 3]]  # batch 1 (worker 1's first) holds item 5: raised in its turn
    batches = iter(make_loader(Pipe.from_iterable(range(400)).shard().map(torch.tensor), batch_size=4, num_workers=3,
                               backend="thread", device="cpu"))
    assert next(batches).tolist() == [0, 1, 2, 3]
    batches.close()  # type: ignore[attr-defined]
    assert not [t for t in threading.enumerate() if t.name.startswith("stoker-stream-")]
