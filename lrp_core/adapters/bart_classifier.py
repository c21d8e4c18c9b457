"""``BartForSequenceClassification`` (and mBART's): the encoder-decoder read at the source's last end-of-text
token by its classification head (docs/METHODS.md §2i).

The model feeds the decoder the source shifted right (``decoder_start_token_id`` first) unless given
``decoder_input_ids``, and reads the decoder's output at the last ``eos_token_id`` of ``input_ids``, then
``dense → tanh → out_proj``. The replay is the base's (:mod:`.seq2seq`: one S + P token axis), read there by that
head; the decoder's padding follows the source's (shifted), so a row's explanation is that of the row alone.

Shapes: B batch, S source tokens (the prefix has as many), C classes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..rules.linear import is_linear
from ..rules.ops import ELEMENTWISE, LINEAR
from .batches import Seq2SeqBatch
from .checks import tokenized
from .positions import last_real
from .readouts import HeadLayer
from .seq2seq import PreNormSeq2SeqAdapter, Seq2SeqAdapter


class BartClassifierAdapter(Seq2SeqAdapter):
    """``BartForSequenceClassification``: post-LN BART read at the last end-of-text token by its head."""

    is_decoder = False  # a class logit per text, not a next-token logit: the classifiers' defaults

    def _head_layers(self) -> list[HeadLayer]:
        head = getattr(self.model, "classification_head", None)
        if (
            head is None
            or not is_linear(getattr(head, "dense", None))
            or not is_linear(getattr(head, "out_proj", None))
        ):
            raise UnsupportedModelError(
                f"{type(self.model).__name__}: expected a classification_head with dense and out_proj Linears"
            )
        return [HeadLayer(LINEAR, head.dense), HeadLayer(ELEMENTWISE, nn.Tanh()), HeadLayer(LINEAR, head.out_proj)]

    @property
    def prefix_vocab(self) -> int:
        return self.source_vocab

    def check_inputs(self, inputs: Any) -> Seq2SeqBatch:
        """The source; the prefix is the source shifted right (the model's default) unless given, read at the
        source's last end-of-text token."""
        name = type(self.model).__name__
        ids, mask = tokenized(inputs, name)
        eos = int(self.config.eos_token_id)
        at_eos = ids == eos
        if not bool(at_eos.any(dim=1).all()):
            raise InputError(
                f"{name} reads its prediction at the last end-of-text token (id {eos}): every row needs one"
            )
        given = dict(inputs)
        if given.get("decoder_input_ids") is None:
            start = self._start_tokens(ids, mask)
            given["decoder_input_ids"] = torch.cat([start[:, None], ids[:, :-1]], dim=1)
            shifted = torch.cat([torch.ones_like(mask[:, :1]), mask[:, :-1]], dim=1)
            after = last_real(mask) + 1  # the shifted source's last token: padding (the row alone has n tokens)
            inside = after < mask.shape[1]
            shifted[torch.nonzero(inside).flatten(), after[inside]] = 0
            given["decoder_attention_mask"] = shifted
        elif torch.as_tensor(given["decoder_input_ids"]).shape != ids.shape:
            raise InputError(f"{name} reads the decoder at the source's positions: decoder_input_ids must be (B, S)")
        batch = self._with_prefix(given, name, ids, mask)
        S = ids.shape[1]
        last = S - 1 - at_eos.flip(1).long().argmax(dim=1)  # each row's last end-of-text token
        read = torch.zeros_like(batch.read_at)
        read[torch.arange(ids.shape[0]), last.to(read.device)] = 1
        return batch.replace(read_at=read)

    def _start_tokens(self, ids: Tensor, mask: Tensor) -> Tensor:
        """(B,) the token the shifted source starts with: ``decoder_start_token_id``."""
        return torch.full_like(ids[:, 0], int(self.config.decoder_start_token_id))

    def at_position(self, prepared: Seq2SeqBatch, position: Any) -> Seq2SeqBatch:
        raise InputError(
            f"{type(self.model).__name__} reads its prediction at the last end-of-text token; position= names "
            "the prefix token of an encoder-decoder LM (BartForConditionalGeneration)"
        )

    def own_output(self, prepared: Seq2SeqBatch) -> Tensor:
        """(B, C) the model's own class logits."""
        return self.model(**self.own_inputs(prepared), use_cache=False).logits


class MBartClassifierAdapter(BartClassifierAdapter, PreNormSeq2SeqAdapter):
    """``MBartForSequenceClassification``: as BART's, with mBART's pre-LN blocks and final norms; its shifted
    source starts with the row's last real token (the language id), as mBART's ``shift_tokens_right`` does for
    the row alone."""

    def _start_tokens(self, ids: Tensor, mask: Tensor) -> Tensor:
        return ids[torch.arange(ids.shape[0]), last_real(mask)]


__all__ = ["BartClassifierAdapter", "MBartClassifierAdapter"]
