"""Run by ``torchrun`` in tests/train/test_ddp.py (not a test module itself): one rank of a small run.

Usage: ``torchrun ... ddp_script.py MODES OUT [ARGS...]``; every rank writes ``OUT/<mode>-rank<R>.json``
for each of the comma-separated MODES, run one after the other in one process group (process
start-up is most of a test's time).

Modes:
    cli ARGS...   ``stoker train ARGS`` through the CLI; records the weights' digest.
    stream ROOT   ``fit`` over a ShardStream of ROOT (2 workers, batch 50); records the samples trained on.
    pipe          the same over a Pipe of 1,001 numbered samples, accumulating gradients over 3 batches.
    stop          Ctrl-C (SIGINT) on rank 1 during batch 3 of a Pipe epoch: both stop and save last.pt.
    resume        continues ``stop`` from its mid-epoch last.pt, each rank from its own position.
    nan           a non-finite loss on rank 1 at batch 3: records each rank's message.
    nan-late      the same, read back every 5 batches: found after batch 5, named batch 3 on both ranks.
    trace         two epochs over unequal shares (11 and 10 batches) with grad_accum 3, sync_every 5, a
                  mid-epoch last.pt every 2 steps and validation: records the digests of
                  tests/train/test_fit_golden.py, with every Ranks call this rank made.
    crash         rank 1 raises at batch 2 (the test checks that the launch ends).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn


def digest(model: nn.Module) -> str:
    """SHA-256 of every parameter's bytes (equal on every rank when DDP kept them in step)."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def numbered(i: int) -> tuple[torch.Tensor, int]:
    """Sample ``i`` of the Pipe: a tiny image whose first two channels spell ``i`` (see :func:`sample_ids`)."""
    image = torch.zeros((3, 4, 4), dtype=torch.uint8)
    image[0], image[1] = i % 256, i // 256
    return image, i % 4


def sample_ids(images: torch.Tensor) -> list[int]:
    """The sample numbers a batch of :func:`numbered` (or tests' shard) images spell."""
    return (images[:, 0, 0, 0].long() + 256 * images[:, 1, 0, 0].long()).tolist()


def run_cli(out: Path, args: list[str]) -> None:
    from stoker.cli.main import main
    from stoker.train.runner import from_config as runner

    built: list[nn.Module] = []
    original = runner.build_model

    def capture(name: str, classes: int) -> nn.Module:
        built.append(original(name, classes))
        return built[-1]

    runner.build_model = capture  # type: ignore[assignment]
    try:
        main(args, standalone_mode=False)
    finally:
        rank = int(os.environ["RANK"])
        (out / f"cli-rank{rank}.json").write_text(json.dumps({"digest": digest(built[0]) if built else None}))


def run_fit(out: Path, modes: list[str], root: str | None) -> None:
    from stoker.train.engine.distributed import join_launch

    ranks = join_launch("cpu", timeout_s=150)  # a loaded CI machine can be slow; the test's timeout still bounds a hang
    for mode in modes:
        result = fit_once(mode, root, ranks.rank, out)
        (out / f"{mode}-rank{ranks.rank}.json").write_text(json.dumps(result))
    ranks.close()


def fit_traced(rank: int, out: Path) -> dict[str, Any]:
    """Mode ``trace``: the run's digests on this rank (see tests/train/test_fit_golden.py)."""
    import random

    import numpy as np
    import pytest
    from test_fit_golden import Recorder, environment, sha, trace_ranks, untimed_checkpoint, untimed_history

    from stoker.loading import make_loader
    from stoker.pipes import Pipe
    from stoker.train import Scenario, fit

    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    train = make_loader(Pipe.from_iterable(range(1001)).shuffle(1001, seed=3).shard().map(numbered), batch_size=50,
                        num_workers=0, device="cpu", seed=0)
    valid = make_loader(Pipe.from_iterable(range(1001, 1228)).shard().map(numbered), batch_size=40, num_workers=0,
                        device="cpu")
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scenario = Scenario(model, optimizer, nn.CrossEntropyLoss(), train, valid, epochs=2, grad_accum=3, sync_every=5,
                        checkpoint_every_steps=2, scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5),
                        preprocess=lambda images: images.float() / 255, device="cpu", log_dir=str(out / "runs"),
                        name="trace", loggers=("csv",), progress=False, plot=False)
    calls: list[Any] = []
    events: list[Any] = []
    histories: list[Any] = []
    with pytest.MonkeyPatch.context() as patch:
        trace_ranks(patch, calls)
        history = fit(scenario, callbacks=[Recorder(events, histories)])
    run_dir = out / "runs" / "trace"
    result = {"collectives": sha(calls), "calls": len(calls), "weights": sha(model.state_dict()),
              "history": sha(untimed_history(history.state_dict())), "trimmed": history[0].trimmed, "environment": environment()}
    if rank == 0:
        result.update(events=sha(events), last=sha(untimed_checkpoint(run_dir / "last.pt")),
                      best=sha(untimed_checkpoint(run_dir / "best.pt")))
    return result


def fit_once(mode: str, root: str | None, rank: int, out: Path) -> dict[str, Any]:
    """One epoch of ``fit`` in ``mode``; what this rank saw."""
    from stoker.errors import TrainingError
    from stoker.loading import make_loader
    from stoker.pipes import Pipe
    from stoker.shards import ShardStream
    from stoker.train import Scenario, fit

    if mode == "trace":
        return fit_traced(rank, out)
    torch.manual_seed(0)
    if mode == "stream":
        # One shard at a time (the 11th shard holds 1 row, so blocks of 1): rank 0 gets 11 batches, rank 1 10.
        dataset: Any = ShardStream(root, shuffle_buffer=64, seed=1, shards_at_once=1)  # type: ignore[arg-type]
    else:
        dataset = Pipe.from_iterable(range(1001)).shuffle(1001, seed=3).shard().map(numbered)
    loader = make_loader(dataset, batch_size=50, num_workers=2, device="cpu", seed=0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 4))
    seen: list[int] = []
    steps = 0

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        nonlocal steps
        steps += 1
        loss = nn.functional.cross_entropy(logits, labels)
        if mode == "stop" and rank == 1 and steps == 3:
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C would: fit finishes the step, then all ranks stop
        if mode in ("nan", "nan-late") and rank == 1 and steps == 3:
            return loss * float("nan")
        if mode == "crash" and rank == 1 and steps == 2:
            raise RuntimeError("rank 1 breaks down")
        return loss

    def preprocess(images: torch.Tensor) -> torch.Tensor:
        seen.extend(sample_ids(images))
        return images.float() / 255

    # The Pipe accumulates over 3 batches (10 steps: windows 3, 3, 3 and a partial 1): the ranks stay in step
    # with DDP's no_sync inside a window and the last, partial window averaged by hand.
    reductions = [0]  # DDP's gradient all-reduces (one bucket: the model is tiny)
    net: nn.Module = model
    if mode == "pipe":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def counted(state, bucket):  # type: ignore[no-untyped-def]  # torch checks a string annotation as wrong
            reductions[0] += 1
            return allreduce_hook(state, bucket)

        net = nn.parallel.DistributedDataParallel(model)
        net.register_comm_hook(None, counted)
    scenario = Scenario(net, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn, loader, None, epochs=1,
                        grad_accum=3 if mode == "pipe" else 1,
                        preprocess=preprocess,
                        device="cpu", log_dir=str(out / "runs"), name="stop" if mode == "resume" else mode,
                        resume=mode == "resume", loggers=(), progress=False, plot=False,
                        sync_every=5 if mode == "nan-late" else None)
    try:
        history = fit(scenario)
    except TrainingError as exc:
        return {"error": str(exc), "steps": steps}
    except KeyboardInterrupt:
        return {"interrupted": True, "steps": steps, "seen": seen}
    return {"steps": steps, "seen": seen, "digest": digest(model), "train_samples": history[0].train_samples,
            "trimmed": history[0].trimmed, "reductions": reductions[0]}


if __name__ == "__main__":
    modes, out = sys.argv[1].split(","), Path(sys.argv[2])
    if modes == ["cli"]:
        run_cli(out, sys.argv[3:])
    else:
        run_fit(out, modes, sys.argv[3] if len(sys.argv) > 3 else None)
