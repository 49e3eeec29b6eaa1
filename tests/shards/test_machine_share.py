"""Encoded shards take the machine's share of readers, and ``decoder="auto"`` decodes where the batches go."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from stoker import make_loader
from stoker.cores import CORES_ENV
from stoker.loading.workers import machine_workers
from stoker.shards import ShardDataset


def test_encoded_shards_take_the_machines_share_not_four(packed: Callable[..., Path],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """16 cores, a model on the CPU: half of them read (the rule of stoker.loading.workers); it was min(4, cores)."""
    monkeypatch.setenv(CORES_ENV, "16")
    ds = ShardDataset(packed(store="encoded", shard_samples=7))
    backend = ds.loader_defaults["backend"]
    loader = make_loader(ds, batch_size=4, device="cpu", persistent_workers=False)
    assert (loader.num_workers, loader.backend) == (machine_workers(accelerator=False, backend=backend), backend)
    if backend == "thread":  # no memory bound on threads: exactly half the cores
        assert loader.num_workers == 8
    loader.close()


def test_auto_does_not_decode_on_the_gpu_for_a_run_on_the_cpu(packed: Callable[..., Path],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """On a machine with a GPU, a loader whose batches stay on the CPU never decodes there and copies back."""
    ds = ShardDataset(packed(store="encoded", shard_samples=7, size=(8, 8)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ds, "mostly_jpeg", lambda: True)
    trials: list[Any] = []
    monkeypatch.setattr(ds, "_measure_decoders", lambda *args: trials.append(args) or {"decoder": "gpu"})
    blobs: list[Any] = []
    assert ds._on_gpu(blobs, [], (8, 8))  # made for no loader: auto may try the GPU (the trial is asked for)
    assert len(trials) == 1
    ds._choice = None
    make_loader(ds, batch_size=4, device="cpu", num_workers=0)
    assert not ds._on_gpu(blobs, [], (8, 8)) and len(trials) == 1  # batches that go to the CPU: decoded there
    assert ds.subset([0, 1])._read_for == {"cpu"}


@pytest.mark.parametrize("first", ["cpu", "cuda"])
def test_auto_decodes_on_the_gpu_only_while_every_loader_over_the_set_goes_to_cuda(
    packed: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, first: str,
) -> None:
    """Two loaders over one set, one to CUDA and one to the CPU, in either order: the CPU decodes for both, said once.

    The CUDA loader is its contract call (read_for), so no CUDA op runs on this machine."""
    ds = ShardDataset(packed(store="encoded", shard_samples=7, size=(8, 8)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ds, "mostly_jpeg", lambda: True)
    monkeypatch.setattr(ds, "_measure_decoders", lambda *args: {"decoder": "gpu"})

    def loader_to(kind: str) -> None:
        if kind == "cuda":
            ds.read_for(torch.device("cuda"))
        else:
            make_loader(ds, batch_size=4, device="cpu", num_workers=0)

    with caplog.at_level("WARNING", logger="stoker"):
        loader_to(first)
        assert ds._on_gpu([], [], (8, 8)) == (first == "cuda")  # one loader: decoded where its batches go
        loader_to("cpu" if first == "cuda" else "cuda")
        assert not ds._on_gpu([], [], (8, 8))  # the last loader made does not decide for the other
        loader_to("cuda")
        loader_to("cpu")
        assert not ds._on_gpu([], [], (8, 8))
    told = [r.getMessage() for r in caplog.records if "decoder='auto' decodes on the CPU" in r.getMessage()]
    assert len(told) == 1 and "cpu and cuda" in told[0], told
