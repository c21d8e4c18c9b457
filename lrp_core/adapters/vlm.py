"""Vision-language models (docs/METHODS.md §2g): the base every VLM family builds on.

A VLM here is three parts, each replayed from the model's own submodules:

* the **vision tower**, a ViT (:class:`~lrp_core.adapters.towers.VisionTower`: Hugging Face CLIP vision, DINOv2,
  SigLIP and Idefics3 towers, each its encoder's one description), run up to the layer the model reads its image
  features from (``vision_feature_layer``); the blocks after it are not run;
* the **connector**, which turns the tower's selected tokens into language-model embeddings (LLaVA: an MLP
  projector; Idefics3: a pixel shuffle; Qwen2.5-VL: a patch merger) — the family's part
  (:meth:`VLMAdapter.connect`, :meth:`VLMAdapter.patch_tokens`);
* the **language model**, a decoder of §2c whose input embeddings ``x0`` are the word embeddings of the text
  with the projected image features in place of the image placeholder tokens (as Hugging Face's
  ``masked_scatter`` puts them). It is the existing decoder adapter of the text model's family over a view of
  the language model and the LM head (:class:`LanguageModelView`), so every decoder rule, the read position
  (``position=``), padding on either side and the layer-product methods are the decoder's.

What is explained is a decoder's: the next-token logit at each row's last real token (or ``position=``).
``scores`` (B, T) are the relevance of every input position's embedding ``x0``, image placeholder tokens
included (their projected image feature); ``pixels`` (B, H, W) where the relevance is carried through the
connector and the tower to the pixels (``lrp``, ``attnlrp``, ``cp_lrp``). A modified-gradient replay runs the tower and
the connector with the same rules as the language model. The layout names the image tokens' positions on the
patch grid (:attr:`~lrp_core.adapters.records.TokenLayout.image_tokens`), so ``Explanation.upsample`` brings
the image tokens' scores to the image.

Images: ``pixel_values`` holds k images per row of ``input_ids`` (the same k for every row, in row order, as the
processor stacks them), and each row holds its images' placeholder tokens, k · P of them. With one image per
row the map over the image is ``Explanation.upsample()`` and the relevance methods fill ``pixels`` (B, H, W);
with several, the image tokens are scored like any token, and ``pixels`` / ``upsample`` (one image per row) are
not given.

Shapes: B rows, k images per row, T tokens, D the language model's width, N_v the tower's tokens, D_v its width,
P image tokens per image, (h, w) the patch grid.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Optional

import torch
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..runtime.devices import Placement
from .base import Adapter
from .batches import ImageBatch, VLMBatch
from .blocks import NO_RECORD, BlockSpec, Replay, block_forward
from .checks import NO_EFFECT, input_keys, pixel_values
from .decoder import DecoderAdapter
from .parts import ModelPart
from .positions import REFUSED_INPUTS
from .records import EmbeddingRecord, TokenLayout, Trace
from .towers import TOWERS, CLIPVisionTower, Dinov2VisionTower, SiglipVisionTower, VisionTower, vision_tower

#: the text model's ``model_type`` -> (adapter module, decoder adapter class) of its family
TEXT_FAMILIES = {
    "llama": ("llama", "LlamaAdapter"),
    "mistral": ("mistral", "MistralAdapter"),
    "qwen2": ("qwen2", "Qwen2Adapter"),
}

#: methods without a meaning on a VLM, and why
VLM_REFUSED_METHODS = {
    "pa_lrp": "its positional relevance is one (B, T) map over the position encodings of one token set; a VLM has "
    "two (the vision tower's position embedding over the patch grid and the language model's rotary "
    "positions over the sequence). Use attnlrp or cp_lrp",
}


class LanguageModelView(nn.Module):
    """A VLM's language model seen as a causal LM: the decoder stack ``model``, the head ``lm_head`` and the text
    ``config`` — what :class:`~lrp_core.adapters.decoder.DecoderAdapter` reads. It holds the model's own modules
    (nothing is copied or changed)."""

    def __init__(self, stack: ModelPart, head: nn.Module, config: Any):
        super().__init__()
        self.model = stack
        self.lm_head = head
        self.config = config

    def get_input_embeddings(self) -> ModelPart:
        """The language model's token embedding (``embed_tokens``)."""
        return self.model.get_input_embeddings()


def text_adapter(
    stack: ModelPart, head: nn.Module, config: Any, families: Optional[Mapping[str, tuple]] = None
) -> DecoderAdapter:
    """The decoder adapter of a VLM's language model, chosen by the text config's ``model_type``.

    Parameters
    ----------
    stack : nn.Module
        The decoder stack (``layers``, ``norm``, ``rotary_emb``, ``embed_tokens``).
    head : nn.Module
        The LM head.
    config : Any
        The text config.
    families : Mapping, optional
        ``model_type`` -> (adapter module, class) of the language models the VLM family explains (default
        :data:`TEXT_FAMILIES`).

    Returns
    -------
    DecoderAdapter
        The family's adapter over a :class:`LanguageModelView`.

    Raises
    ------
    UnsupportedModelError
        For a text model of another family.
    """
    families = TEXT_FAMILIES if families is None else families
    kind = getattr(config, "model_type", None)
    if not isinstance(kind, str) or kind not in families:  # a model_type is a str (the keys' type)
        raise UnsupportedModelError(
            f"its language model is {kind!r}; the language models explained inside this "
            f"vision-language model are {', '.join(families)}"
        )
    module, cls = families[kind]
    return getattr(importlib.import_module(f"{__package__}.{module}"), cls)(LanguageModelView(stack, head, config))


# ----------------------------------------------------------------------------
# records
# ----------------------------------------------------------------------------
@dataclass(kw_only=True)  # keyword-only: the fields after the base's need no default
class VLMEmbeddingRecord(EmbeddingRecord):
    """The input layer of a VLM: the language model's ``x0`` and what made its image part.

    Attributes:
        x0, embeds: (B, T, D) the language model's input embeddings (the text's word embeddings, the projected
            image features at the image tokens); token scores are read here.
        images: (B, 3, H, W) the pixels, the leaf their relevance is read at (one image per row), else ``None``.
        vision: the tower's embedding record.
        selected: (B, P_v, D_v) the tower's tokens the connector reads (after the feature-select strategy).
        connector: the connector's intermediate outputs, by the family's names.
        features: (B, P, D) the connector's output, the image tokens' embeddings.
        image_mask: (B, T) bool, the image placeholder tokens.
    """

    vision: EmbeddingRecord
    selected: Tensor
    connector: dict
    features: Tensor
    image_mask: Tensor


# ----------------------------------------------------------------------------
# the adapter
# ----------------------------------------------------------------------------
class VLMAdapter(Adapter[VLMBatch]):
    """A generative vision-language model: a vision tower, a connector and a decoder language model.

    A family sets :meth:`_parts` (the language model, the head, the tower and the feature layer) and the
    connector (:meth:`connect`, :meth:`patch_tokens`).
    """

    modality = "text"
    is_decoder = True
    is_vlm = True
    mask_value = float("-inf")
    refused_methods = VLM_REFUSED_METHODS
    #: why ``explain_generation`` does not run on this family (``None``: it does): the generation loop extends
    #: ``input_ids``, ``attention_mask`` and the entries in :attr:`generated_token_values`, and keeps the image
    #: entries one (or k) per row
    generation_refused: Optional[str] = None
    #: the processor's per-token entries (B, T) besides ``input_ids`` / ``attention_mask``, each with the value a
    #: generated token takes in it (the value the model's own ``generate`` gives it)
    generated_token_values: Mapping[str, int] = {}
    #: the input keys read besides the text's
    image_inputs: tuple[str, ...] = ("pixel_values", "image_sizes")
    #: the language models the family explains: ``model_type`` -> (adapter module, decoder adapter class)
    text_families: Mapping[str, tuple] = TEXT_FAMILIES

    def __init__(self, model: ModelPart):
        super().__init__(model)
        if not type(model).__module__.startswith("transformers."):
            # a decoder subclass is checked against its own logits on a text probe; a VLM's needs an image too
            raise UnsupportedModelError(
                f"{type(model).__name__} subclasses a vision-language model outside "
                "transformers and may compute something else, which no probe checks here: "
                "explain transformers' own class (load the weights into it)"
            )
        stack, head, text_config, tower, feature_layer = self._parts()
        self.text = text_adapter(stack, head, text_config, self.text_families)
        self.blocks = self.text.blocks
        self.readout = self.text.readout
        self.tower = vision_tower(tower, feature_layer)
        self.image_token_id = int(self.model.config.image_token_id)

    def extend_for_generation(self, entries: Mapping[str, Tensor], new_tokens: Tensor) -> dict:
        """The per-token entries of a prompt extended by generated tokens, as the model's ``generate`` sees them.

        Parameters
        ----------
        entries : Mapping[str, Tensor]
            The per-token entries (:attr:`generated_token_values`' names), each (B, T).
        new_tokens : Tensor
            (B, n) the tokens written after the T columns.

        Returns
        -------
        dict
            The same names, each (B, T + n): the n new columns hold the family's value for a generated token.
        """
        return {
            name: torch.cat(
                [v, torch.full(new_tokens.shape, self.generated_token_values[name], dtype=v.dtype, device=v.device)], 1
            )
            for name, v in entries.items()
        }

    # ------------------------------------------------------------ the family's part
    def _parts(self) -> tuple[ModelPart, ModelPart, Any, ModelPart, int]:
        """(decoder stack, LM head, text config, vision tower, feature layer)."""
        raise NotImplementedError

    def _block(self, i: int, layer: nn.Module) -> BlockSpec:
        return self.text._block(i, layer)

    def select(self, hidden: Tensor) -> Tensor:
        """The tower's tokens (B, N_v, D_v) the connector reads (B, P_v, D_v). Default: all."""
        return hidden

    def connect(self, selected: Tensor, r: Replay) -> tuple[dict, Tensor]:
        """The connector: the selected tokens (B, P_v, D_v) -> (intermediate outputs, image features (B, P, D))."""
        raise NotImplementedError

    def patch_tokens(self, grid: tuple) -> Tensor:
        """(h·w,) long: for each patch in raster order, the index among one image's P image tokens of the token that
        carries it (the inverse of the connector's token layout). Default: token i is patch i."""
        return torch.arange(grid[0] * grid[1])

    def tokens_per_image(self, grid: tuple) -> int:
        """P, the image tokens one image of patch grid ``grid`` gives. Default: one per patch."""
        return grid[0] * grid[1]

    # ------------------------------------------------------------ the input space
    def images_of(self, pixels: Tensor, grid: tuple) -> Tensor:
        """The pixel values of n images as the batch holds them (n, ...) -> the images (n, C', H, W) a pixel map is
        laid on (``grid`` the patch grid). Default: they are the images (n, 3, H, W)."""
        return pixels

    def pixels_of(self, images: Tensor, grid: tuple) -> Tensor:
        """The inverse of :meth:`images_of`: the images (n, C', H, W) -> their pixel values as the batch holds them."""
        return images

    # ------------------------------------------------------------ the model's own output
    def own_pieces(self, prepared: VLMBatch) -> list:
        """The decoder's: rows without their padding (the images taken by rows)."""
        from .verification import unpadded_pieces

        return unpadded_pieces(prepared, self.text.length_dependent)

    def own_inputs(self, prepared: VLMBatch) -> dict:
        """The model's own inputs for a prepared batch: the text's and the images (B · k, …), as the processor
        stacks them. A family whose forward reads other entries adds them."""
        stacked = prepared.pixel_values
        return {**self.text.own_inputs(prepared), "pixel_values": stacked.reshape(-1, *stacked.shape[2:])}

    def own_output(self, prepared: VLMBatch) -> Tensor:
        """(B, V) the model's own logits at each row's read position."""
        from .verification import read_logits

        return read_logits(self.model, {**self.own_inputs(prepared), "use_cache": False}, prepared.read, None)

    # ------------------------------------------------------------ validation
    def check_inputs(self, inputs) -> VLMBatch:
        """The processor's output: ``input_ids``, ``attention_mask``, ``pixel_values`` (k images per row, the same
        k for every row), and ``image_sizes`` where the processor gives it (each the image's own size).
        The batch's ``pixel_values`` are (B, k, 3, H, W)."""
        name = type(self.model).__name__
        if not isinstance(inputs, Mapping) or "input_ids" not in inputs:
            raise InputError(
                f"{name} explains a text with an image: pass the processor's output, a dict with "
                "'input_ids', 'attention_mask' and 'pixel_values', e.g. processor(images=image, "
                f"text=prompt, return_tensors='pt'); got {type(inputs).__name__}"
            )
        if inputs.get("pixel_values") is None:
            raise InputError(
                f"{name}: 'pixel_values' is missing. Pass the image with the text (the processor's "
                "output); to explain a text alone, explain the language model on its own"
            )
        refused = {
            **REFUSED_INPUTS,
            **{
                k: f"the replay reads the model's config ({k} = {getattr(self.model.config, k, None)!r}); pass none"
                for k in ("vision_feature_layer", "vision_feature_select_strategy")
            },
        }
        input_keys(inputs, name, self.text.honoured_inputs + self.image_inputs, refused, NO_EFFECT)
        prepared = self.text.check_inputs({k: inputs[k] for k in self.text.honoured_inputs if k in inputs})
        images = self.tower.check_inputs(pixel_values(inputs["pixel_values"])).images
        ids, mask = prepared.input_ids, prepared.attention_mask
        B = ids.shape[0]
        if images.shape[0] % B:
            raise InputError(
                f"pixel_values holds {images.shape[0]} images for {B} rows of input_ids: every row "
                "must hold the same number of images (the processor stacks them in row order)"
            )
        k = images.shape[0] // B
        grid = self.tower.layout(ImageBatch(images=images)).grid
        assert grid is not None, "an image layout has its patch grid"
        P = self.tokens_per_image(grid)
        placeholders = ids == self.image_token_id
        counts = placeholders.sum(dim=1)
        bad = torch.nonzero(counts != k * P).flatten().tolist()
        if bad:
            raise InputError(
                f"row {bad[0]} holds {int(counts[bad[0]])} image tokens (id {self.image_token_id}), "
                f"but its {k} image(s) of {tuple(images.shape[-2:])} pixels give {k} × {P} features: "
                "put the processor's image tokens in the text (processor(images=..., text=...)), the "
                "same number of images in every row"
            )
        if bool((placeholders & (mask == 0)).any()):
            raise InputError("an image token is padding (attention_mask 0): the image tokens must be real tokens")
        sizes = inputs.get("image_sizes")
        if sizes is not None:
            sizes = torch.as_tensor(sizes).cpu()
            if sizes.shape != (B * k, 2) or not bool((sizes == torch.tensor(images.shape[-2:])).all()):
                raise InputError(
                    f"image_sizes must give each image's own size {tuple(images.shape[-2:])} "
                    f"({B * k}, 2): images cropped or padded inside pixel_values are not explained"
                )
        return VLMBatch.of(prepared, images.reshape(B, k, *images.shape[1:]))

    def at_position(self, prepared: VLMBatch, position) -> VLMBatch:
        return self.text.at_position(prepared, position)

    def readout_for(self, prepared: VLMBatch):
        return self.text.readout_for(prepared)

    def layout(self, prepared: VLMBatch) -> TokenLayout:
        """The decoder's layout, with the patch grid, the image size and each patch's image token
        (``image_tokens`` (B, k·h·w): positions in the sequence, raster order, image after image)."""
        images = prepared.pixel_values
        grid = self.tower.layout(ImageBatch(images=images[:, 0])).grid
        assert grid is not None, "an image layout has its patch grid"
        ids = prepared.input_ids
        # each row's image tokens in order: their positions, first the image tokens, by a stable sort
        where = torch.argsort((ids != self.image_token_id).to(torch.int8), dim=1, stable=True)
        P = self.tokens_per_image(grid)
        per_image = self.patch_tokens(grid).to(ids.device)
        carriers = torch.cat([per_image + j * P for j in range(images.shape[1])])
        positions = where.gather(1, carriers[None].expand(ids.shape[0], -1))
        return replace(
            self.text.layout(prepared), grid=grid, image_size=tuple(images.shape[-2:]), image_tokens=positions
        )

    # ------------------------------------------------------------ forward
    def block_context(
        self, x0: Tensor, mask: Optional[Tensor], positions: Optional[Tensor], fused: bool = False
    ) -> list:
        return self.text.block_context(x0, mask, positions, fused)

    def tower_inputs(self, prepared: VLMBatch, images: Tensor) -> ImageBatch:
        """What the tower's embedding reads: the images (B · k, 3, H, W); a family adds its own entries.

        Parameters
        ----------
        prepared : VLMBatch
            The batch.
        images : Tensor
            (B · k, 3, H, W) the images, one after the other.

        Returns
        -------
        ImageBatch
            The tower's batch (the images and the family's entries).
        """
        return ImageBatch(images=images)

    def tower_bias(self, prepared: VLMBatch, x: Tensor) -> Optional[Tensor]:
        """The additive key mask of every tower block (``None``: none; a family with padded patches has one).

        Parameters
        ----------
        prepared : VLMBatch
            The batch.
        x : Tensor
            (B · k, N_v, D_v) the tower's block-0 input.

        Returns
        -------
        Tensor or None
            (B · k, 1, 1, N_v), or ``None``.
        """
        return None

    def embed(self, prepared: VLMBatch, r: Replay = NO_RECORD, track: bool = False) -> VLMEmbeddingRecord:
        """The tower up to the feature layer, the connector, and the features scattered into the word embeddings
        at the image tokens — every operation through the same replay ``r``. ``track``: the pixels are the leaf
        (``images``, one image per row; several: the stacked images, not recorded)."""
        stacked = prepared.pixel_values  # (B, k, 3, H, W)
        B, k = stacked.shape[:2]
        images = stacked[:, 0] if k == 1 else stacked
        if track:
            images = images.detach().requires_grad_(True)
        place = Placement(self.model, self.module_name)  # split over devices: each block where it computes
        with place.replaying(r):  # and each module between them (the connector's)
            vision = self.tower.embed(self.tower_inputs(prepared, images.reshape(B * k, *stacked.shape[2:])), r)
            x = vision.x0
            bias = self.tower_bias(prepared, x)
            for b, spec in enumerate(self.tower.blocks):
                device = place.device(f"vision block {b}", spec)
                x, bias = place.move(x, device), place.move(bias, device, True)
                x = block_forward(spec, x, bias, r).out
            selected = self.select(x)
            connector, features = self.connect(selected, r)
        ids = prepared.input_ids
        words = self.text.embed_tokens(ids).to(ids.device)  # a split model: block 0's input where the batch is
        image_mask = ids == self.image_token_id
        x0 = words.masked_scatter(image_mask[..., None], features.to(words))
        return VLMEmbeddingRecord(
            x0=x0,
            embeds=x0,
            images=images if k == 1 else None,
            vision=vision,
            selected=selected,
            connector=connector,
            features=features,
            image_mask=image_mask,
        )

    # ------------------------------------------------------------ relevance
    def relevance_inputs(self, trace: Trace) -> list:
        """Block 0's input, and the pixels where one image per row is their leaf (the connector, the tower's
        blocks and its embedding are the replay's operations)."""
        emb = trace.embedding
        assert isinstance(emb, VLMEmbeddingRecord)
        return [trace.x0] if emb.images is None else [trace.x0, emb.images]

    def input_relevance(self, trace: Trace, R: list, prepared: VLMBatch) -> tuple[Tensor, Optional[Tensor]]:
        """Token scores: every position's embedding's relevance summed over channels (padding 0); pixels (one
        image per row, else ``None``): the pixels' relevance, channels summed."""
        scores = R[0].sum(-1) * prepared.attention_mask.to(R[0].dtype)
        return scores, (R[1].sum(dim=1) if len(R) > 1 else None)


__all__ = [
    "VLMAdapter",
    "VisionTower",
    "CLIPVisionTower",
    "Dinov2VisionTower",
    "SiglipVisionTower",
    "LanguageModelView",
    "VLMEmbeddingRecord",
    "TEXT_FAMILIES",
    "TOWERS",
    "VLM_REFUSED_METHODS",
    "text_adapter",
    "vision_tower",
]
