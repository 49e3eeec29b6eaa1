"""A shard set read from an S3 API server with a cold and a warm cache, next to local disk.

Generates DigiFace-like images (class folders of 112x112 PNGs), packs them into
``pixels`` shards at ``--size``, starts moto's S3 server on 127.0.0.1 (a child process on
a free port), uploads the shard set to a bucket there, and reads one epoch of it, batch
256, in the training process (0 workers), in these ways:

* local disk: ``ShardStream`` over the local folder (in the page cache: just written);
* S3, cold cache: ``ShardStream`` over ``s3://...`` with an empty cache folder — every
  shard is downloaded, SHA-256-checked and memory-mapped; ``fetch_ahead`` shards are
  downloaded while one is read (also shown with ``fetch_ahead=0``: one request at a time);
* S3, warm cache: the same, again — nothing is downloaded;
* S3, cold cache, map-style: ``ShardDataset`` with a shuffled sampler (the first batch
  needs every shard, so they are fetched side by side).

For each: samples per second, MB per second of shard bytes, and the time to the first
batch (from opening the data set). Then ``--rounds`` interleaved rounds of: local stream,
cold stream (a fresh cache, opening included), the next epoch of that stream (warm, the
same object) and of a local one, and the same objects downloaded one after another
with the same client (``RemoteLocation.open(...).read()``, nothing else done); it
reports the median over rounds of warm / local (target >= 0.9) and of the serial
download's time / the cold stream's time (target >= 0.8), after a line per round with
both ratios and the wall and CPU milliseconds (this process, the server) of the serial
download and the cold stream. moto is a Python server sharing this machine's cores,
so the S3 numbers are a floor, not what a real object store gives. The caches go in a
folder of the run's own inside stoker's cache folder (``STOKER_CACHE``, else
``~/.cache/stoker``; ``--cache-dir`` picks another), since every cached shard creates a
few files and what that costs depends on the file system; the run prints what creating
one file there takes.

With ``--cpu-rounds N`` it measures only the client's CPU per GB (:func:`measure_cpu_per_gb`):
``N`` interleaved rounds of a cold ``ShardStream`` epoch (a fresh cache, opening included)
and a plain serial download of the same objects by the same client, the CPU-seconds of
this process (every thread, and any child it waited for) per GB of shard bytes, and the
medians of the CPU ratio (cold / serial, target <= 1.2) and of the rate ratio (serial's
time / cold's time, target >= 0.8). A third reading in each round, the same serial download
with each object's SHA-256 taken and its bytes written to a new file (:func:`serial_copy_s`),
is the least the verified cache must do per byte: its CPU ratio to the plain download is
the floor of the cold stream's.

With ``--plan`` it measures instead the machine's reading plan under a cache limit of a
quarter of the set (``--limit-share``): for 1 x 1 (one rank, read in its process), 2 x 1
(two ranks) and 2 x 2 (two ranks of two DataLoader worker processes) readers, ``--epochs``
epochs of a ``ShardStream`` read by forked rank processes sharing one cache folder; the
GETs of shard objects per shard per epoch (counted by the server's recorder), the wall
seconds, and the hit rates of the cache's eviction policy, Belady's optimal one and LRU
replayed over the same machine's plan (:mod:`stoker.shards.cache.simulate`; readers in
step, and a reader one read behind).

Run::

    python benchmarks/bench_remote.py --n 4000
    python benchmarks/bench_remote.py --quick
    python benchmarks/bench_remote.py --n 4000 --cpu-rounds 12
    python benchmarks/bench_remote.py --plan --n 4000 --shard-samples 125
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision")

from stoker.fs import where  # noqa: E402
from stoker.loading import make_loader  # noqa: E402
from stoker.packer import pack  # noqa: E402
from stoker.shards import ShardDataset, ShardStream  # noqa: E402
from stoker.shards.cache.folder import default_cache_dir  # noqa: E402
from stoker.sources.synthetic import make_digiface  # noqa: E402

BATCH = 256


@dataclass
class Row:
    """One way of reading, timed."""

    name: str
    samples: int
    seconds: float
    first_batch_s: float
    shard_bytes: int
    downloaded: int

    def cells(self) -> list[str]:
        return [
            self.name,
            f"{self.samples / self.seconds:,.0f}",
            f"{self.shard_bytes / self.seconds / 1e6:,.1f}",
            f"{self.first_batch_s * 1000:,.0f}",
            f"{self.downloaded / 1e6:,.1f}",
        ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    """moto's S3 server on 127.0.0.1, and the environment pointing s3fs at it."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise SystemExit("the moto server did not start; pip install 'moto[server]'") from None
            time.sleep(0.1)
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
    )
    return proc, f"http://127.0.0.1:{port}"


def packed_set(args: argparse.Namespace) -> tuple[Path, Path]:
    """The run's folder and the pixel shard set in it, generated and packed once (kept with ``--out``)."""
    work = args.out or Path(tempfile.mkdtemp(prefix="stoker-bench-remote-"))
    data, local = work / "data", work / "packed"
    if not data.exists():
        make_digiface(data, 1000 if args.quick else args.n, progress=False)
    if not (local / "manifest.json").exists():
        pack(data, local, store="pixels", size=(args.size, args.size), shard_samples=args.shard_samples, progress=False)
    return work, local


def serve(local: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """moto's server on this machine with ``local`` uploaded to it: ``(process, endpoint, url of the set)``."""
    proc, endpoint = start_server()
    try:
        where("s3://bench").fs.mkdir("bench")
        url = "s3://bench/packed"
        place = where(url)
        for path in sorted(local.iterdir()):
            place.upload(path, path.name)
    except BaseException:
        proc.terminate()
        proc.wait(timeout=10)
        raise
    return proc, endpoint, url


def time_epoch(name: str, make: Callable[[], ShardDataset | ShardStream], shuffle: bool) -> Row:
    """Open the data set, read one epoch at batch 256, report."""
    start = time.perf_counter()
    dataset = make()
    loader = make_loader(dataset, batch_size=BATCH, shuffle=shuffle, num_workers=0, device="cpu")
    first = None
    samples = 0
    for images, _labels in loader:
        if first is None:
            first = time.perf_counter() - start
        samples += len(images)
    seconds = time.perf_counter() - start
    shards = dataset.dataset.shards if isinstance(dataset, ShardStream) else dataset.shards
    downloaded = shards.cache.downloaded_bytes if shards.cache is not None else 0
    return Row(name, samples, seconds, first or seconds, shards.manifest.bytes, downloaded)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=4000, help="images")
    parser.add_argument("--size", type=int, default=64, help="stored image size (pixels shards)")
    parser.add_argument("--shard-samples", type=int, default=250)
    parser.add_argument("--out", type=Path, help="work folder (default: a temporary one)")
    parser.add_argument("--quick", action="store_true", help="1,000 images")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the two ratios")
    parser.add_argument("--cache-dir", type=Path,
                        help="the folder the caches go in (a folder of this run's own inside it, removed after; "
                             "default: stoker's cache folder)")
    parser.add_argument("--cpu-rounds", type=int, default=0,
                        help="measure only the client's CPU per GB, cold stream vs serial download, in this many "
                             "interleaved rounds (>= 10 for the medians)")
    parser.add_argument("--plan", action="store_true",
                        help="measure the machine's reading plan under a cache limit instead (see the module docs)")
    parser.add_argument("--epochs", type=int, default=2, help="--plan: epochs read")
    parser.add_argument("--limit-share", type=float, default=0.25, help="--plan: the cache limit, a share of the set")
    args = parser.parse_args()
    if args.cpu_rounds and args.plan:
        parser.error("--cpu-rounds and --plan are two separate measurements: give one")
    if args.cpu_rounds:
        cpu_per_gb_main(args)
        return
    if args.plan:
        measure_plan(args)
        return
    work, local = packed_set(args)
    # The caches go where stoker keeps its cache, in a folder of this run's own: what a reader's cache costs
    # depends on that file system (each cached shard creates a few files), so the run says what a file costs there.
    caches = (args.cache_dir or default_cache_dir()) / f"bench-remote-{os.getpid()}"
    proc, endpoint, url = serve(local)
    try:
        print(f"cache folder {caches}: creating a file there takes {create_ms(caches):.3f} ms", flush=True)

        def stream(root: str, cache: str, ahead: int = 2) -> Callable[[], ShardStream]:
            return lambda: ShardStream(root, cache_dir=caches / cache, shuffle_buffer=2048, fetch_ahead=ahead)

        time_epoch("warm-up (not shown)", stream(str(local), "unused"), shuffle=False)  # imports, first calls
        rows = [
            time_epoch("local disk, ShardStream", stream(str(local), "unused"), shuffle=False),
            time_epoch("S3, cold cache, ShardStream, fetch_ahead=0", stream(url, "serial", 0), shuffle=False),
            time_epoch("S3, cold cache, ShardStream, fetch_ahead=2", stream(url, "stream"), shuffle=False),
            time_epoch("S3, warm cache, ShardStream", stream(url, "stream"), shuffle=False),
            time_epoch("local disk, ShardDataset (shuffled)", lambda: ShardDataset(local), shuffle=True),
            time_epoch("S3, cold cache, ShardDataset (shuffled)",
                       lambda: ShardDataset(url, cache_dir=caches / "map"), shuffle=True),
            time_epoch("S3, warm cache, ShardDataset (shuffled)",
                       lambda: ShardDataset(url, cache_dir=caches / "map"), shuffle=True),
        ]
        ratios = measure_ratios(local, url, caches, args.rounds, proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(caches, ignore_errors=True)
    manifest = ShardDataset(local).manifest
    print(
        f"\n{manifest.samples:,} samples, {len(manifest.shards)} pixel shards of {args.size}x{args.size}, "
        f"{manifest.bytes / 1e6:,.1f} MB; S3 = moto server on {endpoint}; batch {BATCH}, 0 workers\n"
    )
    header = ["reading", "img/s", "MB/s", "first batch (ms)", "downloaded (MB)"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
    for row in rows:
        print("| " + " | ".join(row.cells()) + " |")
    warm, cold = ratios
    print(f"\nwarm S3 stream / local stream: {warm:.2f}x (median of {args.rounds} interleaved rounds; target >= 0.9)")
    print(f"cold S3 stream / serial download of the same objects: {cold:.2f}x (MB/s; target >= 0.8)")
    if args.out is None:
        shutil.rmtree(work, ignore_errors=True)


def client_cpu_s() -> float:
    """CPU seconds of this process so far, every thread (``time.process_time``), plus the children it waited for."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def serial_copy_s(url: str, names: list[str], folder: Path) -> float:
    """:func:`serial_download_s`, each object also hashed (SHA-256) and written to a new file in ``folder``: the cache's least work.

    Each object gets a file of its own, kept, as a cache keeps them: writing over one file
    again and again reuses its pages, and costs the kernel less than new files. The caller
    removes ``folder`` after the timing, as a cold stream's cache is removed after its.
    """
    place = where(url)
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for name in names:
        digest = hashlib.sha256()
        with place.open(name) as f, open(folder / name, "wb") as out:
            while chunk := f.read(4 << 20):
                digest.update(chunk)
                out.write(chunk)
    return time.perf_counter() - start


def measure_cpu_per_gb(local: Path, url: str, caches: Path, rounds: int, server: int) -> tuple[float, float, float]:
    """Medians over interleaved rounds of (client CPU of a cold stream / of a serial download, serial's time / cold's
    time, client CPU of a serial download hashed and written / of the plain one).

    Each round reads the same objects twice with the same client (fsspec/s3fs): a plain
    serial download (:func:`serial_download_s`) and a cold ``ShardStream`` epoch over a fresh
    cache (opening, download, SHA-256, memory-map, batches of 256, 0 workers), in turns
    (odd rounds the stream first), so that a change in the machine's load meets both. The
    client's CPU is :func:`client_cpu_s` (not wall time); the server's is printed beside
    it: moto is a Python server sharing the machine's cores.
    """
    names = [info.name for info in ShardDataset(local).manifest.shards]
    gb = ShardDataset(local).manifest.bytes / 1e9
    cpu_ratios, rate_ratios, floor_ratios = [], [], []
    print("round | serial: wall ms, client CPU s/GB, server CPU ms | cold stream: wall ms, client CPU s/GB, "
          "server CPU ms | serial + SHA-256 + write: client CPU s/GB | CPU cold/serial | rate cold/serial")

    def timed(run: Callable[[], float]) -> tuple[float, float, float]:
        client, served = client_cpu_s(), server_cpu_s(server)
        wall = run()
        return wall, client_cpu_s() - client, server_cpu_s(server) - served

    for k in range(rounds):
        cache = caches / f"cpu-round-{k}"

        def cold(cache: Path = cache) -> float:
            return time_epoch("cold", lambda: ShardStream(url, cache_dir=cache, shuffle_buffer=2048), shuffle=False).seconds

        def serial() -> float:
            return serial_download_s(url, names)

        def copied(copies: Path = caches / f"copy-round-{k}") -> float:
            return serial_copy_s(url, names, copies)

        if k % 2:
            c, s, f = timed(cold), timed(serial), timed(copied)
        else:
            s, f, c = timed(serial), timed(copied), timed(cold)
        cpu_ratios.append(c[1] / max(s[1], 1e-9))
        rate_ratios.append(s[0] / c[0])
        floor_ratios.append(f[1] / max(s[1], 1e-9))
        print(f"{k + 1} | {1e3 * s[0]:.0f}, {s[1] / gb:.2f}, {1e3 * s[2]:.0f} | {1e3 * c[0]:.0f}, {c[1] / gb:.2f}, "
              f"{1e3 * c[2]:.0f} | {f[1] / gb:.2f} | {cpu_ratios[-1]:.2f} | {rate_ratios[-1]:.2f}", flush=True)
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(caches / f"copy-round-{k}", ignore_errors=True)
    return statistics.median(cpu_ratios), statistics.median(rate_ratios), statistics.median(floor_ratios)


def cpu_per_gb_main(args: argparse.Namespace) -> None:
    """``--cpu-rounds``: pack, serve and upload as :func:`main` does, then only :func:`measure_cpu_per_gb`."""
    work, local = packed_set(args)
    caches = (args.cache_dir or default_cache_dir()) / f"bench-remote-{os.getpid()}"
    proc, endpoint, url = serve(local)
    try:
        manifest = ShardDataset(local).manifest
        print(f"{manifest.samples:,} samples, {len(manifest.shards)} pixel shards of {args.size}x{args.size}, "
              f"{manifest.bytes / 1e6:,.1f} MB; S3 = moto server on {endpoint} (on this machine's {os.cpu_count()} "
              "cores); batch 256, 0 workers\n", flush=True)
        time_epoch("warm-up (not shown)", lambda: ShardStream(str(local), shuffle_buffer=2048), shuffle=False)
        serial_download_s(url, [info.name for info in manifest.shards])  # the client's first calls
        cpu, rate, floor = measure_cpu_per_gb(local, url, caches, args.cpu_rounds, proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(caches, ignore_errors=True)
    print(f"\nclient CPU per GB, cold stream / serial download: {cpu:.2f}x (median of {args.cpu_rounds} interleaved "
          "rounds; target <= 1.2)")
    print(f"rate, cold stream / serial download: {rate:.2f}x (median; target >= 0.8)")
    print(f"client CPU per GB, serial download + SHA-256 + write / serial download: {floor:.2f}x (median: the least "
          "a verified cache does per byte)")
    if args.out is None:
        shutil.rmtree(work, ignore_errors=True)


def create_ms(folder: Path, files: int = 50) -> float:
    """Milliseconds to create (and close) one empty file in ``folder``: the median of ``files``."""
    probe = folder / "create-probe"
    probe.mkdir(parents=True, exist_ok=True)
    took = []
    for i in range(files):
        start = time.perf_counter()
        os.close(os.open(probe / f"{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        took.append(time.perf_counter() - start)
    shutil.rmtree(probe, ignore_errors=True)
    return 1000 * statistics.median(took)


def serial_download_s(url: str, names: list[str]) -> float:
    """Seconds to read every object whole, one after another, with the client the cache uses."""
    place = where(url)
    start = time.perf_counter()
    for name in names:
        with place.open(name) as f:
            while f.read(4 << 20):
                pass
    return time.perf_counter() - start


def pass_s(stream: ShardStream) -> float:
    """Seconds of one more epoch of an open stream (batch 256, 0 workers)."""
    stream.set_epoch(stream.epoch + 1)
    loader = make_loader(stream, batch_size=BATCH, shuffle=False, num_workers=0, device="cpu")
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def server_cpu_s(pid: int) -> float:
    """CPU seconds the server process has used so far (user + system), from /proc; 0 where there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def with_cpu(server: int, timed: Callable[[], float]) -> tuple[float, float, float]:
    """(wall seconds ``timed`` returns, this process's CPU seconds, the server's CPU seconds) over one call."""
    client, served = time.process_time(), server_cpu_s(server)
    wall = timed()
    return wall, time.process_time() - client, server_cpu_s(server) - served


def measure_ratios(local: Path, url: str, caches: Path, rounds: int, server: int) -> tuple[float, float]:
    """Median over interleaved rounds of (warm stream / local stream, cold stream / serial download).

    Warm and local: the next epoch of a stream already open (the issue's "second epoch,
    everything cached"). Cold: opening the stream over an empty cache and one epoch.
    Each round's ratios are printed, with the wall time and the CPU time of this process
    (the client) and of the server for the serial download and the cold stream: where
    the two CPU times add up to the wall time or more, the machine's cores, not the
    network, set the pace.
    """
    names = [info.name for info in ShardDataset(local).manifest.shards]
    warm_ratios, cold_ratios = [], []
    print("round | warm/local | cold/serial | serial ms: wall, client CPU, server CPU | cold ms: wall, client CPU, server CPU")
    for k in range(rounds):
        cache = caches / f"round-{k}"
        remote: list[ShardStream] = []

        def make_remote(remote: list[ShardStream] = remote, cache: Path = cache) -> ShardStream:
            remote.append(ShardStream(url, cache_dir=cache, shuffle_buffer=2048, shards_at_once=8))
            return remote[-1]

        serial = with_cpu(server, lambda: serial_download_s(url, names))
        cold = with_cpu(server, lambda: time_epoch("cold", make_remote, shuffle=False).seconds)
        local_stream = ShardStream(str(local), shuffle_buffer=2048, shards_at_once=8)
        pass_s(local_stream)  # its first pass maps the files
        local_s, warm_s = pass_s(local_stream), pass_s(remote[0])
        warm_ratios.append(local_s / warm_s)
        cold_ratios.append(serial[0] / cold[0])
        print(f"{k + 1} | {warm_ratios[-1]:.2f} | {cold_ratios[-1]:.2f} | "
              + ", ".join(f"{1e3 * t:.0f}" for t in serial) + " | " + ", ".join(f"{1e3 * t:.0f}" for t in cold), flush=True)
        shutil.rmtree(cache, ignore_errors=True)
    return statistics.median(warm_ratios), statistics.median(cold_ratios)


def _plan_rank(rank: int, ranks: int, workers: int, url: str, cache: str, limit: int, epochs: int) -> None:
    """One rank of ``measure_plan``: ``epochs`` epochs of the stream, read by ``workers`` DataLoader workers (0: itself)."""
    from torch.utils.data import DataLoader

    stream = ShardStream(url, cache_dir=cache, cache_limit=limit, rank=rank, world_size=ranks, read_rows=BATCH)
    context = "fork" if workers else None
    loader = DataLoader(stream, batch_size=BATCH, num_workers=workers, collate_fn=len, multiprocessing_context=context)
    for epoch in range(epochs):
        stream.set_epoch(epoch)
        for _ in loader:
            pass


def _recorded_gets(endpoint: str, prefix: str) -> int:
    """GETs of the shard objects under ``prefix`` that moto's recorder saw since it was reset."""
    import json
    import urllib.request
    from urllib.parse import urlparse

    request = urllib.request.Request(f"{endpoint}/moto-api/recorder/download-recording", method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        lines = answer.read().decode().splitlines()
    found = 0
    for line in lines:
        if line.strip():
            entry = json.loads(line)
            path = urlparse(entry["url"]).path
            found += entry["method"] == "GET" and path.startswith(f"/{prefix}/") and path.endswith(".arrow")
    return found


def _recorder(endpoint: str, action: str) -> None:
    import urllib.request

    with urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/recorder/{action}", method="POST"), timeout=30):
        pass


def measure_plan(args: argparse.Namespace) -> None:
    """GETs per shard per epoch and hit rates against the optimal, for 1 x 1, 2 x 1 and 2 x 2 readers under a limit."""
    import multiprocessing

    from stoker.shards.cache.entries import entry_cost
    from stoker.shards.cache.simulate import replay, trace_of

    work, local = packed_set(args)
    caches = (args.cache_dir or default_cache_dir()) / f"bench-plan-{os.getpid()}"
    n = 1000 if args.quick else args.n
    os.environ["MOTO_RECORDER_FILEPATH"] = str(work / "recording.jsonl")  # moto's recorder writes there
    os.environ.pop("LOCAL_WORLD_SIZE", None)  # every rank on this machine
    infos = ShardDataset(local).manifest.shards
    set_bytes = sum(entry_cost(i.bytes) for i in infos)
    limit = int(set_bytes * args.limit_share)
    proc, endpoint, url = serve(local)
    rows = []
    try:
        for ranks, workers in ((1, 0), (2, 0), (2, 2)):
            cache = caches / f"{ranks}x{workers}"
            _recorder(endpoint, "reset-recording")
            _recorder(endpoint, "start-recording")
            start = time.perf_counter()
            fork = multiprocessing.get_context("fork")
            procs = [fork.Process(target=_plan_rank, args=(r, ranks, workers, url, str(cache), limit, args.epochs))
                     for r in range(ranks)]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
            wall = time.perf_counter() - start
            _recorder(endpoint, "stop-recording")
            if any(p.exitcode for p in procs):
                raise SystemExit(f"{ranks} x {max(workers, 1)}: a rank failed (exit codes {[p.exitcode for p in procs]})")
            gets = _recorded_gets(endpoint, "bench/packed")
            stream = ShardStream(url, cache_dir=cache, cache_limit=limit, rank=0, world_size=ranks, read_rows=BATCH)
            plan, _, _ = stream.machine_plan(0, ranks, 0, max(workers, 1))
            sizes = {i.sha256: entry_cost(i.bytes) for i in infos}
            room = stream.dataset.shards.cache.shard_room or limit  # type: ignore[union-attr]
            rates = []
            for lags in ([0] * len(plan.uses), [BATCH * (r % 2) for r in range(len(plan.uses))]):
                trace = trace_of(plan.uses, lags)
                rates.append([replay(trace, plan.uses, sizes, room, p, plan.window).hit_rate  # type: ignore[arg-type]
                              for p in ("plan", "optimal", "lru")])
            rows.append((f"{ranks} x {max(workers, 1)}", gets / len(infos) / args.epochs, wall, plan.smallest_room(),
                         room // max(sizes.values()), rates))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(caches, ignore_errors=True)
        if args.out is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n{n:,} samples, {len(infos)} pixel shards of {args.size}x{args.size}, {set_bytes / 1e6:,.1f} MB in the "
          f"cache; limit {limit / 1e6:,.1f} MB ({args.limit_share:.0%}); {args.epochs} epochs; batch {BATCH}; "
          f"S3 = moto on {endpoint}\n")
    header = ["readers (ranks x workers)", "GETs / shard / epoch", "wall (s)", "shards the plan needs at once",
              "shards the limit holds", "hit rate in step: plan / optimal / LRU", "one read behind: plan / optimal / LRU"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
    for name, per, wall, need, holds, rates in rows:
        cells = [" / ".join(f"{r:.3f}" for r in rate) for rate in rates]
        print(f"| {name} | {per:.2f} | {wall:.1f} | {need} | {holds} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
