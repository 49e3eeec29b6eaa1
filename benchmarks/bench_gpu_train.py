"""Train a model with a stoker loader on a GPU: CUDA transfer, AMP bf16/fp16, torch.compile, nvJPEG.

Generates a synthetic DigiFace-like data set (112x112 PNGs in class folders), optionally
packs it into pixel shards, and (for the ``jpeg``/``nvjpeg`` cases) CelebA-like JPEGs
packed as encoded shards (crop ``(40, 20, 138, 138)``, 112x112 out), then trains the
model for a few epochs per case and records the last epoch's img/s and data-wait share
(the first epoch pays for worker start-up, cuDNN autotuning and compilation). A case is
``source:amp[+compile][+syncN][+procN][+unplaced]`` (``+syncN``: read the loss back every N
batches, ``Scenario.sync_every``; default: fit's own, 16 on CUDA; ``+procN``: N worker
processes instead of the data's own pick; ``+unplaced``: the readers run as the training
process does, ``make_loader(place_readers=False)``; otherwise ``place_readers=True``,
stoker's reader placement, :mod:`stoker.loading.reader_cpu`, the default on a GPU) with
source one of

* ``files``: the PNG class folders, worker processes;
* ``shards`` or ``pixels``: pixel shards, the loader settings they pick themselves;
* ``jpeg``: encoded JPEG shards decoded on the CPU (fast path, loader threads);
* ``nvjpeg``: the same shards decoded on the GPU (``decoder="nvjpeg"``: stoker.decode.device);
* ``autojpeg``: the same shards with ``decoder="auto"`` (GPU or CPU, as the first batch measured);
* ``synthetic``: random uint8 batches already on the device (the model's own ceiling).

``--suite issue13`` runs the issue's GPU measurement in one go: ResNet-50, AMP bf16,
channels_last, batch 256, pixels vs jpeg vs nvjpeg vs synthetic, plus the nvJPEG decode
rate against this machine's CPU full-decode limit. ``--suite fitsync`` compares reading the
loss back every batch (``+sync1``) with fit's default on a ResNet-18 at batch 128, where
a per-step wait for the GPU costs most, with data on the device and from pixel shards.
``--suite readers`` measures what the training process keeps when readers run: encoded
JPEG shards with stoker's own pick and with 14 worker processes, each with and without the
reader placement, against the synthetic ceiling (target: >= 0.9x).
Every case is a normal stoker run folder, so

    stoker compare OUT/runs --group-by category --metric img_per_s

draws them side by side. Results go to ``OUT/results.json`` and ``OUT/results.md``.

Usage (on a machine with a GPU)::

    python benchmarks/bench_gpu_train.py --out bench-gpu            # default cases
    python benchmarks/bench_gpu_train.py --cases files:bf16 shards:bf16+compile --n 20000
    python benchmarks/bench_gpu_train.py --suite issue13 --out $OUT/gpu   # a few minutes on one GPU
    python benchmarks/bench_gpu_train.py --suite fitsync --out $OUT/sync  # sync_every=1 vs the default

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
SOURCES = ("files", "shards", "pixels", "jpeg", "nvjpeg", "autojpeg", "synthetic")
JPEG_SOURCES = ("jpeg", "nvjpeg", "autojpeg")
SUITES: dict[str, dict[str, Any]] = {
    "issue13": {"model": "resnet50", "batch_size": 256, "cases": ["pixels:bf16", "jpeg:bf16", "nvjpeg:bf16", "synthetic:bf16"]},
    "issue37": {"model": "resnet50", "batch_size": 256,
                "cases": ["synthetic:bf16", "jpeg:bf16", "nvjpeg:bf16", "autojpeg:bf16"]},
    "readers": {"model": "resnet50", "batch_size": 256,
                "cases": ["synthetic:bf16", "jpeg:bf16", "jpeg:bf16+unplaced", "jpeg:bf16+proc14", "jpeg:bf16+proc14+unplaced"]},
    "fitsync": {"model": "resnet18", "batch_size": 128,
                "cases": ["synthetic:bf16+sync1", "synthetic:bf16", "pixels:bf16+sync1", "pixels:bf16"]},
}
CELEBA_CROP = (40, 20, 138, 138)


class SyntheticLoader:
    """Random uint8 batches made once on the device: what the model does with no loading at all."""

    def __init__(self, n: int, batch_size: int, classes: int, device: torch.device, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.batches = max(1, n // batch_size)
        self.images = torch.randint(0, 255, (batch_size, 3, 112, 112), dtype=torch.uint8, generator=generator).to(device)
        self.labels = torch.randint(0, classes, (batch_size,), generator=generator).to(device)

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Any:
        return iter([(self.images, self.labels)] * self.batches)


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


def prepare_data(root: Path, n: int, classes: int, workers: int) -> tuple[Path, Path]:
    """Class folders of 112x112 PNGs (made once, reused) and their pixel shards (made on demand)."""
    files = root / "digiface"
    if not (files / "0").is_dir():
        print(f"generating {n} images in {files} ...", flush=True)
        make_digiface(files, n=n, classes=classes, workers=workers, progress=True, overwrite=True)
    return files, root / "shards"


def jpeg_shards(root: Path, n: int, classes: int, workers: int) -> Path:
    """CelebA-like JPEGs (178x218) packed as encoded shards, cropped and read at 112x112 (made once)."""
    from stoker.packer import pack
    from stoker.sources.synthetic import make_celeba

    out = root / "jpeg-shards"
    if not (out / "manifest.json").is_file():
        files = root / "celeba"
        print(f"generating {n} JPEGs in {files} and packing them into {out} ...", flush=True)
        make_celeba(files, n=n, classes=classes, workers=workers, progress=False, overwrite=True)
        pack(files, out, store="encoded", size=(112, 112), crop=CELEBA_CROP, valid=0.1, workers=workers,
             progress=False, overwrite=True, label_order="sorted")
    return out


def open_case_data(source: str, files: Path, shards: Path, workers: int, device: torch.device | None = None,
                   jpegs: Path | None = None) -> tuple[Any, Any, Any]:
    """(train, valid, loader arguments that override the command line's) for a case's source."""
    if source == "files":
        train, valid = ClassFolderDataset(files).split(valid=0.1, seed=0)
        return train, valid, {"backend": "process"}
    from stoker.packer import pack
    from stoker.shards import ShardDataset

    if source in JPEG_SOURCES:
        if jpegs is None:
            raise SystemExit("jpeg cases need the JPEG shards")
        decoder = "nvjpeg" if source == "nvjpeg" else "auto"
        # jpeg: the CPU path (auto with no CUDA device to try); nvjpeg, autojpeg: the training device
        where = "cpu" if source == "jpeg" else str(device) if device is not None else "cuda"
        train = ShardDataset(jpegs, "train", decoder=decoder, decode_device=where)
        valid = ShardDataset(jpegs, "valid", decoder=decoder, decode_device=where)
        return train, valid, dict(train.loader_defaults)

    if not (shards / "manifest.json").is_file():
        print(f"packing {files} into pixel shards in {shards} ...", flush=True)
        pack(files, shards, store="pixels", valid=0.1, workers=workers, progress=True, overwrite=True)
    train = ShardDataset(shards, "train")
    return train, ShardDataset(shards, "valid"), dict(train.loader_defaults)  # what measured fastest for shards


def run_case(case: str, args: argparse.Namespace, device: torch.device, files: Path, shards: Path) -> dict[str, Any]:
    source, _, mode = case.partition(":")
    amp, *flags = mode.split("+")
    compile_ = "compile" in flags
    syncs = [int(f[4:]) for f in flags if f.startswith("sync") and f[4:].isdigit() and int(f[4:]) >= 1]
    procs = [int(f[4:]) for f in flags if f.startswith("proc") and f[4:].isdigit()]
    unplaced = "unplaced" in flags
    if (source not in SOURCES or amp not in ("off", "bf16", "fp16") or len(syncs) > 1 or len(procs) > 1
            or len(flags) != int(compile_) + len(syncs) + len(procs) + int(unplaced)):
        raise SystemExit(f"bad case {case!r}: expected {'|'.join(SOURCES)}:off|bf16|fp16[+compile][+syncN][+procN][+unplaced]")
    sync_every = syncs[0] if syncs else None
    train_loader: Any
    valid_loader: Any
    if source == "synthetic":
        train_loader = SyntheticLoader(args.n, args.batch_size, args.classes, device)
        valid_loader = SyntheticLoader(max(args.batch_size, args.n // 10), args.batch_size, args.classes, device, seed=1)
        num_classes = args.classes
    else:
        jpegs = jpeg_shards(args.out / "data", args.n, args.classes, args.workers) if source in JPEG_SOURCES else None
        train, valid, extras = open_case_data(source, files, shards, args.workers, device, jpegs)
        if procs:
            extras = {**extras, "num_workers": procs[0], "backend": "process"}
        common = {"batch_size": args.batch_size, "num_workers": args.workers, "device": device, "seed": 0, **extras,
                  "place_readers": not unplaced}
        train_loader = make_loader(train, shuffle=True, **common)
        valid_loader = make_loader(valid, shuffle=False, **common)
        num_classes = train.num_classes
    torch.manual_seed(0)
    model = build_model(args.model, num_classes).to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    name = case.replace(":", "-").replace("+", "-")
    scenario = Scenario(
        model, optimizer, nn.CrossEntropyLoss(), train_loader, valid_loader, epochs=args.epochs, device=device,
        amp=amp, compile=compile_, log_dir=args.out / "runs", name=f"{name}-{time.strftime('%H%M%S')}",
        tags={"category": source, "amp": amp, "compile": str(compile_).lower()}, progress=not args.quiet,
        preprocess=ChannelsLastPreprocess(), sync_every=sync_every,
    )
    start = time.perf_counter()
    history = fit(scenario)
    last = history.epochs[-1]
    batch = next(iter(valid_loader))[0]
    record = json.loads((history.run_dir / "run.json").read_text())  # type: ignore[operator]
    return {
        "case": case,
        "decode": record.get("decode"),
        "readers": f"{getattr(train_loader, 'num_workers', 0)} {getattr(train_loader, 'backend', '-')}",
        "reader_placement": record.get("reader_placement"),
        "model": args.model,
        "source": source,
        "amp": amp,
        "compile": compile_,
        "sync_every": record["sync_every"],
        "batches_on": str(batch.device),
        "img_per_s": last.img_per_s,
        "data_wait_share": last.data_wait_share,
        "epoch_time_s": last.time_s,
        "first_epoch_time_s": history.epochs[0].time_s,
        "valid_acc": last.valid_acc,
        "total_s": time.perf_counter() - start,
        "run_dir": str(history.run_dir),
    }


def measure_decode(jpegs: Path, device: torch.device, batch_size: int, seconds: float = 3.0) -> dict[str, Any]:
    """nvJPEG batch decode (+ crop + resize) img/s against the CPU full-decode limit (one core's rate x cores)."""
    import numpy as np

    from stoker.decode.image import decode_sample, resize
    from stoker.shards import ShardDataset

    full = ShardDataset(jpegs, "train", decoder="full")
    shards = full.shards
    shard_ids, rows = shards.locate(np.arange(min(512, len(full))))
    blobs = [shards.checked_bytes(int(s), int(r)) for s, r in zip(shard_ids, rows, strict=True)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds or done < 32:
            data, name, box = blobs[done % len(blobs)]
            resize(decode_sample(data, name, box), (112, 112))
            done += 1
        one_core = done / (time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    nv = ShardDataset(jpegs, "train", decoder="nvjpeg", decode_device=str(device))
    batch = np.arange(min(batch_size, len(nv)))
    nv.__getitems__(batch)  # warm-up: nvJPEG handles, CUDA context
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or done == 0:
        images = nv.__getitems__(batch).images
        done += len(batch)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    nv_rate = done / (time.perf_counter() - start)
    return {
        "cpu_decode_1core_img_per_s": one_core,
        "cores": cores,
        "cpu_decode_limit_img_per_s": one_core * cores,
        "nvjpeg_img_per_s": nv_rate,
        "nvjpeg_on": str(images.device),
        "nvjpeg_x_cpu_limit": nv_rate / (one_core * cores),
    }


def targets(results: list[dict[str, Any]], decode: dict[str, Any] | None) -> list[str]:
    """The issue's GPU targets, each marked met or not, from this run's numbers."""
    by_source = {r["source"]: r for r in results}
    lines = []
    synthetic = by_source.get("synthetic")
    pixels = by_source.get("pixels") or by_source.get("shards")
    if synthetic and pixels:
        share = pixels["img_per_s"] / synthetic["img_per_s"]
        ok = share >= 0.95 and pixels["data_wait_share"] < 0.02
        lines.append(f"- pixel shards: {share:.0%} of synthetic img/s, data wait {pixels['data_wait_share']:.1%} "
                     f"(target >= 95% and < 2%): {'met' if ok else 'NOT met'}")
    if decode:
        lines.append(f"- nvJPEG decode on {decode['nvjpeg_on']}: {decode['nvjpeg_img_per_s']:,.0f} img/s = "
                     f"{decode['nvjpeg_x_cpu_limit']:.1f}x the CPU full-decode limit "
                     f"({decode['cpu_decode_1core_img_per_s']:,.0f} img/s x {decode['cores']} cores) "
                     f"(target >= 5x): {'met' if decode['nvjpeg_x_cpu_limit'] >= 5 else 'NOT met'}")
    jpeg = [r for r in results if r["source"] == "jpeg"]
    if synthetic and jpeg:
        for r in jpeg:
            share = r["img_per_s"] / synthetic["img_per_s"]
            lines.append(f"- {r['case']} ({r['readers']}): {share:.2f}x synthetic img/s (target >= 0.9x): "
                         f"{'met' if share >= 0.9 else 'NOT met'}")
    return lines


def write_results(out: Path, meta: dict[str, Any], transfer: dict[str, Any] | None, results: list[dict[str, Any]],
                  decode: dict[str, Any] | None = None) -> None:
    (out / "results.json").write_text(
        json.dumps({"meta": meta, "transfer": transfer, "decode": decode, "results": results}, indent=2) + "\n")
    lines = [
        f"{meta['model']}, {meta['image_size']}x{meta['image_size']} images, batch {meta['batch_size']}, "
        f"{meta['workers']} workers, {meta['device_name']}; last of {meta['epochs']} epochs.",
        "",
        "| case | sync every | img/s | data wait | epoch (s) | first epoch (s) | valid acc | readers |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['case']} | {r['sync_every']} | {r['img_per_s']:.0f} | {r['data_wait_share']:.0%} | {r['epoch_time_s']:.1f} | "
            f"{r['first_epoch_time_s']:.1f} | {r['valid_acc']:.3f} | {r['readers']} |"
        )
    if transfer:
        lines += ["", f"Pinned uint8 batch ({transfer['batch_mb']:.1f} MB) to the GPU: "
                      f"{transfer['ms_per_batch']:.2f} ms, {transfer['gb_per_s']:.1f} GB/s."]
    found = targets(results, decode)
    if found:
        lines += ["", *found]
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
    parser.add_argument("--model", default="resnet18", help="small_cnn or a torchvision model name")
    parser.add_argument("--suite", choices=sorted(SUITES), help="a prepared set of cases, model and batch size")
    parser.add_argument("--no-decode", action="store_true", help="skip the nvJPEG vs CPU decode measurement")
    args = parser.parse_args()
    if args.suite:
        for key, value in SUITES[args.suite].items():
            setattr(args, key, value)

    if torch.cuda.is_available():
        device = torch.device("cuda")
        device_name = torch.cuda.get_device_name(device)
    elif args.allow_cpu:
        device, device_name = torch.device("cpu"), f"CPU ({os.cpu_count()} cores)"
    else:
        print("no CUDA device: nothing to measure (use --allow-cpu for a smoke test)", file=sys.stderr)
        raise SystemExit(2)
    args.out.mkdir(parents=True, exist_ok=True)
    needs_files = any(case.partition(":")[0] in ("files", "shards", "pixels") for case in args.cases)
    files, shards = prepare_data(args.out / "data", args.n, args.classes, args.workers) if needs_files else (
        args.out / "data" / "digiface", args.out / "data" / "shards")
    transfer = check_transfer(device, args.batch_size, 112) if device.type == "cuda" else None
    results = [run_case(case, args, device, files, shards) for case in args.cases]
    decode = None
    if not args.no_decode and any(case.partition(":")[0] in JPEG_SOURCES for case in args.cases):
        decode = measure_decode(jpeg_shards(args.out / "data", args.n, args.classes, args.workers), device,
                                args.batch_size, seconds=3.0 if device.type == "cuda" else 0.5)
    meta = {
        "model": args.model,
        "device_name": device_name,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "image_size": 112,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "epochs": args.epochs,
        "n": args.n,
    }
    write_results(args.out, meta, transfer, results, decode)


if __name__ == "__main__":
    main()
