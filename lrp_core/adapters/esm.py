"""ESM protein-language-model classifiers from Hugging Face (``EsmForSequenceClassification``).

A BERT-family encoder with **pre-LN** layers (``attention.LayerNorm`` before the attention, ``LayerNorm`` before
the MLP, both residuals outside) and a final ``encoder.emb_layer_norm_after``; positions **rotary** (ESM-2: q and k
rotated by the model's own ``rotary_embeddings`` tables, positions 0 … T−1, or the ``position_ids`` given) or
**absolute** (ESM-1b: a table indexed from the padding index on, as RoBERTa's). The queries are scaled by
``d^-½`` before the rotation (a constant scale), and float32 copies of q and k are rotated, as the model does; the
scores take no further scale. In the model's order, the embeddings are:

* the word embeddings; with ``token_dropout`` (ESM-2), the mask tokens' rows set to 0 (a selection) and every row
  scaled by ``(1 − 0.15 · 0.8) / (1 − its share of mask tokens)``, a constant per row (its relevance passes
  unchanged in the explicit passes, the plain gradient elsewhere);
* + the absolute positions (POS_ADD), where ``position_embedding_type="absolute"``;
* the embedding LayerNorm where ``emb_layer_norm_before``; then × the padding mask (a selection).

The head (``classifier``: token 0 → dense → tanh → out_proj) is RoBERTa's. Shapes: B batch, T tokens, D width.
"""

from __future__ import annotations

import importlib

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from ..rules.ops import POS_ADD
from .batches import TextBatch
from .bert import BertAdapter
from .blocks import NO_RECORD, AttentionSpec, BlockSpec, MlpSpec, Replay
from .deberta import position_ids_shaped
from .heads import hf_heads
from .parts import ModelPart
from .readouts import TokenReadout
from .records import EmbeddingRecord

#: ESM's token-dropout rate at training (hard-coded in the model: 15 % masked, 80 % of those as the mask token)
MASK_RATIO_TRAIN = 0.15 * 0.8


class ModelFunction(nn.Module):
    """A function of the model's code as a module (ESM's erf GELU is a module-level function, not a module)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x)


class EsmAdapter(BertAdapter):
    """``EsmForSequenceClassification``: pre-LN layers, rotary or absolute positions, token dropout."""

    honoured_inputs = ("input_ids", "attention_mask", "position_ids")

    def __init__(self, model):
        super().__init__(model)
        self.readout = TokenReadout(norm=self.base.encoder.emb_layer_norm_after, head_layers=self._head())

    @property
    def rotary(self) -> bool:
        return getattr(self.base.embeddings, "position_embedding_type", "absolute") == "rotary"

    def _backbone(self) -> ModelPart:
        model = self.model
        name = type(model).__name__
        base = getattr(model, "esm", None)
        cfg = getattr(model, "config", None)
        if cfg is None or base is None or not hasattr(getattr(base, "encoder", None), "layer"):
            raise UnsupportedModelError(
                f"{name}: not an ESM classifier (expected esm.embeddings and esm.encoder.layer)"
            )
        if getattr(cfg, "is_decoder", False):
            raise UnsupportedModelError(f"{name}: decoder (causal) models are not supported")
        pet = getattr(base.embeddings, "position_embedding_type", "absolute")
        if pet not in ("absolute", "rotary"):
            raise UnsupportedModelError(
                f"{name}: position_embedding_type={pet!r} is not replayed (only 'rotary' and 'absolute')"
            )
        self.padding_idx = int(base.embeddings.padding_idx)
        return base

    def _max_length(self) -> int:
        """Absolute positions start after the padding index (as RoBERTa's); rotary ones: the config's length."""
        n = int(self.model.config.max_position_embeddings)
        return n if self.rotary else n - self.padding_idx - 1

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        try:
            sa, out = layer.attention.self, layer.attention.output
            d = int(sa.attention_head_size)
            H, d, _ = hf_heads(sa, sa.query, sa.key, sa.value, out.dense, f"layer {i}", d)
            gelu = importlib.import_module(type(layer.intermediate).__module__).gelu  # the model's erf GELU
            return BlockSpec(
                layout="pre_ln",
                norm1=layer.attention.LayerNorm,
                norm2=layer.LayerNorm,
                attn=AttentionSpec(
                    q=sa.query,
                    k=sa.key,
                    v=sa.value,
                    proj=out.dense,
                    num_heads=H,
                    head_dim=d,
                    scale=1.0,  # the module's `scaling`: the queries are scaled before their rotation
                    query_scale=d**-0.5,
                    rotary=self.rotary,
                    rotary_dtype=torch.float32,  # the model rotates float32 copies of q and k
                ),
                mlp=MlpSpec(fc1=layer.intermediate.dense, act=ModelFunction(gelu), fc2=layer.output.dense),
            )
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have the ESM layout (attention.LayerNorm, "
                f"attention.self.query/key/value, attention.output.dense, LayerNorm, intermediate, output): {e}"
            ) from None

    def _given_positions(self, value, ids: Tensor) -> Tensor:
        """Rotary positions: any (one per token); absolute ones index the table."""
        if self.rotary:
            return position_ids_shaped(value, ids)
        return super()._given_positions(value, ids)

    def _positions(self, ids: Tensor) -> Tensor:
        """The model's absolute position ids (its module's ``create_position_ids_from_input_ids``)."""
        module = importlib.import_module(type(self.base.embeddings).__module__)
        return module.create_position_ids_from_input_ids(ids, self.padding_idx)

    # --------------------------------------------------------------- forward
    def embed(self, prepared: TextBatch, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """Words (token dropout) (+ absolute positions) (→ LayerNorm) → × mask, the model's order."""
        emb = self.base.embeddings
        ids, mask = prepared.input_ids, prepared.attention_mask
        words = emb.word_embeddings(ids)  # (B, T, D)
        if track:
            words = words.detach().requires_grad_(True)
        x = words
        if emb.token_dropout and emb.mask_token_id is not None:
            masked = ids == emb.mask_token_id
            x = x.masked_fill(masked[..., None], 0.0)  # a selection: the mask tokens' rows are 0
            observed = masked.sum(-1).float() / mask.sum(-1)  # (B,) the share of mask tokens, as the model counts it
            x = r.transparent(lambda t: (t * (1 - MASK_RATIO_TRAIN) / (1 - observed)[:, None, None]).to(t.dtype), x)
        if not self.rotary:
            given = prepared.position_ids
            x = r(POS_ADD, torch.add, x, emb.position_embeddings(self._positions(ids) if given is None else given))
        if emb.layer_norm is not None:
            x = r.norm(emb.layer_norm, x)
        x0 = x * mask[..., None].to(x.dtype)  # the padding rows set to 0: a selection
        return EmbeddingRecord(x0=x0, embeds=words)

    def block_context(self, x0: Tensor, mask, positions, fused: bool = False) -> list:
        """Every block: the padding mask and, where rotary, the model's tables at positions 0 … T−1 (or given)."""
        bias = self.attention_bias(x0, mask)
        if not self.rotary:
            return [(bias, None)] * len(self.blocks)
        B, T = x0.shape[:2]
        if positions is None:
            positions = torch.arange(T, device=x0.device)[None].expand(B, T)
        return [(bias, self.base.rotary_embeddings(x0, positions))] * len(self.blocks)


__all__ = ["EsmAdapter", "ModelFunction", "MASK_RATIO_TRAIN"]
