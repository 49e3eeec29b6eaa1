"""stoker's resize is torchvision's resize to the bit: the same pixels and the same strides, for every layout it meets."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F

from stoker.decode.image import _native_uint8, crop, decode_image, resize


def _jpeg(height: int, width: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def _layouts(seed: int) -> list[torch.Tensor]:
    decoded = decode_image(_jpeg(218, 178, seed), "x.jpg")  # as torchvision decodes: a CHW view of HWC memory
    contiguous = torch.from_numpy(np.random.default_rng(seed).integers(0, 255, (3, 90, 70), dtype=np.uint8))
    return [
        decoded,
        crop(decoded, (40, 20, 138, 138)),
        decoded.contiguous(),
        crop(decoded.contiguous(), (3, 5, 100, 77)),
        contiguous,
        contiguous.permute(0, 2, 1),
        decoded[:, ::2, ::3],
    ]


@pytest.mark.parametrize("size", [(112, 112), (64, 80), (300, 250), (16, 9)])
def test_resize_equals_torchvision_pixels_and_strides(size: tuple[int, int]) -> None:
    for seed in range(3):
        for image in _layouts(seed):
            ours, theirs = resize(image, size), F.resize(image, list(size), antialias=True)
            assert ours.shape == theirs.shape == (3, *size)
            assert torch.equal(ours, theirs)
            assert ours.stride() == theirs.stride() and ours.dtype == torch.uint8


def test_what_it_does_not_take_itself_goes_to_torchvision() -> None:
    floats = torch.rand(3, 20, 30)
    assert torch.equal(resize(floats, (10, 12)), F.resize(floats, [10, 12], antialias=True))
    batch = torch.randint(0, 255, (2, 3, 20, 30), dtype=torch.uint8)
    assert torch.equal(resize(batch, (10, 12)), F.resize(batch, [10, 12], antialias=True))
    image = torch.randint(0, 255, (3, 20, 30), dtype=torch.uint8)
    assert resize(image, (20, 30)) is image and resize(image, None) is image
    assert isinstance(_native_uint8(), bool)
