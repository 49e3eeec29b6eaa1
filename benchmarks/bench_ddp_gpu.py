"""``torchrun stoker train`` on the GPU: ResNet-18 over pixel shards, NCCL, AMP bf16; img/s and data wait.

Generates a synthetic DigiFace-like data set (112x112 PNGs), packs it into pixel shards,
then launches ``torchrun --standalone --nproc-per-node N -m stoker.cli.main train`` (one
rank per GPU, NCCL) and reads the run's ``run.json``: the last epoch's img/s (global,
over all ranks), data-wait share (mean and slowest rank) and samples. The first epoch
pays for worker start-up and cuDNN autotuning, so the last one is reported. Results go
to ``OUT/ddp_results.json`` (``OUT`` defaults to ``$OUT``, else ``bench-ddp``).

Without CUDA it runs a tiny gloo version on the CPU (small_cnn, 32x32, no AMP), so the
script itself is tested everywhere.

Usage::

    python benchmarks/bench_ddp_gpu.py                       # 1 GPU, 12,000 images, 3 epochs
    python benchmarks/bench_ddp_gpu.py --nproc 8 --n 50000   # 8 GPUs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "bench-ddp"))
    parser.add_argument("--nproc", type=int, default=1, help="ranks (GPUs) on this machine")
    parser.add_argument("--n", type=int, default=None, help="images to generate (default: 12,000 on a GPU, 96 on a CPU)")
    parser.add_argument("--epochs", type=int, default=None, help="default: 3 on a GPU, 1 on a CPU")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=None, help="loader workers per rank")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="give up on the launch after this long")
    args = parser.parse_args()

    gpu = torch.cuda.is_available()
    n = args.n or (12_000 if gpu else 96)
    epochs = args.epochs or (3 if gpu else 1)
    workers = args.workers if args.workers is not None else (max(1, min(8, (os.cpu_count() or 2) // args.nproc - 1)) if gpu else 0)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    from stoker.packer import pack
    from stoker.sources.synthetic import make_digiface

    files, shards = out / "digiface", out / "shards"
    started = time.perf_counter()
    if not (files / "0").is_dir():
        make_digiface(files, n=n, classes=100 if gpu else 4, workers=os.cpu_count(), progress=False, overwrite=True)
    if not (shards / "manifest.json").is_file():
        pack(files, shards, store="pixels", valid=0.1, workers=os.cpu_count(), progress=False, overwrite=True)
    prepare_s = time.perf_counter() - started

    name = f"ddp-{time.strftime('%Y%m%d-%H%M%S')}"
    train = ["train", "--data", str(shards), "--epochs", str(epochs), "--batch-size", str(args.batch_size if gpu else 16),
             "--workers", str(workers), "--log-dir", str(out / "runs"), "--name", name, "--no-progress",
             "--tag", "category=ddp"]
    if gpu:
        train += ["--model", "resnet18", "--amp", "bf16", "--device", "cuda"]
    else:
        train += ["--model", "small_cnn", "--image-size", "32", "--device", "cpu"]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["STOKER_DIST_BACKEND"] = "nccl" if gpu else "gloo"
    import stoker  # the ranks import the same stoker as this script

    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(stoker.__file__).resolve().parents[1]), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.nproc),
           "-m", "stoker.cli.main", *train]
    print(" ".join(cmd), flush=True)
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout_s)
    launch_s = time.perf_counter() - started
    print(done.stdout[-3000:], done.stderr[-3000:] if done.returncode else "", sep="\n", flush=True)
    result: dict[str, Any] = {"ok": done.returncode == 0, "returncode": done.returncode, "gpu": gpu,
                              "device_name": torch.cuda.get_device_name(0) if gpu else "cpu", "nproc": args.nproc,
                              "backend": env["STOKER_DIST_BACKEND"], "images": n, "epochs": epochs,
                              "batch_size_per_rank": args.batch_size if gpu else 16, "workers_per_rank": workers,
                              "prepare_s": prepare_s, "launch_s": launch_s}
    run_json = out / "runs" / name / "run.json"
    if run_json.is_file():
        record = json.loads(run_json.read_text())
        last = record["epochs"][-1] if record.get("epochs") else {}
        rows = _csv_rows(out / "runs" / name / "metrics.csv")
        result.update({
            "world_size": record.get("world_size"),
            "status": record.get("status"),
            "img_per_s": float(rows[-1]["img_per_s"]) if rows else None,
            "data_wait_share": last.get("data_wait_share"),
            "slowest_data_wait_share": last.get("slowest_data_wait_share"),
            "train_samples": last.get("train_samples"),
            "valid_samples": last.get("valid_samples"),
            "trimmed": last.get("trimmed"),
            "run_dir": str(run_json.parent),
        })
    if not done.returncode == 0:
        result["stderr_tail"] = done.stderr[-4000:]
    (out / "ddp_results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "stderr_tail"}, indent=2))
    sys.exit(0 if done.returncode == 0 else 1)


def _csv_rows(path: Path) -> list[dict[str, str]]:
    import csv

    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


if __name__ == "__main__":
    main()
