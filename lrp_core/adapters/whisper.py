"""Whisper (``WhisperForConditionalGeneration``): speech recognition as an encoder-decoder (docs/METHODS.md §2n).

The source is the log-mel spectrogram ``input_features`` (B, n_mels, T_audio); the encoder's stem is two
``Conv1d`` (the second with stride 2) each followed by GELU, then the sinusoidal position rows (an additive
constant) over its S = T_audio / 2 positions; the blocks are pre-LN with a final norm per stack (the BART layout's
names), the decoder's positions learned, the head ``proj_out``. What is explained is as for the text
encoder-decoders: ``exp.source`` (B, S) over the encoder positions after the stem (the stem's output is where
those scores are read), ``exp.prefix`` (B, P), and — for the gradient methods that reach the input (AttnLRP,
CP-LRP) — ``exp.frames`` (B, T_audio): the relevance of each log-mel frame in time, summed over the mel bins,
with ``Σ frames = Σ source`` where the stem conserves (its convolutions by the ε-rule: their gradient; GELU by the
identity rule). Plain LRP is refused (the stem's convolutions have no explicit rule here).

Shapes: B batch, n_mels mel bins, T_audio frames, S encoder positions, P prefix tokens, D width.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..rules.linear import is_linear
from ..rules.ops import ELEMENTWISE, LINEAR, POS_ADD
from .batches import Seq2SeqBatch
from .checks import NO_EFFECT, input_keys
from .positions import position_ids
from .readouts import HeadLayer
from .records import EmbeddingRecord
from .replay import NO_RECORD, Replay
from .seq2seq import SEQ2SEQ_REFUSED_METHODS, HeadView, PreNormSeq2SeqAdapter


class WhisperAdapter(PreNormSeq2SeqAdapter):
    """``WhisperForConditionalGeneration``: the audio stem, then the pre-LN encoder-decoder."""

    refused_methods = {
        **SEQ2SEQ_REFUSED_METHODS,
        "lrp": "its audio stem's two convolutions have no explicit relevance rule here. Use attnlrp or cp_lrp "
        "(exp.frames: the log-mel frames' relevance) or a Captum baseline",
    }
    honoured_inputs = ("input_features", "attention_mask", "decoder_input_ids", "decoder_attention_mask")

    def _head_layers(self) -> list[HeadLayer]:
        head = getattr(self.model, "proj_out", None)
        if not is_linear(head):
            raise UnsupportedModelError(f"{type(self.model).__name__}: no LM head (proj_out)")
        return [HeadLayer(LINEAR, HeadView(head))]

    @property
    def source_vocab(self) -> int:
        return 0

    def check_inputs(self, inputs: Any) -> Seq2SeqBatch:
        """``input_features`` (B, n_mels, 2·max_source_positions) and the decoder prefix."""
        name = type(self.model).__name__
        feats = inputs.get("input_features") if hasattr(inputs, "get") else None
        if not isinstance(feats, Tensor) or feats.dim() != 3:
            raise InputError(f"{name} explains speech: pass input_features (B, n_mels, T_audio) from its processor")
        conv1, conv2 = self.encoder.conv1, self.encoder.conv2
        S = int(self.encoder.embed_positions.num_embeddings)
        T = S * int(conv1.stride[0]) * int(conv2.stride[0])
        if feats.shape[1] != conv1.in_channels or feats.shape[2] != T:
            raise InputError(f"{name}: input_features must be (B, {conv1.in_channels}, {T}); got {tuple(feats.shape)}")
        input_keys(inputs, name, self.honoured_inputs, {}, NO_EFFECT)
        mask = torch.ones(feats.shape[0], S, dtype=torch.long)
        given = {k: v for k, v in inputs.items() if k != "attention_mask"}  # the encoder reads every frame
        feats = feats.to(dtype=conv1.weight.dtype)
        return self._with_prefix(given, name, None, mask, input_features=feats)

    def own_inputs(self, prepared: Seq2SeqBatch) -> dict:
        return {
            "input_features": prepared.input_features,
            "decoder_input_ids": prepared.decoder_input_ids,
            "decoder_attention_mask": prepared.decoder_attention_mask,
        }

    def token_embeddings(self, prepared: Seq2SeqBatch, token: int) -> Tensor:
        raise InputError(f"{type(self.model).__name__}'s source is audio: use baseline='zeros'")

    def embed(self, prepared: Seq2SeqBatch, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """The stem on the frames (``images``: the frames, a leaf when tracked) and the prefix's word embeddings;
        ``embeds`` (B, S + P, D): the stem's output, then the word embeddings."""
        feats = prepared.input_features
        assert feats is not None, "a speech batch has its frames"
        words = prepared.inputs_embeds
        if words is None:
            if track:
                feats = feats.detach().requires_grad_(True)
            dec = self.word_embeddings(self.decoder, prepared.decoder_input_ids)
            if track:
                dec = dec.detach().requires_grad_(True)
            # a split model: the stem's output and the prefix's words where the frames are
            words = torch.cat([self.stem(feats, r).to(feats.device), dec.to(feats.device)], dim=1)
        S = prepared.source_length
        table = self.encoder.embed_positions.weight[:S].to(words)
        src = r(POS_ADD, torch.add, words[:, :S], table.expand(words.shape[0], -1, -1))
        dec_x = self.embed_side(self.decoder, words[:, S:], position_ids(prepared.decoder_attention_mask), r)
        return EmbeddingRecord(x0=torch.cat([src, dec_x.to(src.device)], dim=1), embeds=words, images=feats)

    def stem(self, feats: Tensor, r: Replay) -> Tensor:
        """(B, n_mels, T_audio) -> (B, S, D): ``gelu(conv2(gelu(conv1(x))))``, time last to time second. The
        convolutions are computed plainly (their gradient: the ε-rule), GELU through the replay (identity rule)."""
        gelu = nn.GELU()
        h = r(ELEMENTWISE, gelu, self.encoder.conv1(feats), module=gelu)
        h = r(ELEMENTWISE, gelu, self.encoder.conv2(h), module=gelu)
        return h.permute(0, 2, 1)

    def position_rows(self, stack: Any, positions: Tensor) -> Tensor:
        return stack.embed_positions.weight[positions]


__all__ = ["WhisperAdapter"]
