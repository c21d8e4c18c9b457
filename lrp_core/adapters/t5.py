"""T5 and mT5 (``T5ForConditionalGeneration``, ``MT5ForConditionalGeneration``): docs/METHODS.md §2i.

The BART-layout base (:mod:`.seq2seq`) with T5's parts: ``model.encoder`` / ``model.decoder`` stacks of
``block``s, each a list of sub-layers (self-attention, the decoder's cross-attention, the feed-forward), every
sub-layer pre-norm with T5's RMSNorm (its variance in float32, as the model computes it; the divisor detached by
the LayerNorm rule); no position embedding: the relative position bias, computed by the first block's
self-attention from the token offsets and shared by every block of its stack, is an additive constant of the
scores (with the padding / causal mask); the scores are not scaled. v1.0's ReLU feed-forward
(``wi → act → wo``) and v1.1's gated one (``feed_forward_proj="gated-gelu"``: ``act(wi_0 x) ⊙ wi_1 x → wo``, the
gated rule of §2c). A tied head reads the decoder's output times ``d_model^-½`` (``scale_decoder_outputs``).

Shapes: B batch, S source tokens, P prefix tokens, H heads.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from ..rules.linear import is_linear
from ..rules.ops import LINEAR
from .batches import Seq2SeqBatch
from .blocks import AttentionSpec, BlockSpec, MlpSpec, Replay
from .parts import IDENTITY, ModelPart
from .readouts import HeadLayer
from .seq2seq import HeadView, Seq2SeqAdapter


class T5Adapter(Seq2SeqAdapter):
    """T5 v1.0 / v1.1 and mT5 encoder-decoders with their LM head."""

    pre_norm = True

    def _stacks(self) -> tuple[ModelPart, ModelPart]:
        enc, dec = getattr(self.model, "encoder", None), getattr(self.model, "decoder", None)
        if self.config is None or not hasattr(enc, "block") or not hasattr(dec, "block"):
            raise UnsupportedModelError(
                f"{type(self.model).__name__}: not a T5 encoder-decoder (expected model.encoder.block, "
                "model.decoder.block)"
            )
        return enc, dec

    def _layers(self, stack: ModelPart) -> list:
        return list(stack.block)

    def _final_norm(self, stack: ModelPart) -> nn.Module:
        return stack.final_layer_norm

    def _head_layers(self) -> list[HeadLayer]:
        """The LM head; a tied one reads the decoder output times ``d_model^-½`` (one Linear view)."""
        head = getattr(self.model, "lm_head", None)
        if not is_linear(head):
            raise UnsupportedModelError(f"{type(self.model).__name__}: no LM head (lm_head)")
        scale = float(self.config.d_model) ** -0.5 if getattr(self.config, "scale_decoder_outputs", False) else None
        return [HeadLayer(LINEAR, HeadView(head, None, scale))]

    def _t5_attention(self, att: ModelPart, causal: bool = False) -> AttentionSpec:
        """A T5 attention: q/k/v/o without biases, unscaled scores, softmax in the model's dtype."""
        return AttentionSpec(
            q=att.q,
            k=att.k,
            v=att.v,
            proj=att.o,
            num_heads=int(att.n_heads),
            head_dim=int(att.key_value_proj_dim),
            scale=float(att.scaling),
            causal=causal,
        )

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        """A T5 block: [self-attention, (decoder) cross-attention, feed-forward], each pre-norm."""
        decoder = i >= self.num_encoder_blocks
        try:
            subs = list(layer.layer)
            ff = subs[-1].DenseReluDense
            gated = hasattr(ff, "wi_0")
            mlp = (
                MlpSpec(gate=ff.wi_0, fc1=ff.wi_1, act=ff.act, fc2=ff.wo)
                if gated
                else MlpSpec(fc1=ff.wi, act=ff.act, fc2=ff.wo)
            )
            return BlockSpec(
                layout="pre_ln",
                norm1=subs[0].layer_norm,
                norm2=subs[-1].layer_norm,
                attn=self._t5_attention(subs[0].SelfAttention, causal=decoder),
                mlp=mlp,
                cross=self._t5_attention(subs[1].EncDecAttention) if decoder else None,
                norm_cross=subs[1].layer_norm if decoder else IDENTITY,
            )
        except (AttributeError, IndexError) as e:
            raise UnsupportedModelError(
                f"block {i} ({type(layer).__name__}) does not have the T5 layout (layer[0].SelfAttention with "
                f"q/k/v/o, layer[1].EncDecAttention in the decoder, layer[-1].DenseReluDense with wi or wi_0/wi_1 "
                f"and wo, a layer_norm per sub-layer): {e}"
            ) from None

    def word_embeddings(self, stack: ModelPart, ids: Tensor) -> Tensor:
        """The shared token embedding of ``ids`` (B, n, D), unscaled."""
        return stack.embed_tokens(ids)

    def embed_side(self, stack: ModelPart, words: Tensor, positions: Tensor, r: Replay) -> Tensor:
        """T5 adds nothing to its word embeddings (its positions enter the scores: :meth:`attention_biases`)."""
        return words

    def attention_biases(self, prepared: Seq2SeqBatch, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """The masks with each stack's relative position bias (1, H, n, n) added, from its first block's own
        ``compute_bias`` (offsets between tokens: a row's padding shifts none of its real tokens' offsets)."""
        enc, dec, cross = super().attention_biases(prepared, dtype)
        S, P = prepared.source_length, prepared.decoder_input_ids.shape[1]
        # a split model: each stack's bias is made where its first block is, and added where the masks are
        enc_pos, dec_pos = _position_bias(self.encoder, S, dtype), _position_bias(self.decoder, P, dtype)
        return enc + enc_pos.to(enc.device), dec + dec_pos.to(dec.device), cross


def _position_bias(stack: ModelPart, n: int, dtype: torch.dtype) -> Tensor:
    """(1, H, n, n) the relative position bias of a stack's first self-attention, a constant (no gradient)."""
    att = stack.block[0].layer[0].SelfAttention
    if not getattr(att, "has_relative_attention_bias", False):
        raise UnsupportedModelError("the first T5 block has no relative_attention_bias: not the T5 layout")
    with torch.no_grad():
        return att.compute_bias(n, n).to(dtype)


__all__ = ["T5Adapter"]
