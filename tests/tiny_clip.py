"""A tiny random Hugging Face CLIPModel, built in milliseconds, shared by the engine and widget tests."""

from __future__ import annotations

import torch


def make_clip(seed: int = 0, eos_token_id: int = 98) -> torch.nn.Module:
    """32 px images, 8 px patches (4×4 grid), 2 vision and 2 text blocks, vocabulary of 99, LayerNorms randomised.

    ``eos_token_id``: 2 selects transformers' legacy pooling rule (the highest token id), anything else
    the first occurrence of that id.
    """
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(seed)
    cfg = CLIPConfig(
        text_config=dict(
            vocab_size=99,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=16,
            bos_token_id=1,
            eos_token_id=eos_token_id,
        ),
        vision_config=dict(
            image_size=32,
            patch_size=8,
            hidden_size=48,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=3,
        ),
        projection_dim=24,
    )
    model = CLIPModel(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # non-trivial LayerNorms
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
    return model
