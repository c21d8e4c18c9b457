"""DeBERTa-v2 / v3 sequence classifiers from Hugging Face (``DebertaV2ForSequenceClassification``).

BERT's post-LN layers (``attention.self`` / ``attention.output``, ``intermediate``, ``output``) with DeBERTa's
**disentangled attention**: the scores add content → position and position → content terms of the relative
embeddings to ``q·kᵀ`` (:mod:`.disentangled`, docs/METHODS.md §2k). The rest, in the model's order:

* embeddings: words (+ absolute positions where ``position_biased_input``) (+ token types where the model has
  a segment table) → ``embed_proj`` (where the embedding width differs) → LayerNorm → × the padding mask
  (padding rows set to 0: a selection, its relevance dropped at the padding);
* the mask: a query–key pair with a padding token on either side is set to the dtype's minimum, as the model's
  ``masked_fill`` does (a padding query row then attends every key uniformly; the replay adds the minimum, which
  the scores cannot move, so the rows are the model's);
* the head: ``ContextPooler`` (token 0 → dense → ``pooler_hidden_act``) → classifier.

The relative embeddings (``rel_embeddings``, after the encoder's LayerNorm where ``norm_rel_ebd`` has
``layer_norm``) and the relative positions are computed by the model's own encoder methods. Refused: the
convolution after the first layer (``conv_kernel_size`` > 0, DeBERTa-v2 xlarge / xxlarge) and the other heads.

Shapes: B batch, T tokens, D width, H heads.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..errors import InputError, UnsupportedModelError
from ..rules.linear import is_linear
from ..rules.ops import ADD, ELEMENTWISE, LINEAR, POS_ADD
from .batches import TextBatch
from .bert import BertAdapter
from .blocks import NO_RECORD, AttentionSpec, BlockSpec, MlpSpec, Replay
from .checks import token_ids
from .disentangled import DisentangledScores
from .heads import hf_heads
from .parts import ModelPart
from .readouts import HeadLayer
from .records import EmbeddingRecord

#: the position terms DeBERTa-v2 computes (any other ``pos_att_type`` entry is ignored by the model too)
POSITION_TERMS = ("c2p", "p2c")

#: methods with no meaning on a model with relative attention, and why
REFUSED_METHODS = {
    "pa_lrp": "DeBERTa's positions enter through the relative-position terms of its attention scores (the "
    "projected relative embeddings, gathered by bucket), which PA-LRP's rules do not make relevance inputs (they "
    "take the rotary tables and the added position embeddings only), so the positions' share would be missing. "
    "Use attnlrp or cp_lrp (the relative-position operand's share is absorbed, docs/METHODS.md §2k)",
}


def position_ids_shaped(value, ids: Tensor) -> Tensor:
    """``position_ids`` given as (B, T) or (1, T), as (B, T) long; refused where they are not one per token."""
    pos = token_ids(value, "position_ids").to(ids.device)
    if pos.shape[0] == 1 and pos.shape[1:] == ids.shape[1:]:
        pos = pos.expand(ids.shape)
    if pos.shape != ids.shape:
        raise InputError(
            f"position_ids has shape {tuple(pos.shape)}, input_ids {tuple(ids.shape)}: give one position per token, "
            "(B, T) or (1, T)"
        )
    return pos


class DebertaV2Adapter(BertAdapter):
    """``DebertaV2ForSequenceClassification``: post-LN layers with disentangled attention, a ContextPooler head."""

    def __init__(self, model):
        super().__init__(model)
        if getattr(model.config, "relative_attention", False):
            self.refused_methods = REFUSED_METHODS

    def _backbone(self) -> ModelPart:
        model = self.model
        name = type(model).__name__
        base = getattr(model, "deberta", None)
        enc = getattr(base, "encoder", None)
        if getattr(model, "config", None) is None or base is None or not hasattr(enc, "layer"):
            raise UnsupportedModelError(
                f"{name}: not a DeBERTa-v2 classifier (expected deberta.embeddings and deberta.encoder.layer)"
            )
        if getattr(enc, "conv", None) is not None:
            raise UnsupportedModelError(
                f"{name}: conv_kernel_size={model.config.conv_kernel_size} adds a convolution over the tokens "
                "after the first layer (DeBERTa-v2 xlarge / xxlarge), which the block replay does not describe. "
                "DeBERTa-v3 and DeBERTa-v2 models without it are explained"
            )
        if int(getattr(base, "z_steps", 0)) > 1:
            raise UnsupportedModelError(f"{name}: z_steps={base.z_steps} (the last layer run again) is not replayed")
        return base

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        try:
            sa, so = layer.attention.self, layer.attention.output
            d = self.model.config.hidden_size // self.model.config.num_attention_heads
            H, d, _ = hf_heads(sa, sa.query_proj, sa.key_proj, sa.value_proj, so.dense, f"layer {i}", d)
            scores = self._scores(sa, H, d)
            return BlockSpec(
                layout="post_ln",
                norm1=so.LayerNorm,
                norm2=layer.output.LayerNorm,
                attn=AttentionSpec(
                    q=sa.query_proj,
                    k=sa.key_proj,
                    v=sa.value_proj,
                    proj=so.dense,
                    num_heads=H,
                    head_dim=d,
                    scale=float(scores.scale(torch.float64)) ** -1,
                    scores=scores,
                ),
                mlp=MlpSpec(
                    fc1=layer.intermediate.dense, act=layer.intermediate.intermediate_act_fn, fc2=layer.output.dense
                ),
            )
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have the DeBERTa-v2 layout (attention.self.query_proj/"
                f"key_proj/value_proj, attention.output, intermediate, output): {e}"
            ) from None

    def _scores(self, sa: ModelPart, H: int, d: int) -> DisentangledScores:
        """The layer's disentangled scores: its position terms and projections, the encoder's table and buckets."""
        types = [t for t in POSITION_TERMS if t in (sa.pos_att_type or [])]
        enc = self.base.encoder
        relative = bool(getattr(sa, "relative_attention", False))
        shared = bool(getattr(sa, "share_att_key", False))

        def projection(term: str) -> Optional[ModelPart]:
            if not relative or term not in types:
                return None
            if term == "c2p":
                return sa.key_proj if shared else sa.pos_key_proj
            return sa.query_proj if shared else sa.pos_query_proj

        return DisentangledScores(
            num_heads=H,
            head_dim=d,
            span=int(getattr(sa, "pos_ebd_size", 0)),
            scale_factor=1 + len(types),  # counted whether or not relative attention is on, as the model does
            table=enc.get_rel_embedding,
            relative=lambda n: enc.get_rel_pos(torch.empty(n, 0))[0],
            pos_key=projection("c2p"),
            pos_query=projection("p2c"),
        )

    def _head(self) -> list:
        """ContextPooler (token 0 → dense → its activation) → classifier."""
        from transformers.activations import ACT2FN

        model = self.model
        pooler: ModelPart = getattr(model, "pooler", None)
        clf = getattr(model, "classifier", None)
        if not is_linear(getattr(pooler, "dense", None)) or not is_linear(clf):
            raise UnsupportedModelError(
                f"{type(model).__name__}: classification head not recognised (expected pooler.dense and a Linear "
                "classifier)"
            )
        act = ACT2FN[model.config.pooler_hidden_act]  # the module the pooler's forward looks up
        return [HeadLayer(LINEAR, pooler.dense), HeadLayer(ELEMENTWISE, act), HeadLayer(LINEAR, clf)]

    def _given_positions(self, value, ids: Tensor) -> Tensor:
        """Given ``position_ids`` (B, T) or (1, T) index the absolute table; without one (``position_biased_input``
        off, DeBERTa-v3) the model ignores them, and so does the replay (their shape is still checked)."""
        if self.base.embeddings.position_embeddings is not None:
            return super()._given_positions(value, ids)
        return position_ids_shaped(value, ids)

    # --------------------------------------------------------------- forward
    def embed(self, prepared: TextBatch, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """Words (+ positions) (+ types) → embed_proj → LayerNorm → × mask, the model's order.

        ``embeds`` (B, T, E) are the word embeddings; ``x0`` (B, T, D) is block 0's input.
        """
        emb = self.base.embeddings
        ids = prepared.input_ids
        words = emb.word_embeddings(ids)  # (B, T, E)
        if track:
            words = words.detach().requires_grad_(True)
        x = words
        if emb.position_embeddings is not None and emb.position_biased_input:
            pos = prepared.position_ids if prepared.position_ids is not None else emb.position_ids[:, : ids.shape[1]]
            x = r(POS_ADD, torch.add, x, emb.position_embeddings(pos))
        if emb.token_type_embeddings is not None:
            tt = prepared.token_type_ids
            x = r(ADD, torch.add, x, emb.token_type_embeddings(torch.zeros_like(ids) if tt is None else tt))
        if emb.embed_proj is not None:
            x = r.module(LINEAR, emb.embed_proj, x)
        x = r.norm(emb.LayerNorm, x)  # dropout: inference
        # the padding rows set to 0: a selection (relevance passes at real tokens, none at the padding)
        x0 = x * prepared.attention_mask[..., None].to(x.dtype)
        return EmbeddingRecord(x0=x0, embeds=words)

    def attention_bias(self, x0: Tensor, mask: Optional[Tensor]) -> Tensor:
        """(B, 1, N, N): the dtype's minimum where the query or the key is padding, 0 elsewhere."""
        assert mask is not None, "run_blocks makes a mask"
        m = mask.to(x0.dtype)
        pair = m[:, None, :, None] * m[:, None, None, :]
        return (1.0 - pair) * torch.finfo(x0.dtype).min


__all__ = ["DebertaV2Adapter", "REFUSED_METHODS", "position_ids_shaped"]
