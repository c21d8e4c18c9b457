"""scripts/train_toy_vit.py: its parts do what the recipe says, and a short run is reproducible."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

from lrp_core.data.scenes import make_scenes
from lrp_core.models.toy_vit import build_toy_vit

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_toy_vit.py"


@pytest.fixture(scope="module")
def script():
    # imported by name (not from a file spec) so that worker processes can unpickle its functions
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        yield importlib.import_module(SCRIPT.stem)
    finally:
        sys.path.remove(str(SCRIPT.parent))


def test_pool_chunks_do_not_depend_on_the_number_of_workers(script):
    a = script.make_pool(40, 30, seed=3, workers=1)
    b = script.make_pool(40, 30, seed=3, workers=2)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert a["two"].sum() == 30 and a["images"].shape == (70, 3, 64, 64)
    one = ~a["two"]
    assert torch.equal(a["labels"][one, 0], a["labels"][one, 1])  # one object: label repeated
    assert a["cover"][one, 1].sum() == 0
    assert (a["labels"][a["two"], 0] != a["labels"][a["two"], 1]).all()


def test_cover_is_the_object_share_of_each_patch(script):
    images, labels, cover = script._pool_chunk((4, 11, 2))
    s = make_scenes(4, 11, n_objects=2)
    i, k, r, c = 2, 1, 3, 5
    share = s.masks[i, k, 8 * r : 8 * r + 8, 8 * c : 8 * c + 8].float().mean()
    assert float(cover[i, k, r, c]) == pytest.approx(float(share), abs=1e-3)
    assert torch.equal(labels, s.labels)


def test_data_driven_init_is_a_scaled_rotation_onto_principal_axes(script):
    model = build_toy_vit()
    images = make_scenes(64, 5).images
    script.data_driven_init(model, images, scale=2.0)
    w = model.patch_embed.proj.weight.reshape(128, -1)
    assert torch.allclose(w @ w.T, 4.0 * torch.eye(128), atol=1e-4)
    # the embedded patches are centred and their variance falls along the rows
    patches = torch.nn.functional.unfold(images, 8, stride=8).transpose(1, 2).reshape(-1, 192)
    emb = patches @ w.T + model.patch_embed.proj.bias
    assert emb.mean(0).abs().max() < 1e-3
    var = emb.var(0)
    assert var[0] >= var[1] >= var[10] >= var[100]
    pos = model.pos_embed[0, 1:]
    assert torch.allclose(pos, script.sincos_grid(8, 128))


def test_forward_kept_keeps_every_object_patch(script):
    model = build_toy_vit().eval()
    images, labels, cover = script._pool_chunk((6, 21, 2))
    gen = torch.Generator().manual_seed(0)
    feats, kept_cover = script.forward_kept(model, images.float(), cover.float(), 40, gen)
    assert feats.shape == (6, 41, 128) and kept_cover.shape == (6, 2, 40)
    # all the object mass survives the dropping
    assert torch.allclose(kept_cover.sum(-1), cover.float().flatten(2).sum(-1))
    # keeping all 64 tokens is the ordinary forward pass
    full, _ = script.forward_kept(model, images.float(), cover.float(), 64, gen)
    assert torch.allclose(full, model.forward_features(images.float()), atol=1e-5)


def test_losses_match_a_hand_computation(script):
    model = build_toy_vit().eval()
    feats = torch.randn(2, 65, 128)
    labels = torch.tensor([[3, 3], [1, 6]])
    cover = torch.zeros(2, 2, 64)
    cover[1, 0, 5] = 1.0
    cover[1, 1, 5] = 0.0
    logits = model.forward_head(feats)
    lp = torch.log_softmax(logits, -1)
    cls = (-lp[0, 3] - 0.5 * lp[1, 1] - 0.5 * lp[1, 6]) / 2
    tok = -torch.log_softmax(model.head(feats[1, 6]), -1)[1]
    got = script.losses(model, feats, labels, cover, token_weight=0.5, token_min_cover=0.25)
    assert torch.allclose(got, cls + 0.5 * tok, atol=1e-5)


@pytest.mark.slow
def test_a_short_run_is_reproducible_and_loadable(script, tmp_path):
    args = [
        "--steps",
        "12",
        "--pool-single",
        "128",
        "--pool-double",
        "128",
        "--eval",
        "20",
        "--threads",
        "1",
        "--log-every",
        "0",
        "--batch",
        "16",
        "--keep",
        "40",
        "--full-fraction",
        "0.5",
    ]
    script.main(args + ["--out", str(tmp_path / "a")])
    script.main(args + ["--out", str(tmp_path / "b")])
    from safetensors.torch import load_file

    wa = load_file(str(tmp_path / "a" / "model.safetensors"))
    wb = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    model = build_toy_vit()
    model.load_state_dict(wa)  # a plain timm ViT state dict
    info = json.loads((tmp_path / "a" / "info.json").read_text())
    assert info["training"]["options"]["steps"] == 12
    assert 0.0 <= info["accuracy"]["single_object_accuracy"] <= 1.0
