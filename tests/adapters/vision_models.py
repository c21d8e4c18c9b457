"""Tiny random vision models for the adapter tests: the families beyond the [CLS]-pooled timm ViT (timm and
Hugging Face), SigLIP's SiglipModel, timm Eva and Swin; built in milliseconds, no downloads."""

from __future__ import annotations

import torch
from by_path import root_fixtures  # the root conftest by path (tests/widgets has a conftest too)

_perturb_norms = root_fixtures()._perturb_norms
make_tiny_vit = root_fixtures().make_tiny_vit

#: the Hugging Face classifiers' sizes (3 blocks of width 48, 3 heads, 5 classes, 32-pixel images)
CFG = dict(
    image_size=32,
    patch_size=8,
    hidden_size=48,
    num_hidden_layers=3,
    num_attention_heads=3,
    intermediate_size=192,
    num_labels=5,
    layer_norm_eps=1e-6,
)


def random_images(n: int = 3, size: tuple = (32, 32), seed: int = 1) -> torch.Tensor:
    """(n, 3, H, W) standard-normal images, seeded."""
    return torch.randn(n, 3, *size, generator=torch.Generator().manual_seed(seed))


def timm_distilled(seed: int = 0):
    """A tiny timm distilled DeiT (class and distillation tokens, two heads averaged)."""
    from timm.models.deit import VisionTransformerDistilled

    torch.manual_seed(seed)
    model = VisionTransformerDistilled(
        img_size=32, patch_size=8, embed_dim=48, depth=3, num_heads=3, num_classes=5, qkv_bias=True
    ).eval()
    _perturb_norms(model, seed)
    return model


def hf_classifier(cls_name: str, config_name: str, seed: int = 0, **kw):
    """A tiny Hugging Face image classifier ``cls_name`` built from ``config_name`` with :data:`CFG` and ``kw``."""
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(getattr(transformers, config_name)(**{**CFG, **kw})).eval()
    _perturb_norms(model, seed)
    return model


def hf_dinov2(seed: int = 0):
    """A tiny ``Dinov2ForImageClassification`` with random LayerScales."""
    model = hf_classifier("Dinov2ForImageClassification", "Dinov2Config", seed, mlp_ratio=4)
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():  # LayerScale away from its constant init, so that it matters
        for name, p in model.named_parameters():
            if name.endswith("lambda1"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
    return model


def hf_siglip(seed: int = 0, attn: str = "sdpa", **kw):
    """A tiny ``SiglipForImageClassification`` (no class token, mean of all tokens; the unread pooling head kept)."""
    import transformers

    torch.manual_seed(seed)
    vision = {
        k: CFG[k]
        for k in (
            "image_size",
            "patch_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "layer_norm_eps",
        )
    }
    config = transformers.SiglipConfig(vision_config={**vision, **kw}, num_labels=CFG["num_labels"])
    model = transformers.SiglipForImageClassification._from_config(config, attn_implementation=attn).eval()
    _perturb_norms(model, seed)
    return model


def hf_siglip2(seed: int = 0):
    """A tiny ``Siglip2ForImageClassification`` on (B, 3, H, W) images (its patch Linear read as a convolution)."""
    import transformers

    torch.manual_seed(seed)
    vision = {
        k: CFG[k]
        for k in (
            "patch_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "layer_norm_eps",
        )
    }
    config = transformers.Siglip2Config(vision_config={**vision, "num_patches": 16}, num_labels=CFG["num_labels"])
    model = transformers.Siglip2ForImageClassification._from_config(config, attn_implementation="sdpa").eval()
    _perturb_norms(model, seed)
    return model


#: family -> builder of a tiny random model: the families beyond the [CLS]-pooled timm ViT
FAMILIES = {
    "timm_avg": lambda: make_tiny_vit(global_pool="avg"),  # fc_norm after the mean
    "timm_avg_no_class_token": lambda: make_tiny_vit(global_pool="avg", class_token=False),
    "timm_avg_registers": lambda: make_tiny_vit(global_pool="avg", reg_tokens=2, init_values=0.5),
    "timm_distilled": timm_distilled,
    "hf_deit": lambda: hf_classifier("DeiTForImageClassification", "DeiTConfig"),
    "hf_deit_teacher": lambda: hf_classifier("DeiTForImageClassificationWithTeacher", "DeiTConfig"),
    "hf_dinov2": hf_dinov2,
    "hf_siglip": hf_siglip,
    "hf_siglip2": hf_siglip2,
}

#: the tokens the classifier reads directly, per family
READOUT_TOKENS = {
    "timm_avg": (),
    "timm_avg_no_class_token": (),
    "timm_avg_registers": (),
    "timm_distilled": (0, 1),
    "hf_deit": (0,),
    "hf_deit_teacher": (0, 1),
    "hf_dinov2": (0,),
    "hf_siglip": (),
    "hf_siglip2": (),
}


def siglip2_patches(images: torch.Tensor, length: int = 0, patch: int = 8) -> dict:
    """What SigLIP 2's processor gives for these images: transformers' own patchify, padded to ``length`` patches."""
    from transformers.models.siglip2.image_processing_siglip2 import convert_image_to_patches

    rows = torch.stack([convert_image_to_patches(im, patch) for im in images])  # (B, h·w, p·p·3)
    B, P, F = rows.shape
    values = torch.zeros(B, max(length, P), F, dtype=images.dtype)
    values[:, :P] = rows
    mask = torch.zeros(B, max(length, P), dtype=torch.long)
    mask[:, :P] = 1
    grid = torch.tensor([[images.shape[2] // patch, images.shape[3] // patch]] * B)
    return {"pixel_values": values, "pixel_attention_mask": mask, "spatial_shapes": grid}


#: a tiny SigLIP vision tower and text tower (SiglipModel)
SIGLIP_VISION = dict(
    image_size=32,
    patch_size=8,
    hidden_size=48,
    num_hidden_layers=3,
    num_attention_heads=3,
    intermediate_size=96,
    layer_norm_eps=1e-6,
)
SIGLIP_TEXT = dict(
    vocab_size=50,
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=8,
    projection_size=48,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def siglip_model(seed: int = 0, attn: str = "sdpa"):
    """A tiny SiglipModel: the pooling head's LayerNorms randomised like the others, a non-zero logit_bias."""
    from transformers import SiglipConfig, SiglipModel

    torch.manual_seed(seed)
    model = SiglipModel._from_config(
        SiglipConfig(vision_config=SIGLIP_VISION, text_config=SIGLIP_TEXT), attn_implementation=attn
    ).eval()
    _perturb_norms(model, seed)
    with torch.no_grad():
        model.logit_scale.fill_(1.2)
        model.logit_bias.fill_(-2.5)
        head = model.vision_model.head.attention  # a peaked probe attention: larger query weights
        head.in_proj_weight[: head.embed_dim].mul_(10.0)
    return model


def siglip_pair(images: torch.Tensor) -> dict:
    """SiglipModel inputs: ``images`` (3, 3, H, W) with three padded prompts of lengths 4, 6 and 2."""
    ids = torch.tensor([[5, 6, 7, 2, 0, 0, 0, 0], [8, 9, 10, 11, 12, 2, 0, 0], [13, 2, 0, 0, 0, 0, 0, 0]])
    return {"pixel_values": images, "input_ids": ids}


def make_eva(seed: int = 0, **kw):
    """A tiny timm Eva with random biases, norms and LayerScales (timm initialises them to constants), Linear and
    patch-convolution weights of std 1/√fan_in (timm's std 0.02 leaves the logits nearly constant) and q/k
    weights 3× larger, so that the attention — and the rotation of q and k — shapes the logits (measured: the
    other rotary pairing moves them by 0.4–1.8 relative)."""
    from timm.models.eva import Eva

    torch.manual_seed(seed)
    cfg = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=5)
    cfg.update(kw)
    model = Eva(**cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("gamma_1") or name.endswith("gamma_2"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            elif p.dim() >= 2 and name.endswith("weight"):  # Linears and the patch convolution
                big = name.endswith(("attn.qkv.weight", "attn.q_proj.weight", "attn.k_proj.weight"))
                p.copy_(torch.randn(p.shape, generator=g) * p[0].numel() ** -0.5 * (3.0 if big else 1.0))
    return model


def make_swin(seed: int = 0, **kw):
    """A tiny timm Swin with weights of std 1/√fan_in (q/k 3× larger) and random biases and position-bias tables,
    so that the windows, their shifts and the position bias shape the logits."""
    from timm.models.swin_transformer import SwinTransformer

    torch.manual_seed(seed)
    cfg = dict(img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(2, 2), num_heads=(2, 4), num_classes=5)
    cfg.update(kw)
    model = SwinTransformer(**cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and name.endswith("weight"):
                p.copy_(torch.randn(p.shape, generator=g) * p[0].numel() ** -0.5 * (3.0 if "qkv" in name else 1.0))
            elif "relative_position_bias_table" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
    return model
