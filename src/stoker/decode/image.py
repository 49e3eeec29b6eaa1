"""Turn the bytes of one sample file into a uint8 RGB CHW tensor, in one place.

PNGs decode with libspng (through ``imagecodecs``; it releases the GIL, so threads
decode side by side), after stoker has checked every chunk's CRC and the declared size;
Pillow decodes the PNGs libspng cannot (gray+alpha, 16-bit gray or RGB, compressed text
or ICC chunks), the ones it refuses, and every PNG when ``imagecodecs`` is missing.
torchvision's libpng never sees a PNG: it crashes the process on some damaged files.
Every other image decodes with torchvision.io (libjpeg-turbo for JPEG), and Pillow where
torchvision cannot read it. (JPEGs of encoded shards read at a known size take a faster
path first, :mod:`stoker.decode.jpeg`, which comes back here when it cannot be sure of its
result.) ``.pt`` files load with ``weights_only=True`` and ``.npy`` files with
``allow_pickle=False``: opening a stranger's data never runs code.
Grayscale, grayscale+alpha and RGBA all become RGB here and nowhere else.
"""

from __future__ import annotations

import functools
import io
import os
import re
import zlib
from collections.abc import Sequence
from pathlib import PurePath
from typing import Any

import numpy as np
import torch

from stoker.decode.headers import BAD_SAMPLE_HINT as _BAD_SAMPLE_HINT
from stoker.decode.headers import (
    MAX_CHANNELS,
    PNG_SIGNATURE,
    check_npy_header,
    check_pt_entries,
    declared_size,
    declared_size_of,
)
from stoker.errors import ConfigError, DecodeError

try:  # libspng, bundled in imagecodecs' wheel: PNG at 1.2-1.6x Pillow's speed, GIL released
    from imagecodecs import spng_decode as _spng_decode
except ImportError:  # pragma: no cover - a dependency; Pillow decodes every PNG without it
    _spng_decode = None  # type: ignore[assignment]

__all__ = [
    "ARRAY_SUFFIXES",
    "IMAGE_SUFFIXES",
    "SAMPLE_SUFFIXES",
    "check_box",
    "crop",
    "decode_array",
    "decode_image",
    "decode_sample",
    "declared_size",
    "get_max_pixels",
    "png_decoder",
    "resize",
    "set_max_pixels",
    "to_rgb",
]

IMAGE_SUFFIXES: tuple[str, ...] = (
    ".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff", ".ppm", ".pgm", ".pbm", ".pnm",  # ImageFolder's and more
)
ARRAY_SUFFIXES: tuple[str, ...] = (".pt", ".npy")
SAMPLE_SUFFIXES: tuple[str, ...] = ARRAY_SUFFIXES + IMAGE_SUFFIXES


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


def decode_image(
    data: bytes | bytearray | memoryview | np.ndarray, name: str = "<bytes>", max_pixels: int | None = None
) -> torch.Tensor:
    """Decode an encoded image (JPEG, PNG, WEBP, GIF, BMP, TIFF) to a uint8 RGB CHW tensor.

    The bytes are checked before a decoder sees them: the width and height a header
    declares against ``max_pixels`` (before any pixel buffer is allocated), and a PNG's
    chunk lengths and CRCs (for a message naming the damaged chunk). A PNG's compressed
    stream is not checked beforehand: PNGs go to libspng, or Pillow (see the module's
    docstring), which raise on a bad stream (a :class:`DecodeError` here) where
    torchvision's libpng crashes the process. Other formats go to torchvision.io, and to
    Pillow when it cannot read them. A multi-frame image (an animated GIF) gives its first
    frame; 16-bit samples are scaled to 8 bits.

    Args:
        data: the encoded bytes of the file.
        name: the file name, used in error messages only.
        max_pixels: refuse images with more pixels than this (default:
            :func:`get_max_pixels`, set with :func:`set_max_pixels` or ``STOKER_MAX_PIXELS``).

    Raises:
        DecodeError: the bytes are not a readable image, or it has too many pixels.

    Example:
        >>> from stoker.decode.image import decode_image
        >>> from pathlib import Path
        >>> decode_image(Path("data/celeba/img/000001.jpg").read_bytes(), "000001.jpg").shape
        torch.Size([3, 218, 178])
    """
    limit = get_max_pixels() if max_pixels is None else max_pixels
    buffer = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1)
    if buffer.size == 0:
        raise DecodeError(f"{name}: the file is empty; {_BAD_SAMPLE_HINT}")
    view = memoryview(buffer)  # type: ignore[arg-type]  # ndarray is a buffer (stubs < 3.12 disagree)
    head = view[:8].tobytes()
    size = declared_size_of(buffer, view, head)
    if size is not None:
        _check_pixels(size, limit, name)
    if head == PNG_SIGNATURE:
        # Never libpng through torchvision: it crashes the process on some damaged PNGs.
        if _check_png_chunks(view, name) and _spng_decode is not None:
            image = _decode_with_spng(buffer, name)
            if image is not None:
                return image
        return _decode_with_pil(view, name, limit)
    # torchvision wants a writable tensor (it does not write to it): a read-only buffer (bytes) is copied first.
    encoded = torch.from_numpy(buffer if buffer.flags.writeable and buffer.dtype == np.uint8 else buffer.copy())
    try:
        tv_io = _torchvision_io()
        image = tv_io.decode_image(encoded, mode=tv_io.ImageReadMode.RGB)
    except Exception:  # noqa: BLE001 - not a format it reads, corrupt, or crafted (it may raise anything): PIL decides
        return _decode_with_pil(view, name, limit)
    if image.ndim == 4:  # an animated GIF or WEBP: frames x C x H x W
        image = image[0]
    return image


_DEFAULT_MAX_PIXELS = 89_478_485  # PIL's Image.MAX_IMAGE_PIXELS: about 9459 x 9459
_MAX_PIXELS_ENV = "STOKER_MAX_PIXELS"
_max_pixels: int | None = None  # set_max_pixels; None reads the environment


def get_max_pixels() -> int:
    """The most pixels (width x height) an image may declare before it is refused."""
    if _max_pixels is not None:
        return _max_pixels
    text = os.environ.get(_MAX_PIXELS_ENV)
    if text is None:
        return _DEFAULT_MAX_PIXELS
    if not re.fullmatch(r"[0-9]+", text.strip()) or int(text) < 1:
        raise ConfigError(f"{_MAX_PIXELS_ENV}={text!r}: expected a positive whole number of pixels")
    return int(text)


def set_max_pixels(pixels: int | None) -> None:
    """Refuse images with more than ``pixels`` pixels (``None``: back to the default, about 89.5 megapixels).

    The limit is also put in the environment (``STOKER_MAX_PIXELS``), so worker
    processes started afterwards use it too.

    Raises:
        ConfigError: ``pixels`` is not a positive integer.
    """
    global _max_pixels
    if pixels is None:
        _max_pixels = None
        os.environ.pop(_MAX_PIXELS_ENV, None)
        return
    if isinstance(pixels, bool) or not isinstance(pixels, int) or pixels < 1:
        raise ConfigError(f"max_pixels must be a positive integer, got {pixels!r}")
    _max_pixels = pixels
    os.environ[_MAX_PIXELS_ENV] = str(pixels)


def _check_pixels(size: tuple[int, int], limit: int, name: str) -> None:
    width, height = size
    if width * height > limit:
        raise DecodeError(
            f"{name}: the image declares {width}x{height} = {width * height:,} pixels, more than the limit of "
            f"{limit:,} (a decompression bomb, or a very large image); {_BAD_SAMPLE_HINT}, "
            "or raise the limit with stoker.decode.image.set_max_pixels / STOKER_MAX_PIXELS"
        )


def _check_png_chunks(data: memoryview, name: str) -> bool:
    """Check every PNG chunk's length and CRC; True when libspng may decode the file.

    It costs a few microseconds per file and names the damaged chunk; crafted files
    with valid CRCs are the decoders' to refuse (they raise, where libpng crashes).
    libspng is used only for what it decodes to the same pixels as Pillow (gray up to 8
    bits, 8-bit RGB, palette, RGBA of 8 or 16 bits), with the header first (so that its
    size was checked), and never for a file with compressed text or ICC chunks: libspng
    inflates those without a limit (a 2 MB zTXt chunk took 1 GB), Pillow stops at 1 MB.
    """
    pos, end = 8, len(data)
    spng = end >= 33 and data[12:16].tobytes() == b"IHDR" and (data[24], data[25]) in _SPNG_HEADERS
    while pos + 12 <= end:
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        stop = pos + 8 + length
        if stop + 4 > end:
            raise DecodeError(f"{name}: PNG is truncated in its {bytes(kind)!r} chunk; {_BAD_SAMPLE_HINT}")
        if zlib.crc32(data[pos + 4 : stop]) != int.from_bytes(data[stop : stop + 4], "big"):
            raise DecodeError(f"{name}: PNG {bytes(kind).decode('latin-1')!r} chunk fails its CRC (corrupt file); {_BAD_SAMPLE_HINT}")
        if kind == b"IEND":
            return spng
        if kind in _INFLATED_CHUNKS:
            spng = False
        pos = stop + 4
    raise DecodeError(f"{name}: PNG ends before its IEND chunk (truncated file); {_BAD_SAMPLE_HINT}")


# (bit depth, colour type) libspng decodes to Pillow's pixels through imagecodecs' formats
# (G8, RGB8, RGBA8, RGBA16); gray+alpha and 16-bit gray or RGB go to Pillow.
_SPNG_HEADERS = frozenset({(1, 0), (2, 0), (4, 0), (8, 0), (8, 2), (1, 3), (2, 3), (4, 3), (8, 3), (8, 6), (16, 6)})
_INFLATED_CHUNKS = (b"zTXt", b"iTXt", b"iCCP")


def _decode_with_spng(buffer: np.ndarray, name: str) -> torch.Tensor | None:
    """Decode a checked PNG with libspng; None when it refuses the file (Pillow then decides).

    Damaged files are rare and Pillow is the reference, so a file libspng refuses (it is
    stricter: it checks the zlib stream's Adler-32) goes to Pillow, which decodes or
    raises a DecodeError: what libspng raises never escapes, and every PNG readable
    before is readable still. Its palette, tRNS and gAMA handling is off, as Pillow's.
    """
    try:
        pixels = _spng_decode(buffer)  # type: ignore[misc,arg-type]  # not None (the caller); a buffer, not bytes, in its stubs
    except Exception:  # noqa: BLE001 - a crafted file may make a C library raise anything; Pillow decides
        return None
    if pixels.dtype == np.uint16:  # RGBA16: the high byte, as Pillow gives
        pixels = (pixels >> 8).astype(np.uint8)
    if pixels.ndim == 2:  # G8
        return to_rgb(torch.from_numpy(pixels), name)
    # HWC -> CHW by numpy (alpha dropped): one copy, faster than torch's permute on one thread.
    return torch.from_numpy(np.ascontiguousarray(pixels[:, :, :3].transpose(2, 0, 1)))


def is_png(data: bytes | bytearray | memoryview | np.ndarray) -> bool:
    """Whether ``data`` starts with the PNG signature."""
    head = data[:8].tobytes() if isinstance(data, np.ndarray) else bytes(data[:8])
    return head == PNG_SIGNATURE


def png_decoder() -> str:
    """The library that decodes PNGs here: ``"libspng"`` (``imagecodecs`` installed) or ``"pillow"``."""
    return "libspng" if _spng_decode is not None else "pillow"


def _decode_with_pil(data: memoryview, name: str, max_pixels: int) -> torch.Tensor:
    """Decode with Pillow: the PNGs libspng cannot or will not, and what torchvision cannot read.

    Pillow raises on damaged data where torchvision's libpng path crashes, and its
    pixels are the reference libspng's are tested against. The declared size is checked
    before any pixel is decoded; a multi-frame image gives its first frame; 16-bit
    grayscale is scaled to 8 bits rather than clipped.
    """
    from PIL import Image, UnidentifiedImageError

    if Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS < max_pixels:
        Image.MAX_IMAGE_PIXELS = max_pixels  # PIL would refuse below stoker's own (raised) limit
    try:
        img = Image.open(io.BytesIO(data))
        with img:
            _check_pixels(img.size, max_pixels, name)
            if img.mode in ("I;16", "I;16B", "I;16L", "I"):
                gray = np.asarray(img, dtype=np.uint32) >> 8  # the high byte, as libpng and PIL do for 16-bit RGB
                return to_rgb(torch.from_numpy(gray.clip(0, 255).astype(np.uint8)), name)
            # RGB and RGBA (dropping alpha is Pillow's own RGBA -> RGB) are read as they are, with
            # no conversion pass; np.asarray's view is copied once, below.
            if img.mode in ("RGB", "RGBA"):
                rgb = np.asarray(img)[:, :, :3]
            elif img.mode in ("P", "PA"):  # through RGBA: a palette's transparency would warn
                rgb = np.asarray(img.convert("RGBA"))[:, :, :3]
            else:
                rgb = np.asarray(img.convert("RGB"))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:  # the warning, when warnings are errors
        raise DecodeError(
            f"{name}: {exc} (more than the limit of {max_pixels:,} pixels); {_BAD_SAMPLE_HINT}, "
            "or raise the limit with stoker.decode.image.set_max_pixels / STOKER_MAX_PIXELS"
        ) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as exc:
        raise DecodeError(f"{name}: cannot decode image ({exc}); {_BAD_SAMPLE_HINT}") from None
    except DecodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - a crafted file may make a decoder raise anything (KeyError, MemoryError)
        raise DecodeError(f"{name}: cannot decode image ({type(exc).__name__}: {exc}); {_BAD_SAMPLE_HINT}") from None
    # HWC -> CHW by numpy: several times faster than torch's permute(...).contiguous() on one thread.
    return torch.from_numpy(np.ascontiguousarray(rgb.transpose(2, 0, 1)))


def decode_array(data: bytes | bytearray | memoryview | np.ndarray, name: str) -> torch.Tensor:
    """Load a ``.pt`` (``weights_only=True``) or ``.npy`` (no pickle) image tensor.

    A 3-D array is taken as CHW when its first dimension is 1-4, else as HWC; a 2-D
    array is grayscale. The result is converted to RGB, but its dtype is kept.
    """
    suffix = PurePath(name).suffix.lower()
    limit = get_max_pixels()
    try:
        if suffix == ".pt":
            check_pt_entries(data, name)
            obj = torch.load(io.BytesIO(bytes(data)), map_location="cpu", weights_only=True)
            if not isinstance(obj, torch.Tensor):
                raise DecodeError(f"{name}: expected a tensor, found {type(obj).__name__}; {_BAD_SAMPLE_HINT}")
            tensor = obj
        elif suffix == ".npy":
            check_npy_header(data, name, limit)
            tensor = torch.from_numpy(np.load(io.BytesIO(bytes(data)), allow_pickle=False).copy())
        else:
            raise DecodeError(f"{name}: not an array file (expected .pt or .npy)")
    except DecodeError:
        raise
    except Exception as exc:  # torch.load and np.load raise many kinds on garbage
        raise DecodeError(f"{name}: cannot load array ({type(exc).__name__}: {exc}); {_BAD_SAMPLE_HINT}") from None
    if tensor.numel() > MAX_CHANNELS * limit:
        raise DecodeError(
            f"{name}: the array holds {tensor.numel():,} values, more than {MAX_CHANNELS} channels of the pixel limit of "
            f"{limit:,}; {_BAD_SAMPLE_HINT}, or raise the limit with stoker.decode.image.set_max_pixels / STOKER_MAX_PIXELS"
        )
    if tensor.ndim == 3 and tensor.shape[0] not in (1, 2, 3, 4) and tensor.shape[-1] in (1, 2, 3, 4):
        tensor = tensor.permute(2, 0, 1)
    return to_rgb(tensor, name)


def crop(image: torch.Tensor, box: Box | None, name: str = "<tensor>") -> torch.Tensor:
    """Crop a CHW tensor to ``box = (top, left, height, width)``; ``None`` keeps it whole."""
    if box is None:
        return image
    _, h, w = image.shape
    check_box(box, (h, w), name)
    top, left, height, width = box
    return image[:, top : top + height, left : left + width]


def check_box(box: Box, image_hw: tuple[int, int], name: str = "<tensor>") -> None:
    """Raise unless the crop box ``(top, left, height, width)`` fits in an image of ``image_hw = (height, width)``.

    Raises:
        DecodeError: it does not fit (the message names ``name``).
    """
    top, left, height, width = box
    h, w = image_hw
    if top < 0 or left < 0 or height <= 0 or width <= 0 or top + height > h or left + width > w:
        raise DecodeError(
            f"{name}: crop box (top={top}, left={left}, height={height}, width={width}) "
            f"does not fit in the {h}x{w} image; fix the crop box of this source (--crop, crop=)"
        )


def resize(image: torch.Tensor, size: Sequence[int] | None) -> torch.Tensor:
    """Resize a uint8 CHW tensor to ``size = (height, width)`` with antialiasing: torchvision's ``resize``, to the bit.

    One image on the CPU where torchvision resizes uint8 natively takes its kernel's own
    steps without its per-call dispatch, the same pixels and strides
    (``tests/test_decode_resize.py``); anything else goes through ``torchvision.transforms.v2.functional.resize``.
    """
    if size is None or tuple(image.shape[-2:]) == tuple(size):
        return image
    height, width = int(size[0]), int(size[1])
    if image.ndim == 3 and image.dtype == torch.uint8 and image.device.type == "cpu" and image.numel() and _native_uint8():
        channels, old_height, old_width = image.shape
        batch = image.reshape(-1, channels, old_height, old_width)  # as torchvision's resize_image, step by step
        strides = batch.stride()
        if batch.is_contiguous(memory_format=torch.channels_last) and image.numel() != strides[0]:
            # torchvision's restride of a channels_last 1CHW batch, so that the output keeps that layout
            batch = batch.as_strided((1, channels, old_height, old_width), [image.numel(), *strides[1:]])
        out = torch.nn.functional.interpolate(batch, size=[height, width], mode="bilinear", align_corners=False,
                                              antialias=True)
        return out.reshape(channels, height, width)
    return _functional().resize(image, [height, width], antialias=True)


@functools.cache
def _native_uint8() -> bool:
    """Whether torchvision resizes uint8 images bilinearly as they are on this CPU (else through float32)."""
    try:
        from torchvision.transforms.v2 import InterpolationMode
        from torchvision.transforms.v2.functional._geometry import _do_native_uint8_resize_on_cpu
    except ImportError:  # another torchvision: its public resize, always
        return False
    return bool(_do_native_uint8_resize_on_cpu(InterpolationMode.BILINEAR))


@functools.cache
def _torchvision_io() -> Any:
    """torchvision.io, imported on the first image it decodes: importing torchvision costs a second
    (its models import torch._dynamo), which a process that reads pixel shards or only packs PNGs never pays."""
    import torchvision.io

    return torchvision.io


@functools.cache
def _functional() -> Any:
    """torchvision's v2 functional transforms, imported on the first resize (not at every one)."""
    from torchvision.transforms.v2 import functional

    return functional


def decode_sample(data: bytes | bytearray | memoryview | np.ndarray, name: str, box: Box | None = None) -> torch.Tensor:
    """Decode one sample file by its suffix (image or array) and apply its source's crop."""
    suffix = os.path.splitext(name)[1].lower()  # PurePath(name).suffix, without building a path per sample
    image = decode_array(data, name) if suffix in ARRAY_SUFFIXES else decode_image(data, name)
    return crop(image, box, name)
