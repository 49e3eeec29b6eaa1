"""fit's figures, weights, checkpoints, logger calls and collectives, pinned bit for bit.

The digests were first recorded from ``fit`` as it was before it was split into named
steps (commit 35817e7, one 308-line function), and the split reproduced every one of
them. They were re-recorded twice since, each time for a change that is meant to change
exactly what it changed: the one order module (every shuffled order and worker seed
changed, README "Changes"), then equal steps moving into the loader (only
``collectives`` changed: ``fit``'s per-step ``agree`` lost its "out of batches" flag;
every figure, weight, checkpoint and logger call stayed the same, compared case by case),
the interrupted warning naming the resume command that runs (the log lines, in ``collectives``),
the loader state's format ``stoker-loader/2`` (``last`` of the one case whose last.pt is mid-epoch),
and the end-of-epoch check for a train split read to no batch summing the skipped count beside the
samples (commit 0fafb4f: each epoch's first ``sum`` is 2 wide, not 1; only ``collectives`` changed,
compared case by case, the first time these digests ran on an AVX-512 machine, held to AVX2). Each case runs ``fit`` on a small fixed scenario on the CPU with one compute
thread and no loader workers, and reduces what it did to SHA-256 digests of:

* ``history``: every epoch's figures but the times (losses, accuracies, lr, samples,
  skipped, trimmed), best accuracy and epoch, how the run stopped;
* ``csv``: the same columns of ``metrics.csv``, as text;
* ``weights``: the final ``state_dict`` of the model (names, dtypes, shapes, bytes);
* ``last`` and ``best``: ``last.pt`` and ``best.pt`` (model, optimizer, scaler and
  scheduler states, RNG states, epoch, best so far, the mid-epoch entry but its seconds);
* ``events``: every logger call in order (with each batch's running loss and accuracy);
* ``collectives``: every :class:`~stoker.train.engine.distributed.Ranks` call in order (the
  flags and the answer of each ``agree``, the width of each ``sum``/``max``), which fixes
  the handshake that keeps ranks in step; with the stoker log lines (warnings and notes)
  and the error message a run ended with.

``tests/train/test_ddp.py`` pins the same digests of a run on two gloo ranks (unequal
shares, DDP's ``no_sync`` inside accumulation windows, mid-epoch ``last.pt`` with every
rank's position), through ``ddp_script.py``'s ``trace`` mode, which uses the helpers here.

Float sums depend on the kernels torch picks for the machine. The digests pin torch's
version and the AVX2 kernels (``ENVIRONMENT``): on a machine that has more (AVX-512), the
cases run in a child process whose libraries are held to AVX2 (``AVX2_ONLY``: ATen's
kernels, oneDNN's and MKL's code paths), so the same digests hold on every x86_64 machine
with AVX2, whatever its maker. Elsewhere (another torch, no AVX2, not x86_64) the test is
skipped, saying so; re-record there from a commit whose ``fit`` is trusted
(``pytest -s tests/train/test_fit_golden.py`` prints each case's digests on a ``GOLDEN`` line).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from stoker import ClassFolderDataset, TrainingError, make_loader
from stoker.train import Logger, Scenario, SmallCNN, fit, load_checkpoint
from stoker.train.engine.distributed import Ranks

TIMES = ("time_s", "train_time_s", "data_wait_s", "compute_s", "img_per_s", "data_wait_share", "slowest_data_wait_share")
CSV_KEPT = ("epoch", "acc/train", "acc/valid", "loss/train", "loss/valid", "lr")  # metrics.csv less its times
COLLECTIVES = ("agree", "sum", "max", "any", "gather_text", "broadcast_text", "broadcast_bytes", "broadcast_buffers",
               "average_gradients")


def environment() -> str:
    return f"torch {torch.__version__.split('+')[0]}, {platform.machine()}, {torch.backends.cpu.get_cpu_capability()}"


# ---------------------------------------------------------------------------------------------------------------
# Reducing a run to digests.


def _canon(obj: Any) -> Any:
    """A JSON-able form of a checkpoint part: tensors by dtype, shape and SHA-256 of their bytes, floats exact."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return ["tensor", str(t.dtype), list(t.shape), hashlib.sha256(data).hexdigest()]
    if isinstance(obj, dict):
        return [[_canon(k), _canon(v)] for k, v in obj.items()]
    if isinstance(obj, (list, tuple)):
        return [_canon(v) for v in obj]
    if isinstance(obj, float):
        return repr(obj)  # exact, and nan-safe
    if isinstance(obj, bytes):
        return hashlib.sha256(obj).hexdigest()
    return obj


def sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(_canon(obj)).encode()).hexdigest()


def untimed_history(state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "epochs": [{k: v for k, v in e.items() if k not in TIMES} for e in state["epochs"]]}


def untimed_checkpoint(path: Path) -> Any:
    if not path.is_file():
        return None
    state = load_checkpoint(path)
    state.pop("config", None)
    if isinstance(state.get("history"), dict):
        state["history"] = untimed_history(state["history"])
    partial = state.get("partial")
    if isinstance(partial, dict):
        partial = {k: v for k, v in partial.items() if k != "train_timer"}
        if "ranks" in partial:
            partial["ranks"] = [{k: v for k, v in r.items() if k != "train_timer"} for r in partial["ranks"]]
        state["partial"] = partial
    return state


def _csv(path: Path) -> list[list[str]]:
    if not path.is_file():
        return []
    lines = [line.split(",") for line in path.read_text().splitlines()]
    keep = [lines[0].index(column) for column in CSV_KEPT]
    return [[row[i] for i in keep] for row in lines]


class Recorder(Logger):
    """Every logger call, with the figures that do not depend on the clock."""

    def __init__(self, events: list[Any], history: list[Any]) -> None:
        self.events, self.history = events, history

    def start(self, run, history):  # type: ignore[no-untyped-def]
        self.events.append(["start", run.epochs, run.start_epoch, run.resumed, len(history.epochs)])

    def epoch_start(self, epoch, batches):  # type: ignore[no-untyped-def]
        self.events.append(["epoch_start", epoch, batches])

    def batch_end(self, progress):  # type: ignore[no-untyped-def]
        p = progress
        self.events.append(["batch_end", p.phase, p.epoch, p.batch, p.batches, p.samples, repr(p.loss), repr(p.acc)])

    def epoch_end(self, stats):  # type: ignore[no-untyped-def]
        self.events.append(["epoch_end", {k: v for k, v in stats.to_dict().items() if k not in TIMES}])

    def end(self, history):  # type: ignore[no-untyped-def]
        self.events.append(["end", history.stopped, len(history.epochs)])
        self.history.append([untimed_history(history.state_dict()), history.stopped])


class StopAt(Recorder):
    """A Recorder whose ``batch_end`` raises KeyboardInterrupt once, at (phase, epoch, batch): as Ctrl-C."""

    def __init__(self, events: list[Any], history: list[Any], at: tuple[str, int, int]) -> None:
        super().__init__(events, history)
        self.at: tuple[str, int, int] | None = at

    def batch_end(self, progress):  # type: ignore[no-untyped-def]
        super().batch_end(progress)
        if (progress.phase, progress.epoch, progress.batch) == self.at:
            self.at = None
            raise KeyboardInterrupt


def trace_ranks(monkeypatch: pytest.MonkeyPatch, calls: list[Any]) -> None:
    """Record every Ranks call in ``calls``: each ``agree`` with its flags and answer, ``sum``/``max`` by width."""
    for name in COLLECTIVES:
        original = getattr(Ranks, name)

        def traced(self: Ranks, *args: Any, __name: str = name, __original: Callable[..., Any] = original) -> Any:
            result = __original(self, *args)
            if __name == "agree":
                calls.append(["agree", [bool(a) for a in args], result])
            elif __name in ("sum", "max"):
                calls.append([__name, len(args[0])])
            else:
                calls.append([__name])
            return result

        monkeypatch.setattr(Ranks, name, traced)


class Run:
    """What one case did: digests of each part (see the module docs)."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
        self.tmp_path, self.caplog = tmp_path, caplog
        self.events: list[Any] = []
        self.history: list[Any] = []  # each fit's History, as its loggers' end() saw it
        self.calls: list[Any] = []
        trace_ranks(monkeypatch, self.calls)
        caplog.set_level(logging.INFO, logger="stoker")

    def fit(self, scenario: Scenario, logger: Recorder | None = None) -> None:
        """Run ``fit``; its way of ending (a return, an interrupt, an error) goes into ``collectives``."""
        try:
            history = fit(scenario, callbacks=[logger or Recorder(self.events, self.history)])
            self.calls.append(["returned", history.stopped])
        except KeyboardInterrupt:
            self.calls.append(["KeyboardInterrupt"])
        except TrainingError as exc:
            self.calls.append(["TrainingError", str(exc).replace(str(self.tmp_path), "<tmp>")])

    def digests(self, scenario: Scenario) -> dict[str, str]:
        run_dir = self.tmp_path / str(scenario.name)
        record = json.loads((run_dir / "run.json").read_text())
        lines = [r.getMessage().replace(str(self.tmp_path), "<tmp>") for r in self.caplog.records if r.name == "stoker"]
        return {
            "history": sha([self.history, record["status"], record["summary"]["epochs_done"],
                             record["summary"]["best_valid_acc"], record["summary"]["best_epoch"],
                             [{k: v for k, v in e.items() if k not in TIMES} for e in record["epochs"]]]),
            "csv": sha(_csv(run_dir / "metrics.csv")),
            "weights": sha(scenario.model.state_dict()),
            "last": sha(untimed_checkpoint(run_dir / "last.pt")),
            "best": sha(untimed_checkpoint(run_dir / "best.pt")),
            "events": sha(self.events),
            "collectives": sha([self.calls, lines]),
        }


# ---------------------------------------------------------------------------------------------------------------
# The scenarios.


def _cnn(folders: Path, tmp_path: Path, name: str, *, grad_accum: int, sync_every: int, resume: bool = False,
         seed: int = 0, loss_fn: Any = None, interval: str = "epoch") -> Scenario:
    """Small CNN with dropout over class folders: 120 train samples in batches of 16 (8, the last short), 40 valid in 6s."""
    torch.manual_seed(seed)  # a resumed run starts from other weights: last.pt must win
    model = nn.Sequential(nn.Dropout(0.1), SmallCNN(4, width=8))  # dropout draws from the global RNG
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    train, valid = ClassFolderDataset(folders).split(valid=0.25, seed=0)
    scheduler = (torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5) if interval == "epoch"
                 else torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=2 * 8 // grad_accum + 1))
    return Scenario(
        model, optimizer, loss_fn or nn.CrossEntropyLoss(),
        make_loader(train, batch_size=16, num_workers=0, device="cpu", seed=3),
        make_loader(valid, batch_size=6, shuffle=False, num_workers=0, device="cpu"),
        epochs=2, device="cpu", log_dir=tmp_path, name=name, resume=resume, grad_accum=grad_accum,
        sync_every=sync_every, checkpoint_every_steps=2, scheduler=scheduler, scheduler_interval=interval,  # type: ignore[arg-type]
        cpu_threads=1, loggers=("csv",), progress=False, plot=False,
    )


class _NanAt:
    """Cross-entropy, except NaN at the ``at``-th training batch of the run."""

    def __init__(self, at: int) -> None:
        self.at, self.calls = at, 0

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(logits, labels)
        if torch.is_grad_enabled():
            self.calls += 1
            if self.calls == self.at:
                return loss * float("nan")
        return loss


def _plain(tmp_path: Path, name: str, amp: str) -> Scenario:
    """A linear model over plain lists of float batches (no set_epoch, no state_dict), under autocast."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(22, 6, generator=g), torch.randint(0, 3, (22,), generator=g)
    train = [(x[i : i + 4], y[i : i + 4]) for i in range(0, 22, 4)]  # 6 batches, the last of 2
    valid = [(x[i : i + 5], y[i : i + 5]) for i in range(0, 22, 5)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    return Scenario(
        model, optimizer, nn.CrossEntropyLoss(), train, valid, epochs=3, device="cpu", log_dir=tmp_path, name=name,
        amp=amp, grad_accum=4, sync_every=3, preprocess=None, patience=1,  # type: ignore[arg-type]
        scheduler=torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.5, total_iters=5),
        scheduler_interval="step", cpu_threads=1, loggers=("csv",), progress=False, plot=False,
    )


def run_case(case: str, folders: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
             caplog: pytest.LogCaptureFixture) -> dict[str, str]:
    run = Run(tmp_path, monkeypatch, caplog)
    random.seed(0)  # last.pt holds every generator's state
    np.random.seed(0)
    if case.startswith("accum"):  # e.g. "accum3-sync5": straight through, a mid-epoch last.pt every 2 steps
        grad_accum, sync_every = (int(part[5:]) if part.startswith("accum") else int(part[4:]) for part in case.split("-"))
        scenario = _cnn(folders, tmp_path, case, grad_accum=grad_accum, sync_every=sync_every)
        run.fit(scenario)
    elif case in ("stop-train", "stop-valid"):  # Ctrl-C mid-phase (a callback's KeyboardInterrupt), then --resume
        at = ("train", 2, 4) if case == "stop-train" else ("valid", 1, 3)
        run.fit(_cnn(folders, tmp_path, case, grad_accum=3, sync_every=5, interval="step"), StopAt(run.events, run.history, at))
        scenario = _cnn(folders, tmp_path, case, grad_accum=3, sync_every=5, interval="step", resume=True, seed=1)
        run.fit(scenario)
    elif case == "nan-late":  # NaN at epoch 2, batch 3, read back at the checkpoint due after batch 4 (not written)
        scenario = _cnn(folders, tmp_path, case, grad_accum=1, sync_every=8, loss_fn=_NanAt(8 + 3))
        run.fit(scenario)
    elif case.startswith("plain-"):
        scenario = _plain(tmp_path, case, case.removeprefix("plain-"))
        run.fit(scenario)
    else:
        raise ValueError(case)
    return run.digests(scenario)


CASES = ("accum1-sync1", "accum1-sync5", "accum3-sync1", "accum3-sync5", "stop-train", "stop-valid", "nan-late",
         "plain-bf16", "plain-fp16")
ENVIRONMENT = "torch 2.14.1, x86_64, AVX2"
GOLDEN: dict[str, dict[str, str]] = {
    "accum1-sync1": {
        "history": "668bdbcb575992fe57b1af46509db243d03a6bf0fc7303fd2f4d899002f6aa79",
        "csv": "a2c81f4765b94a74361f8ab3bf7465e236cb1ec05aaf680f47bb0a5c4922c925",
        "weights": "589d7b9aa8751c9bfd1415d7cb9f5f30e5d193a2e285703a5abe51e94be052a8",
        "last": "be197abe9b4a4b8d368bc170803f91ee0f67cefcdb4755c97c24891d4cb68178",
        "best": "1f665e60f2ca604adb74f0a5c6701c5869ca677652a77d01df481d234a03baa5",
        "events": "54d88e2304ea8602e4915427ba36cd3669fcc3324e40cdee6090efc31cae55b3",
        "collectives": "432716475361a029ca3f4f6ba988d841efab763cfd915a2c130b9a46cc903ab4",
    },
    "accum1-sync5": {
        "history": "668bdbcb575992fe57b1af46509db243d03a6bf0fc7303fd2f4d899002f6aa79",
        "csv": "a2c81f4765b94a74361f8ab3bf7465e236cb1ec05aaf680f47bb0a5c4922c925",
        "weights": "589d7b9aa8751c9bfd1415d7cb9f5f30e5d193a2e285703a5abe51e94be052a8",
        "last": "bcf57fcbab9ec7382ab50dcc518d596269f0bbc5adb62f2d1ea0ce94d60d44b9",
        "best": "5a5b5ef10a4b587bcee9c74965cf43b541816d1fa1320291658523c9ecc7f071",
        "events": "54d88e2304ea8602e4915427ba36cd3669fcc3324e40cdee6090efc31cae55b3",
        "collectives": "ef1283eae56310f16e93422f58ab4701d50ad9e1c69f7f5655f457d0da3c84fd",
    },
    "accum3-sync1": {
        "history": "e8c43b0d3cacd0476225905f158086bd414aaa2280039d99da77edef8709c460",
        "csv": "bc8719a7bc788135261a0b6c1744404f961e4026ffbb25c98ed54b024e54ce39",
        "weights": "b1a2b9bcee9e7090f70bbe9d8bb1baf59eb8963053ab0d7829103011ed381fae",
        "last": "6e6a959e5c678e3e13efbea171e2e2f5177f90f49a8899018546f852a40a81e9",
        "best": "42d7d75531966f9b8215c4d213a45de7e725f90906006f2a677f5fcedf3c3f16",
        "events": "82f32af901ea923b2b9c5367c3383ebf3ea3224306086a2a67181d74f0e216a4",
        "collectives": "432716475361a029ca3f4f6ba988d841efab763cfd915a2c130b9a46cc903ab4",
    },
    "accum3-sync5": {
        "history": "e8c43b0d3cacd0476225905f158086bd414aaa2280039d99da77edef8709c460",
        "csv": "bc8719a7bc788135261a0b6c1744404f961e4026ffbb25c98ed54b024e54ce39",
        "weights": "b1a2b9bcee9e7090f70bbe9d8bb1baf59eb8963053ab0d7829103011ed381fae",
        "last": "afe76cf0e8da57818bc6e05668cdbc2fdad8fdc0e3df4404581aed1e00e6a23d",
        "best": "7c0171c75d8a2a07cf20b268f2c4333f7b60799716ce71661438eee6aa5cbb26",
        "events": "82f32af901ea923b2b9c5367c3383ebf3ea3224306086a2a67181d74f0e216a4",
        "collectives": "3e82082faa7cadb664e6c3cd31db3c5558732fb577b6ca92c6ba2eb777e34a26",
    },
    "stop-train": {
        "history": "010776e8dfbd3260fbb964439a0678a68485760a8531d2af6bda58a7e66a98ab",
        "csv": "5a50d66c73b559ec92f04697c24fee535be3ebdd0df0cd0a885bb9ee1cd872b1",
        "weights": "f8fba693f747bd7b1468a44ab3d2ac2dce7296be0ddd0c1c08e2aeb5aa584746",
        "last": "768694e3b88653b4ec0b14d3aaa1bc5d6860571755a5bc9c02bd2f5f41baeff5",
        "best": "fc5febc8a6dcb4e6850dba210dc6aaa178d8d17c3ae6799e97dad0b214a87fde",
        "events": "c7e003a134d586c14dfa9ecda4130ed0699979a47c963b8d37c04d106b58715e",
        "collectives": "d4e255d2c5462d6fd9be0c30b945e09632b28f509d8cb8c8868457ab8b98b435",
    },
    "stop-valid": {
        "history": "56dcd6fa6914144597ebcd2971f32b0c4652a9c9cd771f41582948a57be96a22",
        "csv": "5a50d66c73b559ec92f04697c24fee535be3ebdd0df0cd0a885bb9ee1cd872b1",
        "weights": "f8fba693f747bd7b1468a44ab3d2ac2dce7296be0ddd0c1c08e2aeb5aa584746",
        "last": "986dec7ccea967e8969c1235ef592ff038a5dc438ea51c496d56fff1453d1ea7",
        "best": "87f27b3e227c6b756077c5f003bc8ca14088071b9eb6c17e78264817cd1ea7c2",
        "events": "ec869966d207fed38082096dac97679a3caef487fd3fd065f20eacd9d6f03093",
        "collectives": "22e80c54e64ec919e46de3baf13f57b88398848ca2b391b9b3e609d05bff3bbb",
    },
    "nan-late": {
        "history": "701a884425d7bfc09382bd8e75794ad7dd2f20c38730f5b1be9ab33f4763490b",
        "csv": "c7cf62ae7136a58ed15e6beda52324893579856243bbc92ea918a3d37a250ed1",
        "weights": "90fc2ba081fe8312a1ec27ac1be56b63ffbd6325907b6ac3155bfbb408b09720",
        "last": "d6f017c205bc2d7a92455a672235b726deb48f99275209b5fcc044ffda502e95",
        "best": "2150424a43ff5a192e0c10f1b827c8337e4e30516e14b6cfe572220c37ca1c92",
        "events": "1f5d1a818251d6c803ec6dbb36cc27bad9b602f12971681ca7c7609fecddc237",
        "collectives": "2cf2cc8311c562b6f0d0b61b6d36b1ae20fce2cec0bee27712249d78f5460185",
    },
    "plain-bf16": {
        "history": "2207733badd03ef040c0384c74ff59f7a627193dd1736fc7628acdb022b58053",
        "csv": "16cd38759515ee660ce28ab9c12343d53d91c3f57e5cea71d7307a8073913d26",
        "weights": "6658aa630e284a083116286911ef1fef204faba239de8b3fc05dd15158dd6e53",
        "last": "b466a595054d7a0032b40b645d2d786ad8e7cc11ceee956f188894b69eb0ca01",
        "best": "4da17a2e7f73dfe9d15abf3980ef5f1dcd2a4b2ae1467fb3ca9319f07c239155",
        "events": "d878bdac3a72123e648d4aa44994c54373c553d3fe85e166ef38725e00db3f30",
        "collectives": "c01af6b645c0091012d9ba19637c83ea20d5b63ba0ec4c75268c60f8e245af8c",
    },
    "plain-fp16": {
        "history": "83843955c7d831e6720d8d78f3e52f159c2c126531bf0a9cd1128c3d721b7102",
        "csv": "b0afd958967d1a6de3227e4fb7f543ad08f06f3d12248621f18fc96706446d41",
        "weights": "d08f8cf608a058f606cb57a626a210b5e93750f8c41585d2ce430a082af384d2",
        "last": "93224fbc2493115b5a87ab0ba2a26858206a00c56e9d9865e139eb30e81d9529",
        "best": "71f057b7f7f70d68f556bb0991a7e0dcbb808f5330c8eaca6773811f75025e08",
        "events": "d86c29d082808e58829d97d2d69203cf25cfdbeed3d2429abdbc6c291252954d",
        "collectives": "9834f136e7a7d25476090c80da6d3e027c2fd5da59d231d0efabaa2a46a5af23",
    },
}


# What holds torch's libraries to the AVX2 code paths, read when torch is imported: ATen's kernels, oneDNN's
# (convolutions) and MKL's (matrix products; conditional numerical reproducibility at AVX2).
AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"}
_OUT = "STOKER_GOLDEN_OUT"  # the child writes each case's digests there, one JSON line a case


def held_to_avx2() -> bool:
    """Whether this process runs the pinned environment: torch's version, AVX2 kernels, every library held to them."""
    return environment() == ENVIRONMENT and all(os.environ.get(k) == v for k, v in AVX2_ONLY.items())


@pytest.fixture(scope="module")
def _child_digests(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]] | None:
    """None where this process is held to AVX2; else every case's digests from a child pytest that is."""
    if held_to_avx2():
        return None
    if platform.machine() not in ("x86_64", "AMD64") or not environment().startswith(ENVIRONMENT.rsplit(",", 1)[0]):
        pytest.skip(f"the golden digests pin {ENVIRONMENT}; this is {environment()} (re-record them here)")
    out = tmp_path_factory.mktemp("golden") / "digests.jsonl"
    env = {**os.environ, **AVX2_ONLY, _OUT: str(out)}
    env.pop("PYTEST_ADDOPTS", None)
    child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "bit_for_bit", __file__],
                           env=env, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=280)
    found: dict[str, dict[str, str]] = {}
    for line in out.read_text().splitlines() if out.is_file() else []:
        found.update(json.loads(line))
    if not found:
        pytest.skip(f"the golden digests pin {ENVIRONMENT}; held to AVX2, this machine ran none: {child.stdout[-500:]}")
    return found


@pytest.mark.parametrize("case", CASES)
def test_fit_reproduces_the_recorded_run_bit_for_bit(case: str, folders: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                                                     _child_digests: dict[str, dict[str, str]] | None) -> None:
    """The case's digests, from this process where it is held to AVX2, else from the child that is."""
    if _child_digests is not None:
        assert _child_digests.get(case) == GOLDEN[case], f"held to AVX2 in a child process, case {case} differs"
        return
    digests = run_case(case, folders, tmp_path, monkeypatch, caplog)
    print(f"\nGOLDEN {json.dumps({case: digests})}")  # to re-record: pytest -s -k golden, then collect these lines
    if os.environ.get(_OUT):
        with open(os.environ[_OUT], "a") as out:
            out.write(json.dumps({case: digests}) + "\n")
    assert digests == GOLDEN.get(case)
