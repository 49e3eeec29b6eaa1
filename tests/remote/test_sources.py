"""Sources in a bucket: class folders, a label file, ids files, and Pipe.list_files, listed through fsspec."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from stoker import pack
from stoker.pipes import Pipe
from stoker.shards import ShardDataset
from stoker.sources import ClassFolderDataset
from stoker.sources.ids import IdDataset
from stoker.sources.label_file import LabelFileDataset

from .conftest import upload_folder


def _shards(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.glob("*.arrow"))}


def test_class_folders_in_a_bucket_pack_like_local_ones(
    s3_server: str, bucket: str, small_folders: Path, small_pack: Path, tmp_path: Path
) -> None:
    url = upload_folder(small_folders, f"{bucket}/data")
    ds = ClassFolderDataset(url)
    local = ClassFolderDataset(small_folders)
    assert ds.index.keys.tolist() == local.index.keys.tolist() and ds.classes == local.classes
    assert ds[3][0].equal(local[3][0])
    out = tmp_path / "packed"
    manifest = pack(url, out, store="pixels", shard_samples=8, workers=2, progress=False)
    assert manifest.sources[0].root == url
    assert _shards(out) == _shards(small_pack)  # shards hold relative file names only


def test_a_label_file_set_in_a_bucket(s3_server: str, bucket: str, tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    for i in range(6):
        Image.fromarray(np.full((8, 8, 3), i * 30, np.uint8)).save(tmp_path / "img" / f"{i:03d}.png")
    (tmp_path / "labels.txt").write_text("".join(f"{i:03d}.png {i % 2}\n" for i in range(6)))
    url = upload_folder(tmp_path, f"{bucket}/celeb")
    ds = LabelFileDataset(f"{url}/img", f"{url}/labels.txt")
    assert len(ds) == 6 and ds.labels.tolist() == [0, 1, 0, 1, 0, 1]
    assert int(ds[5][0][0, 0, 0]) == 150


def test_an_ids_set_in_a_bucket(s3_server: str, bucket: str, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    ids = [f"id{i}" for i in range(4)]
    for i, sample in enumerate(ids):
        np.save(tmp_path / "data" / f"{sample}.npy", np.full((3, 4, 4), i, np.uint8))
    (tmp_path / "ids.json").write_text(json.dumps({"partition": {"train": ids}, "labels": {s: 1 for s in ids}}))
    url = upload_folder(tmp_path, f"{bucket}/ids")
    ds = IdDataset.from_json(f"{url}/ids.json")
    assert len(ds) == 4 and int(ds[2][0][0, 0, 0]) == 2
    assert ds.index.sources[0].root == f"{url}/data"


def test_pipe_list_files_in_a_bucket(s3_server: str, bucket: str, small_folders: Path) -> None:
    url = upload_folder(small_folders, f"{bucket}/data")
    files = list(Pipe.list_files(url, masks="*.png", recursive=True))
    assert len(files) == 40 and files[0] == f"{url}/0/0000.png"
    assert files == sorted(files)
    images = list(Pipe.list_files(f"{url}/1", masks="*.png").load_image())
    assert len(images) == 10 and images[0][0] == f"{url}/1/0001.png" and images[0][1].shape == (3, 12, 10)


def test_a_shard_set_packed_from_a_bucket_reads_back(s3_server: str, bucket: str, small_folders: Path, tmp_path: Path) -> None:
    src = upload_folder(small_folders, f"{bucket}/data")
    pack(src, f"{bucket}/packed", store="encoded", shard_samples=16, workers=0, progress=False, cache_dir=tmp_path)
    ds = ShardDataset(f"{bucket}/packed", cache_dir=tmp_path)
    assert len(ds) == 40 and ds[0][0].shape == (3, 12, 10)


def test_open_data_and_bench_take_a_bucket(s3_server: str, bucket: str, small_folders: Path) -> None:
    from stoker import open_data
    from stoker.bench.benchmark import open_data as bench_open

    url = upload_folder(small_folders, f"{bucket}/data")
    data = open_data(url, valid=0.25)
    assert data.opened == ((url, "class_folders"),) and len(data["train"]) + len(data["valid"]) == 40
    dataset, name = bench_open(url)
    assert len(dataset) == 40 and name == "data"
