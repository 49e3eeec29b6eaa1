"""JPEG shards decoded on the GPU (stoker.decode.device) against the CPU path: read alone, CPU time, agreement.

The read-alone half of the GPU decode measurement; ``bench_gpu_train.py --suite issue37``
is the training half (ResNet-50, bf16, batch 256: CPU decode, the device path and
``decoder="auto"`` against the synthetic ceiling), and ``--table`` prints both as one
table with the targets. ``bash benchmarks/gpu_check.sh decode`` runs the three parts, each
under its own time limit (about 4 minutes on one H200); ``TINY=1`` runs them on the CPU
with a few images (a check that the script works, not a measurement).

Read-alone rows (no training; batches delivered where training would use them):

* ``cpu, W processes`` / ``cpu, threads (default)``: encoded shards, the CPU path
  (libjpeg-turbo at full scale), ``decoder="auto"`` kept off the GPU;
* ``device path, 1 loader thread``: ``decoder="nvjpeg"`` through the loader;
* ``device path alone, ENGINE``: :class:`~stoker.decode.device.DeviceDecoder` on bytes
  already in memory (decode, crop, resize; the library's own rate); nvImageCodec twice,
  decoding only each crop box (its default) and whole images (``roi=False``).

CPU time is the whole machine's busy CPU seconds (every process, ``psutil.cpu_times``)
per 1,000 images while a row runs. Agreement: the device path's first batch against the
CPU full path (mean and max absolute difference, grey levels).

Usage::

    python benchmarks/bench_gpu_decode.py --out $OUT/issue37 --n 8000            # read-alone rows
    python benchmarks/bench_gpu_train.py --suite issue37 --out $OUT/issue37 --n 8000 --epochs 2 --quiet
    python benchmarks/bench_gpu_decode.py --out $OUT/issue37 --table              # the table, the targets
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_gpu_train import jpeg_shards  # noqa: E402

from stoker import make_loader  # noqa: E402
from stoker.decode.device import DeviceDecoder, nvimagecodec_available  # noqa: E402
from stoker.shards import ShardDataset  # noqa: E402

SIZE = (112, 112)


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy so far (all cores, every process)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def timed(batches: Callable[[], Iterable[Any]], seconds: float, device: torch.device) -> dict[str, float]:
    """img/s and busy CPU s per 1,000 images over passes of ``batches()``, after one warm-up batch."""
    done, start, cpu0 = -1, 0.0, 0.0
    while True:
        passed = done
        for images, _ in batches():
            if done < 0:  # the first batch pays for start-up (workers, CUDA context, decoder handles)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                done, start, cpu0 = 0, time.perf_counter(), busy_cpu_s()
                continue
            done += len(images)
            if time.perf_counter() - start >= seconds:
                break
        if done > 0 and time.perf_counter() - start >= seconds:
            break
        if done == passed:
            raise SystemExit("a pass gave no batch: too few images for the batch size")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall, cpu = time.perf_counter() - start, busy_cpu_s() - cpu0
    return {"img_per_s": done / wall, "cpu_s_per_1000": 1000 * cpu / done, "images": done, "wall_s": wall}


def read_rows(root: Path, device: torch.device, workers: list[int], batch_size: int, seconds: float) -> list[dict]:
    rows: list[dict[str, Any]] = []

    def row(name: str, result: dict[str, float], **extra: Any) -> None:
        rows.append({"read": name, **result, **extra})
        print(f"{name:44s} {result['img_per_s']:10,.0f} img/s  {result['cpu_s_per_1000']:6.2f} CPU s/1000", flush=True)

    cpu_only = ShardDataset(root, "train", decoder="auto", decode_device="cpu")  # auto never tries the GPU here
    for w in workers:
        loader = make_loader(cpu_only, batch_size=batch_size, shuffle=True, num_workers=w, backend="process",
                             device=device, seed=0)
        row(f"cpu, {w} processes", timed(functools.partial(iter, loader), seconds, device), kind="cpu")
        loader.close()
    defaults = cpu_only.loader_defaults
    loader = make_loader(cpu_only, batch_size=batch_size, shuffle=True, device=device, seed=0, **defaults)
    row(f"cpu, {loader.num_workers} {loader.backend}s (default)", timed(lambda: loader, seconds, device),
        kind="cpu")
    loader.close()
    nv = ShardDataset(root, "train", decoder="nvjpeg", decode_device=str(device))
    loader = make_loader(nv, batch_size=batch_size, shuffle=True, device=device, seed=0, **nv.loader_defaults)
    row(f"device path, {loader.num_workers} loader thread", timed(lambda: loader, seconds, device),
        kind="device", on=str(device))
    loader.close()

    # The library alone: bytes in memory, one DeviceDecoder call per batch.
    batches = memory_batches(cpu_only, batch_size)
    engines = [("torchvision", False)] + ([("nvimagecodec", True), ("nvimagecodec", False)]
                                          if nvimagecodec_available() else [])
    for engine, roi in engines:
        decoder = DeviceDecoder(device, engine=engine, roi=roi)  # type: ignore[arg-type]
        name = f"device path alone, {engine}" + (", whole images" if engine == "nvimagecodec" and not roi else "")
        if decoder.engine != engine:
            print(f"{name}: {engine} did not start on {device} (left out)", flush=True)
            continue
        row(name, timed(decoding(decoder, batches), seconds, device), kind="device alone", engine=decoder.engine,
            roi=roi)
    return rows


def memory_batches(data: ShardDataset, batch_size: int) -> list[list[tuple[Any, ...]]]:
    """Up to 4 batches of ``(bytes, name, box)`` rows read into memory once (CRC-checked)."""
    shards = data.shards
    ids, positions = shards.locate(np.arange(min(len(data), 4 * batch_size)))
    rows_read = [shards.checked_bytes(int(s), int(r)) for s, r in zip(ids, positions, strict=True)]
    return [rows_read[i : i + batch_size] for i in range(0, len(rows_read) - batch_size + 1, batch_size)]


def decoding(decoder: DeviceDecoder, batches: list[list[tuple[Any, ...]]]) -> Callable[[], Iterable[Any]]:
    """A pass over ``batches`` decoded by ``decoder``, for :func:`timed` (nothing falls back: blank rows)."""

    def decode_all() -> Iterable[Any]:
        for batch in batches:
            blobs, _, boxes = zip(*batch, strict=True)
            out = decoder.decode(list(blobs), list(boxes), SIZE, lambda k: torch.zeros((3, *SIZE), dtype=torch.uint8))
            if out.ready is not None:
                out.ready.wait()
            yield out.images, None

    return decode_all


def region_rounds(root: Path, device: torch.device, batch_size: int, rounds: int, seconds: float) -> dict[str, Any]:
    """nvImageCodec decoding only each crop box against whole images, interleaved by round, on ``device``.

    On the CPU this is its libjpeg-turbo backend: what the region decode saves of the decode
    work, the same pixels (tests/test_decode_device.py). Each round times both in alternating
    order, the whole path (decode, crop, resize) and the decode call alone; a ratio is the
    median of the rounds' ratios.
    """
    batches = memory_batches(ShardDataset(root, "train", decoder="full"), batch_size)
    decoders = {roi: DeviceDecoder(device, engine="nvimagecodec", roi=roi) for roi in (True, False)}
    if decoders[True].engine != "nvimagecodec":
        raise SystemExit(f"nvImageCodec did not start on {device} (pip install nvidia-nvimgcodec-cu13; 0.9+ on a CPU)")
    rates: dict[bool, list[float]] = {True: [], False: []}
    alone: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for roi in (True, False) if r % 2 == 0 else (False, True):
            rates[roi].append(timed(decoding(decoders[roi], batches), seconds, device)["img_per_s"])
            alone[roi].append(timed(decode_calls(decoders[roi], batches), seconds, device)["img_per_s"])
        print(f"round {r + 1}: by region {rates[True][-1]:,.0f} img/s (decode call {alone[True][-1]:,.0f}), "
              f"whole images {rates[False][-1]:,.0f} img/s (decode call {alone[False][-1]:,.0f})", flush=True)

    def median_ratio(a: list[float], b: list[float]) -> float:
        return float(np.median([x / y for x, y in zip(a, b, strict=True)]))

    return {"device": str(device), "rounds": rounds, "batch_size": batch_size, "by_region": rates[True],
            "whole": rates[False], "median_ratio": median_ratio(rates[True], rates[False]),
            "decode_call_by_region": alone[True], "decode_call_whole": alone[False],
            "decode_call_median_ratio": median_ratio(alone[True], alone[False]), "date": time.strftime("%Y-%m-%d")}


def decode_calls(decoder: DeviceDecoder, batches: list[list[tuple[Any, ...]]]) -> Callable[[], Iterable[Any]]:
    """A pass over ``batches`` through the engine's decode call alone (no crop, no resize), for :func:`timed`."""

    calls = [([torch.from_numpy(np.array(row[0])) for row in batch], [row[2] for row in batch]) for batch in batches]

    def decode_all() -> Iterable[Any]:
        for tensors, boxes in calls:
            part = decoder._decode_part(tensors, boxes)
            if decoder.stream is not None:
                decoder.stream.synchronize()
            yield part.images, None

    return decode_all


def agreement(root: Path, device: torch.device, batch_size: int) -> dict[str, float]:
    """The device path's first batch against the CPU full path: mean and max absolute difference (grey levels)."""
    full_set = ShardDataset(root, "train", decoder="full")
    idx = np.arange(min(batch_size, len(full_set)))
    ids, positions = full_set.shards.locate(idx)
    blobs, _, boxes = zip(*(full_set.shards.checked_bytes(int(s), int(r)) for s, r in zip(ids, positions, strict=True)),
                          strict=True)
    full = full_set.__getitems__(idx).images
    decoder = DeviceDecoder(device)  # what decoder="nvjpeg" uses: nvImageCodec by region where it starts on CUDA
    decoded = decoder.decode(list(blobs), list(boxes), SIZE, lambda k: full[k])
    if decoded.ready is not None:
        decoded.ready.wait()
    diff = (decoded.images.cpu().int() - full.int()).abs()
    return {"engine": decoder.engine, "by_region": decoded.by_region, "on_cpu": decoded.on_cpu,
            "mean_abs_diff": float(diff.float().mean()), "max_abs_diff": int(diff.max()), "images": len(idx),
            "worst_image_mean_abs_diff": float(diff.float().mean(dim=(1, 2, 3)).max())}


def table(out: Path) -> str:
    """The issue's table for the device path, from ``read.json`` and ``results.json`` in ``out``, with the targets."""
    read = json.loads((out / "read.json").read_text())
    train = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else {"results": []}
    lines = [f"JPEG shards on {read['device_name']} ({read['cores']} cores), {read['n']} images at 112x112, "
             f"batch {read['batch_size']}, {read['date']}", "", "| read | img/s | busy CPU s per 1,000 images |",
             "|---|---:|---:|"]
    if read["device_name"] == "CPU":
        lines[0] += " (--tiny on a CPU: a check that the script runs, not a measurement; the targets are for a GPU)"
    for r in read["rows"]:
        lines.append(f"| {r['read']}, no training | {r['img_per_s']:,.0f} | {r['cpu_s_per_1000']:.2f} |")
    by_source = {r["source"]: r for r in train["results"]}
    for source, name in (("synthetic", "synthetic ceiling"), ("jpeg", "CPU decode (loader defaults)"),
                         ("nvjpeg", "device path"), ("autojpeg", "decoder='auto'")):
        if source in by_source:
            r = by_source[source]
            lines.append(f"| {train['meta']['model']} {r['amp']} loop, {name} | {r['img_per_s']:,.0f} | |")
    if (out / "region.json").is_file():
        region = json.loads((out / "region.json").read_text())
        lines.append(f"| nvImageCodec by crop box / whole images, on {region['device']}, no training | "
                     f"{region['median_ratio']:.2f}x (decode call alone: {region['decode_call_median_ratio']:.2f}x; "
                     f"medians of {region['rounds']} rounds) | |")
    a = read["agreement"]
    lines += ["", f"Device path ({a.get('engine', '?')}, {a.get('by_region', 0)} decoded by region, "
                  f"{a.get('on_cpu', 0)} on the CPU) vs CPU full path, {a['images']} images: "
                  f"mean |diff| {a['mean_abs_diff']:.2f}, "
                  f"worst image {a['worst_image_mean_abs_diff']:.2f}, max {a['max_abs_diff']} grey levels."]
    cpu_rows = [r for r in read["rows"] if r["kind"] == "cpu"]
    device_rows = [r for r in read["rows"] if r["kind"] == "device"]
    if cpu_rows and device_rows:
        best_cpu = max(cpu_rows, key=lambda r: r["img_per_s"])
        dev = device_rows[0]
        ratio, cpu_ratio = dev["img_per_s"] / best_cpu["img_per_s"], dev["cpu_s_per_1000"] / best_cpu["cpu_s_per_1000"]
        lines += ["", f"- read alone: device path {ratio:.2f}x the best CPU row ({best_cpu['read']}) "
                      f"(target >= 2x): {'met' if ratio >= 2 else 'NOT met'}",
                  f"- CPU time per 1,000 images: {cpu_ratio:.2f}x the best CPU row's (target <= 0.2x): "
                  f"{'met' if cpu_ratio <= 0.2 else 'NOT met'}"]
    if "synthetic" in by_source and "nvjpeg" in by_source:
        share = by_source["nvjpeg"]["img_per_s"] / by_source["synthetic"]["img_per_s"]
        lines.append(f"- training loop: device path {share:.2f}x the synthetic ceiling (target >= 0.9x): "
                     f"{'met' if share >= 0.9 else 'NOT met'}")
    if "autojpeg" in by_source:
        record = json.loads((Path(by_source["autojpeg"]["run_dir"]) / "run.json").read_text())
        lines.append(f"- decoder='auto' chose: {record.get('decode', {}).get('reason', 'nothing (no CUDA device)')}"
                     f" -> {record.get('decode', {}).get('decoder', 'cpu')}")
    text = "\n".join(lines) + "\n"
    (out / "table.md").write_text(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-gpu-decode"))
    parser.add_argument("--n", type=int, default=8000, help="CelebA-like JPEGs to generate (made once in OUT/data)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", default="0,8,14", help="worker processes of the CPU rows (capped by the cores)")
    parser.add_argument("--seconds", type=float, default=4.0, help="timed seconds per row (after a warm-up batch)")
    parser.add_argument("--tiny", action="store_true", help="on the CPU, a few images: checks the script runs")
    parser.add_argument("--table", action="store_true", help="print the table from OUT's read.json and results.json")
    parser.add_argument("--region", type=int, default=0, metavar="ROUNDS",
                        help="only nvImageCodec by crop box against whole images, ROUNDS interleaved rounds, on CUDA "
                             "or else the CPU (its libjpeg-turbo backend); writes OUT/region.json")
    args = parser.parse_args()
    if args.table:
        print(table(args.out))
        return
    if args.region:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        args.out.mkdir(parents=True, exist_ok=True)
        root = jpeg_shards(args.out / "data", args.n, 100 if not args.tiny else 4, os.cpu_count() or 1)
        region = region_rounds(root, device, args.batch_size, args.region, args.seconds)
        (args.out / "region.json").write_text(json.dumps(region, indent=2) + "\n")
        print(f"by region / whole images on {device}: {region['median_ratio']:.2f}x decode, crop and resize, "
              f"{region['decode_call_median_ratio']:.2f}x the decode call alone (medians of {args.region} "
              "interleaved rounds)")
        return
    if torch.cuda.is_available():
        device = torch.device("cuda")
        device_name = torch.cuda.get_device_name(device)
    elif args.tiny:
        device, device_name = torch.device("cpu"), "CPU"
    else:
        print("no CUDA device: nothing to measure (use --tiny for a check on the CPU)", file=sys.stderr)
        raise SystemExit(2)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = sorted({min(int(w), cores) for w in args.workers.split(",")})
    args.out.mkdir(parents=True, exist_ok=True)
    root = jpeg_shards(args.out / "data", args.n, 100 if not args.tiny else 4, min(cores, 12))
    rows = read_rows(root, device, workers, args.batch_size, args.seconds)
    result = {"device_name": device_name, "cores": cores, "n": args.n, "batch_size": args.batch_size,
              "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "rows": rows,
              "nvimagecodec": nvimagecodec_available(), "agreement": agreement(root, device, args.batch_size)}
    (args.out / "read.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["agreement"]))


if __name__ == "__main__":
    main()
