"""The vision tower of a vision-language model: an image encoder read up to the layer the VLM takes its features
from (``vision_feature_layer``); the blocks after it are not run.

Each tower is the encoder's one description (:class:`~lrp_core.adapters.vit.Encoder`), the same one the
classifier or similarity adapter of that encoder replays: CLIP vision (:class:`~lrp_core.adapters.clip.
CLIPVisionEncoder`), DINOv2 (:class:`~lrp_core.adapters.dinov2.Dinov2Encoder`), SigLIP (:class:`~lrp_core.
adapters.siglip_tower.SiglipVisionEncoder`) and, registered by its family's module, Idefics3 / SmolVLM
(:mod:`~lrp_core.adapters.idefics3`). A tower validates the images and carries relevance from its block-0 input
to the pixels as a ViT does (:class:`~lrp_core.adapters.vit.ViTAdapter`).

Shapes: B images, N_v = prefix + patch tokens, D_v width.
"""

from __future__ import annotations

from torch import nn

from ..errors import UnsupportedModelError
from .batches import ImageBatch
from .clip import CLIPVisionEncoder
from .dinov2 import Dinov2Encoder
from .parts import ModelPart
from .records import TokenLayout
from .siglip_tower import SiglipVisionEncoder
from .vit import Encoder, ViTAdapter


class VisionTower(ViTAdapter[ImageBatch]):
    """A VLM's vision tower: ``encoder`` without a head, replayed up to its first ``layers`` blocks. ``model`` is
    the tower module."""

    #: the Hugging Face class of the tower
    tower_class: str = ""

    def __init__(self, encoder: Encoder, layers: int):
        super().__init__(encoder.module)
        self.use_encoder(encoder, layers)

    @staticmethod
    def encoder_of(module: nn.Module) -> Encoder:
        """The description of the tower ``module``."""
        raise NotImplementedError

    def layout(self, prepared: ImageBatch) -> TokenLayout:
        """The tower's tokens: the prefix, then the patches in raster order."""
        H, W = prepared.images.shape[-2:]
        grid = (H // self.patch_size[0], W // self.patch_size[1])
        return TokenLayout(
            modality="image",
            num_tokens=self.num_prefix_tokens + grid[0] * grid[1],
            output_start=self.num_prefix_tokens,
            readout_tokens=(),
            grid=grid,
            image_size=(H, W),
        )


class CLIPVisionTower(VisionTower):
    """Hugging Face ``CLIPVisionModel`` (LLaVA's tower; :class:`~lrp_core.adapters.clip.CLIPVisionEncoder`)."""

    tower_class = "CLIPVisionModel"

    @staticmethod
    def encoder_of(module: ModelPart) -> Encoder:
        return CLIPVisionEncoder(module)


class Dinov2VisionTower(VisionTower):
    """Hugging Face ``Dinov2Model`` (:class:`~lrp_core.adapters.dinov2.Dinov2Encoder`); the hidden states are read
    before its final ``layernorm``."""

    tower_class = "Dinov2Model"

    @staticmethod
    def encoder_of(module: ModelPart) -> Encoder:
        return Dinov2Encoder(module, "a DINOv2 vision tower")


class SiglipVisionTower(VisionTower):
    """Hugging Face ``SiglipVisionModel`` (:class:`~lrp_core.adapters.siglip_tower.SiglipVisionEncoder`) at the
    trained size (the VLM runs it without ``interpolate_pos_encoding``). ``post_layernorm`` is not a block: a
    family that reads the tower's ``last_hidden_state`` (Gemma 3, PaliGemma) runs it first in its connector; the
    attention-pooling head (when present) is not on the features' path."""

    tower_class = "SiglipVisionModel"

    @staticmethod
    def encoder_of(module: ModelPart) -> Encoder:
        return SiglipVisionEncoder(module, "the vision tower", trained_size=True)


#: the vision towers replayed, by class name
TOWERS: dict[str, type[VisionTower]] = {
    cls.tower_class: cls for cls in (CLIPVisionTower, Dinov2VisionTower, SiglipVisionTower)
}


def vision_tower(module: nn.Module, feature_layer: int) -> VisionTower:
    """The tower's replay up to the hidden state ``feature_layer`` (Hugging Face's ``hidden_states`` index: 0 the
    embeddings, i the output of layer i, negative from the end).

    Parameters
    ----------
    module : nn.Module
        The VLM's vision tower.
    feature_layer : int
        The index of the hidden state the features are read from.

    Returns
    -------
    VisionTower
        The tower, with the blocks up to that hidden state.

    Raises
    ------
    UnsupportedModelError
        For a tower of another class, a layer index outside the tower, or a tower whose last hidden state is read
        after its final norm (``tie_last_hidden_states``).
    """
    name = type(module).__name__
    if name not in TOWERS:
        raise UnsupportedModelError(f"its vision tower is {name}; the towers explained are {', '.join(TOWERS)}")
    cls = TOWERS[name]
    encoder = cls.encoder_of(module)
    depth = len(encoder.layers_of(module))
    if not -(depth + 1) <= feature_layer <= depth:
        raise UnsupportedModelError(
            f"vision_feature_layer={feature_layer} is outside the tower's {depth + 1} hidden states"
        )
    layers = feature_layer % (depth + 1)
    if layers == depth and getattr(module.config, "tie_last_hidden_states", None):
        raise UnsupportedModelError(
            "the vision config sets tie_last_hidden_states, so the last hidden state is read "
            "after the tower's final norm, which the replay does not run"
        )
    return cls(encoder, layers)


__all__ = ["VisionTower", "CLIPVisionTower", "Dinov2VisionTower", "SiglipVisionTower", "TOWERS", "vision_tower"]
