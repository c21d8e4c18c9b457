"""Fixtures for the widget tests: tiny random models, built in milliseconds."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image


def tiny_vit(seed: int = 0, **kw: Any) -> torch.nn.Module:
    """A random timm ViT: 32 px images, 8 px patches (4x4 grid), 3 blocks, 2 heads, 5 classes."""
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    cfg = dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, num_classes=5)
    cfg.update(kw)
    model = VisionTransformer(**cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # non-trivial LayerNorm affines, so relevance is not uniform
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
    return model


def tiny_bert(seed: int = 0) -> torch.nn.Module:
    """A random HF BERT classifier: vocab 100, hidden 32, 2 layers, 2 heads, 3 labels."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=40,
        num_labels=3,
        id2label={0: "negative", 1: "neutral", 2: "positive"},
        label2id={"negative": 0, "neutral": 1, "positive": 2},
    )
    return BertForSequenceClassification(cfg).eval()


class WordPieceTokenizer:
    """A minimal tokenizer: known words map to fixed pieces (some with ``##``)."""

    VOCAB = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "the",
        "film",
        "was",
        "un",
        "##believ",
        "##ably",
        "good",
        "bad",
        "play",
        "##ing",
        "a",
        "story",
    ]

    def __init__(self) -> None:
        self.ids = {t: i for i, t in enumerate(self.VOCAB)}
        self.split = {"unbelievably": ["un", "##believ", "##ably"], "playing": ["play", "##ing"]}

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.VOCAB[i] for i in ids]

    def __call__(
        self, texts: list[str], return_tensors: str = "pt", padding: bool = True, truncation: bool = True
    ) -> dict[str, torch.Tensor]:
        rows = []
        for text in texts:
            pieces = ["[CLS]"]
            for word in text.lower().split():
                pieces += self.split.get(word, [word if word in self.ids else "[UNK]"])
            rows.append([self.ids[p] for p in pieces + ["[SEP]"]])
        T = max(len(r) for r in rows)
        ids = torch.tensor([r + [0] * (T - len(r)) for r in rows])
        return {"input_ids": ids, "attention_mask": (ids != 0).long()}


def png_array(png: bytes) -> np.ndarray:
    """Decode PNG bytes to an (H, W, 3) uint8 array."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


@pytest.fixture(scope="module")
def vit() -> torch.nn.Module:
    return tiny_vit()


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def bert() -> torch.nn.Module:
    return tiny_bert()


@pytest.fixture(scope="module")
def tokenizer() -> WordPieceTokenizer:
    return WordPieceTokenizer()


@pytest.fixture()
def decode_png():
    return png_array


@pytest.fixture()
def make_vit():
    return tiny_vit
