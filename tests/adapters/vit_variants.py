"""Tiny random ViT variants for tests/adapters/test_vit_variants.py: relative position bias (HF BEiT,
Data2Vec-vision, timm Beit, timm VisionTransformerRelPos), built from configs in milliseconds, with their
position-bias tables, LayerScales, norms and heads drawn at random so that each part matters."""

from __future__ import annotations

import torch
from by_path import root_fixtures  # the root conftest by path (tests/widgets has a conftest too)
from vision_models import CFG, _perturb_norms


def _randomised(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random bias tables (and the MLPs that make them), LayerScales and classifier heads; random norms."""
    _perturb_norms(model, seed)
    g = torch.Generator().manual_seed(seed + 11)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "relative_position_bias_table" in name or ".rel_pos." in name or "shared_rel_pos" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.split(".")[-1] in ("lambda_1", "lambda_2", "gamma_1", "gamma_2", "gamma"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif name.startswith(("head.", "classifier.")) or name in ("cls_token", "q_bias", "v_bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith(("q_bias", "v_bias")):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def hf_relpos(cls_name: str, config_name: str, seed: int = 0, **kw) -> torch.nn.Module:
    """A tiny Hugging Face BEiT-style classifier (:data:`CFG`, ``kw``), randomised."""
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(getattr(transformers, config_name)(**{**CFG, **kw}))
    return _randomised(model, seed)


def timm_beit(seed: int = 0, **kw) -> torch.nn.Module:
    """A tiny timm ``Beit`` (img 32, patch 8, width 48, depth 2, 3 heads, 5 classes), randomised."""
    from timm.models.beit import Beit

    torch.manual_seed(seed)
    cfg = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=5, qkv_bias=True)
    return _randomised(Beit(**{**cfg, **kw}), seed)


def timm_relpos(seed: int = 0, **kw) -> torch.nn.Module:
    """A tiny timm ``VisionTransformerRelPos`` (img 32, patch 8, width 48, depth 2, 3 heads), randomised."""
    from timm.models.vision_transformer_relpos import VisionTransformerRelPos

    torch.manual_seed(seed)
    cfg = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=5, qkv_bias=True)
    return _randomised(VisionTransformerRelPos(**{**cfg, **kw}), seed)


def _post_norm(**kw):
    from timm.models.vision_transformer_relpos import ResPostRelPosBlock

    return timm_relpos(block_fn=ResPostRelPosBlock, **kw)


#: family -> builder, each a different combination of the variants' parts (the relative-position-bias ViTs, I-JEPA)
VARIANTS = {
    # per-layer tables, LayerScale, mean pooling + the pooler's LayerNorm (BEiT's defaults for classification)
    "hf_beit": lambda: hf_relpos(
        "BeitForImageClassification", "BeitConfig", use_relative_position_bias=True, layer_scale_init_value=0.1
    ),
    # a shared table and per-layer ones, absolute positions, [CLS] after the final layernorm, no LayerScale
    "hf_beit_shared_cls": lambda: hf_relpos(
        "BeitForImageClassification",
        "BeitConfig",
        use_relative_position_bias=True,
        use_shared_relative_position_bias=True,
        use_absolute_position_embeddings=True,
        use_mean_pooling=False,
        layer_scale_init_value=0.0,
    ),
    # BEiT's eager kernel: the softmax in float32, as the model
    "hf_beit_eager": lambda: hf_relpos(
        "BeitForImageClassification", "BeitConfig", use_relative_position_bias=True, attn_implementation="eager"
    ),
    "data2vec": lambda: hf_relpos(
        "Data2VecVisionForImageClassification",
        "Data2VecVisionConfig",
        use_relative_position_bias=True,
        use_shared_relative_position_bias=True,
        layer_scale_init_value=0.1,
    ),
    # per-block and shared tables, q/v biases added by the attention, LayerScale, average pooling + fc_norm
    "timm_beit": lambda: timm_beit(use_rel_pos_bias=True, use_shared_rel_pos_bias=True, init_values=0.1),
    # [CLS], a bias table per block, LayerScale
    "timm_relpos": lambda: timm_relpos(class_token=True, global_pool="token", rel_pos_type="bias", init_values=0.1),
    # no class token, one shared MLP bias, residual post-norm blocks, average pooling + fc_norm
    "timm_relpos_post": lambda: _post_norm(shared_rel_pos=True, fc_norm=True),
    # I-JEPA: no class token, the mean of every token
    "hf_ijepa": lambda: hf_relpos("IJepaForImageClassification", "IJepaConfig"),
}

#: the families with an absolute position embedding (pa_lrp has one to score)
WITH_POSITIONS = ("hf_beit_shared_cls", "hf_ijepa")


def hf_dinov2_registers(seed: int = 0, registers: int = 3) -> torch.nn.Module:
    """A tiny ``Dinov2WithRegistersForImageClassification`` with random register tokens and LayerScales."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.Dinov2WithRegistersConfig(**{**CFG, "num_register_tokens": registers, "mlp_ratio": 4})
    model = transformers.Dinov2WithRegistersForImageClassification(config)
    _perturb_norms(model, seed)
    g = torch.Generator().manual_seed(seed + 5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("register_tokens", "cls_token")):
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("lambda1"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
    return model.eval()


def timm_registers(seed: int = 0) -> torch.nn.Module:
    """A tiny timm ``VisionTransformer`` with [CLS] and 2 register tokens (random)."""
    make_tiny_vit = root_fixtures().make_tiny_vit
    model = make_tiny_vit(seed=seed, reg_tokens=2)
    with torch.no_grad():
        model.reg_token.copy_(torch.randn(model.reg_token.shape, generator=torch.Generator().manual_seed(seed)))
    return model


def eva_registers(seed: int = 0) -> torch.nn.Module:
    """A tiny timm ``Eva`` with rotary q/k, [CLS] and 2 register tokens (random)."""
    from vision_models import make_eva

    model = make_eva(use_rot_pos_emb=True, num_reg_tokens=2)
    with torch.no_grad():
        model.reg_token.copy_(torch.randn(model.reg_token.shape, generator=torch.Generator().manual_seed(seed)))
    return model


#: family -> (builder, number of registers)
REGISTER_FAMILIES = {
    "hf_dinov2_registers": (hf_dinov2_registers, 3),
    "timm_registers": (timm_registers, 2),
    "eva_registers": (eva_registers, 2),
}
