"""pack: round trips, splits, determinism, the output folder rules, resuming, re-packing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stoker.data import open_data
from stoker.decode.image import decode_sample, resize
from stoker.errors import ConfigError, ShardError
from stoker.packer import pack
from stoker.shards import Manifest, ShardDataset, verify
from stoker.shards.format.schema import PLAN_NAME
from stoker.sources import ClassFolderDataset, FileDataset


def _samples(root: Path, split: str = "train") -> dict[str, tuple[int, str, str, object]]:
    """key -> (label, source, file, image) of every sample of a split, read back from the shards."""
    ds = ShardDataset(root, split)
    out = {}
    for i in range(len(ds)):
        info = ds.trace(i)
        image, label = ds[i]
        assert label == info["label"]
        out[info["key"]] = (label, info["source"], info["file"], image)
    return out


def _shard_bytes(ds: ShardDataset, i: int) -> bytes:
    data, _, _ = ds.shards.read_encoded(i)
    return data.tobytes()


def test_encoded_round_trip_keeps_every_files_bytes(digi: Path, packed: Callable[..., Path]) -> None:
    root = packed(store="encoded", shard_samples=7)
    source = ClassFolderDataset(digi)
    ds = ShardDataset(root)
    assert len(ds) == len(source) and ds.classes == source.classes
    manifest = Manifest.load(root)
    assert [i.samples for i in manifest.shards] == [7, 7, 7, 7, 7, 5]
    by_key = {str(k): i for i, k in enumerate(source.index.keys)}
    for i in range(len(ds)):
        info = ds.trace(i)
        j = by_key[info["key"]]
        assert _shard_bytes(ds, i) == source.read_bytes(j)
        assert info["label"] == int(source.labels[j])
        assert info["source"] == digi.name and info["file"] == info["key"]
        image, label = ds[i]
        assert torch.equal(image, source.load_image(j))  # RGBA became RGB, as from the file


def test_pixels_round_trip_equals_decode_crop_resize(celeb: Path, tmp_path: Path) -> None:
    crop = (2, 1, 8, 9)
    pack(celeb, tmp_path / "out", store="pixels", size=(6, 5), crop=crop, progress=False, workers=0)
    ds = ShardDataset(tmp_path / "out")
    assert ds.image_size == (6, 5) and ds.store == "pixels"
    for i in range(len(ds)):
        info = ds.trace(i)
        data = (celeb / "img" / info["file"]).read_bytes()
        expected = resize(decode_sample(data, info["file"], crop), (6, 5))
        image, _ = ds[i]
        assert torch.equal(image, expected)
    labels = dict(line.split() for line in (celeb / "identity_CelebA.txt").read_text().splitlines())
    for key, (label, _, _, _) in _samples(tmp_path / "out").items():
        assert label == int(labels[key])


def test_samples_are_shuffled_and_the_split_is_stratified(digi: Path, packed: Callable[..., Path]) -> None:
    root = packed(store="encoded", valid=0.25, seed=3)
    train, valid = ShardDataset(root, "train"), ShardDataset(root, "valid")
    assert len(train) + len(valid) == 40 and len(valid) == 10
    keys = [train.trace(i)["key"] for i in range(len(train))]
    assert keys != sorted(keys)  # written shuffled, not in folder order
    assert set(keys).isdisjoint(valid.trace(i)["key"] for i in range(len(valid)))
    assert sorted(np.bincount(valid.labels).tolist()) == [3, 3, 4]  # every class held out


def test_ids_partitions_become_splits_and_arrays_round_trip(ids: Path, tmp_path: Path) -> None:
    manifest = pack(ids, tmp_path / "out", progress=False, workers=0)
    assert list(manifest.splits) == ["train", "valid"]
    assert manifest.split_samples("train") == 15 and manifest.split_samples("valid") == 5
    ds = ShardDataset(tmp_path / "out", "valid")
    for i in range(len(ds)):
        info = ds.trace(i)
        image, _ = ds[i]
        assert torch.equal(image, torch.from_numpy(np.load(ids / "data" / info["file"])))


def test_several_sources_are_laid_side_by_side(digi: Path, celeb: Path, tmp_path: Path) -> None:
    manifest = pack([celeb, digi], tmp_path / "out", store="pixels", size=(8, 8), progress=False, workers=0)
    assert [s.name for s in manifest.sources] == [celeb.name, digi.name]
    assert len(manifest.classes) == 4 + 3  # celeba labels 0..3 (1-based identities), then digiface
    ds = ShardDataset(tmp_path / "out")
    sources = {ds.trace(i)["source"]: ds.trace(i)["label"] for i in range(len(ds))}
    assert len(sources) == 2 and sources[digi.name] >= 4


def _all_bytes(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def test_deterministic_and_independent_of_worker_count(digi: Path, tmp_path: Path) -> None:
    kwargs = dict(store="pixels", size=(6, 6), shard_samples=9, valid=0.2, seed=5, progress=False)
    pack(digi, tmp_path / "a", workers=0, **kwargs)  # type: ignore[arg-type]
    pack(digi, tmp_path / "b", workers=2, **kwargs)  # type: ignore[arg-type]
    a, b = _all_bytes(tmp_path / "a"), _all_bytes(tmp_path / "b")
    assert a == b and "manifest.json" in a and PLAN_NAME not in a
    pack(digi, tmp_path / "c", workers=0, **{**kwargs, "seed": 6})  # type: ignore[arg-type]
    assert _all_bytes(tmp_path / "c")["train-00000.arrow"] != a["train-00000.arrow"]


def test_output_folder_rules(digi: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        pack(digi, out, progress=False, workers=0)
    first = pack(digi, tmp_path / "set", progress=False, workers=0)
    again = pack(digi, tmp_path / "set", progress=False, workers=0)  # the same pack: nothing to do
    assert again == first
    with pytest.raises(ConfigError, match="different shard set"):
        pack(digi, tmp_path / "set", shard_samples=5, progress=False, workers=0)
    pack(digi, tmp_path / "set", shard_samples=5, overwrite=True, progress=False, workers=0)
    assert len(Manifest.load(tmp_path / "set").shards) == 8
    assert not (tmp_path / "set" / "train-00000.arrow.tmp").exists()
    with pytest.raises(ConfigError, match="inside the source"):
        pack(digi, digi / "packed", progress=False, workers=0)


def test_bad_arguments_are_refused_before_writing(digi: Path, tmp_path: Path) -> None:
    out = tmp_path / "never"
    for kwargs in (
        {"store": "pickle"},
        {"size": (0, 4)},
        {"shard_samples": 0},
        {"shard_bytes": 0},
        {"valid": 1.5},
        {"workers": -1},
    ):
        with pytest.raises(ConfigError):
            pack(digi, out, progress=False, **kwargs)  # type: ignore[arg-type]
    assert not out.exists()


def test_shard_bytes_caps_the_shard_size(digi: Path, tmp_path: Path) -> None:
    manifest = pack(digi, tmp_path / "out", store="pixels", size=(10, 10), shard_bytes=4000, progress=False, workers=0)
    assert all(info.samples <= 13 for info in manifest.shards)  # 300 pixel bytes + text per row
    assert sum(info.samples for info in manifest.shards) == 40


def test_repack_a_shard_set_to_pixels_and_back_refused(packed: Callable[..., Path], tmp_path: Path) -> None:
    encoded = packed(store="encoded", valid=0.25, seed=3)
    manifest = pack(encoded, tmp_path / "px", store="pixels", size=(5, 5), progress=False, workers=0)
    assert list(manifest.splits) == ["train", "valid"] and manifest.split_samples("valid") == 10
    source, repacked = ShardDataset(encoded, "valid"), ShardDataset(tmp_path / "px", "valid")
    by_key = {source.trace(i)["key"]: i for i in range(len(source))}
    for i in range(len(repacked)):
        j = by_key[repacked.trace(i)["key"]]
        assert torch.equal(repacked[i][0], resize(source[j][0], (5, 5)))
    with pytest.raises(ConfigError, match="keep no encoded files"):
        pack(tmp_path / "px", tmp_path / "enc", store="encoded", progress=False, workers=0)


_INTERRUPT = textwrap.dedent(
    """
    import os, signal, sys
    import stoker.shards.pack.writer as writer_module
    from stoker.packer import pack

    rows = 0
    original = writer_module.ShardWriter.write_row

    def write_then_die(self, *args, **kwargs):
        global rows
        original(self, *args, **kwargs)
        rows += 1
        if rows == int(sys.argv[3]):  # half way through a shard: no cleanup runs
            os.kill(os.getpid(), signal.SIGKILL)

    writer_module.ShardWriter.write_row = write_then_die
    pack(sys.argv[1], sys.argv[2], store="pixels", size=(6, 6), shard_samples=6, valid=0.2,
         seed=1, workers=0, progress=False)
    """
)


def test_a_killed_pack_resumes_to_the_same_bytes(digi: Path, tmp_path: Path) -> None:
    kwargs = dict(store="pixels", size=(6, 6), shard_samples=6, valid=0.2, seed=1, progress=False)
    pack(digi, tmp_path / "whole", workers=0, **kwargs)  # type: ignore[arg-type]
    out = tmp_path / "killed"
    done = subprocess.run([sys.executable, "-c", _INTERRUPT, str(digi), str(out), "15"], env={**os.environ})
    assert done.returncode == -9
    names = sorted(p.name for p in out.iterdir())
    assert "manifest.json" not in names and PLAN_NAME in names
    assert "train-00001.arrow" in names and "train-00002.arrow.tmp" in names and "train-00002.arrow" not in names
    with pytest.raises(ShardError, match="did not finish"):
        ShardDataset(out)
    pack(digi, out, workers=2, **kwargs)  # type: ignore[arg-type]  # the same arguments: resume
    assert _all_bytes(out) == _all_bytes(tmp_path / "whole")
    assert verify(out, workers=0).ok


def test_deleted_or_damaged_shards_are_rewritten_by_the_same_pack(digi: Path, tmp_path: Path) -> None:
    kwargs = dict(store="encoded", shard_samples=10, progress=False, workers=0)
    pack(digi, tmp_path / "out", **kwargs)  # type: ignore[arg-type]
    whole = _all_bytes(tmp_path / "out")
    (tmp_path / "out" / "train-00001.arrow").unlink()
    damaged = bytearray(whole["train-00002.arrow"])
    damaged[len(damaged) // 2] ^= 0xFF
    (tmp_path / "out" / "train-00002.arrow").write_bytes(bytes(damaged))
    pack(digi, tmp_path / "out", **kwargs)  # type: ignore[arg-type]
    assert _all_bytes(tmp_path / "out") == whole


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(min_value=2, max_value=40),
    shard_samples=st.integers(min_value=1, max_value=15),
    valid=st.sampled_from([None, 0.2, 0.5]),
    store=st.sampled_from(["encoded", "pixels"]),
    seed=st.integers(min_value=0, max_value=2**40),
)
def test_round_trip_property(
    digi: Path, tmp_path_factory: pytest.TempPathFactory, n: int, shard_samples: int, valid: float | None, store: str, seed: int
) -> None:
    """Any size, shard size, split and mode: every sample comes back once, with its bytes or pixels and label."""
    full = open_data(digi, "train")
    source = full.subset(np.arange(n))
    try:
        expected_splits = dict(zip(["train", "valid"], source.split(valid, seed), strict=True)) if valid else {"train": source}
    except ConfigError:
        return  # too few samples to split: pack refuses the same way
    out = tmp_path_factory.mktemp("prop")
    manifest = pack(source, out, store=store, shard_samples=shard_samples, valid=valid, seed=seed, progress=False, workers=0)
    assert all(info.samples <= shard_samples for info in manifest.shards)
    for split, expected in expected_splits.items():
        ds = ShardDataset(out, split)
        assert len(ds) == len(expected)
        rows = {str(k): i for i, k in enumerate(expected.index.keys)}
        seen = set()
        batch = ds.__getitems__(np.arange(len(ds)))
        for i in range(len(ds)):
            info = ds.trace(i)
            j = rows[info["key"]]
            seen.add(j)
            assert info["label"] == int(expected.labels[j]) == int(batch.labels[i])
            if store == "encoded":
                assert _shard_bytes(ds, i) == expected.read_bytes(j)
            else:
                assert torch.equal(batch.images[i], expected.load_image(j))
        assert len(seen) == len(expected)


def test_a_file_dataset_object_packs_too(digi: Path, tmp_path: Path) -> None:
    ds: FileDataset = ClassFolderDataset(digi)
    manifest = pack({"train": ds.subset(range(10)), "test": ds.subset(range(10, 14))}, tmp_path / "o", progress=False, workers=0)
    assert list(manifest.splits) == ["train", "test"] and manifest.split_samples("test") == 4
