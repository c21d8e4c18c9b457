"""toy-vit: architecture, offline loading, accuracy on fresh held-out scenes."""

import json
import time

import numpy as np
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from lrp_core.data import CLASS_NAMES, make_scenes
from lrp_core.models import load
from lrp_core.models.toy_vit import ASSET_DIR, toy_vit_preprocess

HELD_OUT = 987_654  # far from the training pool (seeds >= 10^8) and the script's own evaluation seeds


@pytest.fixture(scope="module")
def toy():
    t = time.perf_counter()
    m = load("toy-vit")
    m.info["_load_seconds"] = time.perf_counter() - t
    return m


def test_loads_offline_quickly_as_a_token_pooled_timm_vit(toy):
    assert toy.info["_load_seconds"] < 10
    assert isinstance(toy.model, VisionTransformer) and toy.model.global_pool == "token"
    assert toy.model.num_prefix_tokens == 1 and toy.model.patch_embed.num_patches == 64
    assert not toy.model.training and toy.kind == "image"
    assert list(toy.labels) == list(CLASS_NAMES)


def test_committed_assets():
    weights = ASSET_DIR / "model.safetensors"
    assert weights.is_file() and weights.stat().st_size < 20e6
    info = json.loads((ASSET_DIR / "info.json").read_text())
    assert info["class_names"] == list(CLASS_NAMES)
    assert info["accuracy"]["single_object_accuracy"] >= 0.95
    assert info["accuracy"]["two_object_top2_accuracy"] >= 0.90
    assert info["training"]["seconds"] <= 600  # the recipe's own measured time, pool included


def test_single_object_accuracy_on_held_out_scenes(toy):
    s = make_scenes(300, HELD_OUT, n_objects=1)
    with torch.no_grad():
        acc = (toy.model(s.images).argmax(1) == s.labels[:, 0]).float().mean().item()
    print(f"toy-vit single-object accuracy (300 held-out scenes): {acc:.3f}")
    assert acc >= 0.95


def test_two_object_scenes_top2_reach_the_target(toy):
    """Both present classes are the top-2 logits in >= 90 % of 2,000 held-out two-object scenes."""
    s = make_scenes(2000, HELD_OUT + 1, n_objects=2)
    with torch.no_grad():
        top2 = toy.model(s.images).topk(2, dim=1).indices.sort(1).values
    rate = (top2 == s.labels.sort(1).values).all(1).float().mean().item()
    print(f"toy-vit two-object top-2 rate (2,000 held-out scenes): {rate:.4f}")
    assert rate >= 0.90


def test_preprocess_matches_scene_normalisation(toy):
    s = make_scenes(4, 3, n_objects=1)
    u8 = (s.rgb[0] * 255).round().astype(np.uint8)
    x = toy.preprocess(u8)
    assert x.shape == (1, 3, 64, 64)
    assert torch.allclose(x, s.images[:1], atol=1 / 255 / 0.25 + 1e-5)
    # float arrays, PIL images and larger photos are accepted; resized to 64 x 64
    assert torch.allclose(toy_vit_preprocess(s.rgb[0]), s.images[:1], atol=1e-5)
    from PIL import Image

    big = Image.fromarray(u8).resize((200, 200))
    assert toy.preprocess(big).shape == (1, 3, 64, 64)
    # an already-normalised scene tensor passes through
    assert torch.equal(toy.preprocess(s.images[1]), s.images[1:2])


def test_random_weights_option():
    m = load("toy-vit", pretrained=False)
    trained = load("toy-vit")
    a = dict(m.model.named_parameters())["blocks.0.attn.qkv.weight"]
    b = dict(trained.model.named_parameters())["blocks.0.attn.qkv.weight"]
    assert a.shape == b.shape and not torch.equal(a, b)
