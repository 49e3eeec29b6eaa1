"""fit's figures, weights, checkpoints, logger calls and collectives, pinned bit for bit.

The digests below were recorded from ``fit`` as it was before it was split into named
steps (commit 35817e7, one 308-line function): the split must reproduce every one of
them. Each case runs ``fit`` on a small fixed scenario on the CPU with one compute
thread and no loader workers, and reduces what it did to SHA-256 digests of:

* ``history``: every epoch's figures but the times (losses, accuracies, lr, samples,
  skipped, trimmed), best accuracy and epoch, how the run stopped;
* ``csv``: the same columns of ``metrics.csv``, as text;
* ``weights``: the final ``state_dict`` of the model (names, dtypes, shapes, bytes);
* ``last`` and ``best``: ``last.pt`` and ``best.pt`` (model, optimizer, scaler and
  scheduler states, RNG states, epoch, best so far, the mid-epoch entry but its seconds);
* ``events``: every logger call in order (with each batch's running loss and accuracy);
* ``collectives``: every :class:`~stoker.train.distributed.Ranks` call in order (the
  flags and the answer of each ``agree``, the width of each ``sum``/``max``), which fixes
  the handshake that keeps ranks in step; with the stoker log lines (warnings and notes)
  and the error message a run ended with.

``tests/train/test_ddp.py`` pins the same digests of a run on two gloo ranks (unequal
shares, DDP's ``no_sync`` inside accumulation windows, mid-epoch ``last.pt`` with every
rank's position), through ``ddp_script.py``'s ``trace`` mode, which uses the helpers here.

Float sums depend on the kernels torch picks for the machine: the digests pin this
project's environment (``ENVIRONMENT``). Elsewhere the test is skipped, saying so;
re-record there from a commit whose ``fit`` is trusted (``pytest -s tests/train/test_fit_golden.py``
prints each case's digests on a ``GOLDEN`` line).
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from stoker import ClassFolderDataset, TrainingError, make_loader
from stoker.train import Logger, Scenario, SmallCNN, fit, load_checkpoint
from stoker.train.distributed import Ranks

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
        "history": "12532e9353beb7eb7e4c7472cd25ff629b4e33d46035dfb7a3eb313d09ad25f5",
        "csv": "d99bc699e8cd60e45982671ee682722414b0a8c521cf0f4d4c367e9acae92b0b",
        "weights": "3b505fe2da73f7506da0d6d031622d2aee63078fa84bdbd92a2d6ab6b3a3ea25",
        "last": "deb824d5a1501ee6bb8f6919dbac9ecb1b540cacba1324b98a8b0d8db9dfdeec",
        "best": "e1f9940b5f36f92759074743c00c2c1930d461d72efab4ff99fa1070ed2d1db3",
        "events": "a26a1fd853c98a4cae6ff8b7025040b80141c3da0530f40c74c48c5c650e7223",
        "collectives": "5f6923fdec716ff4ec44a1d73db7bb9a6ff3ce398eaf37b309bdc8f4ebc7d1d7",
    },
    "accum1-sync5": {
        "history": "12532e9353beb7eb7e4c7472cd25ff629b4e33d46035dfb7a3eb313d09ad25f5",
        "csv": "d99bc699e8cd60e45982671ee682722414b0a8c521cf0f4d4c367e9acae92b0b",
        "weights": "3b505fe2da73f7506da0d6d031622d2aee63078fa84bdbd92a2d6ab6b3a3ea25",
        "last": "0c5dda5c5bd236ef1e276a1d2e02d3afa91c62ac0f91c1260f32747ee5325195",
        "best": "fa4ac2ee8dc9016ab3d6785b38f4a01bb38899fe5c5e98a915d2fb930141bb01",
        "events": "a26a1fd853c98a4cae6ff8b7025040b80141c3da0530f40c74c48c5c650e7223",
        "collectives": "bc819370cbdb23ea4b83fd5bdba15949575efd1888abb8077b0d32204ab656b5",
    },
    "accum3-sync1": {
        "history": "8c11e495494dd2a56e445ba5db2f0194446637818651c0c5899071462cdda5f0",
        "csv": "b2f883221e0b25c647b62eafe3af4cdecd9e4a7d39d5f3a2fa21c91f3c0f7ed2",
        "weights": "a91a46cb9f75e6f427f5474a35ff5b2521fa5561b9ac4df56897cf077f61a477",
        "last": "f0f2d334190b5349e05a96c1577727def10bd9a967a304307a608b98198ec749",
        "best": "e8c96d29711367db98bbeea2a62bd155bd31eb55448f7a36e3aae267a5c2513e",
        "events": "68f0f2e3d8f9638f987dbe6277ae0bfbcd40ae1a9ed4b06e692980d0bdabc3c0",
        "collectives": "5f6923fdec716ff4ec44a1d73db7bb9a6ff3ce398eaf37b309bdc8f4ebc7d1d7",
    },
    "accum3-sync5": {
        "history": "8c11e495494dd2a56e445ba5db2f0194446637818651c0c5899071462cdda5f0",
        "csv": "b2f883221e0b25c647b62eafe3af4cdecd9e4a7d39d5f3a2fa21c91f3c0f7ed2",
        "weights": "a91a46cb9f75e6f427f5474a35ff5b2521fa5561b9ac4df56897cf077f61a477",
        "last": "affa1b16db675122900d4598b8fcfb69dcec9716ad34cae2b259a27213e62566",
        "best": "b2f6ac055787b612fe61b9a83df3bcfd5c2738f6f41b790480694c4c39e05f18",
        "events": "68f0f2e3d8f9638f987dbe6277ae0bfbcd40ae1a9ed4b06e692980d0bdabc3c0",
        "collectives": "9868559ecc80f4c92aaffadd7b79cb0883f745ef2e701447126d9b576276639b",
    },
    "stop-train": {
        "history": "e20042c898cc5b924ad03275528323cc154b1fab6545a52608edd61d40ce061a",
        "csv": "a435c77289ee44724b9c4b723cf79ac3e2f4c3e094950f13f49b2603a2b366dd",
        "weights": "9bb7e65cd80d9b87340e645890704b1be44df870ef81f8db56a6b86328582ceb",
        "last": "6f14549c7f095b9a1c681f1a326c0e84879a1bb93fd66b9a6974dbca98ac8dd4",
        "best": "aa05a9c1b5f36205b1db37da98e41a7c6c3e67af83da04b3f27fb84ab5ffded1",
        "events": "1dfe2baa23b2f300e97f780a87d1b467e1414cf502cf8c0864f2c4e12e5fae4d",
        "collectives": "5a3f37248371ea6aa23507a94276dc0fe2ab457baf0b30fd6598c706477c5906",
    },
    "stop-valid": {
        "history": "ffbfa2842114619d310f3862b1eb8d7808ec33a46766d7b20d235a47ad468cdf",
        "csv": "a435c77289ee44724b9c4b723cf79ac3e2f4c3e094950f13f49b2603a2b366dd",
        "weights": "9bb7e65cd80d9b87340e645890704b1be44df870ef81f8db56a6b86328582ceb",
        "last": "e3ef9ce1614fe6ae8e62e5806568a58d12307b72a027e7c747a0ea533f784419",
        "best": "a8755fb86a2ee45b75046f38ffc0bda0cc33f83989dc8d2efbc73181ef432e91",
        "events": "ad571ed5df1f526c673a65baab40f6232b0c2a029a805d7a467de5b47eb2a5d9",
        "collectives": "a79ddbbc2d6245ce82671faf39d4631d257c534d3b47b1e4c5392859bb17f95b",
    },
    "nan-late": {
        "history": "5846b278c1d8144f42adc71424458f7b0b12554d3c7de5e83d11352d96989036",
        "csv": "64123cc8ffd925bf463a595c9adf384f19356837e451cd85cdf150792c1f6d0f",
        "weights": "90fc2ba081fe8312a1ec27ac1be56b63ffbd6325907b6ac3155bfbb408b09720",
        "last": "71729afaa1272a3b20e592bea62825bfc7aba88be7260b22582c7555d461b361",
        "best": "fc1e5d40335ef37e6c8754b1a476e6933103bc4990001a584c9aad5f40d75260",
        "events": "369a0b090bf7f1a257afb13d0cd3f2b3ce490ca43817e391ab58602135520061",
        "collectives": "8f067fb149e2cadb58aa4e383ffe4930146746f00bb85d696821c2e57d9b9750",
    },
    "plain-bf16": {
        "history": "0e823dbf2b8824c20048f3cd2b24917789be0c25818ebe3f5a4bcf426f640d92",
        "csv": "16cd38759515ee660ce28ab9c12343d53d91c3f57e5cea71d7307a8073913d26",
        "weights": "6658aa630e284a083116286911ef1fef204faba239de8b3fc05dd15158dd6e53",
        "last": "497b0a147c676969e9aed5571ca96eda498130c306e76424a50ec3510a13e807",
        "best": "4da17a2e7f73dfe9d15abf3980ef5f1dcd2a4b2ae1467fb3ca9319f07c239155",
        "events": "d878bdac3a72123e648d4aa44994c54373c553d3fe85e166ef38725e00db3f30",
        "collectives": "f651e55124d8f3387f0bfc75a5e149ddc3768f722809502cc8e82822ccae7e2f",
    },
    "plain-fp16": {
        "history": "18c66ff22d14c426a8602a7c4a11ba97cc4a19569c79a775725a05c87291edb2",
        "csv": "b0afd958967d1a6de3227e4fb7f543ad08f06f3d12248621f18fc96706446d41",
        "weights": "d08f8cf608a058f606cb57a626a210b5e93750f8c41585d2ce430a082af384d2",
        "last": "3c745d6c3fa0403a3bb1132cd92723948b15e59ab22a592074925d68784c459e",
        "best": "71f057b7f7f70d68f556bb0991a7e0dcbb808f5330c8eaca6773811f75025e08",
        "events": "d86c29d082808e58829d97d2d69203cf25cfdbeed3d2429abdbc6c291252954d",
        "collectives": "2b9f9034d5ade0f67a5456f45a0cb4bef2b41a68fc69445a88a24ed8c6c7e703",
    },
}


@pytest.fixture
def _pinned() -> Iterator[None]:
    if environment() != ENVIRONMENT:
        pytest.skip(f"the golden digests pin {ENVIRONMENT}; this is {environment()} (re-record them here)")
    yield


@pytest.mark.parametrize("case", CASES)
def test_fit_reproduces_the_recorded_run_bit_for_bit(case: str, folders: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                                                     _pinned: None) -> None:
    digests = run_case(case, folders, tmp_path, monkeypatch, caplog)
    print(f"\nGOLDEN {json.dumps({case: digests})}")  # to re-record: pytest -s -k golden, then collect these lines
    assert digests == GOLDEN.get(case)
