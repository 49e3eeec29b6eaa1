"""Crafted JPEGs (and image arrays) on every path: only DecodeErrors, bounded memory, verify agrees with training."""

from __future__ import annotations

import io
import struct
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from fuzzing.jpeg import JPEG_MUTATIONS, JPEG_PATHS, jpeg_case, run_jpeg_guarded
from PIL import Image

from stoker.decode import jpeg
from stoker.decode.image import declared_size, decode_sample
from stoker.errors import DecodeError
from stoker.packer import pack
from stoker.shards import ShardDataset, verify


def _jpeg(height: int = 40, width: int = 48, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def _sof(data: bytes) -> int:
    return data.index(b"\xff\xc0")


def _with_size(data: bytes, height: int, width: int) -> bytes:
    at = _sof(data)
    return data[: at + 5] + struct.pack(">HH", height, width) + data[at + 9 :]


def test_crafted_jpegs_through_files_shards_and_verify_give_only_decode_errors_in_bounded_memory() -> None:
    # 300 cases x 4 paths; before the fixes: KeyError out of the shard paths, 8 GiB for a declared 48679x59164,
    # verify calling rows ok that the shard reader died on, and (a reduced DCT scale) shard pixels other than
    # the file's for noise images and changed quantisation tables: every decoding path must give the file's pixels.
    counts = run_jpeg_guarded(range(300), block=150, timeout_s=300)
    outcomes = {outcome for (_, _, outcome) in counts}
    assert outcomes <= {"decoded", "DecodeError"}, sorted(counts.items())
    assert {(path, kind) for (path, kind, _) in counts} == {(p, k) for p in JPEG_PATHS for k in JPEG_MUTATIONS}
    for path in JPEG_PATHS:
        assert sum(n for (p, _, _), n in counts.items() if p == path) == 300
        huge = {o for (p, k, o) in counts if p == path and k.startswith("huge")}
        assert huge == {"DecodeError"}, (path, huge)


def test_jpeg_cases_are_made_from_their_seed_alone() -> None:
    assert jpeg_case(2) == jpeg_case(2)
    assert jpeg_case(2)[0] == "huge declared size" and jpeg_case(3)[0] == "huge size behind garbage"
    assert len({jpeg_case(s)[1] for s in range(26)}) == 26


def test_a_huge_frame_header_behind_stray_bytes_is_refused_before_decoding() -> None:
    """libjpeg skips stray bytes before a marker; the pixel limit's header walk must too (it stopped there)."""
    data = _with_size(_jpeg(), 48679, 59164)
    at = _sof(data)
    hidden = data[:at] + b"\x00\x17\x2a" + data[at:]
    assert declared_size(hidden) == (59164, 48679)
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError, match=r"hidden.jpg: the image declares 59164x48679 .* more than the limit"):
            decode_sample(hidden, "hidden.jpg")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_luma_sampling_0x14_and_a_huge_size_in_an_encoded_shard_are_skipped_and_verify_agrees(tmp_path: Path) -> None:
    good = _jpeg()
    at = _sof(good)
    sampling = bytearray(good)
    sampling[at + 11] = 0x14  # simplejpeg's header reader raised KeyError: 6 on this
    bomb = _with_size(good, 48679, 59164)
    folder = tmp_path / "src" / "0"
    folder.mkdir(parents=True)
    for name, data in (("a-good.jpg", good), ("b-sampling.jpg", bytes(sampling)), ("c-bomb.jpg", bomb)):
        (folder / name).write_bytes(data)
    out = tmp_path / "shards"
    pack(tmp_path / "src", out, store="encoded", size=(32, 32), progress=False, workers=0, shuffle=False)

    ds = ShardDataset(out, on_error="skip")
    files = [ds.shards.row_info(i)["file"] for i in range(len(ds))]
    batch = ds.__getitems__(list(range(len(ds))))
    read_ok = {files[i] for i in range(len(ds))} - {files[int(s.key.split("[")[1][:-1])] for s in batch.skipped}
    assert "0/c-bomb.jpg" not in read_ok and "0/a-good.jpg" in read_ok
    assert any("c-bomb.jpg" in s.reason and "more than the limit" in s.reason for s in batch.skipped)
    report = verify(out, workers=0)
    bad = {files[i] for i in range(len(ds)) for f in report.faults if f.row == ds.shards.row_info(i)["row"]}
    assert {files[i] for i in range(len(ds))} - bad == read_ok  # "ok" means training reads it, and only then
    raising = ShardDataset(out)
    for i, name in enumerate(files):
        if name in read_ok:
            assert raising[i][0].shape == (3, 32, 32)
        else:
            with pytest.raises(DecodeError, match=rf"shard .* row {ds.shards.row_info(i)['row']}: .*{name}"):
                raising[i]


def test_verify_reports_what_escapes_a_decoder_instead_of_dying(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "src" / "0"
    folder.mkdir(parents=True)
    (folder / "a.jpg").write_bytes(_jpeg())
    pack(tmp_path / "src", tmp_path / "shards", store="encoded", size=(16, 16), progress=False, workers=0)
    assert verify(tmp_path / "shards", workers=0).ok

    def broken(*args: object) -> None:
        raise KeyError(6)

    monkeypatch.setattr(jpeg, "decode_jpeg_resized", broken)  # the fast path verify runs, as training does
    report = verify(tmp_path / "shards", workers=0)
    assert not report.ok and "the decoder raised KeyError" in report.faults[0].problem
    assert report.faults[0].row == 0


def test_verify_finds_a_row_the_fast_decoder_reads_to_other_pixels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "src" / "0"
    folder.mkdir(parents=True)
    (folder / "a.jpg").write_bytes(_jpeg())
    pack(tmp_path / "src", tmp_path / "shards", store="encoded", size=(16, 16), progress=False, workers=0)
    real = jpeg.decode_jpeg_resized

    def off_by_three(*args: object) -> torch.Tensor | None:  # a fast decoder that drifted from the full one
        image = real(*args)  # type: ignore[arg-type]
        return None if image is None else image.clamp(max=250) + 3

    monkeypatch.setattr(jpeg, "decode_jpeg_resized", off_by_three)
    report = verify(tmp_path / "shards", workers=0)
    assert not report.ok and "the fast JPEG decoder gives other pixels than the full decode" in report.faults[0].problem


def test_a_huge_header_never_goes_to_nvjpeg() -> None:
    from stoker.decode.device import check_headers

    blobs = [_jpeg(), _with_size(_jpeg(), 48679, 59164), b"\x89PNG\r\n\x1a\n"]
    offsets = np.cumsum([0] + [len(b) for b in blobs])
    assert check_headers(np.frombuffer(b"".join(blobs), np.uint8), offsets).ok.tolist() == [True, False, False]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_device_path_refuses_a_huge_header_on_the_cpu_without_allocating_it() -> None:
    blobs = [np.frombuffer(_jpeg(seed=1), np.uint8), np.frombuffer(_with_size(_jpeg(), 48679, 59164), np.uint8)]
    cpu_calls: list[int] = []

    def on_cpu(j: int) -> torch.Tensor:
        cpu_calls.append(j)
        return torch.zeros((3, 16, 16), dtype=torch.uint8)

    torch.cuda.reset_peak_memory_stats()
    batch = jpeg.decode_batch_on_device(blobs, [None, None], (16, 16), torch.device("cuda"), on_cpu)
    assert batch.shape == (2, 3, 16, 16) and cpu_calls == [1]
    assert torch.cuda.max_memory_allocated() < 256 << 20


def test_an_npy_header_declaring_a_huge_array_is_refused_before_numpy_allocates_it() -> None:
    out = io.BytesIO()
    np.save(out, np.zeros((4, 4, 3), np.uint8))
    data = out.getvalue().replace(b"(4, 4, 3)", b"(60000, 60000, 3)")
    with pytest.raises(DecodeError, match=r"huge.npy: the .npy header declares shape \(60000, 60000, 3\)"):
        decode_sample(data, "huge.npy")
    short = out.getvalue().replace(b"(4, 4, 3)", b"(40, 40, 3)")
    with pytest.raises(DecodeError, match=r"short.npy: the .npy header declares 4,800 bytes of data, the file holds [0-9]+ \(truncated"):
        decode_sample(short, "short.npy")


def test_a_pt_archive_with_compressed_entries_is_refused() -> None:
    out = io.BytesIO()
    torch.save(torch.zeros((3, 4, 4), dtype=torch.uint8), out)
    assert decode_sample(out.getvalue(), "ok.pt").shape == (3, 4, 4)
    packed = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(out.getvalue())) as source, zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as bomb:
        for info in source.infolist():
            bomb.writestr(info.filename, source.read(info))
    with pytest.raises(DecodeError, match="bomb.pt: the .pt archive has compressed entries"):
        decode_sample(packed.getvalue(), "bomb.pt")
