"""Equal steps on every rank, in the user's own loop: real gloo ranks, and the rule over many shapes.

The launch runs a hand-written DDP loop (no ``fit``) over every reader through
``equal_steps_script.py``; a hang or a gloo "collective mismatch" fails it (the
subprocess timeout bounds a hang). A second launch runs Lightning's
``Trainer(strategy="ddp")`` over a stoker loader (``lightning_script.py``). The property test runs the real :class:`EqualSteps`
on several ranks at once (threads agreeing through a barrier) over the batches each
reader gives each rank, for any ranks, workers, data size and batch size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from stoker.loading.samplers import EpochSampler, RankSlice
from stoker.loading.steps import EqualSteps, batch_samples, steps_are_certain
from stoker.pipes import Pipe
from stoker.pipes.context import Context
from stoker.shards import stream_order

SCRIPT = Path(__file__).with_name("equal_steps_script.py")
TIMEOUT_S = 240  # a hang fails here, long before gloo's own timeout
N = 1001


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2] / "src"), env.get("PYTHONPATH")) if p)
    return env


def _numbered_folders(root: Path, n: int) -> Path:
    """Class folders of ``n`` 4x4 PNGs whose first two channels spell the sample's number (4 classes)."""
    for c in range(4):
        (root / str(c)).mkdir(parents=True)
    for i in range(n):
        Image.new("RGB", (4, 4), (i % 256, i // 256, 0)).save(root / str(i % 4) / f"{i:04d}.png", compress_level=1)
    return root


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo")
def test_a_hand_written_ddp_loop_runs_equal_steps_over_every_reader(tmp_path: Path) -> None:
    from stoker.packer import pack

    folders = _numbered_folders(tmp_path / "folders", N)
    pack(folders, tmp_path / "packed", store="pixels", shard_samples=100, progress=False, workers=0)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT),
           str(tmp_path), str(folders), str(tmp_path / "packed")]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    a, b = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert a["digest"] == b["digest"]  # DDP kept the weights in step through every reader
    for name in a["readers"]:
        for epoch, (x, y) in enumerate(zip(a["readers"][name], b["readers"][name], strict=True)):
            where = f"{name}, epoch {epoch}"
            seen = x["seen"] + y["seen"]
            assert x["steps"] == y["steps"], where
            assert x["steps"] == 9 + (name != "skipping"), where  # a stream too: whole batches of the rank's order
            assert len(seen) == len(set(seen)) and set(seen) <= set(range(N)), where  # at most once per epoch
            # Every sample is trained on, trimmed (counted) or skipped (counted): none lost unseen.
            assert len(seen) + x["trimmed"] + y["trimmed"] + x["skipped"] + y["skipped"] == N, where
            known = name in ("folders", "shards")  # even map-style split, raising reader: no agreement at all
            assert x["agreements"] == y["agreements"] == (0 if known else x["steps"] + 1), where
            assert x["equal_steps"] is y["equal_steps"] is True, where
    # What is trimmed: the map-style tail on rank 0 only; a stream's batches past the shortest rank's.
    assert [a["readers"]["shards"][0]["trimmed"], b["readers"]["shards"][0]["trimmed"]] == [1, 0]
    for name in ("dataloader", "wrapped"):  # 501 and 500 samples: rank 0's last batch of 1 trimmed
        assert [a["readers"][name][0]["trimmed"], b["readers"][name][0]["trimmed"]] == [1, 0], name
    # rank 0's first batch was all bad (dropped): 9 batches to rank 1's 10; rank 1 trims its last 50.
    assert [a["readers"]["skipping"][0][k] for k in ("trimmed", "skipped")] == [1, 50]
    assert [b["readers"]["skipping"][0][k] for k in ("trimmed", "skipped")] == [50, 0]


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo")
def test_lightning_ddp_over_a_stoker_loader_runs_equal_steps(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    script = SCRIPT.with_name("lightning_script.py")
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    a, b = (json.loads((tmp_path / f"lightning-rank{r}.json").read_text())["epochs"] for r in (0, 1))
    assert len(a) == len(b) == 2
    for x, y in zip(a, b, strict=True):
        # A Pipe of 1,001 over 2 ranks x 2 workers: 11 and 10 batches; both ran 10, rank 0 trimmed its last sample.
        assert x["steps"] == y["steps"] == 10 and (x["trimmed"], y["trimmed"]) == (1, 0)
        seen = x["seen"] + y["seen"]
        assert len(seen) == len(set(seen)) == N - 1 and set(seen) <= set(range(N))


# -- the rule, over ranks x workers x sizes x batch sizes (threads as ranks) ------------------

Batches = list[list[int]]


def _batched(items: list[int], size: int) -> Batches:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _round_robin(per_worker: list[Batches]) -> Batches:
    """The loader's order of an iterable's batches: one per worker in turn, a finished worker passed over."""
    return [b[k] for k in range(max((len(b) for b in per_worker), default=0)) for b in per_worker if k < len(b)]


def _map_style(n: int, rank: int, world: int, workers: int, batch: int, bad: frozenset[int]) -> Batches:
    sampler = EpochSampler(range(n), rank, world, shuffle=True, seed=0, even=True)
    kept = [[i for i in b if i not in bad] for b in _batched(list(sampler), batch)]
    return [b for b in kept if b]  # the loader does not yield a batch whose samples were all bad


def _stream(n: int, rank: int, world: int, workers: int, batch: int, bad: frozenset[int]) -> Batches:
    shards = [97] * (n // 97) + ([n % 97] if n % 97 else [])
    return _round_robin([
        _batched(stream_order(shards, seed=1, epoch=0, shuffle=True, shuffle_buffer=7, rank=rank, world_size=world,
                              worker=k, num_workers=workers, block_rows=batch).tolist(), batch)
        for k in range(workers)
    ])


def _pipe(n: int, rank: int, world: int, workers: int, batch: int, bad: frozenset[int]) -> Batches:
    # As the loader reads a cut pipe: worker k takes the rank's items at shard() a batch at a time.
    pipe = Pipe.from_iterable(range(n)).shuffle(buffer_size=16, seed=2).shard()
    return _round_robin([
        _batched(list(pipe.iterate(Context(rank=rank, world_size=world, worker=k, num_workers=workers, block=batch))),
                 batch)
        for k in range(workers)
    ])


READERS: dict[str, Callable[[int, int, int, int, int, frozenset[int]], Batches]] = {
    "map-style (files, shard sets), some samples bad": _map_style,
    "ShardStream": _stream,
    "Pipe": _pipe,
}


def _run_ranks(per_rank: list[Batches]) -> list[tuple[Batches, EqualSteps[list[int]]]]:
    """Every rank's pass over its batches through the real EqualSteps, agreeing through a barrier (MIN)."""
    world = len(per_rank)
    says: list[bool] = [False] * world
    verdict = [True]

    def decide() -> None:
        verdict[0] = all(says)

    barrier = threading.Barrier(world, action=decide)
    results: list[Any] = [None] * world

    def rank(r: int) -> None:
        def agree(mine: bool) -> bool:
            says[r] = mine
            barrier.wait(timeout=30)
            out = verdict[0]
            barrier.wait(timeout=30)  # nobody overwrites says before all have read the verdict
            return out

        steps = EqualSteps(per_rank[r], agree=agree)
        results[r] = (list(steps), steps)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(r is not None for r in results), "a rank did not finish"
    return results


@settings(max_examples=25, deadline=None)
@given(world=st.integers(1, 4), workers=st.integers(1, 3), n=st.integers(1, 400), batch=st.integers(1, 64),
       bad=st.frozensets(st.integers(0, 399), max_size=60), data=st.data())
def test_every_reader_runs_the_same_steps_on_every_rank_and_counts_what_it_trims(
    world: int, workers: int, n: int, batch: int, bad: frozenset[int], data: st.DataObject
) -> None:
    name = data.draw(st.sampled_from(sorted(READERS)))
    per_rank = [READERS[name](n, r, world, workers, batch, bad) for r in range(world)]
    results = _run_ranks(per_rank)
    yielded = [out for out, _ in results]
    assert len({len(out) for out in yielded}) == 1  # equal steps
    assert len(yielded[0]) == min(len(b) for b in per_rank)  # as many as the shortest rank has: none lost early
    for r, (out, steps) in enumerate(results):
        assert out == per_rank[r][: len(out)] and steps.steps == len(out)  # in the reader's own order
        assert steps.trimmed == sum(len(b) for b in per_rank[r][len(out):])  # every left-out sample counted
        assert steps.trimmed_batches == len(per_rank[r]) - len(out)
    seen = [i for out in yielded for b in out for i in b]
    assert len(seen) == len(set(seen))  # at most once per epoch over the ranks
    if name.startswith("map-style") and not bad:
        # The even split gives every rank the same batches: what makes the by-construction path sound.
        assert len({len(b) for b in per_rank}) == 1 and all(s.trimmed == 0 for _, s in results)
    elif not name.startswith("map-style"):
        # A stream's ranks differ by a sample: at most one batch per worker is left out.
        assert all(s.trimmed_batches <= workers for _, s in results)


def test_the_count_is_known_only_for_an_even_map_style_split_of_a_raising_reader() -> None:
    class Reader(list[int]):
        on_error = "raise"

    even = EpochSampler(range(5), 0, 2, even=True)
    assert steps_are_certain(Reader(range(5)), even)
    assert not steps_are_certain(Reader(range(5)), RankSlice(range(5), 0, 2))  # uneven: validation's split
    skipping = Reader(range(5))
    skipping.on_error = "skip"
    assert not steps_are_certain(skipping, even)
    assert not steps_are_certain(list(range(5)), even)  # says nothing about bad samples: agreed on
    assert not steps_are_certain(Reader(range(5)), None)  # not split by rank: the ranks' data may differ
    assert not steps_are_certain(Pipe.from_iterable(range(5)), None)


def test_alone_every_batch_passes_and_samples_are_counted_in_any_batch_shape() -> None:
    import torch

    from stoker.loading.collate import Batch

    steps = EqualSteps([[1, 2], [3]])
    assert list(steps) == [[1, 2], [3]] and (steps.steps, steps.trimmed) == (2, 0)

    class InStep(list[list[int]]):  # as a stoker Loader: keeps the ranks in step itself and counts its trim
        equal_steps, trimmed = True, 3

    passed = EqualSteps(EqualSteps(InStep([[1], [2]])))
    assert list(passed) == [[1], [2]] and passed.trimmed == 3  # passed through (agrees once), its count kept
    assert batch_samples((torch.zeros(4, 3), torch.zeros(4))) == 4
    assert batch_samples({"image": torch.zeros(2, 1)}) == 2
    assert batch_samples(Batch(None, 7)) == 7 and batch_samples([5, 6, 7]) == 3 and batch_samples(object()) == 1
