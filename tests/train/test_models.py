"""Models by name, random weights, the right number of classes; preprocessing on the device."""

from __future__ import annotations

import pytest
import torch

from stoker import ConfigError
from stoker.train import Preprocess, SmallCNN, build_model


def test_small_cnn_shapes() -> None:
    model = build_model("small_cnn", 7)
    assert isinstance(model, SmallCNN)
    assert model(torch.zeros(2, 3, 40, 56)).shape == (2, 7)


def test_torchvision_model_with_our_class_count_and_no_download() -> None:
    model = build_model("resnet18", 5)  # weights=None: builds offline
    assert model.fc.out_features == 5


def test_unknown_model_names_close_matches() -> None:
    with pytest.raises(ConfigError, match=r"did you mean resnet18"):
        build_model("resnet19", 10)
    with pytest.raises(ConfigError, match=r"num_classes must be a whole number >= 2"):
        build_model("small_cnn", 1)


def test_preprocess_turns_uint8_into_normalised_float() -> None:
    images = torch.full((2, 3, 4, 4), 255, dtype=torch.uint8)
    out = Preprocess(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))(images)
    assert out.dtype == torch.float32 and torch.allclose(out, torch.ones_like(out))
    floats = Preprocess(mean=(0.0,) * 3, std=(1.0,) * 3)(torch.full((1, 3, 2, 2), 0.25))
    assert torch.allclose(floats, torch.full_like(floats, 0.25))  # float input is taken as [0, 1]


def test_small_cnn_has_the_parameters_its_docstring_says() -> None:
    import re

    from stoker.train import SmallCNN

    said = [int(n.replace(",", "")) for n in re.findall(r"([0-9][0-9,]*) (?:parameters|per class|for 10)", SmallCNN.__doc__ or "")]
    blocks, per_class, ten = said
    count = sum(p.numel() for p in SmallCNN(10).parameters())
    assert count == ten == blocks + 10 * per_class
    assert sum(p.numel() for p in SmallCNN(3).parameters()) == blocks + 3 * per_class
