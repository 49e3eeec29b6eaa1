"""Adapt while training against every fixed setting: is the adapted run as fast as the best one, never slower than the default?

Generates DigiFace-like data (PNG class folders), then, in interleaved rounds, trains
``SmallCNN`` with ``fit`` once per loader setting adapt can try (worker processes 0, 1,
2, ... and loader threads; each with ``adapt=False``), once with today's default
(``make_loader``'s own workers and backend, ``adapt=False``) and once adapted from that
default (``adapt=True``). Training img/s is the run's samples over its training seconds,
trials included. Each round prints the adapted run's ratio to that round's best fixed
setting and to the default, and the default's ratio to the same setting run as a fixed
one (what a single setting scatters by: the noise floor); then the median and spread.

The round's best fixed setting is the fastest of several runs that scatter by the noise
floor, so it is biased upwards (the maximum of five equally fast noisy runs beats their
median): the adapted run is also shown against the one fixed setting that is fastest by
its median over all rounds, measured in the same rounds.

With ``--standin-step-ms MS`` the model is an accelerator stand-in: its step waits MS
milliseconds without using the CPU (as the host waits for a GPU), so the readers have
the cores to themselves, as on a GPU server; the fixed settings are the reader counts
adapt steps through (0, 1, 2, 4, ... up to the cores) with each backend.

With ``--read-ms MS`` every sample's read first waits MS milliseconds without the CPU
(slow storage): then more readers feed the step faster whatever the cores, and with
``STOKER_CORES=16`` the search can be watched climbing toward 16 on a small machine.

Run::

    python benchmarks/bench_adapt.py --n 1600 --epochs 3 --rounds 3
    python benchmarks/bench_adapt.py --n 1600 --epochs 3 --rounds 3 --standin-step-ms 5
    STOKER_CORES=16 python benchmarks/bench_adapt.py --n 1600 --epochs 3 --rounds 3 --standin-step-ms 5 \
        --read-ms 2 --backends thread
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

from stoker import Scenario, fit, make_loader, open_data  # noqa: E402
from stoker.sources.synthetic import make_digiface  # noqa: E402
from stoker.train import SmallCNN  # noqa: E402
from stoker.train.engine import adapt as adapt_module  # noqa: E402
from stoker.train.engine.threads import usable_cores  # noqa: E402


class SlowStorage(Dataset):
    """A data set whose every read first waits ``read_s`` without the CPU (storage that answers slowly)."""

    def __init__(self, base: Any, read_s: float) -> None:
        self.base, self.read_s = base, read_s

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> Any:
        time.sleep(self.read_s)
        return self.base[i]


class StandIn(nn.Module):
    """An accelerator stand-in: a step that waits ``step_s`` without using the CPU, then a linear head."""

    def __init__(self, num_classes: int, step_s: float) -> None:
        super().__init__()
        self.step_s = step_s
        self.head = nn.Linear(3, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.step_s)
        return self.head(x.float().mean(dim=(2, 3)))


def _run(data_dir: Path, log_dir: Path, tag: str, batch: int, epochs: int, setting: dict[str, Any] | None,
         adapt: bool, width: int = 16, step_s: float = 0.0, read_s: float = 0.0) -> tuple[float, dict[str, Any]]:
    """Train once; ``setting`` ``None``: make_loader's defaults. Returns (img/s of training, run.json's adapt record)."""
    data = open_data(data_dir, valid=0.1, image_size=32, seed=0)
    loader_args = {} if setting is None else {"num_workers": setting["workers"], "backend": setting["backend"]}
    train_set = SlowStorage(data["train"], read_s) if read_s else data["train"]
    train = make_loader(train_set, batch_size=batch, device="cpu", seed=0, **loader_args)
    torch.manual_seed(0)
    model = StandIn(data.num_classes, step_s) if step_s else SmallCNN(num_classes=data.num_classes, width=width)
    history = fit(Scenario(model, torch.optim.AdamW(model.parameters(), 3e-3), nn.CrossEntropyLoss(), train, None,
                           epochs=epochs, device="cpu", log_dir=log_dir, name=tag, loggers=(), plot=False, adapt=adapt))
    train.close()
    samples = sum(e.train_samples for e in history.epochs)
    seconds = sum(e.train_time_s for e in history.epochs)
    record = json.loads((log_dir / tag / "run.json").read_text())["adapt"]
    return samples / seconds, record


def _spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f}, min {min(values):.2f}, max {max(values):.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1600, help="images to generate")
    parser.add_argument("--batch", type=int, default=16, help="batch size")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--width", type=int, default=16,
                        help="SmallCNN's width (64: a model whose step hardly waits for data; fewer readers may still win cores)")
    parser.add_argument("--min-run-s", type=float, default=0.0,
                        help="adapt's MIN_RUN_S (fit's default 20: a shorter run keeps its settings); 0 makes these "
                             "short runs adapt, to measure what trying costs and wins")
    parser.add_argument("--standin-step-ms", type=float, default=0.0,
                        help="train an accelerator stand-in whose step waits this long without the CPU (0: SmallCNN)")
    parser.add_argument("--read-ms", type=float, default=0.0,
                        help="every sample's read first waits this long without the CPU (slow storage); 0: none")
    parser.add_argument("--backends", default="process,thread", help="the fixed settings' backends")
    args = parser.parse_args(argv)
    adapt_module.MIN_RUN_S = args.min_run_s
    cores = usable_cores()
    step_s, read_s = args.standin_step_ms / 1e3, args.read_ms / 1e3
    counts = sorted({0, cores} | {2**k for k in range(cores.bit_length()) if 2**k <= cores})  # adapt's steps
    backends = args.backends.split(",")
    fixed = [{"backend": b, "workers": w} for b in backends for w in counts if w or b == "process"]
    to_best: list[float] = []
    to_default: list[float] = []
    noise: list[float] = []  # default / the same setting run as a fixed one: what one setting scatters by
    every: list[dict[str, float]] = []  # each round's img/s by run
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_digiface(root / "data", n=args.n, classes=10, progress=False)
        model = f"a stand-in step of {args.standin_step_ms:g} ms" if step_s else f"SmallCNN width {args.width}"
        model += f", reads waiting {args.read_ms:g} ms a sample" if read_s else ""
        print(f"{cores} cores, {args.n} images 32x32 PNG, {model}, batch {args.batch}, {args.epochs} epochs a run, "
              f"{args.rounds} rounds; img/s of training (adapt's trials included)\n")
        _run(root / "data", root / "runs", "warm-up", args.batch, 1, None, False, args.width, step_s, read_s)  # not timed: every run finds warm caches
        for r in range(args.rounds):
            rates: dict[str, float] = {}
            runs: list[tuple[str, dict[str, Any] | None, bool]] = [(f"{s['workers']} {s['backend']}", s, False) for s in fixed]
            runs += [("default", None, False), ("adapted", None, True)]
            order = runs if r % 2 == 0 else runs[::-1]  # A/B/A/B: no setting always runs first
            chosen, given = "", ""
            for name, setting, adapt in order:
                rate, record = _run(root / "data", root / "runs", f"r{r}-{name.replace(' ', '-')}", args.batch,
                                    args.epochs, setting, adapt, args.width, step_s, read_s)
                rates[name] = rate
                if adapt:
                    given = f"{record['given']['workers']} {record['given']['backend']}"
                    chosen = record["reason"] if not record["chosen"] else (
                        f"{record['chosen']['workers']} {record['chosen']['backend']}, prefetch {record['chosen']['prefetch']}"
                        f" ({len(record['trials'])} trials, {record['switches']} changes)")
            best_name = max((n for n in rates if n not in ("default", "adapted")), key=rates.__getitem__)
            to_best.append(rates["adapted"] / rates[best_name])
            to_default.append(rates["adapted"] / rates["default"])
            if given in rates:
                noise.append(rates["default"] / rates[given])
            every.append(rates)
            cells = ", ".join(f"{n} {v:.0f}" for n, v in rates.items())
            print(f"round {r + 1}: {cells}")
            print(f"  adapted chose {chosen}; adapted / best fixed ({best_name}) {to_best[-1]:.2f}, "
                  f"adapted / default {to_default[-1]:.2f}"
                  + (f"; default / the same setting fixed ({given}) {noise[-1]:.2f}" if given in rates else ""))
    print(f"\nadapted / best fixed: {', '.join(f'{v:.2f}' for v in to_best)} ({_spread(to_best)})")
    print(f"adapted / default:    {', '.join(f'{v:.2f}' for v in to_default)} ({_spread(to_default)})")
    if noise:
        print(f"default / the same setting fixed (the noise floor): {', '.join(f'{v:.2f}' for v in noise)} ({_spread(noise)})")
    names = [n for n in every[0] if n not in ("default", "adapted")]
    steady = max(names, key=lambda n: statistics.median(rates[n] for rates in every))
    to_steady = [rates["adapted"] / rates[steady] for rates in every]
    print("(best fixed is the fastest of several noisy runs per round, so it is biased upwards)")
    print(f"adapted / the fixed setting fastest by median ({steady}): {', '.join(f'{v:.2f}' for v in to_steady)} "
          f"({_spread(to_steady)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
