"""Shared fixtures: tiny models built in milliseconds."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # for tests/reference.py

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def _perturb_norms(model: torch.nn.Module, seed: int) -> None:
    """Random LayerNorm affine parameters, so that the rules see non-trivial activations."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g))
                if m.bias is not None:  # ModernBERT's LayerNorms have none
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))


def make_tiny_vit(seed: int = 0, **kw):
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    cfg = dict(img_size=32, patch_size=8, embed_dim=48, depth=3, num_heads=3, num_classes=5, qkv_bias=True)
    cfg.update(kw)
    model = VisionTransformer(**cfg).eval()
    _perturb_norms(model, seed)
    return model


def make_tiny_bert(seed: int = 0, weight_scale: float = 1.0, **kw):
    """A 2-layer BERT classifier. ``weight_scale`` > 1 enlarges the matrices beyond HF's init (std 0.02)."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    cfg = dict(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=40,
        num_labels=3,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    cfg.update(kw)
    model = BertForSequenceClassification(BertConfig(**cfg)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(weight_scale)
    _perturb_norms(model, seed)
    return model


@pytest.fixture
def tiny_vit():
    return make_tiny_vit()


@pytest.fixture
def tiny_bert():
    return make_tiny_bert()


@pytest.fixture
def wide_bert():
    """Weights 5× HF's init: larger activations, a harder case for the rules (and for float32)."""
    return make_tiny_bert(weight_scale=5.0)


@pytest.fixture
def images():
    return torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))


@pytest.fixture
def text_batch():
    """Three texts of different lengths, right-padded with id 0."""
    ids = torch.tensor([[2, 11, 12, 13, 14, 15, 3], [2, 21, 22, 3, 0, 0, 0], [2, 31, 32, 33, 34, 3, 0]])
    mask = (ids != 0).long()
    return {"input_ids": ids, "attention_mask": mask}
