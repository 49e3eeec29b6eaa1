"""Run every untrusted-input and fault case against this stoker; print the table of ``docs/reliability.md``.

Each case makes its own data in a temporary folder and runs in a fresh process with a
timeout, so a crash or a hang is an outcome in the table, not the end of the run.

Run::

    python benchmarks/reliability_table.py                       # runs a 300-case PNG fuzz too
    python benchmarks/reliability_table.py --fuzz-json fuzz.json  # counts from benchmarks/fuzz_decode.py
"""

from __future__ import annotations

import argparse
import errno
import io
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

CASES: dict[str, tuple[str, Callable[[Path], str]]] = {}


def case(name: str, tried: str) -> Callable[[Callable[[Path], str]], Callable[[Path], str]]:
    def register(fn: Callable[[Path], str]) -> Callable[[Path], str]:
        CASES[name] = (tried, fn)
        return fn

    return register


def _png(path: Path, seed: int = 0) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (8, 6, 3), dtype=np.uint8)).save(path)
    return path


def _error(fn: Callable[[], object]) -> str:
    """What calling ``fn`` gives: the stoker error class and the start of its message, or 'no error'."""
    from stoker.errors import StokerError

    try:
        fn()
    except StokerError as exc:
        return f"{type(exc).__name__}: {str(exc)[:90]}"
    return "no error"


@case("label file naming ../secret.png, /etc/passwd, a symlink out", "3")
def _escape(tmp: Path) -> str:
    from stoker.sources import LabelFileDataset

    _png(tmp / "secret.png")
    _png(tmp / "img" / "a.png")
    (tmp / "img" / "b.png").symlink_to(tmp / "secret.png")
    out = []
    for name in ("../secret.png", "/etc/passwd", "b.png"):
        (tmp / "labels.txt").write_text(f"a.png 0\n{name} 1\n")
        out.append(_error(lambda: LabelFileDataset(tmp / "img", tmp / "labels.txt")).split(":")[0])
    return ", ".join(out) + " (naming labels.txt:2)"


@case("FIFO named .jpg (class folders, label file); symlink to /dev/zero", "3")
def _fifo(tmp: Path) -> str:
    from stoker.sources import ClassFolderDataset, LabelFileDataset

    _png(tmp / "cls" / "0" / "a.png")
    os.mkfifo(tmp / "cls" / "0" / "b.jpg")
    first = _error(lambda: ClassFolderDataset(tmp / "cls")).split(":")[0]
    (tmp / "labels.txt").write_text("a.png 0\nb.jpg 1\n")
    second = _error(lambda: LabelFileDataset(tmp / "cls" / "0", tmp / "labels.txt")).split(":")[0]
    (tmp / "cls" / "0" / "b.jpg").unlink()
    (tmp / "cls" / "0" / "z.png").symlink_to("/dev/zero")
    third = _error(lambda: ClassFolderDataset(tmp / "cls")).split(":")[0]
    return f"{first}, {second}, {third}: not a regular file / outside the folder (no hang)"


@case("FIFO in place of a shard, `verify`", "1")
def _fifo_shard(tmp: Path) -> str:
    from stoker.packer import pack
    from stoker.shards import verify

    for i in range(4):
        _png(tmp / "cls" / str(i % 2) / f"{i}.png", seed=i)
    manifest = pack(tmp / "cls", tmp / "set", workers=0, progress=False)
    (tmp / "set" / manifest.shards[0].name).unlink()
    os.mkfifo(tmp / "set" / manifest.shards[0].name)
    report = verify(tmp / "set", workers=0)
    return f"fault reported: {report.faults[0]} (no hang)"


@case("PNG / JPEG declaring 60000x60000; 200-megapixel TIFF", "3")
def _bombs(tmp: Path) -> str:
    from PIL import Image

    from stoker.decode.image import decode_image

    small = io.BytesIO()
    Image.new("RGB", (8, 8)).save(small, "PNG")
    png = small.getvalue()
    body = struct.pack(">II", 60000, 60000) + png[24:29]
    bomb = png[:16] + body + struct.pack(">I", zlib.crc32(b"IHDR" + body)) + png[33:]
    jpeg = io.BytesIO()
    Image.new("RGB", (8, 8)).save(jpeg, "JPEG")
    data = bytearray(jpeg.getvalue())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", 60000, 60000)
    tiff = io.BytesIO()
    Image.new("L", (20000, 10000)).save(tiff, "TIFF", compression="tiff_deflate")
    outs = [_error(lambda d=d: decode_image(d, "x")).split(":")[0] for d in (bomb, bytes(data), tiff.getvalue())]
    return ", ".join(outs) + " (refused before decoding; limit set_max_pixels / STOKER_MAX_PIXELS)"


@case("animated GIF", "1")
def _gif(tmp: Path) -> str:
    from PIL import Image

    from stoker.decode.image import decode_image

    frames = [Image.new("RGB", (12, 10), (40 * i, 0, 0)) for i in range(3)]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:])
    return f"first frame, shape {tuple(decode_image(out.getvalue(), 'a.gif').shape)}"


@case("labels 10**7, 10**12, 10**20, -3, 1_0, +3, 3.0", "7")
def _labels(tmp: Path) -> str:
    from stoker.sources import LabelFileDataset

    _png(tmp / "img" / "a.png")
    outs = []
    for label in ("10000000", str(10**12), str(10**20), "-3", "1_0", "+3", "3.0"):
        (tmp / "labels.txt").write_text(f"a.png {label}\n")
        outs.append(_error(lambda: LabelFileDataset(tmp / "img", tmp / "labels.txt")).split(":")[0])
    return f"{', '.join(sorted(set(outs)))} x{len(outs)} (naming the line)"


@case("UTF-8 BOM in a label file, ids CSV, ids JSON", "3")
def _bom(tmp: Path) -> str:
    from stoker.sources import IdDataset, LabelFileDataset

    _png(tmp / "data" / "a.png")
    (tmp / "labels.txt").write_bytes(b"\xef\xbb\xbfa.png 0\n")
    (tmp / "ids.csv").write_bytes(b"\xef\xbb\xbfid,label,split\na,0,train\n")
    (tmp / "ids.json").write_bytes(b"\xef\xbb\xbf" + json.dumps({"partition": {"train": ["a"]}, "labels": {"a": 0}}).encode())
    n = len(LabelFileDataset(tmp / "data", tmp / "labels.txt")) + len(IdDataset.from_csv(tmp / "ids.csv"))
    return f"loaded ({n + len(IdDataset.from_json(tmp / 'ids.json'))} of 3)"


@case("ids: latin-1 CSV, nested JSON, an int for a list, a list for a label, 100k-deep JSON", "5")
def _ids(tmp: Path) -> str:
    from stoker.sources import IdDataset

    _png(tmp / "data" / "a.png")
    bodies = [
        ("ids.csv", "id,label,split\n\xe9,0,train\n".encode("latin-1")),
        ("ids.json", json.dumps({"partition": {"train": [["a"]]}, "labels": {"a": 0}}).encode()),
        ("ids.json", json.dumps({"partition": {"train": 5}, "labels": {"a": 0}}).encode()),
        ("ids.json", json.dumps({"partition": {"train": ["a"]}, "labels": {"a": [0]}}).encode()),
        ("ids.json", b"[" * 100_000 + b"]" * 100_000),
    ]
    outs = []
    for name, body in bodies:
        (tmp / name).write_bytes(body)
        load = IdDataset.from_csv if name.endswith(".csv") else IdDataset.from_json
        outs.append(_error(lambda load=load, name=name: load(tmp / name)).split(":")[0])
    return f"{', '.join(sorted(set(outs)))} x{len(outs)}"


@case("file name that is not UTF-8", "1")
def _utf8(tmp: Path) -> str:
    from stoker.sources import ClassFolderDataset

    _png(tmp / "cls" / "0" / "a.png")
    with open(os.fsencode(tmp / "cls" / "0") + b"/b\xff.png", "wb") as f:
        f.write((tmp / "cls" / "0" / "a.png").read_bytes())
    return _error(lambda: ClassFolderDataset(tmp / "cls"))[:90]


def _three_shards(tmp: Path) -> Path:
    from stoker.packer import pack

    for i in range(18):
        _png(tmp / "cls" / str(i % 3) / f"{i:02d}.png", seed=i)
    pack(tmp / "cls", tmp / "set", shard_samples=6, workers=0, progress=False)
    return tmp / "set"


@case("in-place re-pack (`pack S S --overwrite`) interrupted after 2 shards", "1")
def _repack(tmp: Path) -> str:
    from stoker.packer import pack
    from stoker.shards import verify
    from stoker.shards.pack.writer import ShardWriter

    root = _three_shards(tmp)
    original, calls = ShardWriter.close, [0]

    def close(self: ShardWriter) -> object:
        calls[0] += 1
        if calls[0] > 2:
            raise KeyboardInterrupt
        return original(self)

    ShardWriter.close = close  # type: ignore[method-assign]
    try:
        pack(root, root, store="pixels", overwrite=True, shard_samples=6, workers=0, progress=False)
    except KeyboardInterrupt:
        pass
    ShardWriter.close = original  # type: ignore[method-assign]
    intact = verify(root, workers=0).ok
    pack(root, root, store="pixels", overwrite=True, shard_samples=6, workers=0, progress=False)
    return f"old set intact: {intact}; re-run resumed and swapped: {verify(root, workers=0).ok}"


@case("reader open while its set is re-packed", "1")
def _reader(tmp: Path) -> str:
    from stoker.packer import pack
    from stoker.shards.read.reader import ShardSet

    root = _three_shards(tmp)
    reader = ShardSet(root, "train")
    reader.read_labels(np.arange(2))
    pack(root, root, overwrite=True, seed=1, shard_samples=6, workers=0, progress=False)
    return _error(lambda: reader.read_labels(np.asarray([len(reader) - 1])))[:80]


@case("two packs into one folder at once", "1")
def _lock(tmp: Path) -> str:
    from stoker.packer import pack
    from stoker.shards.pack.replace import pack_lock

    root = _three_shards(tmp)
    with pack_lock(root):
        return _error(lambda: pack(tmp / "cls", root, overwrite=True, workers=0, progress=False))[:80]


@case("full disk while packing (ENOSPC) and checkpointing", "2")
def _disk(tmp: Path) -> str:
    import torch

    from stoker.packer import pack
    from stoker.shards.pack.writer import ShardWriter
    from stoker.train.engine import checkpoint

    for i in range(4):
        _png(tmp / "cls" / str(i % 2) / f"{i}.png", seed=i)

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    ShardWriter.write = full  # type: ignore[method-assign]
    first = _error(lambda: pack(tmp / "cls", tmp / "out", workers=0, progress=False)).split(":")[0]
    usage = checkpoint.shutil.disk_usage(tmp)
    checkpoint.shutil.disk_usage = lambda _: usage._replace(free=10)  # type: ignore[assignment]
    second = _error(lambda: checkpoint.save_checkpoint({"w": torch.zeros(1000)}, tmp / "last.pt")).split(":")[0]
    return f"{first}, {second}: 'the disk is full: ... needs about N MiB, M MiB are free'"


@case("config lr=nan, device cuda:99, image_size 10**9", "3")
def _config(tmp: Path) -> str:
    from stoker.train.runner.config import parse_config

    base = {"data": {"path": "d"}, "model": {"name": "small_cnn"}, "optim": {}, "run": {}}
    outs = []
    for table, key, value in (("optim", "lr", float("nan")), ("run", "device", "cuda:99"), ("data", "image_size", 10**9)):
        raw = json.loads(json.dumps(base))
        raw[table][key] = value
        outs.append(_error(lambda raw=raw: parse_config(raw)).split(":")[0])
    return f"{', '.join(sorted(set(outs)))} x{len(outs)}"


@case("kill -9 of `stoker pack` (2 workers)", "1")
def _kill(tmp: Path) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (256, 256, 3), dtype=np.uint8)).save(buffer, "PNG")
    for i in range(3000):
        folder = tmp / "cls" / str(i % 2)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:05d}.png").write_bytes(buffer.getvalue())
    proc = subprocess.Popen(
        [sys.executable, "-c", "from stoker.cli.main import main; main()", "pack", str(tmp / "cls"), str(tmp / "out"),
         "--store", "pixels", "--size", "32x32", "--shard-samples", "50", "--workers", "2", "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )

    def children() -> list[int]:
        kids = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == proc.pid and fields[0] != "Z":
                kids.append(int(entry))
        return kids

    while len(children()) < 2 and proc.poll() is None:
        time.sleep(0.005)
    workers = children()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    for _ in range(2000):
        alive = [w for w in workers if Path(f"/proc/{w}").exists() and "Z" not in Path(f"/proc/{w}/stat").read_text().split()[2]]
        if not alive:
            return f"{len(workers)} workers, all gone after the kill"
        time.sleep(0.01)
    for w in alive:
        os.kill(w, signal.SIGKILL)
    return f"ORPHANED: {len(alive)} of {len(workers)} workers"


def _run_one(name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        print(CASES[name][1](Path(tmp)).replace(tmp, "<tmp>"))


def _fuzz_row(fuzz_json: str | None) -> str:
    if fuzz_json:
        counts = json.loads(Path(fuzz_json).read_text())
        stoker, base = counts["stoker"], counts["torchvision"]
        source = f"counts from `benchmarks/fuzz_decode.py` in `{fuzz_json}`"
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))  # fuzz tooling
        from fuzzing.png import run_guarded

        stoker = [[k, o, n] for (k, o), n in run_guarded("png", range(300)).items()]
        base = []
        source = "300 cases run here"
    total = sum(n for _, _, n in stoker)
    by = {o: sum(n for _, oo, n in stoker if oo == o) for o in ("decoded", "DecodeError", "other error", "crash")}
    crashed = sum(n for _, o, n in base if o == "crash")
    before = f"; torchvision alone crashed on {crashed} of {sum(n for _, _, n in base)}" if base else ""
    return (
        f"| crafted PNG, valid CRCs, broken data (11 mutations) | {total:,} | {by['crash']} crashes, "
        f"{by['other error']} other errors, {by['DecodeError']:,} DecodeError, {by['decoded']:,} decoded{before}; {source} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--fuzz-json", help="counts written by benchmarks/fuzz_decode.py --json")
    parser.add_argument("--timeout", type=float, default=180, help="seconds per case before it counts as a hang")
    args = parser.parse_args()
    if args.one:
        _run_one(args.one)
        return 0
    print("| input or fault | tried | outcome |")
    print("|---|---|---|")
    print(_fuzz_row(args.fuzz_json))
    failed = 0
    for name, (tried, _) in CASES.items():
        try:
            done = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True, timeout=args.timeout)
            outcome = done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else (
                f"FAILED (rc {done.returncode}): {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}")
        except subprocess.TimeoutExpired:
            outcome = f"HANG (over {args.timeout:.0f} s)"
        failed += outcome.startswith(("FAILED", "HANG", "ORPHANED"))
        print(f"| {name} | {tried} | {outcome.replace('|', '/')} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
