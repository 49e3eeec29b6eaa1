"""Decode a JPEG only as far as it is used: at a reduced DCT scale, then crop and resize.

A loader cannot decode faster than its decoder unless it decodes less. When the image
is read at a known output size, this module decodes it with libjpeg-turbo (through
`simplejpeg <https://gitlab.com/jfolz/simplejpeg>`_, which bundles it) at the smallest
power-of-two scale ``m/8`` (``m`` = 1, 2, 4, 8; libjpeg-turbo has fast paths for these)
that keeps the crop box at least twice as big as the output, then crops and resizes with the
same antialiased resize as the full path (:func:`stoker.decode.image.resize`). At scale 1 it
is still about twice as fast as the full path: the decoder writes into a buffer each
thread keeps (memory already mapped: a fresh array per image costs a page fault per
4 KiB), the resize reads a chunk of crops where they are, and one numpy copy puts them
in the batch.

Where the result could differ from the full path by more than rounding, or where this
path cannot read the file (CMYK, a decoder warning, simplejpeg not installed), the
functions return ``None`` and the caller takes the full path (:func:`decode_sample` +
:func:`resize`), which also names the file in its error.

:func:`decode_batch_on_device` decodes a whole batch on a CUDA device
(:mod:`stoker.decode.device`: one header pass, one decode call, one resize per crop size)
and falls back to the CPU image by image when a decode fails or there is no CUDA device.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from stoker.decode.image import Box, decode_sample, get_max_pixels, resize

__all__ = [
    "JPEG_SCALES",
    "available",
    "decode_batch_on_device",
    "decode_jpeg_resized",
    "decode_jpegs_into",
    "decode_stored",
    "is_jpeg",
    "reduced_scale",
]

log = logging.getLogger(__name__)

# The reduced image is at least this many times the output, so that the antialiased resize
# after it, not the decoder's own reduction (a box filter), shapes the result: then it is
# within a grey level or two of the full path (tests/test_jpeg.py pins it).
MARGIN = 2.0

# Scales m/8 libjpeg-turbo decodes with SIMD or a dedicated reduced IDCT (others, such
# as 7/8, use a generic C IDCT that is slower than decoding at full size).
JPEG_SCALES: tuple[int, ...] = (1, 2, 4, 8)

_simplejpeg: Any | None = None
_checked = False


def available() -> bool:
    """Whether the reduced-scale decoder (the ``simplejpeg`` package) is installed."""
    return _decoder() is not None


def _decoder() -> Any | None:
    global _simplejpeg, _checked
    if not _checked:
        try:
            import simplejpeg
        except ImportError:
            simplejpeg = None
        _simplejpeg, _checked = simplejpeg, True
    return _simplejpeg


def is_jpeg(data: np.ndarray | bytes) -> bool:
    """Whether the bytes start with a JPEG start-of-image marker."""
    head = bytes(data[:3])
    return head == b"\xff\xd8\xff"


def reduced_scale(image_hw: tuple[int, int], box: Box | None, size: tuple[int, int]) -> int:
    """The ``m`` of the smallest DCT scale ``m/8`` at which ``box`` still covers ``MARGIN x size``.

    The box must land on whole pixels of the scaled image (every corner a multiple of
    ``8/m``), so that cropping after the reduced decode takes the same part of the image
    as cropping before a full one; otherwise the next larger scale is tried, down to 8
    (full size).
    """
    height, width = image_hw
    top, left, box_h, box_w = box if box is not None else (0, 0, height, width)
    out_h, out_w = size
    for m in JPEG_SCALES:
        if m == 8:
            return 8
        if box_h * m < 8 * MARGIN * out_h or box_w * m < 8 * MARGIN * out_w:
            continue  # too close to the output size: the decoder's box filter would show
        edges = (top, left, box_h, box_w) if box is not None else (height, width)
        if all(edge * m % 8 == 0 for edge in edges):
            return m
    return 8


def decode_jpeg_resized(
    data: np.ndarray | bytes, size: tuple[int, int], box: Box | None = None
) -> torch.Tensor | None:
    """Decode a JPEG, crop it to ``box`` and resize it to ``size``, decoding no more than needed.

    Args:
        data: the encoded bytes (a read-only view is fine).
        size: ``(height, width)`` of the result.
        box: ``(top, left, height, width)`` in pixels of the full-size image, or ``None``.

    Returns:
        ``uint8 [3, height, width]`` (contiguous), within 2 grey levels (mean absolute difference) of
        ``resize(crop(decode_image(data), box), size)``; or ``None`` when this path
        cannot be sure of that (not a JPEG, CMYK, a warning from the decoder, a box
        outside the image, simplejpeg missing): then take the full path.

    Example:
        >>> image = decode_jpeg_resized(open("000001.jpg", "rb").read(), (112, 112), (40, 20, 138, 138))  # doctest: +SKIP
        >>> image.shape  # doctest: +SKIP
        torch.Size([3, 112, 112])
    """
    simplejpeg = _decoder()
    plan = _plan_of(simplejpeg, data, box, size) if simplejpeg is not None else None
    if plan is None:  # before allocating anything: most callers then take the full path
        return None
    out = np.empty((1, 3, *size), dtype=np.uint8)
    if _decode_group(simplejpeg, [data], [0], plan, size, out):
        return None
    return torch.from_numpy(out[0])


def decode_jpegs_into(
    blobs: Sequence[np.ndarray | bytes], boxes: Sequence[Box | None], size: tuple[int, int], out: torch.Tensor
) -> list[int]:
    """Decode a batch of JPEGs into ``out`` (``uint8 [n, 3, height, width]``, contiguous), resizing them together.

    Each image is decoded at its reduced scale (:func:`reduced_scale`) straight into a
    buffer this thread reuses (a fresh one per image costs a page fault per 4 KiB on
    every decode); images of one decoded size and crop are resized by one call per
    :data:`CHUNK_BYTES` of decoded pixels (one antialiased resize of a ``[k, 3, h, w]``
    batch costs a fraction of ``k`` calls) and copied into ``out`` once. The result
    equals :func:`decode_jpeg_resized` image by image.

    Returns:
        The positions this path did not fill (see :func:`decode_jpeg_resized` for when),
        in order: the caller decodes those by the full path.
    """
    simplejpeg = _decoder()
    if simplejpeg is None:
        return list(range(len(blobs)))
    failed: list[int] = []
    groups: dict[_Plan, list[int]] = {}
    for j, (data, box) in enumerate(zip(blobs, boxes, strict=True)):
        plan = _plan_of(simplejpeg, data, box, size)
        if plan is None:
            failed.append(j)
        else:
            groups.setdefault(plan, []).append(j)
    out_array = out.numpy()
    for plan, members in groups.items():
        failed += _decode_group(simplejpeg, blobs, members, plan, size, out_array)
    return sorted(failed)


# Decoded pixels resized by one call: big enough that the call's fixed cost vanishes, small
# enough to stay in the CPU's caches between the decode and the resize (and to bound the
# buffer each thread keeps).
CHUNK_BYTES = 4 << 20

# (decoded height, decoded width, crop box in decoded pixels or None)
_Plan = tuple[int, int, "Box | None"]


class _Scratch(threading.local):
    """A decode buffer per thread, made once: reused, its pages are already mapped."""

    def __init__(self) -> None:
        self.buffer = np.empty(0, dtype=np.uint8)

    def take(self, nbytes: int) -> np.ndarray:
        if nbytes > CHUNK_BYTES:  # one image larger than a chunk: its own buffer, not kept
            return np.empty(nbytes, dtype=np.uint8)
        if self.buffer.size < CHUNK_BYTES:
            self.buffer = np.empty(CHUNK_BYTES, dtype=np.uint8)
        return self.buffer[:nbytes]


_scratch = _Scratch()


def _plan_of(simplejpeg: Any, data: np.ndarray | bytes, box: Box | None, size: tuple[int, int]) -> _Plan | None:
    """How to decode one JPEG (see :func:`_plan`), or ``None`` when this path cannot take it."""
    if not is_jpeg(data):
        return None
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except Exception:  # crafted headers raise KeyError and more, not only ValueError: the full path decides
        return None
    if height * width > get_max_pixels():
        return None  # before any allocation: the full path refuses it with the error that names the file
    if colorspace not in ("YCbCr", "Gray", "RGB"):
        return None  # CMYK/YCCK: libjpeg-turbo's RGB conversion of these is not the reference's
    return _plan(height, width, None if box is None else tuple(box), tuple(size))  # type: ignore[arg-type]


@functools.lru_cache(maxsize=4096)
def _plan(height: int, width: int, box: Box | None, size: tuple[int, int]) -> _Plan | None:
    """The decoded size and the crop in its pixels of a ``height x width`` JPEG (a data set has few of these)."""
    if box is not None:
        top, left, box_h, box_w = box
        if top < 0 or left < 0 or box_h <= 0 or box_w <= 0 or top + box_h > height or left + box_w > width:
            return None  # the full path raises the error that names the file
    m = reduced_scale((height, width), box, size)
    want_h, want_w = -(-height * m // 8), -(-width * m // 8)
    if box is None:
        return want_h, want_w, None
    scaled = tuple(v * m // 8 for v in box)
    return want_h, want_w, scaled  # type: ignore[return-value]


def _decode_group(
    simplejpeg: Any,
    blobs: Sequence[np.ndarray | bytes],
    members: list[int],
    plan: _Plan,
    size: tuple[int, int],
    out: np.ndarray,
) -> list[int]:
    """Decode the images ``members`` (one plan) a chunk at a time, resize each chunk into ``out``; the ones that failed."""
    want_h, want_w, crop = plan
    per_image = want_h * want_w * 3
    chunk = max(1, CHUNK_BYTES // per_image)
    failed: list[int] = []
    for start in range(0, len(members), chunk):
        part = members[start : start + chunk]
        buffer = _scratch.take(len(part) * per_image).reshape(len(part), want_h, want_w, 3)
        done: list[int] = []
        for j in part:
            slot = buffer[len(done)]
            try:
                pixels = simplejpeg.decode_jpeg(
                    blobs[j], colorspace="RGB", min_height=want_h, min_width=want_w, strict=True, buffer=slot
                )
            except Exception:  # corrupt, unusual or crafted (any error simplejpeg raises): the full path decides
                failed.append(j)
                continue
            if pixels.shape != (want_h, want_w, 3):
                failed.append(j)
                continue
            if not np.shares_memory(pixels, slot):
                slot[...] = pixels
            done.append(j)
        if done:
            _resize_into(buffer[: len(done)], crop, done, size, out)
    return failed


def _resize_into(images: np.ndarray, crop: Box | None, positions: list[int], size: tuple[int, int], out: np.ndarray) -> None:
    """``out[positions] = resize(crop(images))``: one resize of the HWC batch ``images``, one copy into NCHW ``out``."""
    if crop is not None:
        top, left, height, width = crop
        images = images[:, top : top + height, left : left + width]
    resized = resize(torch.from_numpy(images).permute(0, 3, 1, 2), size).numpy()  # [k, 3, H, W], channels last
    # numpy's copy of the transposed batch is several times faster than torch's copy_.
    first = positions[0]
    if positions[-1] - first == len(positions) - 1:  # in order, side by side (positions ascend)
        out[first : first + len(positions)] = resized
    else:
        out[positions] = resized


def decode_batch_on_device(
    blobs: Sequence[np.ndarray],
    boxes: Sequence[Box | None],
    size: tuple[int, int],
    device: torch.device,
    on_cpu: Callable[[int], torch.Tensor],
) -> torch.Tensor:
    """Decode a batch of JPEGs on a CUDA device, crop and resize there (:mod:`stoker.decode.device`).

    Falls back to ``on_cpu(j)`` for image ``j`` when the device cannot decode it (not a
    JPEG, corrupt, CMYK, whatever the decoder raises), when a header declares more than
    ``STOKER_MAX_PIXELS`` (or cannot be read: a device decoder allocates what it
    declares), and for every image when ``device`` is not CUDA or CUDA is not available,
    so the result is the same batch either way (within the decoders' rounding). The
    calling thread's current stream waits for the batch.

    Args:
        blobs: each image's encoded bytes.
        boxes: each image's crop box in its own pixels, or ``None``.
        size: ``(height, width)`` of every output image.
        device: where to decode; the batch comes back there.
        on_cpu: decodes, crops and resizes image ``j`` on the CPU (raises on a bad image).

    Returns:
        ``uint8 [len(blobs), 3, height, width]`` on ``device`` (on the CPU when it fell
        back for every image).
    """
    n = len(blobs)
    if device.type != "cuda" or not torch.cuda.is_available() or n == 0:
        out = torch.empty((n, 3, *size), dtype=torch.uint8)
        for j in range(n):
            out[j] = on_cpu(j)
        return out
    from stoker.decode.device import device_decoder

    batch = device_decoder(device).decode(blobs, boxes, size, on_cpu)
    if batch.ready is not None:
        batch.ready.wait()
    return batch.images


def decode_stored(
    data: np.ndarray | bytes, name: str, box: Box | None, size: tuple[int, int] | None, reduced: bool = True
) -> torch.Tensor:
    """One stored image as a training read on the CPU decodes it: cropped to ``box``, resized to ``size``.

    With ``reduced`` (the default decoder) a JPEG goes by :func:`decode_jpeg_resized`
    where it can; everything else, and whatever that path does not take, goes by the full
    path (:func:`stoker.decode.image.decode_sample`, then :func:`stoker.decode.image.resize`). The
    shard reader and ``stoker verify`` both decode through here, so a row verify calls
    ok is a row training reads.

    Raises:
        DecodeError: the image does not decode, or declares more pixels than the limit
            (the message names ``name``).
    """
    if reduced and size is not None:
        image = decode_jpeg_resized(data, size, box)
        if image is not None:
            return image
    return resize(decode_sample(data, name, box), size)

