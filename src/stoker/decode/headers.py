"""What an image or array file declares about itself, read before any decoder allocates for it.

The pixel limit (``STOKER_MAX_PIXELS``) is only as good as the size it is checked
against, so the size is read the way the decoders read it: a JPEG's markers walked as
libjpeg walks them (stray bytes skipped, not taken as the end), with libjpeg-turbo's own
header reader as a second opinion; a ``.npy`` header's shape against the bytes the file
holds; a ``.pt`` archive refused when it has compressed entries (``torch.save`` never
writes them; inflating one is unbounded). :mod:`stoker.decode.image` checks these before it
hands the bytes to a decoder, and :mod:`stoker.decode.jpeg` before it hands them to nvJPEG.
"""

from __future__ import annotations

import io
import zipfile

import numpy as np

try:
    from simplejpeg import decode_jpeg_header as _jpeg_header
except ImportError:  # pragma: no cover - a dependency; the marker walk alone then
    _jpeg_header = None  # type: ignore[assignment]

from stoker.errors import DecodeError

__all__ = [
    "BAD_SAMPLE_HINT", "MAX_CHANNELS", "PNG_SIGNATURE", "check_npy_header", "check_pt_entries", "declared_size", "declared_size_of",
]

#: What a bad sample message tells the user to do.
BAD_SAMPLE_HINT = "delete or re-export the file, or load with on_error='skip' to skip bad samples"

#: The eight bytes every PNG starts with.
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

def _declared_size(data: memoryview, head: bytes) -> tuple[int, int] | None:
    """``(width, height)`` a PNG, JPEG, GIF or WEBP header declares, or None when not found (cheap)."""
    if head == PNG_SIGNATURE and len(data) >= 24 and data[12:16].tobytes() == b"IHDR":
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if head[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    if head[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
    if head[:4] == b"RIFF" and data[8:12].tobytes() == b"WEBP" and len(data) >= 30:
        kind = data[12:16].tobytes()
        if kind == b"VP8X":
            return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
        if kind == b"VP8 ":
            return int.from_bytes(data[26:28], "little") & 0x3FFF, int.from_bytes(data[28:30], "little") & 0x3FFF
        if kind == b"VP8L":
            bits = int.from_bytes(data[21:25], "little")
            return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None


# Start-of-frame markers: C0-CF except DHT (C4), JPG (C8) and DAC (CC).
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(data: memoryview) -> tuple[int, int] | None:
    """``(width, height)`` of a JPEG's first frame header, walking the markers as libjpeg does.

    libjpeg skips bytes that are not a marker (with a warning) and goes on looking, so this
    does too: stopping at the first stray byte would let a crafted file hide a huge frame
    header from the pixel limit behind one byte of garbage.
    """
    pos, end = 2, len(data)
    while pos + 1 < end:
        if data[pos] != 0xFF:  # garbage between markers: find the next 0xFF, a window at a time
            window = data[pos : pos + 4096].tobytes()
            found = window.find(b"\xff")
            pos += len(window) if found < 0 else found
            continue
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0x00 or marker in (0x01, *range(0xD0, 0xD8)):  # stuffed byte, or markers without a length
            pos += 2
            continue
        if marker in _JPEG_SOF:
            if pos + 9 > end:
                return None
            height = int.from_bytes(data[pos + 5 : pos + 7], "big")
            width = int.from_bytes(data[pos + 7 : pos + 9], "big")
            return width, height
        if marker in (0xD9, 0xDA):  # end of image, start of scan: no frame header before
            return None
        if pos + 4 > end:
            return None
        pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
    return None


def _libjpeg_size(data: np.ndarray) -> tuple[int, int] | None:
    """``(width, height)`` as libjpeg-turbo's own header reader sees it (through simplejpeg), or None.

    A second opinion on :func:`_jpeg_size`, from the library that decodes: whatever a
    crafted header makes it raise (``KeyError`` for a luma sampling byte of 0x14) means
    "no opinion", never an error out of stoker.
    """
    if _jpeg_header is None:  # pragma: no cover - a dependency; the marker walk alone then
        return None
    try:
        height, width, _, _ = _jpeg_header(data)
    except Exception:  # noqa: BLE001 - crafted headers make it raise anything
        return None
    return int(width), int(height)


def declared_size(data: bytes | bytearray | memoryview | np.ndarray) -> tuple[int, int] | None:
    """``(width, height)`` an image's header declares (PNG, JPEG, GIF, WEBP), or None when it cannot be told cheaply.

    For a JPEG, the larger of stoker's marker walk and libjpeg-turbo's own header reader,
    so that no decoder is handed an image larger than it looks. Reads no pixels.
    """
    buffer = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1)
    view = memoryview(buffer)  # type: ignore[arg-type]  # ndarray is a buffer (stubs < 3.12 disagree)
    return declared_size_of(buffer, view, view[:8].tobytes())


def declared_size_of(buffer: np.ndarray, view: memoryview, head: bytes) -> tuple[int, int] | None:
    """:func:`declared_size` of bytes a caller already holds as a flat ``uint8`` array, its memoryview and first 8 bytes."""
    size = _declared_size(view, head)
    if head[:2] == b"\xff\xd8":
        other = _libjpeg_size(buffer)
        if other is not None and (size is None or other[0] * other[1] > size[0] * size[1]):
            size = other
    return size


#: An image array has at most this many channels (RGBA).
MAX_CHANNELS = 4


def check_pt_entries(data: bytes | bytearray | memoryview | np.ndarray, name: str) -> None:
    """Refuse a ``.pt`` archive with compressed entries before torch inflates them (a zip bomb).

    ``torch.save`` stores its entries uncompressed, so the tensors it loads are at most as
    large as the file; a compressed entry could expand without bound.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
            packed = [i.filename for i in archive.infolist() if i.compress_type != zipfile.ZIP_STORED]
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return  # not a zip (torch's legacy format, or garbage): torch.load decides
    if packed:
        raise DecodeError(
            f"{name}: the .pt archive has compressed entries ({packed[0]!r}), which torch.save never writes "
            f"(a zip bomb?); {BAD_SAMPLE_HINT}"
        )


def check_npy_header(data: bytes | bytearray | memoryview | np.ndarray, name: str, limit: int) -> None:
    """Check a ``.npy`` header's shape against the file's size and the pixel limit before numpy allocates it."""
    f = io.BytesIO(bytes(data[:65536]) if not isinstance(data, np.ndarray) else data[:65536].tobytes())
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise DecodeError(f"{name}: .npy format version {version} is not read (save with numpy.save); {BAD_SAMPLE_HINT}")
    except DecodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - numpy raises many kinds on a crafted header
        raise DecodeError(f"{name}: cannot read the .npy header ({type(exc).__name__}: {exc}); {BAD_SAMPLE_HINT}") from None
    total = data.nbytes if isinstance(data, (np.ndarray, memoryview)) else len(data)
    count = 1
    for dim in shape:
        count *= int(dim)
    if count > MAX_CHANNELS * limit:
        raise DecodeError(
            f"{name}: the .npy header declares shape {tuple(shape)} ({count:,} values), more than {MAX_CHANNELS} channels "
            f"of the pixel limit of {limit:,}; {BAD_SAMPLE_HINT}, or raise the limit with stoker.decode.image.set_max_pixels"
        )
    if count * dtype.itemsize > total - f.tell():
        raise DecodeError(
            f"{name}: the .npy header declares {count * dtype.itemsize:,} bytes of data, the file holds "
            f"{total - f.tell():,} (truncated or crafted); {BAD_SAMPLE_HINT}"
        )
