"""Decode a batch of JPEGs fast, to the same pixels as the full path: decode, crop, resize.

One file has one answer: every reader (files, encoded shards by either decoder, ``stoker
verify``, the GPU path's fallback) gives the pixels of the full path, a full-size decode,
the crop, then :func:`stoker.decode.image.resize`. This module's path decodes with
libjpeg-turbo through `simplejpeg <https://gitlab.com/jfolz/simplejpeg>`_ (which bundles
it; its decode equals torchvision's bit for bit, which is checked once per process
before it is used) at full scale, and is faster than the
full path by how it handles memory: the decoder writes into a buffer each thread keeps
(memory already mapped: a fresh array per image costs a page fault per 4 KiB), the
resize reads a chunk of crops where they are, and one numpy copy puts them in the batch.

It never decodes at a reduced DCT scale (``m/8``): that result differs from the full path
by as much as the image's high frequencies and its quantisation tables make it (a noise
image or a crafted table, unbounded), and neither the header nor the reduced decode
shows how much. docs/format-pixels.md states the rule.

Where this path cannot read the file (CMYK, a decoder warning, simplejpeg not installed),
the functions return ``None`` and the caller takes the full path (:func:`decode_sample` +
:func:`resize`), which also names the file in its error.

:func:`decode_batch_on_device` decodes a whole batch on a CUDA device
(:mod:`stoker.decode.device`: one header pass, one decode call, one resize per crop size)
and falls back to the CPU image by image when a decode fails or there is no CUDA device.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from stoker.decode.image import Box, decode_sample, get_max_pixels, resize

__all__ = [
    "available",
    "decode_batch_on_device",
    "decode_jpeg_resized",
    "decode_jpegs_into",
    "decode_stored",
    "is_jpeg",
]

log = logging.getLogger(__name__)

_simplejpeg: Any | None = None
_checked = False


def available() -> bool:
    """Whether the fast JPEG decoder (the ``simplejpeg`` package) is installed."""
    return _decoder() is not None


def _decoder() -> Any | None:
    global _simplejpeg, _checked
    if not _checked:
        try:
            import simplejpeg
        except ImportError:
            simplejpeg = None
        with _check_lock:
            if not _checked:
                if simplejpeg is not None and not _same_pixels_as_the_full_path(simplejpeg):
                    log.warning(
                        "simplejpeg %s decodes other pixels than torchvision's JPEG decoder here (another "
                        "libjpeg-turbo build): every JPEG takes the full path, so that one file gives one answer",
                        getattr(simplejpeg, "__version__", "?"),
                    )
                    simplejpeg = None
                _simplejpeg, _checked = simplejpeg, True
    return _simplejpeg


_check_lock = threading.Lock()


def _same_pixels_as_the_full_path(simplejpeg: Any) -> bool:
    """Whether simplejpeg decodes as the full path does, bit for bit, on this install (checked once per process).

    The rule (one file, one answer) rests on both being the same libjpeg-turbo IDCT,
    upsampling and colour conversion; two builds could differ, so a few small noise
    JPEGs (every chroma subsampling Pillow writes, gray, progressive, odd sizes) are
    decoded both ways before the fast path is trusted.
    """
    import io

    from PIL import Image

    from stoker.decode.image import decode_image

    noise = np.random.default_rng(0).integers(0, 256, (29, 37, 3), dtype=np.uint8)
    cases: list[tuple[Image.Image, dict[str, Any]]] = [
        (Image.fromarray(noise), {"subsampling": sub}) for sub in (0, 1, 2)
    ] + [(Image.fromarray(noise).convert("L"), {}), (Image.fromarray(noise), {"progressive": True})]
    for image, options in cases:
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=90, **options)
        data = buffer.getvalue()
        try:
            fast = simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
        except Exception:  # noqa: BLE001 - a broken install: the full path it is
            return False
        if not np.array_equal(fast.transpose(2, 0, 1), decode_image(data, "check.jpg").numpy()):
            return False
    return True


def is_jpeg(data: np.ndarray | bytes) -> bool:
    """Whether the bytes start with a JPEG start-of-image marker."""
    head = bytes(data[:3])
    return head == b"\xff\xd8\xff"


def decode_jpeg_resized(
    data: np.ndarray | bytes, size: tuple[int, int], box: Box | None = None
) -> torch.Tensor | None:
    """Decode a JPEG, crop it to ``box`` and resize it to ``size``: the full path's pixels, faster.

    Args:
        data: the encoded bytes (a read-only view is fine).
        size: ``(height, width)`` of the result.
        box: ``(top, left, height, width)`` in pixels of the full-size image, or ``None``.

    Returns:
        ``uint8 [3, height, width]`` (contiguous), equal to
        ``resize(crop(decode_image(data), box), size)``; or ``None`` when this path
        cannot be sure of that (not a JPEG, CMYK, a warning from the decoder, a box
        outside the image, simplejpeg missing): then take the full path.

    Example:
        >>> from pathlib import Path
        >>> image = decode_jpeg_resized(Path("data/celeba/img/000001.jpg").read_bytes(), (112, 112), (40, 20, 138, 138))
        >>> image.shape
        torch.Size([3, 112, 112])
    """
    simplejpeg = _decoder()
    plan = _plan_of(simplejpeg, data, box) if simplejpeg is not None else None
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

    Each image is decoded at full scale straight into a buffer this thread reuses (a fresh one per image costs a page fault per 4 KiB on
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
        plan = _plan_of(simplejpeg, data, box)
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


def _plan_of(simplejpeg: Any, data: np.ndarray | bytes, box: Box | None) -> _Plan | None:
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
    return _plan(height, width, None if box is None else tuple(box))  # type: ignore[arg-type]


def _plan(height: int, width: int, box: Box | None) -> _Plan | None:
    """The decoded size and the crop of a ``height x width`` JPEG, or ``None`` for a box outside it."""
    if box is not None:
        top, left, box_h, box_w = box
        if top < 0 or left < 0 or box_h <= 0 or box_w <= 0 or top + box_h > height or left + box_w > width:
            return None  # the full path raises the error that names the file
    return height, width, box


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

    With ``reduced`` (the default decoder; the name is kept from when that path decoded at
    a reduced DCT scale) a JPEG goes by :func:`decode_jpeg_resized` where it can, to the
    same pixels; everything else, and whatever that path does not take, goes by the full
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

