"""Train ResNet-18 with a stoker loader on a GPU: CUDA transfer, AMP bf16/fp16, torch.compile.

Generates a synthetic DigiFace-like data set (112x112 PNGs in class folders), optionally
packs it into pixel shards, then trains ResNet-18 for a few epochs per case and records
the last epoch's img/s and data-wait share (the first epoch pays for worker start-up,
cuDNN autotuning and compilation). Every case is a normal stoker run folder, so

    stoker compare OUT/runs --group-by category --metric img_per_s

draws them side by side. Results go to ``OUT/results.json`` and ``OUT/results.md``.

Usage (on a machine with a GPU)::

    python benchmarks/bench_gpu_train.py --out bench-gpu            # default cases
    python benchmarks/bench_gpu_train.py --cases files:bf16 shards:bf16+compile --n 20000

``--allow-cpu --n 64 --epochs 1 --cases files:off`` runs it on a CPU as a smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stoker import ClassFolderDataset, make_loader
from stoker.sources.synthetic import make_digiface
from stoker.train import Preprocess, Scenario, build_model, fit

DEFAULT_CASES = ("files:off", "files:bf16", "files:fp16", "files:bf16+compile", "shards:bf16", "shards:bf16+compile")


class ChannelsLastPreprocess(Preprocess):
    """uint8 -> normalised float on the device, in channels-last layout (faster convolutions under AMP)."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return super().forward(images).contiguous(memory_format=torch.channels_last)


def check_transfer(device: torch.device, batch_size: int, size: int, repeats: int = 20) -> dict[str, Any]:
    """Host-to-device copy of a pinned uint8 batch, non-blocking: GB/s and ms per batch."""
    batch = torch.randint(0, 255, (batch_size, 3, size, size), dtype=torch.uint8).pin_memory()
    batch.to(device, non_blocking=True)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        on_device = batch.to(device, non_blocking=True)
    torch.cuda.synchronize(device)
    seconds = (time.perf_counter() - start) / repeats
    if on_device.device.type != "cuda" or on_device.dtype != torch.uint8:
        raise RuntimeError(f"transfer check: batch arrived as {on_device.dtype} on {on_device.device}")
    return {"batch_mb": batch.numel() / 1e6, "ms_per_batch": seconds * 1e3, "gb_per_s": batch.numel() / seconds / 1e9}


def prepare_data(root: Path, n: int, classes: int, workers: int) -> tuple[Path, Path | None]:
    """Class folders of 112x112 PNGs (made once, reused) and their pixel shards (made on demand)."""
    files = root / "digiface"
    if not (files / "0").is_dir():
        print(f"generating {n} images in {files} ...", flush=True)
        make_digiface(files, n=n, classes=classes, workers=workers, progress=True, overwrite=True)
    return files, root / "shards"


def open_case_data(source: str, files: Path, shards: Path, workers: int) -> tuple[Any, Any, Any]:
    """(train, valid, loader arguments that override the command line's) for ``files`` or ``shards``."""
    if source == "files":
        train, valid = ClassFolderDataset(files).split(valid=0.1, seed=0)
        return train, valid, {"backend": "process"}
    from stoker.packer import pack
    from stoker.shards import ShardDataset

    if not (shards / "manifest.json").is_file():
        print(f"packing {files} into pixel shards in {shards} ...", flush=True)
        pack(files, shards, store="pixels", valid=0.1, workers=workers, progress=True, overwrite=True)
    train = ShardDataset(shards, "train")
    return train, ShardDataset(shards, "valid"), dict(train.loader_defaults)  # what measured fastest for shards


def run_case(case: str, args: argparse.Namespace, device: torch.device, files: Path, shards: Path) -> dict[str, Any]:
    source, _, mode = case.partition(":")
    amp, _, flag = mode.partition("+")
    compile_ = flag == "compile"
    if source not in ("files", "shards") or amp not in ("off", "bf16", "fp16") or flag not in ("", "compile"):
        raise SystemExit(f"bad case {case!r}: expected files|shards:off|bf16|fp16[+compile]")
    train, valid, extras = open_case_data(source, files, shards, args.workers)
    common = {"batch_size": args.batch_size, "num_workers": args.workers, "device": device, "seed": 0, **extras}
    train_loader = make_loader(train, shuffle=True, **common)
    valid_loader = make_loader(valid, shuffle=False, **common)
    torch.manual_seed(0)
    model = build_model("resnet18", train.num_classes).to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    name = case.replace(":", "-").replace("+", "-")
    scenario = Scenario(
        model, optimizer, nn.CrossEntropyLoss(), train_loader, valid_loader, epochs=args.epochs, device=device,
        amp=amp, compile=compile_, log_dir=args.out / "runs", name=f"{name}-{time.strftime('%H%M%S')}",
        tags={"category": source, "amp": amp, "compile": str(compile_).lower()}, progress=not args.quiet,
        preprocess=ChannelsLastPreprocess(),
    )
    start = time.perf_counter()
    history = fit(scenario)
    last = history.epochs[-1]
    batch = next(iter(valid_loader))[0]
    return {
        "case": case,
        "source": source,
        "amp": amp,
        "compile": compile_,
        "batches_on": str(batch.device),
        "img_per_s": last.img_per_s,
        "data_wait_share": last.data_wait_share,
        "epoch_time_s": last.time_s,
        "first_epoch_time_s": history.epochs[0].time_s,
        "valid_acc": last.valid_acc,
        "total_s": time.perf_counter() - start,
        "run_dir": str(history.run_dir),
    }


def write_results(out: Path, meta: dict[str, Any], transfer: dict[str, Any] | None, results: list[dict[str, Any]]) -> None:
    (out / "results.json").write_text(json.dumps({"meta": meta, "transfer": transfer, "results": results}, indent=2) + "\n")
    lines = [
        f"ResNet-18, {meta['image_size']}x{meta['image_size']} images, batch {meta['batch_size']}, "
        f"{meta['workers']} workers, {meta['device_name']}; last of {meta['epochs']} epochs.",
        "",
        "| case | img/s | data wait | epoch (s) | first epoch (s) | valid acc |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['case']} | {r['img_per_s']:.0f} | {r['data_wait_share']:.0%} | {r['epoch_time_s']:.1f} | "
            f"{r['first_epoch_time_s']:.1f} | {r['valid_acc']:.3f} |"
        )
    if transfer:
        lines += ["", f"Pinned uint8 batch ({transfer['batch_mb']:.1f} MB) to the GPU: "
                      f"{transfer['ms_per_batch']:.2f} ms, {transfer['gb_per_s']:.1f} GB/s."]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-gpu"), help="results, data and run folders")
    parser.add_argument("--n", type=int, default=12_000, help="images to generate")
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1))
    parser.add_argument("--epochs", type=int, default=3, help="per case; the last epoch is reported")
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), help="source:amp[+compile]")
    parser.add_argument("--allow-cpu", action="store_true", help="run on the CPU when there is no GPU (smoke test)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args()

    if torch.cuda.is_available():
        device = torch.device("cuda")
        device_name = torch.cuda.get_device_name(device)
    elif args.allow_cpu:
        device, device_name = torch.device("cpu"), f"CPU ({os.cpu_count()} cores)"
    else:
        print("no CUDA device: nothing to measure (use --allow-cpu for a smoke test)", file=sys.stderr)
        raise SystemExit(2)
    args.out.mkdir(parents=True, exist_ok=True)
    files, shards = prepare_data(args.out / "data", args.n, args.classes, args.workers)
    transfer = check_transfer(device, args.batch_size, 112) if device.type == "cuda" else None
    results = [run_case(case, args, device, files, shards) for case in args.cases]
    meta = {
        "device_name": device_name,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "image_size": 112,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "epochs": args.epochs,
        "n": args.n,
    }
    write_results(args.out, meta, transfer, results)


if __name__ == "__main__":
    main()
