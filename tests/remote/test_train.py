"""``stoker train --data s3://...``: one epoch from a shard set in a bucket, through the verified cache."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from stoker import pack
from stoker.cli.train import train
from stoker.shards.cache.store import ShardCache
from stoker.shards.format.manifest import Manifest


def test_train_one_epoch_from_a_bucket(
    s3_server: str, bucket: str, small_folders: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{bucket}/packed"
    pack(small_folders, url, store="pixels", size=(16, 16), valid=0.25, shard_samples=8, workers=0, progress=False,
         cache_dir=tmp_path / "pack-cache")
    monkeypatch.setenv("STOKER_CACHE", str(tmp_path / "cache"))
    result = CliRunner().invoke(train, [
        "--data", url, "--model", "small_cnn", "--epochs", "1", "--batch-size", "8", "--workers", "0",
        "--no-progress", "--set", f"run.log_dir={tmp_path / 'runs'}", "--set", "run.device=cpu",
    ])
    assert result.exit_code == 0, result.output
    manifest = Manifest.load(url)
    cache = ShardCache(tmp_path / "cache")
    assert all(cache.has(info) for info in manifest.shards)  # every shard came through the verified cache
    assert not (tmp_path / "s3:").exists() and not Path("s3:").exists()


def test_every_message_of_a_run_whose_folder_is_at_a_url_names_the_url(
    s3_server: str, bucket: str, small_folders: Path, tmp_path: Path
) -> None:
    """Ctrl-C in `stoker train --log-dir s3://...`: its lines name the URL, never this machine's copy in the cache."""
    import s3fs

    runs, cache = f"{bucket}/runs", tmp_path / "cache"
    env = {**os.environ, "STOKER_CACHE": str(cache)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2] / "src"), env.get("PYTHONPATH")) if p)
    args = [sys.executable, "-m", "stoker", "train", "--data", str(small_folders), "--model", "small_cnn", "--epochs", "1000",
            "--batch-size", "8", "--workers", "0", "--device", "cpu", "--image-size", "16", "--no-progress", "--no-adapt",
            "--log-dir", runs, "--name", "url"]
    with open(tmp_path / "out", "wb") as out, open(tmp_path / "err", "wb") as err:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
    try:
        fs = s3fs.S3FileSystem(skip_instance_cache=True)
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            fs.invalidate_cache()
            if fs.exists(f"{runs}/url/last.pt"):
                break
            time.sleep(0.5)
        assert proc.poll() is None and fs.exists(f"{runs}/url/last.pt"), (tmp_path / "err").read_text()[-3000:]
        os.kill(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    said = (tmp_path / "out").read_text() + (tmp_path / "err").read_text()
    assert code == 130, said[-3000:]
    assert (cache / "runs").is_dir()  # the local copy is there ...
    assert str(cache) not in said, said[-3000:]  # ... and no line names it
    assert f"run url in {runs}/url (cpu" in said, said[-3000:]
    mid_epoch = [line for line in said.splitlines() if "holds this point" in line]  # said when the stop lands in a batch
    expected = f"{runs}/url/last.pt holds this point; continue with stoker train --log-dir {runs} --name url --resume"
    named = all(expected in line for line in mid_epoch)  # a bool: a failure's message is ours, not a diff of the output
    assert named, "\n".join(mid_epoch)
    last = said.strip().splitlines()[-1]
    assert last == f"interrupted; {runs}/url/last.pt holds the last point saved: continue with stoker train --log-dir {runs} " \
                   "--name url --resume", last
