"""Decode a whole batch of JPEGs on a device: one header pass, one decode call, one resize per crop size.

1. **Headers, in one vectorised pass** (:func:`check_headers`): an image goes to the
   device only when every frame header in it declares a size within ``STOKER_MAX_PIXELS``
   with 1 or 3 components and no colour transform a GPU decoder may apply differently;
   anything refused takes the CPU path, which decodes it or names the file.
2. **One decode call** per budget of decoded bytes (:data:`DECODE_BUDGET_BYTES`):
   nvImageCodec where installed (``pip install "stoker[gpu]"``), which decodes only the
   crop box, else ``torchvision.io.decode_jpeg(list, device=...)``.
3. **Crop by slicing (or by the region decode), one antialiased resize per crop size**,
   the same arithmetic on every device, so the CPU tests check the GPU's.

On CUDA the work runs on the decoder's own stream, and :meth:`DeviceDecoder.decode`
returns the batch with a :class:`Ready` event the consumer waits on. The design notes
(``docs/design.md``, "Decoding a batch on the device") give each step in full.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from stoker.decode.image import Box, get_max_pixels

__all__ = [
    "DECODE_BUDGET_BYTES",
    "ENGINES",
    "Decoded",
    "DeviceDecoder",
    "Engine",
    "HeaderCheck",
    "Ready",
    "check_headers",
    "device_decoder",
    "nvimagecodec_available",
]

log = logging.getLogger(__name__)

Engine = Literal["auto", "nvimagecodec", "torchvision"]
ENGINES: tuple[Engine, ...] = ("auto", "nvimagecodec", "torchvision")

#: Decoded bytes (3 x declared pixels) handed to one decode call: a batch of huge images is
#: decoded a part at a time, so the device memory a batch takes is bounded whatever it holds.
DECODE_BUDGET_BYTES = 512 << 20

# Frame headers that declare an image size: SOF0-15 (less DHT, JPG, DAC), DHP, and JPEG-LS's SOF55.
_SIZE_MARKERS = np.zeros(256, dtype=bool)
_SIZE_MARKERS[[m for m in range(0xC0, 0xD0) if m not in (0xC4, 0xC8, 0xCC)] + [0xDE, 0xF7]] = True
_ADOBE = 0xEE  # APP14: Adobe's colour transform flag (RGB or YCCK stored without YCbCr)


@dataclass(frozen=True)
class HeaderCheck:
    """What :func:`check_headers` found, one entry per image.

    Attributes:
        ok: the image may be decoded on the device (``bool [n]``).
        pixels: the largest size any of its frame headers declares (``int64 [n]``; 0 when none).
    """

    ok: np.ndarray
    pixels: np.ndarray


def check_headers(joined: np.ndarray, offsets: np.ndarray, max_pixels: int | None = None) -> HeaderCheck:
    """Which images of a batch may go to a device decoder, read from every frame header at once.

    Args:
        joined: the batch's encoded bytes, one after the other (``uint8``).
        offsets: where each image starts, and the end (``int64 [n + 1]``).
        max_pixels: the pixel limit (default: :func:`stoker.decode.image.get_max_pixels`).

    A 0xFF followed by a size-declaring marker is taken as a frame header wherever it is,
    also inside another segment's payload (entropy-coded data cannot hold one: its 0xFF
    bytes are stuffed), so the largest of them bounds what a decoder will allocate; a
    header cut off by the end of the file, a zero size, or no header at all refuses the
    image. Refusing costs only the CPU path, never a wrong result.
    """
    limit = get_max_pixels() if max_pixels is None else max_pixels
    n = len(offsets) - 1
    starts, ends = offsets[:-1], offsets[1:]
    lengths = ends - starts
    size = len(joined)
    pixels = np.zeros(n, dtype=np.int64)
    if size < 2:
        return HeaderCheck(np.zeros(n, dtype=bool), pixels)

    def byte(at: np.ndarray) -> np.ndarray:  # the bytes at ``at``; reads past the end see zeros
        return np.where(at < size, joined[np.minimum(at, size - 1)], 0).astype(np.int64)

    ok = (lengths >= 4) & (byte(starts) == 0xFF) & (byte(starts + 1) == 0xD8) & (byte(starts + 2) == 0xFF)
    ff = np.flatnonzero(joined[:-1] == 0xFF)  # markers only where a 0xFF is: no table lookup per byte
    marker = joined[ff + 1]
    found = ff[_SIZE_MARKERS[marker]]
    adobe = ff[marker == _ADOBE]
    owner = np.searchsorted(offsets, found, side="right") - 1
    height = byte(found + 5) << 8 | byte(found + 6)
    width = byte(found + 7) << 8 | byte(found + 8)
    components = byte(found + 9)
    rgb_ids = (byte(found + 10) == ord("R")) & (byte(found + 13) == ord("G")) & (byte(found + 16) == ord("B"))
    bad = (
        (found + 10 > ends[owner])  # the header is cut off: its size cannot be told
        | (height == 0) | (width == 0)
        | ((components != 1) & (components != 3))
        | rgb_ids
    )
    np.maximum.at(pixels, owner, height * width)
    headers = np.bincount(owner, minlength=n)
    refused = np.bincount(owner, weights=bad.astype(np.float64), minlength=n) > 0
    refused |= np.bincount(np.searchsorted(offsets, adobe, side="right") - 1, minlength=n) > 0
    ok &= (headers > 0) & ~refused & (pixels <= limit)
    return HeaderCheck(ok, pixels)


class Ready:
    """The event a device batch is ready at; :meth:`wait` makes the consumer's stream wait for it (not the host)."""

    def __init__(self, event: Any, images: torch.Tensor) -> None:
        self.event = event
        self.images = images

    @classmethod
    def now(cls, images: torch.Tensor) -> Ready:
        """An event recorded now on the current stream, for ``images`` made there."""
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(images.device))
        return cls(event, images)

    def wait(self) -> None:
        """Order the current stream after the decode, and keep the batch's memory until that stream is done with it."""
        stream = torch.cuda.current_stream(self.images.device)
        stream.wait_event(self.event)
        self.images.record_stream(stream)


@dataclass
class Decoded:
    """A decoded batch: ``uint8 [n, 3, H, W]`` on the device, and the event it is ready at (None on the CPU)."""

    images: torch.Tensor
    ready: Ready | None
    on_cpu: int  # images that took the CPU path
    by_region: int = 0  # images the engine decoded only inside their crop box (nvImageCodec)


@dataclass
class _Part:
    """One decode call's images, as the engine gives them (uint8 on the device, None where one failed)."""

    images: list[torch.Tensor | None]
    hwc: bool  # [H, W, C] (nvImageCodec), else [C, H, W] (torchvision)
    cropped: np.ndarray  # bool [k]: decoded only inside the image's crop box
    owned: bool  # the engine owns the memory, outside torch's stream-ordered allocator


class DeviceDecoder:
    """Decodes batches of JPEGs on one device into one tensor, on a CUDA stream of its own.

    Args:
        device: where to decode (``"cuda:0"``; ``"cpu"`` runs the same ops on CPU tensors).
        engine: ``"auto"`` (on CUDA, nvImageCodec where installed and it starts, else
            torchvision; on the CPU, torchvision), ``"nvimagecodec"`` (on the CPU, its
            libjpeg-turbo backend: the same calls, which the CPU tests run) or ``"torchvision"``.
        roi: nvImageCodec decodes only the crop box of an image that has one.

    Example:
        >>> from stoker.decode.jpeg import decode_jpeg_resized
        >>> blobs = [np.fromfile(f"data/celeba/img/{name}.jpg", np.uint8) for name in ("000001", "000008")]
        >>> decoder = DeviceDecoder("cpu")  # "cuda": the same calls, on the GPU's own stream
        >>> on_cpu = lambda j: decode_jpeg_resized(blobs[j].tobytes(), (64, 64), None)
        >>> batch = decoder.decode(blobs, [None, (10, 10, 100, 100)], (64, 64), on_cpu)
        >>> batch.images.shape, batch.ready  # on CUDA, wait on batch.ready before using the images
        (torch.Size([2, 3, 64, 64]), None)
    """

    def __init__(self, device: str | torch.device, engine: Engine = "auto", roi: bool = True) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        if cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        self.roi = roi
        self._held = _Held(DECODE_BUDGET_BYTES)
        wanted = engine == "nvimagecodec" or (cuda and engine == "auto")
        self._nvimagecodec = _NvImageCodec.start(self.device) if wanted else None
        if engine == "nvimagecodec" and self._nvimagecodec is None:
            log.info("nvImageCodec is not available on %s: decoding with torchvision.io", self.device)
        self.engine: str = "nvimagecodec" if self._nvimagecodec is not None else "torchvision"

    def decode(
        self,
        blobs: Sequence[np.ndarray],
        boxes: Sequence[Box | None],
        size: tuple[int, int],
        on_cpu: Callable[[int], torch.Tensor],
    ) -> Decoded:
        """Decode, crop and resize a batch; image ``j`` the device cannot take goes by ``on_cpu(j)``.

        Args:
            blobs: each image's encoded bytes (``uint8`` arrays; read-only views are fine).
            boxes: each image's crop box ``(top, left, height, width)`` in its own pixels, or ``None``.
            size: ``(height, width)`` of every output image.
            on_cpu: decodes, crops and resizes image ``j`` on the CPU (raises on a bad image).

        Returns:
            The batch on the device, ready once :attr:`Decoded.ready` is waited on.
        """
        if self.stream is None:
            out, fell_back, by_region = self._decode(blobs, boxes, size, on_cpu)
            return Decoded(out, None, fell_back, by_region)
        with torch.cuda.stream(self.stream):
            out, fell_back, by_region = self._decode(blobs, boxes, size, on_cpu)
            event = torch.cuda.Event()
            event.record(self.stream)
        return Decoded(out, Ready(event, out), fell_back, by_region)

    def _decode(
        self,
        blobs: Sequence[np.ndarray],
        boxes: Sequence[Box | None],
        size: tuple[int, int],
        on_cpu: Callable[[int], torch.Tensor],
    ) -> tuple[torch.Tensor, int, int]:
        n = len(blobs)
        out = torch.empty((n, 3, *size), dtype=torch.uint8, device=self.device)
        if n == 0:
            return out, 0, 0
        arrays = [np.asarray(b, dtype=np.uint8).reshape(-1) for b in blobs]
        lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=n)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        joined = np.concatenate(arrays)
        checked = check_headers(joined, offsets)
        take = np.flatnonzero(checked.ok)
        views = torch.from_numpy(joined).split(lengths.tolist())  # one call: a view per image, no copy
        failed = np.flatnonzero(~checked.ok).tolist()
        # Parts of about one budget of decoded bytes (an image starts the part its first byte falls in).
        cost = checked.pixels[take] * 3
        part_of = (np.cumsum(cost) - cost) // DECODE_BUDGET_BYTES
        by_region = 0
        for part in np.unique(part_of):
            members = take[part_of == part]
            decoded = self._decode_part([views[j] for j in members.tolist()], [boxes[j] for j in members.tolist()])
            failed += self._crop_resize(decoded, members, boxes, size, out)
            by_region += int(decoded.cropped.sum())
            if decoded.owned and self.stream is not None:
                # nvImageCodec owns the decoded images' memory, outside torch's stream-ordered allocator:
                # they are let go only once the kernels reading them are done (the host does not wait here).
                done = torch.cuda.Event()
                done.record(self.stream)
                self._held.add(done, decoded.images, sum(int(im.numel()) for im in decoded.images if im is not None))
            del decoded
        for j in sorted(failed):  # not for the device, or it failed there: the CPU path decodes or raises
            out[j] = on_cpu(j).to(self.device)
        return out, len(failed), by_region

    def _decode_part(self, tensors: list[torch.Tensor], boxes: list[Box | None]) -> _Part:
        """One decode call over ``tensors`` (each image's bytes), by nvImageCodec or else torchvision."""
        if self._nvimagecodec is not None:
            try:
                images, cropped = self._nvimagecodec.decode(tensors, boxes if self.roi else None, self.stream)
                return _Part(images, True, cropped, True)
            except Exception as exc:  # noqa: BLE001 - the optional engine failing as a whole: torchvision from now on
                log.warning("nvImageCodec failed on %s (%s: %s); decoding with torchvision.io from now on",
                            self.device, type(exc).__name__, exc)
                self._nvimagecodec, self.engine = None, "torchvision"
        from torchvision.io import ImageReadMode, decode_jpeg

        whole = np.zeros(len(tensors), dtype=bool)
        try:
            return _Part(list(decode_jpeg(tensors, mode=ImageReadMode.RGB, device=self.device)), False, whole, False)
        except Exception as exc:  # noqa: BLE001 - one bad file fails the batch (whatever it raises): one at a time
            log.debug("batch JPEG decode on %s failed (%s); decoding image by image", self.device, exc)
        decoded: list[torch.Tensor | None] = []
        for tensor in tensors:
            try:
                decoded.append(decode_jpeg(tensor, mode=ImageReadMode.RGB, device=self.device))
            except Exception:  # noqa: BLE001 - crafted bytes may make the decoder raise anything: the CPU decides
                decoded.append(None)
        return _Part(decoded, False, whole, False)

    def _crop_resize(
        self,
        decoded: _Part,
        members: np.ndarray,
        boxes: Sequence[Box | None],
        size: tuple[int, int],
        out: torch.Tensor,
    ) -> list[int]:
        """``out[members] = resize(crop(decoded))``, one resize per crop size; the positions that failed.

        Within a crop size, images of one decoded size are stacked whole (contiguous inputs: one
        batched copy, where views would cost a copy each) and cropped by one slice, or by one
        gather where their boxes differ. An image decoded by region is its crop already.
        """
        images, hwc = decoded.images, decoded.hwc
        first = next((image for image in images if image is not None), None)
        if not hwc and first is not None and first.stride(0) == 1:  # CHW views of HWC memory (torchvision on the CPU)
            images, hwc = [None if image is None else image.permute(1, 2, 0) for image in images], True
        k = len(members)
        shapes = np.zeros((k, 3), dtype=np.int64)  # channels, height, width as decoded (0: not decoded)
        crops = np.zeros((k, 4), dtype=np.int64)
        for i, (image, j) in enumerate(zip(images, members.tolist(), strict=True)):
            if image is not None:
                shapes[i] = (image.shape[2], image.shape[0], image.shape[1]) if hwc else image.shape
                box = boxes[j]
                whole = box is None or decoded.cropped[i]
                crops[i] = (0, 0, shapes[i, 1], shapes[i, 2]) if whole else box
                if decoded.cropped[i] and (shapes[i, 1], shapes[i, 2]) != (box[2], box[3]):  # type: ignore[index]
                    shapes[i] = 0  # a region decode of another size than its box: the CPU path decides
        top, left, height, width = crops.T
        fits = (
            (shapes[:, 0] == 3) & (top >= 0) & (left >= 0) & (height > 0) & (width > 0)
            & (top + height <= shapes[:, 1]) & (left + width <= shapes[:, 2])
        )
        failed = members[~fits].tolist()  # not decoded, or the box is outside the image: the CPU path names the file
        good = np.flatnonzero(fits)
        if len(good) == 0:
            return failed
        keys = np.concatenate([crops[good, 2:], shapes[good, 1:]], axis=1)  # crop size, then decoded size
        groups, group_of = np.unique(keys, axis=0, return_inverse=True)
        group_of = group_of.reshape(-1)
        for crop_size in np.unique(groups[:, :2], axis=0).tolist():
            parts: list[torch.Tensor] = []
            order: list[np.ndarray] = []
            for g in np.flatnonzero((groups[:, :2] == crop_size).all(axis=1)):
                inside = good[group_of == g]
                whole = torch.stack([images[i] for i in inside.tolist()])  # type: ignore[misc]
                whole = whole.permute(0, 3, 1, 2) if hwc else whole
                parts.append(_crop(whole, top[inside], left[inside], *crop_size))
                order.append(members[inside])
            batch = parts[0] if len(parts) == 1 else torch.cat([p.contiguous() for p in parts])
            where = torch.from_numpy(np.concatenate(order)).to(self.device, non_blocking=True)
            out.index_copy_(0, where, resize_batch(batch, (int(size[0]), int(size[1]))))
        return failed


class _Held:
    """Objects kept alive until an event says the device work reading them is done, within a byte bound.

    A part is let go once its event has passed (``event.query()``); while more than ``most_bytes``
    are held, the host waits for the oldest part's event (``event.synchronize()``) and lets it go.
    """

    def __init__(self, most_bytes: int) -> None:
        self.most_bytes = most_bytes
        self.parts: deque[tuple[Any, Any, int]] = deque()
        self.bytes = 0
        self.lock = threading.Lock()  # loader threads share one decoder

    def add(self, event: Any, keep: Any, nbytes: int) -> None:
        """Hold ``keep`` (``nbytes`` of device memory) until ``event`` has passed; let go of what is done."""
        with self.lock:
            self.parts.append((event, keep, nbytes))
            self.bytes += nbytes
            while self.parts:
                oldest, _, size = self.parts[0]
                if not oldest.query():
                    if self.bytes <= self.most_bytes or len(self.parts) == 1:
                        break
                    oldest.synchronize()
                self.parts.popleft()
                self.bytes -= size


def _crop(whole: torch.Tensor, top: np.ndarray, left: np.ndarray, height: int, width: int) -> torch.Tensor:
    """Crop each image of ``whole`` (``[k, C, H, W]``) at its own ``(top, left)``: one slice when they agree, else one gather."""
    if (top == top[0]).all() and (left == left[0]).all():
        t, le = int(top[0]), int(left[0])
        return whole[:, :, t : t + height, le : le + width]
    device = whole.device
    k = torch.arange(len(top), device=device)[:, None, None, None]
    c = torch.arange(whole.shape[1], device=device)[None, :, None, None]
    rows = (torch.from_numpy(top).to(device)[:, None] + torch.arange(height, device=device))[:, None, :, None]
    cols = (torch.from_numpy(left).to(device)[:, None] + torch.arange(width, device=device))[:, None, None, :]
    return whole[k, c, rows, cols]


def resize_batch(images: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Antialiased bilinear resize of a ``uint8 [k, 3, h, w]`` batch through float, rounded: the same on every device."""
    if tuple(images.shape[-2:]) == tuple(size):
        return images
    scaled = torch.nn.functional.interpolate(
        images.float(), size=list(size), mode="bilinear", antialias=True, align_corners=False
    )
    return scaled.round_().clamp_(0, 255).to(torch.uint8)


class _NvImageCodec:
    """nvImageCodec's batched decoder: on CUDA the hardware JPEG engine first, then nvJPEG; on the CPU libjpeg-turbo.

    The CPU backend (nvImageCodec 0.9 and later) runs the same calls, region decode included, so
    the CPU tests check this code; ``bash benchmarks/gpu_check.sh decode`` measures the GPU's.
    """

    def __init__(self, module: Any, decoder: Any, params: Any, device: torch.device) -> None:
        self.module = module
        self.decoder = decoder
        self.params = params
        self.device = device
        self.lock = threading.Lock()  # one decoder, loader threads take turns

    @classmethod
    def start(cls, device: torch.device) -> _NvImageCodec | None:
        """The decoder on ``device``, or None when the package is missing or does not start there."""
        try:
            from nvidia import nvimgcodec  # type: ignore[import-not-found]
        except ImportError:
            return None
        try:
            kinds = nvimgcodec.BackendKind
            if device.type == "cuda":
                device_id = device.index or 0
                backends = [nvimgcodec.Backend(kinds.HW_GPU_ONLY), nvimgcodec.Backend(kinds.GPU_ONLY)]
            else:  # an AttributeError before 0.9 (no CPU-only decoder): torchvision decodes
                device_id = nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY
                backends = [nvimgcodec.Backend(kinds.CPU_ONLY)]
            # RGB out of grey images too (the CPU path's convert("RGB")); no EXIF turn (the CPU path makes none)
            params = nvimgcodec.DecodeParams(apply_exif_orientation=False, allow_any_depth=False,
                                             color_spec=nvimgcodec.ColorSpec.SRGB)
            try:  # libjpeg-turbo's chroma upsampling, as the CPU path decodes
                decoder = nvimgcodec.Decoder(device_id=device_id, backends=backends, options=":fancy_upsampling=1")
            except Exception:  # noqa: BLE001 - an option this version does not know: its default
                decoder = nvimgcodec.Decoder(device_id=device_id, backends=backends)
        except Exception as exc:  # noqa: BLE001 - no engine, no driver: torchvision decodes
            log.info("nvImageCodec did not start on %s (%s): decoding with torchvision.io", device, exc)
            return None
        return cls(nvimgcodec, decoder, params, device)

    def decode(
        self, tensors: list[torch.Tensor], boxes: list[Box | None] | None, stream: Any
    ) -> tuple[list[torch.Tensor | None], np.ndarray]:
        """HWC uint8 tensors (each keeps its nvImageCodec image alive; None where one failed), and which are crops.

        An image whose box lies inside the size its code stream declares is decoded only
        there (a region decode); any other box is left to :meth:`DeviceDecoder._crop_resize`,
        which refuses it, so the CPU path names the file.
        """
        n = len(tensors)
        cropped = np.zeros(n, dtype=bool)
        streams: list[Any] = []
        at: list[int] = []  # the input position of each stream
        for i, tensor in enumerate(tensors):
            try:  # the bytes stay alive: the batch's joined array outlives the decode and its stream's sync
                code = self.module.CodeStream(tensor.numpy())
                box = boxes[i] if boxes is not None else None
                if box is not None:
                    top, left, height, width = (int(v) for v in box)
                    if top >= 0 and left >= 0 and height > 0 and width > 0 \
                            and top + height <= code.height and left + width <= code.width:
                        region = self.module.Region(top, left, top + height, left + width)
                        code = code.get_sub_code_stream(region=region)
                        cropped[i] = True
            except Exception:  # noqa: BLE001 - a code stream it cannot parse: the CPU path decides
                cropped[i] = False
                continue
            streams.append(code)
            at.append(i)
        if not streams:
            return [None] * n, cropped
        with self.lock:
            if self.device.type == "cuda":
                images = self.decoder.decode(streams, params=self.params, cuda_stream=stream.cuda_stream)
            else:
                images = self.decoder.decode(streams, params=self.params)
        out: list[torch.Tensor | None] = [None] * n
        for i, image in zip(at, images, strict=True):
            if image is None:
                cropped[i] = False
            elif self.device.type == "cuda":
                out[i] = torch.as_tensor(image, device=self.device)
            else:  # host memory: the array keeps the image alive
                out[i] = torch.from_numpy(np.asarray(image))
        return out, cropped


def nvimagecodec_available() -> bool:
    """Whether the optional nvImageCodec package (``stoker[gpu]``) can be imported."""
    try:
        from nvidia import nvimgcodec  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return False
    return True


_decoders: dict[tuple[str, str], DeviceDecoder] = {}
_decoders_lock = threading.Lock()


def device_decoder(device: str | torch.device, engine: Engine = "auto") -> DeviceDecoder:
    """The process's one :class:`DeviceDecoder` for ``device`` (its stream and engine made once)."""
    key = (str(torch.device(device)), engine)
    with _decoders_lock:
        if key not in _decoders:
            _decoders[key] = DeviceDecoder(device, engine)
        return _decoders[key]
