"""Qwen2.5-VL and Qwen2-VL (Hugging Face ``Qwen2_5_VLForConditionalGeneration``, ``Qwen2VLForConditionalGeneration``;
docs/METHODS.md §2g).

The three parts of :mod:`lrp_core.adapters.vlm`, each the model's own:

* the **vision tower** (``model.model.visual``): a Conv3d patch embedding over patches of ``temporal_patch_size``
  frames (an image is its frame repeated; the kernel equals the stride, so each token is one Linear map of its
  flattened patch), pre-norm blocks (Qwen2.5-VL: RMSNorm and a SwiGLU MLP; Qwen2-VL: LayerNorm and a GELU MLP)
  whose q and k are rotated by a **2D rotary** embedding (half of each head's rotary frequencies turn with the
  patch's row, half with its column; computed in float32 as the model does), and (Qwen2.5-VL) **window
  attention**: the tokens are reordered window by window (``get_vision_window_index``), the blocks of
  ``fullatt_block_indexes`` attend over the whole image and the others inside their window — replayed as an
  additive block-diagonal mask (the dtype's minimum outside the window). Each image is its own row (the model's
  ``cu_seqlens`` segmentation: no token of one image attends another);
* the **patch merger**: RMSNorm (Qwen2-VL: LayerNorm), the ``m × m`` neighbouring patches' features concatenated
  into one vector, an MLP (Linear, GELU, Linear); then the window order undone. One image token per ``m × m``
  patches;
* the **language model**: a Qwen2 decoder whose rotary positions are **M-RoPE**: three position ids per token
  (temporal, height, width; a text token's three are equal, an image token's are its merged patch's row and
  column after the text before it), the rotary frequencies split into ``mrope_section`` parts, each turned by one
  of the three. The positions are the model's own (``get_rope_index`` of ``input_ids``, ``mm_token_type_ids``,
  ``image_grid_thw`` and the attention mask, so padding on either side gives each row its positions alone).

Inputs: the processor's ``input_ids``, ``attention_mask``, ``pixel_values`` (the flattened patches of all images,
(n · h · w, C · T · p · p), in the processor's order: merge block by merge block), ``image_grid_thw`` (n, 3), and
``mm_token_type_ids`` (1 at the image tokens). Every image has the same grid, one grid per image (t = 1), and every
row the same number k of images. With one image per row, ``pixels`` (B, h · p, w · p) is the relevance of the
pixels reassembled from the patches (summed over the channels and the repeated frames) and ``upsample()`` maps the
image tokens' scores over the image (each token's score split equally over its m × m patches).

Shapes: B rows, k images per row, N = h · w patches per image, P = N / m² image tokens per image, D_v the tower's
width, D the language model's width, F = C · T · p · p a flattened patch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Optional, cast

import torch
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..rules.ops import ELEMENTWISE, LINEAR, PATCH_CONV, ExplicitRule, Op
from ..runtime.devices import Placement
from .base import Adapter
from .batches import VLMBatch
from .blocks import NO_RECORD, AttentionSpec, BlockSpec, MlpSpec, Replay, block_forward
from .checks import NO_EFFECT, input_keys, token_ids
from .kernels import eager_softmax_dtype
from .parts import ModelPart
from .positions import REFUSED_INPUTS
from .qwen2 import Qwen2Adapter
from .records import EmbeddingRecord, TokenLayout, Trace
from .vlm import VLM_REFUSED_METHODS, LanguageModelView, VLMAdapter, VLMEmbeddingRecord

#: the packing of a token's three M-RoPE positions (t, h, w) into one long (:func:`pack_positions`): removing a
#: token before it (token ablation) subtracts from the packed value, which moves t, h and w together
_BASE = 2**20
_OFFSET = 2**19


def pack_positions(positions: Tensor) -> Tensor:
    """(3, B, T) M-RoPE positions (t, h, w) -> (B, T) long, one value per token.

    ``t + O + K · (h − t + O) + K² · (w − t + O)`` (K = 2²⁰, O = 2¹⁹): a token's three positions as one
    integer, so every path that cuts, gathers or shifts a row's position ids keeps them together; subtracting n
    moves all three by −n.

    Parameters
    ----------
    positions : Tensor
        (3, B, T) long, the model's ``get_rope_index`` positions.

    Returns
    -------
    Tensor
        (B, T) long.
    """
    t, h, w = positions.long()
    return (t + _OFFSET) + _BASE * (h - t + _OFFSET) + _BASE * _BASE * (w - t + _OFFSET)


def unpack_positions(packed: Tensor) -> Tensor:
    """The inverse of :func:`pack_positions`.

    Parameters
    ----------
    packed : Tensor
        (B, T) long, positions packed by :func:`pack_positions` (and possibly shifted by a whole number).

    Returns
    -------
    Tensor
        (3, B, T) long, the positions (t, h, w).
    """
    t = packed % _BASE - _OFFSET
    h = t + (packed // _BASE) % _BASE - _OFFSET
    w = t + packed // (_BASE * _BASE) - _OFFSET
    return torch.stack([t, h, w])


class MRopeLanguageModel(Qwen2Adapter):
    """The Qwen2-VL / Qwen2.5-VL language model: a Qwen2 decoder whose rotary tables are read at the three M-RoPE
    positions of each token (``prepared.position_ids`` packed by :func:`pack_positions`)."""

    def rotary_tables(
        self, x0: Tensor, positions: Tensor, key: str, mask: Optional[Tensor] = None
    ) -> tuple[Tensor, Tensor]:
        """(cos, sin) (B, T, d) of the model's ``rotary_emb`` at the (3, B, T) positions packed in ``positions``
        (B, T): each section of the frequencies turned by its position (``mrope_section``), as the model does."""
        return self.base.rotary_emb(x0, unpack_positions(positions))


class _PatchConv2d:
    """The patch embedding's Conv3d read as the Conv2d over the reassembled image it equals: the C · T channels
    of a patch's frames side by side, kernel = stride = p (what the zᴮ rule of PATCH_CONV reads: ``weight``,
    ``stride``, ``padding``)."""

    def __init__(self, conv: nn.Conv3d):
        D, C, T, p, q = conv.weight.shape
        self.weight = conv.weight.reshape(D, C * T, p, q)
        self.stride = (p, q)
        self.padding = 0


class Qwen2_5_VLAdapter(VLMAdapter):
    """``Qwen2_5_VLForConditionalGeneration`` (and ``Qwen2VLForConditionalGeneration``): the vision tower with 2D
    rotary positions and window attention, the patch merger, the M-RoPE language model."""

    #: generated tokens are text (type 0); their M-RoPE positions follow from get_rope_index of the extended ids
    generated_token_values = {"mm_token_type_ids": 0}

    image_inputs = ("pixel_values", "image_grid_thw", "mm_token_type_ids")
    refused_methods = VLM_REFUSED_METHODS
    #: removing tokens (the source methods without ``filler=``) shifts the later tokens' position ids by one; the
    #: packed (t, h, w) M-RoPE positions here would need each of the three shifted by its own rule
    removes_tokens = False

    def __init__(self, model: ModelPart):
        Adapter.__init__(self, model)  # the tower is this family's own (not one of vlm.TOWERS)
        if not type(model).__module__.startswith("transformers."):
            raise UnsupportedModelError(
                f"{type(model).__name__} subclasses a vision-language model outside "
                "transformers and may compute something else, which no probe checks here: "
                "explain transformers' own class (load the weights into it)"
            )
        cfg = model.config
        tcfg = cfg.get_text_config()
        layer_types = getattr(tcfg, "layer_types", None) or ()
        if getattr(tcfg, "use_sliding_window", False) or "sliding_attention" in layer_types:
            raise UnsupportedModelError(
                "its language model uses sliding-window attention (use_sliding_window), which "
                "Hugging Face runs with flash attention only; explained: full attention"
            )
        rope = getattr(tcfg, "rope_parameters", None) or {}
        if rope.get("rope_type", "default") != "default":
            raise UnsupportedModelError(f"its M-RoPE has rope_type={rope.get('rope_type')!r}; explained: 'default'")
        base = model.model
        self.text = MRopeLanguageModel(LanguageModelView(base.language_model, model.lm_head, tcfg))
        self.blocks = self.text.blocks
        self.readout = self.text.readout
        self.visual = base.visual
        vcfg = self.visual.config
        self.merge = int(vcfg.spatial_merge_size)
        self.patch = int(vcfg.patch_size)
        self.frames = int(vcfg.temporal_patch_size)
        self.channels = int(vcfg.in_channels)
        self.windowed = hasattr(self.visual, "fullatt_block_indexes")  # Qwen2.5-VL; Qwen2-VL: full attention
        self.full_blocks = set(self.visual.fullatt_block_indexes) if self.windowed else set()
        impl = getattr(vcfg, "_attn_implementation", "eager")
        if impl not in ("eager", "sdpa"):
            raise UnsupportedModelError(f"its vision tower runs {impl!r} attention; explained: eager and sdpa")
        self.vision_sdpa = impl == "sdpa"
        self.tower_blocks = [self._vision_block(i, layer) for i, layer in enumerate(self.visual.blocks)]
        self.image_token_id = int(cfg.image_token_id)

    def _vision_block(self, i: int, layer: ModelPart) -> BlockSpec:
        """A vision block: pre-norm, fused qkv (query, key, value heads in turn), 2D rotary in float32 (Hugging
        Face rotates float32 copies of q and k with float32 tables), the MLP (gated: SwiGLU; else fc1, act, fc2)."""
        att, mlp = layer.attn, layer.mlp
        H = int(att.num_heads)
        d = int(att.qkv.out_features) // (3 * H)
        spec = AttentionSpec(
            qkv=att.qkv,
            proj=att.proj,
            num_heads=H,
            head_dim=d,
            scale=d**-0.5,
            rotary=True,
            rotary_compute=torch.float32,
            softmax_dtype=eager_softmax_dtype(self.visual.config),
            sdpa=self.vision_sdpa,
            segmented=True,
        )
        if hasattr(mlp, "gate_proj"):
            mlp_spec = MlpSpec(gate=mlp.gate_proj, fc1=mlp.up_proj, act=mlp.act_fn, fc2=mlp.down_proj)
        else:
            mlp_spec = MlpSpec(fc1=mlp.fc1, act=mlp.act, fc2=mlp.fc2)
        return BlockSpec(layout="pre_ln", norm1=layer.norm1, norm2=layer.norm2, attn=spec, mlp=mlp_spec)

    # ------------------------------------------------------------ the image layout
    def patch_tokens(self, grid: tuple) -> Tensor:
        """Patch (r, c) of the raster order is carried by the merged token (r // m, c // m), raster order."""
        h, w = grid
        r = torch.arange(h)[:, None] // self.merge
        c = torch.arange(w)[None, :] // self.merge
        return (r * (w // self.merge) + c).flatten()

    def tokens_per_image(self, grid: tuple) -> int:
        return grid[0] * grid[1] // self.merge**2

    def _raster(self, grid: tuple) -> Tensor:
        """(N,) long: for each patch in the processor's order (merge block by merge block), its raster index."""
        h, w, m = grid[0], grid[1], self.merge
        return torch.arange(h * w).reshape(h // m, m, w // m, m).permute(0, 2, 1, 3).flatten()

    def images_of(self, pixels: Tensor, grid: tuple) -> Tensor:
        """The flattened patches (n, N, F) -> the images (n, C · T, H, W), the frames' channels side by side."""
        return self._image(pixels, grid)

    def pixels_of(self, images: Tensor, grid: tuple) -> Tensor:
        """The inverse of :meth:`images_of`: (n, C · T, H, W) -> the flattened patches (n, N, F)."""
        patches = self._patches(images, grid)
        return patches.reshape(images.shape[0], -1, patches[0].numel())

    def _image(self, patches: Tensor, grid: tuple) -> Tensor:
        """The flattened patches (n, N, F) in the processor's order -> the images (n, C · T, h · p, w · p), the
        frames' channels side by side (channel c · T + t)."""
        n = patches.shape[0]
        h, w, m, p = grid[0], grid[1], self.merge, self.patch
        C, T = self.channels, self.frames
        x = patches.reshape(n, h // m, w // m, m, m, C, T, p, p)
        return x.permute(0, 5, 6, 1, 3, 7, 2, 4, 8).reshape(n, C * T, h * p, w * p)

    def _patches(self, images: Tensor, grid: tuple) -> Tensor:
        """The inverse of :meth:`_image`: (n, C · T, h · p, w · p) -> (n · N, C, T, p, p), the processor's order."""
        n = images.shape[0]
        h, w, m, p = grid[0], grid[1], self.merge, self.patch
        C, T = self.channels, self.frames
        x = images.reshape(n, C, T, h // m, m, p, w // m, m, p)
        return x.permute(0, 3, 6, 4, 7, 1, 2, 5, 8).reshape(n * h * w, C, T, p, p)

    def _windows(self, grid: tuple, device: torch.device) -> tuple[Tensor, Optional[Tensor]]:
        """(the merged tokens' window order (P,) long, the windows' cumulative lengths in patches or ``None``):
        the model's ``get_vision_window_index`` for one image (Qwen2-VL: the identity, no windows)."""
        P = self.tokens_per_image(grid)
        if not self.windowed:
            return torch.arange(P, device=device), None
        from transformers.vision_utils import get_vision_window_index

        thw = torch.tensor([[1, grid[0], grid[1]]], device=device)
        index, cu = get_vision_window_index(
            thw, spatial_merge_size=self.merge, window_size=self.visual.window_size, patch_size=self.patch
        )
        return index.to(device), cu.to(device)

    def _tables(self, x: Tensor, grid: tuple, order: Tensor) -> tuple[Tensor, Tensor]:
        """The tower's rotary tables (1, N, d) at the patches' (row, column), in the window order ``order`` (N,):
        the model's ``rotary_pos_emb`` (float32), exactly cast to the replay's dtype."""
        from transformers.vision_utils import get_vision_position_ids

        thw = torch.tensor([[1, grid[0], grid[1]]], device=x.device)
        pos = get_vision_position_ids(thw, self.merge)  # (N, 2)
        cos, sin = self.visual.rotary_pos_emb(x, pos)  # (N, d) float32
        return cos[order][None].to(x.dtype), sin[order][None].to(x.dtype)

    def _bias(self, cu: Optional[Tensor], N: int, dtype: torch.dtype) -> Optional[Tensor]:
        """(1, 1, N, N): 0 inside a window, the dtype's minimum between windows (``None`` without windows)."""
        if cu is None:
            return None
        window = torch.bucketize(torch.arange(N, device=cu.device), cu[1:].long(), right=True)
        same = window[:, None] == window[None, :]
        zero = torch.zeros((), dtype=dtype, device=cu.device)
        return torch.where(same, zero, torch.finfo(dtype).min)[None, None]

    # ------------------------------------------------------------ validation
    def check_inputs(self, inputs) -> VLMBatch:
        """The processor's output: ``input_ids``, ``attention_mask``, ``pixel_values`` (n · h · w, F),
        ``image_grid_thw`` (n, 3), ``mm_token_type_ids`` (B, T). ``prepared.pixel_values`` is (B, k, N, F),
        ``prepared.grid_thw`` (B, k, 3), ``prepared.position_ids`` the packed M-RoPE positions (B, T)."""
        name = type(self.model).__name__
        if not isinstance(inputs, Mapping) or "input_ids" not in inputs:
            raise InputError(
                f"{name} explains a text with an image: pass the processor's output, a dict with "
                "'input_ids', 'attention_mask', 'pixel_values', 'image_grid_thw' and "
                "'mm_token_type_ids', e.g. processor(images=image, text=prompt, return_tensors='pt'); "
                f"got {type(inputs).__name__}"
            )
        for key in ("pixel_values", "image_grid_thw", "mm_token_type_ids"):
            if inputs.get(key) is None:
                raise InputError(
                    f"{name}: {key!r} is missing. Pass the processor's whole output (input_ids, "
                    "attention_mask, pixel_values, image_grid_thw, mm_token_type_ids): the model places "
                    "the image tokens by image_grid_thw and gives them their 3D positions by "
                    "mm_token_type_ids (without them it would give the image tokens text positions)"
                )
        why_video = "videos are not explained: pass images only"
        refused = {
            **REFUSED_INPUTS,
            "position_ids": "the replay computes the model's own M-RoPE positions (get_rope_index of "
            "input_ids, mm_token_type_ids, image_grid_thw and attention_mask): pass none",
            **{k: why_video for k in ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")},
            "mm_encoder_outputs": "the image features are read from the tower's replay: pass pixel_values",
        }
        honoured = tuple(k for k in self.text.honoured_inputs if k != "position_ids") + self.image_inputs
        input_keys(inputs, name, honoured, refused, NO_EFFECT)
        text = {k: inputs[k] for k in ("input_ids", "attention_mask", "cache_position") if k in inputs}
        prepared = self.text.check_inputs(text)
        ids, mask = prepared.input_ids, prepared.attention_mask
        B = ids.shape[0]
        pixels = inputs["pixel_values"]
        grids, h, w, k = self._check_images(pixels, inputs["image_grid_thw"], B)
        types = token_ids(inputs["mm_token_type_ids"], "mm_token_type_ids").to(ids.device)
        self._check_image_tokens(ids, mask, types, k, (h, w))
        with torch.no_grad():
            rope, _ = self.model.model.get_rope_index(
                ids, mm_token_type_ids=types, image_grid_thw=grids.to(ids.device), attention_mask=mask
            )
        return VLMBatch.of(
            prepared.replace(position_ids=pack_positions(rope)),
            pixels.reshape(B, k, h * w, -1),
            grids.to(ids.device).reshape(B, k, 3),
        )

    def own_inputs(self, prepared: VLMBatch) -> dict:
        """The text, the flattened patches (n · h · w, F), ``image_grid_thw`` (n, 3) and ``mm_token_type_ids`` (1 at
        the image tokens); the M-RoPE positions are the model's own (``get_rope_index``)."""
        ids = prepared.input_ids
        pixels = prepared.pixel_values
        return {
            "input_ids": ids,
            "attention_mask": prepared.attention_mask,
            "pixel_values": pixels.reshape(-1, pixels.shape[-1]),
            "image_grid_thw": prepared.grid_thw.reshape(-1, 3),
            "mm_token_type_ids": (ids == self.image_token_id).long(),
        }

    def _check_images(self, pixels: Any, grid_thw: Any, B: int) -> tuple[Tensor, int, int, int]:
        """The flattened patches and ``image_grid_thw`` checked against each other and the B rows.

        Parameters
        ----------
        pixels : Any
            The processor's ``pixel_values`` (n · h · w, C · T · p · p).
        grid_thw : Any
            The processor's ``image_grid_thw`` (n, 3).
        B : int
            The rows of ``input_ids``.

        Returns
        -------
        tuple[Tensor, int, int, int]
            ``(grids (n, 3) on the CPU, h, w, k images per row)``.
        """
        if not isinstance(pixels, Tensor) or pixels.dim() != 2 or not pixels.is_floating_point():
            raise InputError(
                "pixel_values must be the processor's flattened patches, a float tensor (patches, "
                f"{self.channels} · {self.frames} · {self.patch} · {self.patch}); got "
                f"{getattr(pixels, 'shape', type(pixels).__name__)}"
            )
        F = self.channels * self.frames * self.patch * self.patch
        grids = torch.as_tensor(grid_thw).cpu()
        if grids.dim() != 2 or grids.shape[1] != 3 or grids.shape[0] == 0 or grids.is_floating_point():
            raise InputError(f"image_grid_thw must be (images, 3) integers (t, h, w); got {tuple(grids.shape)}")
        n = grids.shape[0]
        if not bool((grids == grids[0]).all()) or int(grids[0, 0]) != 1:
            raise InputError(
                f"image_grid_thw {grids.tolist()}: every image must have the same grid and t = 1 (one "
                "image, not a video); resize the images to one size"
            )
        h, w = int(grids[0, 1]), int(grids[0, 2])
        if h % self.merge or w % self.merge or h <= 0 or w <= 0:
            raise InputError(
                f"image_grid_thw gives a {h} × {w} patch grid; the patch merger needs multiples of {self.merge}"
            )
        if pixels.shape != (n * h * w, F):
            raise InputError(
                f"pixel_values has shape {tuple(pixels.shape)}; image_grid_thw's {n} image(s) of "
                f"{h} × {w} patches need ({n * h * w}, {F})"
            )
        if n % B:
            raise InputError(
                f"image_grid_thw names {n} images for {B} rows of input_ids: every row must hold the "
                "same number of images"
            )
        return grids, h, w, n // B

    def _check_image_tokens(self, ids: Tensor, mask: Tensor, types: Tensor, k: int, grid: tuple[int, int]) -> None:
        """Each row holds its k images' placeholder tokens as k runs, marked by ``mm_token_type_ids``.

        Parameters
        ----------
        ids, mask, types : Tensor
            (B, T) ``input_ids``, ``attention_mask`` and ``mm_token_type_ids``.
        k : int
            Images per row.
        grid : tuple[int, int]
            The patch grid (h, w) of every image.
        """
        h, w = grid
        P = self.tokens_per_image(grid)
        placeholders = ids == self.image_token_id
        if types.shape != ids.shape or not torch.equal(types, placeholders.to(types.dtype)):
            raise InputError(
                "mm_token_type_ids must be 1 at the image tokens (id "
                f"{self.image_token_id}) and 0 elsewhere, shaped as input_ids (videos, type 2, are not "
                "explained): pass the processor's"
            )
        if bool((placeholders & (mask == 0)).any()):
            raise InputError("an image token is padding (attention_mask 0): the image tokens must be real tokens")
        for b in range(ids.shape[0]):
            real = placeholders[b][mask[b].bool()].to(torch.int8)
            starts = int((real[1:] > real[:-1]).sum()) + int(real[0])
            if int(real.sum()) != k * P or starts != k:
                raise InputError(
                    f"row {b} holds {int(real.sum())} image tokens (id {self.image_token_id}) in "
                    f"{starts} run(s), but its {k} image(s) of {h} × {w} patches give {k} runs of {P}: "
                    "put the processor's image tokens in the text (processor(images=..., text=...)), "
                    "the same number of images in every row"
                )

    def layout(self, prepared: VLMBatch) -> TokenLayout:
        """The decoder's layout, the patch grid, the image size (h · p, w · p) and each patch's image token
        (``image_tokens`` (B, k · h · w): positions in the sequence, raster order, image after image)."""
        grid = tuple(int(v) for v in prepared.grid_thw[0, 0, 1:])
        k = prepared.pixel_values.shape[1]
        ids = prepared.input_ids
        where = torch.argsort((ids != self.image_token_id).to(torch.int8), dim=1, stable=True)
        P = self.tokens_per_image(grid)
        per_image = self.patch_tokens(grid).to(ids.device)
        carriers = torch.cat([per_image + j * P for j in range(k)])
        positions = where.gather(1, carriers[None].expand(ids.shape[0], -1))
        return replace(
            self.text.layout(prepared),
            grid=grid,
            image_size=(grid[0] * self.patch, grid[1] * self.patch),
            image_tokens=positions,
        )

    # ------------------------------------------------------------ forward
    def embed(self, prepared: VLMBatch, r: Replay = NO_RECORD, track: bool = False) -> VLMEmbeddingRecord:
        """The tower (patch embedding, window order, blocks), the merger, the window order undone, and the
        features scattered into the word embeddings at the image tokens — every operation through ``r``.
        ``track``: the reassembled images (B, C · T, H, W) are the leaf (one image per row)."""
        stacked = prepared.pixel_values  # (B, k, N, F)
        B, k, N, _ = stacked.shape
        grid = tuple(int(v) for v in prepared.grid_thw[0, 0, 1:])
        conv = self.visual.patch_embed.proj
        images = self._image(stacked.reshape(B * k, N, -1), grid).to(conv.weight.dtype)
        if track and k == 1:
            images = images.detach().requires_grad_(True)
        place = Placement(self.model, self.module_name)  # split over devices: each block where it computes
        with place.replaying(r):  # and each module between them (the merger's)
            patches, x_tower, selected, connector, features = self._tower(images, grid, r, place)
        ids = prepared.input_ids
        words = self.text.embed_tokens(ids).to(ids.device)  # a split model: block 0's input where the batch is
        image_mask = ids == self.image_token_id
        x0 = words.masked_scatter(image_mask[..., None], features.to(words))
        vision = EmbeddingRecord(x0=x_tower, embeds=patches, images=images)
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

    def _tower(self, images: Tensor, grid: tuple, r: Replay, place: Placement) -> tuple:
        """The patch embedding of ``images``, the tower's blocks in window order (on a split model each where it
        computes) and the merger -> (patches (B·k, N, D_v), block 0's input in window order, the last block's
        output, the merger's steps, features (B·k, P, D) in raster order)."""
        conv = self.visual.patch_embed.proj
        patches = r.module(PATCH_CONV, conv, self._patches(images, grid))  # (B·k·N, D_v, 1, 1, 1)
        patches = patches.reshape(images.shape[0], -1, patches.shape[1])
        N, unit = patches.shape[1], self.merge**2
        index, cu = self._windows(grid, patches.device)
        order = (index[:, None] * unit + torch.arange(unit, device=patches.device)).flatten()  # (N,) window order
        x = x_tower = patches[:, order]
        rope, window = self._tables(x, grid, order), self._bias(cu, N, x.dtype)
        for i, spec in enumerate(self.tower_blocks):
            device = place.device(f"vision block {i}", spec)
            bias = None if not self.windowed or i in self.full_blocks else window
            x, bias, rope = place.move(x, device), place.move(bias, device, True), place.move(rope, device, True)
            x = block_forward(spec, x, bias, r, rope).out
        merger = self.visual.merger
        normed = r.norm(merger.ln_q, x)
        cat = normed.reshape(normed.shape[0], N // unit, -1)  # the m × m patches of a merged token side by side
        fc1, act, fc2 = merger.mlp[0], merger.mlp[1], merger.mlp[2]
        h1 = r.module(LINEAR, fc1, cat)
        a = r.module(ELEMENTWISE, act, h1)
        out = r.module(LINEAR, fc2, a)
        steps = {"norm": normed, "cat": cat, "fc1": h1, "act": a, "out": out, "index": index, "order": order}
        features = out[:, torch.argsort(index).to(out.device)]  # (B·k, P, D) the merged tokens in raster order
        return patches, x_tower, x, {**steps, "grid": grid}, features

    # ------------------------------------------------------------ relevance

    def relevance_inputs(self, trace: Trace) -> list:
        """Block 0's input, and the patch embedding's output (one image per row): the merger and the tower are the
        replay's operations; the patch embedding's Conv3d gets zᴮ as the Conv2d it equals (:meth:`input_relevance`)."""
        emb = trace.embedding
        assert isinstance(emb, VLMEmbeddingRecord)
        return [trace.x0] if emb.images is None else [trace.x0, emb.vision.embeds]

    def input_relevance(self, trace: Trace, R: list, prepared: VLMBatch) -> tuple[Tensor, Optional[Tensor]]:
        """Token scores: every position's embedding's relevance summed over channels (padding 0); pixels (one
        image per row): the patch embedding's relevance (the replay's backward through the merger and the tower)
        laid on the raster, and zᴮ on the patch embedding read as the Conv2d over the reassembled image
        (B, H, W: channels and frames summed)."""
        emb = trace.embedding
        assert isinstance(emb, VLMEmbeddingRecord)
        R0 = R[0]
        scores = R0.sum(-1) * prepared.attention_mask.to(R0.dtype)
        if emb.images is None:
            return scores, None
        c = emb.connector
        B = R0.shape[0]
        R_patches = R[1]  # (B, N, D) in the processor's order
        h, w = c["grid"]
        raster = torch.empty_like(R_patches)
        raster[:, self._raster(c["grid"]).to(R_patches.device)] = R_patches
        R_map = raster.transpose(1, 2).reshape(B, -1, h, w)
        # the rule is chosen for the model's Conv3d (a composite's first-layer or by-name choice names it) and
        # applied to the Conv2d it equals on the reassembled image
        conv = self.visual.patch_embed.proj
        # the stand-in is duck-typed: the zᴮ rule reads its weight, stride and padding (an explicit rule set's rule)
        op = Op(PATCH_CONV, (emb.images,), None, cast(nn.Module, _PatchConv2d(conv)))
        r = trace.replay
        assert r is not None, "an explicit replay"
        with torch.no_grad():  # a rule applied outside the backward: the images are a leaf of the replay's graph
            (R_px,) = cast(ExplicitRule, r.rule(PATCH_CONV, conv)).relevance(op, R_map, r.cache)
        return scores, R_px.sum(dim=1)


__all__ = ["Qwen2_5_VLAdapter", "MRopeLanguageModel", "pack_positions", "unpack_positions"]
