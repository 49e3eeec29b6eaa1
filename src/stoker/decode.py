"""Turn the bytes of one sample file into a uint8 RGB CHW tensor, in one place.

Images decode with torchvision.io (libjpeg-turbo, libpng); PIL is the fallback for
formats torchvision cannot read. ``.pt`` files load with ``weights_only=True`` and
``.npy`` files with ``allow_pickle=False``: opening a stranger's data never runs code.
Grayscale, grayscale+alpha and RGBA all become RGB here and nowhere else.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Sequence
from pathlib import PurePath

import numpy as np
import torch
from torchvision.io import ImageReadMode
from torchvision.io import decode_image as _tv_decode_image

from stoker.errors import DecodeError

__all__ = [
    "ARRAY_SUFFIXES",
    "IMAGE_SUFFIXES",
    "SAMPLE_SUFFIXES",
    "crop",
    "decode_array",
    "decode_image",
    "decode_sample",
    "resize",
    "to_rgb",
]

IMAGE_SUFFIXES: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff")
ARRAY_SUFFIXES: tuple[str, ...] = (".pt", ".npy")
SAMPLE_SUFFIXES: tuple[str, ...] = ARRAY_SUFFIXES + IMAGE_SUFFIXES

# What a bad sample message tells the user to do.
_BAD_SAMPLE_HINT = "delete or re-export the file, or load with on_error='skip' to skip bad samples"

Box = tuple[int, int, int, int]  # (top, left, height, width), as torchvision's F.crop


def to_rgb(image: torch.Tensor, name: str = "<tensor>") -> torch.Tensor:
    """Return ``image`` as a 3-channel CHW tensor (gray is repeated, alpha dropped)."""
    if image.ndim == 2:
        image = image.unsqueeze(0)
    if image.ndim != 3:
        raise DecodeError(f"{name}: expected an image of 2 or 3 dimensions, got shape {tuple(image.shape)}")
    channels = image.shape[0]
    if channels == 3:
        return image
    if channels in (1, 2):  # gray or gray + alpha
        return image[:1].expand(3, -1, -1).contiguous()
    if channels == 4:  # RGBA
        return image[:3].contiguous()
    raise DecodeError(f"{name}: expected 1, 2, 3 or 4 channels first (CHW), got shape {tuple(image.shape)}")


def decode_image(data: bytes | bytearray | memoryview | np.ndarray, name: str = "<bytes>") -> torch.Tensor:
    """Decode an encoded image (JPEG, PNG, WEBP, GIF, BMP, TIFF) to a uint8 RGB CHW tensor.

    Args:
        data: the encoded bytes of the file.
        name: the file name, used in error messages only.

    Raises:
        DecodeError: the bytes are not a readable image.

    Example:
        >>> from stoker.decode import decode_image
        >>> decode_image(open("cat.jpg", "rb").read(), "cat.jpg").shape  # doctest: +SKIP
        torch.Size([3, 218, 178])
    """
    buffer = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1)
    if buffer.size == 0:
        raise DecodeError(f"{name}: the file is empty; {_BAD_SAMPLE_HINT}")
    if buffer[:8].tobytes() == _PNG_SIGNATURE:
        _check_png_chunks(memoryview(buffer), name)  # type: ignore[arg-type]  # ndarray is a buffer (stubs < 3.12 disagree)
    encoded = torch.from_numpy(buffer.copy())  # torchvision wants a writable tensor
    try:
        return _tv_decode_image(encoded, mode=ImageReadMode.RGB)
    except (RuntimeError, ValueError):
        pass  # not a format torchvision reads, or corrupt: let PIL have a go
    return _decode_with_pil(buffer.tobytes(), name)


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _check_png_chunks(data: memoryview, name: str) -> None:
    """Check every PNG chunk's length and CRC before libpng sees the file.

    torchvision 0.29's PNG decoder kills the whole process (a segmentation fault) when
    libpng reports an error inside the image data (a flipped byte in an IDAT chunk), where
    it should raise. The CRC-32 of each chunk catches such damage first, for a few
    microseconds per file, so a corrupt PNG becomes a :class:`DecodeError` instead.
    """
    pos, end = 8, len(data)
    while pos + 12 <= end:
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        stop = pos + 8 + length
        if stop + 4 > end:
            raise DecodeError(f"{name}: PNG is truncated in its {bytes(kind)!r} chunk; {_BAD_SAMPLE_HINT}")
        if zlib.crc32(data[pos + 4 : stop]) != int.from_bytes(data[stop : stop + 4], "big"):
            raise DecodeError(f"{name}: PNG {bytes(kind).decode('latin-1')!r} chunk fails its CRC (corrupt file); {_BAD_SAMPLE_HINT}")
        if kind == b"IEND":
            return
        pos = stop + 4
    raise DecodeError(f"{name}: PNG ends before its IEND chunk (truncated file); {_BAD_SAMPLE_HINT}")


def _decode_with_pil(data: bytes, name: str) -> torch.Tensor:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            rgb = np.asarray(img.convert("RGB"))
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise DecodeError(f"{name}: cannot decode image ({exc}); {_BAD_SAMPLE_HINT}") from None
    return torch.from_numpy(rgb.copy()).permute(2, 0, 1).contiguous()


def decode_array(data: bytes | bytearray | memoryview | np.ndarray, name: str) -> torch.Tensor:
    """Load a ``.pt`` (``weights_only=True``) or ``.npy`` (no pickle) image tensor.

    A 3-D array is taken as CHW when its first dimension is 1-4, else as HWC; a 2-D
    array is grayscale. The result is converted to RGB, but its dtype is kept.
    """
    suffix = PurePath(name).suffix.lower()
    try:
        if suffix == ".pt":
            obj = torch.load(io.BytesIO(bytes(data)), map_location="cpu", weights_only=True)
            if not isinstance(obj, torch.Tensor):
                raise DecodeError(f"{name}: expected a tensor, found {type(obj).__name__}; {_BAD_SAMPLE_HINT}")
            tensor = obj
        elif suffix == ".npy":
            tensor = torch.from_numpy(np.load(io.BytesIO(bytes(data)), allow_pickle=False).copy())
        else:
            raise DecodeError(f"{name}: not an array file (expected .pt or .npy)")
    except DecodeError:
        raise
    except Exception as exc:  # torch.load and np.load raise many kinds on garbage
        raise DecodeError(f"{name}: cannot load array ({type(exc).__name__}: {exc}); {_BAD_SAMPLE_HINT}") from None
    if tensor.ndim == 3 and tensor.shape[0] not in (1, 2, 3, 4) and tensor.shape[-1] in (1, 2, 3, 4):
        tensor = tensor.permute(2, 0, 1)
    return to_rgb(tensor, name)


def crop(image: torch.Tensor, box: Box | None, name: str = "<tensor>") -> torch.Tensor:
    """Crop a CHW tensor to ``box = (top, left, height, width)``; ``None`` keeps it whole."""
    if box is None:
        return image
    top, left, height, width = box
    _, h, w = image.shape
    if top < 0 or left < 0 or height <= 0 or width <= 0 or top + height > h or left + width > w:
        raise DecodeError(
            f"{name}: crop box (top={top}, left={left}, height={height}, width={width}) "
            f"does not fit in the {h}x{w} image; fix the crop box of this source"
        )
    return image[:, top : top + height, left : left + width]


def resize(image: torch.Tensor, size: Sequence[int] | None) -> torch.Tensor:
    """Resize a uint8 CHW tensor to ``size = (height, width)`` with antialiasing."""
    if size is None or tuple(image.shape[-2:]) == tuple(size):
        return image
    from torchvision.transforms.v2 import functional as F

    return F.resize(image, list(size), antialias=True)


def decode_sample(data: bytes | bytearray | memoryview | np.ndarray, name: str, box: Box | None = None) -> torch.Tensor:
    """Decode one sample file by its suffix (image or array) and apply its source's crop."""
    suffix = PurePath(name).suffix.lower()
    image = decode_array(data, name) if suffix in ARRAY_SUFFIXES else decode_image(data, name)
    return crop(image, box, name)
