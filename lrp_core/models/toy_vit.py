"""``toy-vit``: a small timm Vision Transformer trained on the procedural scenes.

The architecture is a plain :class:`timm.models.vision_transformer.VisionTransformer`
(64 x 64 input, 8 x 8 patches -> 64 patch tokens + [CLS], token pooling), so every
explanation method treats it exactly like a hub ViT. The weights ship in
``lrp_core/assets/toy_vit/`` and are produced by ``scripts/train_toy_vit.py``.

>>> m = load_toy_vit()
>>> m.model(m.preprocess(sample_image_array)).shape   # (1, 8)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..data.photos import as_pil_image
from ..data.scenes import CLASS_NAMES, IMAGE_SIZE, MEAN, STD
from ..errors import InputError, MissingFileError
from .base import LoadedModel

__all__ = ["ASSET_DIR", "TOY_VIT_CONFIG", "build_toy_vit", "load_toy_vit", "toy_vit_preprocess"]

#: Folder of the committed weights (``model.safetensors``) and facts (``info.json``).
ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "toy_vit"
#: Keyword arguments of the timm ``VisionTransformer``.
TOY_VIT_CONFIG: dict[str, Any] = dict(
    img_size=IMAGE_SIZE,
    patch_size=8,
    in_chans=3,
    num_classes=len(CLASS_NAMES),
    embed_dim=128,
    depth=4,
    num_heads=4,
    mlp_ratio=2.0,
    qkv_bias=True,
    class_token=True,
    global_pool="token",
)


def build_toy_vit() -> torch.nn.Module:
    """The toy ViT architecture with freshly initialised weights."""
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(**TOY_VIT_CONFIG)


def toy_vit_preprocess(image: Any) -> torch.Tensor:
    """Turn one image into the toy ViT's normalised input.

    The image is resized (bilinear, the whole image, no crop) to 64 x 64. A float *tensor* of shape
    (3, 64, 64) or (1, 3, 64, 64) counts as an already normalised model input (``make_scenes(...).images[i]``,
    for instance) and is only reshaped.

    Parameters
    ----------
    image : Any
        A PIL image, or an (H, W) / (H, W, 3) array, uint8 or float in [0, 1]; or a normalised float tensor
        (3, 64, 64) / (1, 3, 64, 64).

    Returns
    -------
    torch.Tensor
        (1, 3, 64, 64), normalised.
    """
    if (
        isinstance(image, torch.Tensor)
        and image.is_floating_point()
        and tuple(image.shape) in ((3, IMAGE_SIZE, IMAGE_SIZE), (1, 3, IMAGE_SIZE, IMAGE_SIZE))
    ):
        return image.reshape(1, 3, IMAGE_SIZE, IMAGE_SIZE).float()
    if (
        isinstance(image, np.ndarray) and image.dtype.kind == "f" and image.shape == (IMAGE_SIZE, IMAGE_SIZE, 3)
    ):  # e.g. Scenes.rgb[i]: no rounding
        arr = np.clip(image, 0.0, 1.0).astype(np.float32)
    else:
        pil = as_pil_image(image)
        if pil.size != (IMAGE_SIZE, IMAGE_SIZE):
            pil = pil.resize((IMAGE_SIZE, IMAGE_SIZE), resample=2)  # PIL.Image.BILINEAR
        arr = np.asarray(pil, dtype=np.float32) / 255.0
    x = torch.from_numpy(arr).permute(2, 0, 1)
    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)
    return ((x - mean) / std).unsqueeze(0)


def _read_info() -> dict[str, Any]:
    path = ASSET_DIR / "info.json"
    if path.is_file():
        return json.loads(path.read_text())
    return {}


def load_toy_vit(pretrained: str | bool = "auto") -> LoadedModel:
    """Load ``toy-vit`` from the committed weights, without network access.

    Parameters
    ----------
    pretrained : str | bool, optional
        ``"auto"`` or ``True``: the trained weights; ``False``: the same architecture with random weights.

    Returns
    -------
    LoadedModel
        ``labels`` are the scene class names, ``kind="image"``.

    Raises
    ------
    InputError
        If ``pretrained`` is not ``"auto"``, ``True`` or ``False``.
    MissingFileError
        If the trained weights are asked for and missing.
    """
    if pretrained not in ("auto", True, False):
        raise InputError(f"pretrained must be 'auto', True or False, got {pretrained!r}")
    model = build_toy_vit()
    info: dict[str, Any] = {
        "source": "embedded (lrp_core/assets/toy_vit), trained by scripts/train_toy_vit.py",
        "image_size": IMAGE_SIZE,
        "patch_size": TOY_VIT_CONFIG["patch_size"],
        "mean": MEAN,
        "std": STD,
        "config": dict(TOY_VIT_CONFIG),
        "licence": "MIT (this project)",
        # held-out scenes of the kind it was trained on (lrp_core.data.BUILTIN_IMAGE_SETS)
        "evaluation_data": "scenes",
        # trained with cross-entropy on soft targets (scripts/train_toy_vit.py)
        "probabilities": "softmax",
    }
    if pretrained:
        weights = ASSET_DIR / "model.safetensors"
        if not weights.is_file():
            raise MissingFileError(
                f"toy-vit weights not found at {weights}; retrain them with "
                "`python scripts/train_toy_vit.py` or use load_toy_vit(pretrained=False)"
            )
        from safetensors.torch import load_file

        model.load_state_dict(load_file(str(weights)))
        info.update(_read_info())
    info["pretrained"] = bool(pretrained)
    model.eval()
    return LoadedModel(
        name="toy-vit", model=model, preprocess=toy_vit_preprocess, labels=list(CLASS_NAMES), kind="image", info=info
    )


def soft_targets(labels: torch.Tensor, n_classes: int = len(CLASS_NAMES)) -> torch.Tensor:
    """(n, k) class ids -> (n, n_classes) targets with mass 1/k on each present class."""
    t = F.one_hot(labels, n_classes).float().sum(1)
    return t / t.sum(1, keepdim=True)
