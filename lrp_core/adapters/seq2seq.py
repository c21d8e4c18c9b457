"""Encoder-decoder models (docs/METHODS.md §2i): the base every encoder-decoder family builds on.

What is explained: the logit ``y_t`` of target token ``t`` at prefix position ``p`` of the decoder, given the
source (``input_ids``, ``attention_mask``) and the decoder prefix (``decoder_input_ids``, teacher forcing;
default ``p``: each row's last real prefix token, ``explain(..., position=p)`` names another).

The replay runs one token axis of ``S + P`` tokens: the source's S, then the prefix's P. Block 0's input is
both embeddings side by side; an encoder block updates the first S tokens and passes the prefix on; the last
encoder block's output (after the encoder's final norm, where it has one) is the *memory*; a decoder block
updates the last P tokens — causal self-attention, cross-attention (queries from the prefix, keys and values
from the memory), MLP — and passes the memory on. The readout is the LM head at token ``S + p``. So every method
of the single-stream engine sees one (B, S + P) map: ``exp.scores`` is the source's scores then the prefix's, and
``exp.source`` (B, S), ``exp.prefix`` (B, P) are its two parts; padding and the prefix after ``p`` score 0.

Positions follow each side's mask (real tokens count 0, 1, …), so a row's explanation does not depend on its
padding, on either side: the model's own output it is checked against is that of each row without its padding.

A family subclasses :class:`Seq2SeqAdapter`: the BART layout (``model.model.encoder`` / ``decoder`` with
``embed_tokens``, ``embed_positions``, ``layers``) is the default here.

Shapes: B batch, S source tokens, P prefix tokens, D width, V vocabulary.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..rules.linear import LinearView, effective_linear, is_linear
from ..rules.ops import LINEAR, POS_ADD
from ..runtime.devices import Placement, entry_device
from ..runtime.precision import compute_precision
from .base import Adapter
from .batches import Seq2SeqBatch
from .blocks import NO_RECORD, AttentionSpec, BlockSpec, MlpSpec, Replay, block_forward
from .checks import NO_EFFECT, attention_mask, input_keys, token_ids, tokenized
from .parts import IDENTITY, ModelPart
from .positions import causal_bias, last_real, position_ids
from .readouts import HeadLayer, PositionReadout, Readout
from .records import EmbeddingRecord, TokenLayout, Trace

#: the methods the single-stream engine defines that have no meaning across an encoder and a decoder
SEQ2SEQ_REFUSED_METHODS = {
    **{
        m: "it multiplies token-to-token attention matrices block by block (or reads one block's map), and an "
        "encoder-decoder has two token sets — the encoder's self-attention over the source, the decoder's causal "
        "self-attention over the prefix and its cross-attention from the prefix to the source — so no one matrix "
        "product is defined across the two stacks (docs/METHODS.md §2i). Use attnlrp, cp_lrp, lrp or a Captum "
        "baseline"
        for m in (
            "transformer_attribution",
            "generic_attention",
            "rollout",
            "raw_attention",
            "attention_gradcam",
            "partial_lrp",
            "cdam",
        )
    },
    "token_ablation": "it removes one token at a time from one token sequence; an encoder-decoder's source and "
    "prefix are two, and a removal is not defined here yet. Use attnlrp, cp_lrp or occlusion",
    "pa_lrp": "its positional relevance is one (B, T) map over the position encoding of one token set; an "
    "encoder-decoder has two (the encoder's and the decoder's). Use attnlrp or cp_lrp",
    "leave_one_out": "it removes sources from a decoder-only model's context; an encoder-decoder's source is "
    "another input. Use occlusion or the token-map methods",
    "context_cite": "it removes sources from a decoder-only model's context; an encoder-decoder's source is "
    "another input. Use occlusion or the token-map methods",
}


class HeadView(LinearView):
    """The LM head as one Linear: ``head(x · scale) + bias`` — BART / Marian's ``final_logits_bias``, T5's
    ``d_model^-½`` rescale before a tied head — computed as the model does, read by the rules as
    ``W_eff = scale · W``, ``b_eff = bias (+ the head's own)``. Holds the model's tensors (no copy)."""

    head: ModelPart
    extra_bias: Optional[Tensor]

    def __init__(self, head: ModelPart, bias: Optional[Tensor] = None, scale: Optional[float] = None):
        super().__init__()
        object.__setattr__(self, "head", head)  # plain attribute: not a child module
        object.__setattr__(self, "extra_bias", bias)
        self.scale = scale

    def linear_parts(self) -> tuple[Tensor, Optional[Tensor]]:
        w, b = effective_linear(self.head)
        if self.scale is not None:
            w = w * self.scale
        extra = self.extra_bias
        if extra is not None:
            extra = extra.reshape(-1)
            b = extra if b is None else b + extra
        return w, b

    @property
    def weight(self) -> Tensor:
        return self.linear_parts()[0]

    @property
    def bias(self) -> Optional[Tensor]:
        return self.linear_parts()[1]

    @property
    def in_features(self) -> int:
        return int(self.head.weight.shape[1])

    @property
    def out_features(self) -> int:
        return int(self.head.weight.shape[0])

    def forward(self, x: Tensor) -> Tensor:
        """(..., D) -> (..., V), in the model's order of operations."""
        y = self.head(x * self.scale if self.scale is not None else x)
        return y if self.extra_bias is None else y + self.extra_bias


def _causal_within(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """(B, 1, P, P) the decoder's causal mask over its prefix (padding keys masked)."""
    return causal_bias(mask, position_ids(mask), None, dtype)


class Seq2SeqAdapter(Adapter[Seq2SeqBatch]):
    """A Hugging Face encoder-decoder LM (``*ForConditionalGeneration``): the BART layout by default."""

    modality = "text"
    is_decoder = True  # a next-token logit read at one position per row (the decoders' defaults and readout)
    is_seq2seq = True
    mask_value = float("-inf")
    refused_methods: Mapping[str, str] = SEQ2SEQ_REFUSED_METHODS
    #: the encoder's blocks are pre-LN (mBART, Pegasus, T5, Whisper) rather than post-LN (BART, Marian)
    pre_norm = False
    #: the keys of the inputs the replay reads
    honoured_inputs = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask")

    def __init__(self, model: ModelPart):
        super().__init__(model)
        self.config: ModelPart = getattr(model, "config", None)
        self.encoder, self.decoder = self._stacks()
        enc_layers, dec_layers = self._layers(self.encoder), self._layers(self.decoder)
        self.num_encoder_blocks = len(enc_layers)
        self.blocks = [self._block(i, layer) for i, layer in enumerate(enc_layers + dec_layers)]
        self.encoder_norm: nn.Module = self._final_norm(self.encoder)
        self.readout = PositionReadout(self._final_norm(self.decoder), self._head_layers(), torch.zeros(1))
        self.vocab_size = int(self.readout.num_classes)
        self.max_length = int(getattr(self.config, "max_position_embeddings", 0) or 0) or None

    # ------------------------------------------------------------ the family's part
    def _stacks(self) -> tuple[ModelPart, ModelPart]:
        """(the encoder stack, the decoder stack): ``model.model.encoder`` / ``decoder``."""
        base = getattr(self.model, "model", None)
        enc, dec = getattr(base, "encoder", None), getattr(base, "decoder", None)
        if self.config is None or enc is None or dec is None or not hasattr(enc, "layers"):
            raise UnsupportedModelError(
                f"{type(self.model).__name__}: not an encoder-decoder of the BART layout "
                "(expected model.model.encoder.layers and model.model.decoder.layers)"
            )
        return enc, dec

    def _layers(self, stack: ModelPart) -> list:
        """A stack's layers, in order (``layers``)."""
        return list(stack.layers)

    def _final_norm(self, stack: ModelPart) -> nn.Module:
        """A stack's norm after its last block (pre-LN families: ``layer_norm``), identity where none."""
        norm = getattr(stack, "layer_norm", None)
        return norm if isinstance(norm, nn.Module) else IDENTITY

    def _head_layers(self) -> list[HeadLayer]:
        """The LM head with the model's ``final_logits_bias`` (BART, Marian) as one Linear view."""
        head = getattr(self.model, "lm_head", None)
        if not is_linear(head):
            raise UnsupportedModelError(f"{type(self.model).__name__}: no LM head (lm_head)")
        return [HeadLayer(LINEAR, HeadView(head, getattr(self.model, "final_logits_bias", None)))]

    def _attention(self, att: ModelPart, causal: bool = False) -> AttentionSpec:
        """A BART-style attention: q/k/v/out projections, the module's own scale, softmax in the model's dtype."""
        return AttentionSpec(
            q=att.q_proj,
            k=att.k_proj,
            v=att.v_proj,
            proj=att.out_proj,
            num_heads=int(att.num_heads),
            head_dim=int(att.head_dim),
            scale=float(att.scaling),
            causal=causal,
        )

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        """A BART-layout layer: self-attention, (decoder) cross-attention, fc1 → activation → fc2."""
        layout = "pre_ln" if self.pre_norm else "post_ln"
        decoder = i >= self.num_encoder_blocks
        try:
            return BlockSpec(
                layout=layout,
                norm1=layer.self_attn_layer_norm,
                norm2=layer.final_layer_norm,
                attn=self._attention(layer.self_attn, causal=decoder),
                mlp=MlpSpec(fc1=layer.fc1, act=layer.activation_fn, fc2=layer.fc2),
                cross=self._attention(layer.encoder_attn) if decoder else None,
                norm_cross=layer.encoder_attn_layer_norm if decoder else IDENTITY,
            )
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have the BART layout (self_attn with q/k/v/out_proj, "
                f"self_attn_layer_norm, encoder_attn in the decoder, fc1, fc2, final_layer_norm): {e}"
            ) from None

    def word_embeddings(self, stack: ModelPart, ids: Tensor) -> Tensor:
        """A stack's word embeddings of ``ids`` (B, n, D), scaled as the model scales them (``embed_scale``:
        BART inside its embedding module, Marian after it)."""
        table = stack.embed_tokens
        words = table(ids)
        if not hasattr(table, "embed_scale"):
            scale = getattr(stack, "embed_scale", None)
            if scale is not None and scale != 1.0:
                words = words * scale
        return words

    def token_embeddings(self, prepared: Seq2SeqBatch, token: int) -> Tensor:
        """(B, S + P, D) the word embedding of ``token`` at every source and prefix position, each side by its own
        module (the Captum baselines' "pad" / "mask" / token-id references)."""
        limit = min(self.source_vocab, self.prefix_vocab)
        if not 0 <= token < limit:
            raise InputError(f"baseline token id {token} is outside the vocabulary (0 … {limit - 1})")
        B, P = prepared.decoder_input_ids.shape
        full = lambda n: torch.full((B, n), token, dtype=torch.long, device=prepared.decoder_input_ids.device)  # noqa: E731
        with torch.no_grad():
            src = self.word_embeddings(self.encoder, full(prepared.source_length))
            return torch.cat([src, self.word_embeddings(self.decoder, full(P)).to(src)], dim=1)

    def position_rows(self, stack: ModelPart, positions: Tensor) -> Tensor:
        """(B, n, D) the stack's position embeddings at ``positions`` (learned with BART's offset, or a
        sinusoidal table): its own table, read at ``positions + offset``."""
        table = stack.embed_positions
        return F.embedding(positions.to(table.weight.device) + int(getattr(table, "offset", 0)), table.weight)

    def embed_side(self, stack: ModelPart, words: Tensor, positions: Tensor, r: Replay) -> Tensor:
        """One stack's input to its block 0: ``words + positions`` (a constant), then ``layernorm_embedding``."""
        x = r(POS_ADD, torch.add, words, self.position_rows(stack, positions).to(words))
        norm = getattr(stack, "layernorm_embedding", None)
        return r.norm(norm, x) if isinstance(norm, nn.Module) else x

    # ------------------------------------------------------------ validation
    def check_inputs(self, inputs: Any) -> Seq2SeqBatch:
        """The source and the decoder prefix, checked (``decoder_input_ids`` required: the prefix explained)."""
        name = type(self.model).__name__
        ids, mask = tokenized(inputs, name)
        return self._with_prefix(inputs, name, ids, mask)

    def _with_prefix(
        self, inputs: Mapping, name: str, ids: Optional[Tensor], mask: Tensor, **extra: Tensor
    ) -> Seq2SeqBatch:
        """The batch of a checked source (``ids`` (B, S) or a speech model's ``extra``) and the prefix."""
        input_keys(inputs, name, self.honoured_inputs, _REFUSED_INPUTS, NO_EFFECT)
        if inputs.get("decoder_input_ids") is None:
            raise InputError(
                f"{name} is explained at a decoder prefix: pass decoder_input_ids (B, P) — e.g. "
                f"[[config.decoder_start_token_id]] for the first token, or the translation so far — and "
                "decoder_attention_mask where it is padded"
            )
        dec = token_ids(inputs["decoder_input_ids"], "decoder_input_ids")
        dec_mask = attention_mask(inputs.get("decoder_attention_mask"), dec)
        B = mask.shape[0]
        if dec.shape[0] != B:
            raise InputError(f"decoder_input_ids has {dec.shape[0]} rows; the source has {B}")
        if bool((dec_mask.sum(dim=1) == 0).any()):
            raise InputError("a row of decoder_input_ids is all padding (decoder_attention_mask all zeros)")
        for key, t, limit in (("input_ids", ids, self.source_vocab), ("decoder_input_ids", dec, self.prefix_vocab)):
            if t is not None and (t.min() < 0 or t.max() >= limit):
                raise InputError(f"{key} must lie in [0, {limit}) (the vocabulary size)")
        for key, n in (("source", mask.shape[1]), ("prefix", dec.shape[1])):
            if self.max_length is not None and n > self.max_length:
                raise InputError(f"the {key} is {n} tokens long; {name} accepts at most {self.max_length}")
        read = torch.zeros_like(dec_mask)
        read[torch.arange(B), last_real(dec_mask)] = 1
        device = self._device()
        return Seq2SeqBatch(
            input_ids=None if ids is None else ids.to(device),
            attention_mask=mask.to(device),
            decoder_input_ids=dec.to(device),
            decoder_attention_mask=dec_mask.to(device),
            read_at=read.to(device),
            **{k: v.to(device) for k, v in extra.items()},
        )

    def _device(self) -> torch.device:
        return entry_device(self.model)  # the inputs' device: where the embedding computes

    @property
    def source_vocab(self) -> int:
        return int(self.encoder.embed_tokens.num_embeddings)

    @property
    def prefix_vocab(self) -> int:
        return int(self.decoder.embed_tokens.num_embeddings)

    def at_position(self, prepared: Seq2SeqBatch, position: Any) -> Seq2SeqBatch:
        """``prepared`` read at prefix position ``position``: an int or one per row; negative from the end."""
        mask = prepared.decoder_attention_mask
        B, P = mask.shape
        pos = torch.as_tensor(position, device=mask.device)
        if pos.dim() == 0:
            pos = pos.expand(B)
        if pos.shape != (B,) or pos.dtype not in (torch.int64, torch.int32):
            raise InputError(f"position must be an int or one int per row ({B} rows), got {position!r}")
        pos = torch.where(pos < 0, pos + P, pos).long()
        if bool(((pos < 0) | (pos >= P)).any()):
            raise InputError(f"position must name a prefix token: 0 … {P - 1}, or -{P} … -1 from the end")
        if bool((mask[torch.arange(B), pos] == 0).any()):
            raise InputError("position names a padding token of the prefix: name a real token")
        read = torch.zeros_like(mask)
        read[torch.arange(B), pos] = 1
        return prepared.replace(read_at=read)

    def context_mask(self, prepared: Seq2SeqBatch) -> Tensor:
        """(B, S + P) the tokens a row's map covers: its real source tokens and its real prefix up to ``p``."""
        dec = prepared.decoder_attention_mask
        upto = torch.arange(dec.shape[1], device=dec.device)[None, :] <= prepared.read[:, None]
        return torch.cat([prepared.attention_mask, dec * upto.to(dec.dtype)], dim=1)

    def layout(self, prepared: Seq2SeqBatch) -> TokenLayout:
        """One token axis: the source's S tokens, then the prefix's P; read at ``S + p``."""
        S = prepared.source_length
        return TokenLayout(
            modality="text",
            num_tokens=S + prepared.decoder_input_ids.shape[1],
            output_start=0,
            readout_tokens=(),
            mask=self.context_mask(prepared),
            readout_rows=prepared.read + S,
            readout_minimum_applies=False,
            source_tokens=S,
        )

    def readout_for(self, prepared: Seq2SeqBatch) -> PositionReadout:
        """The LM head at each row's token ``S + p``."""
        return PositionReadout(self.readout.norm, self.readout.head_layers, prepared.read + prepared.source_length)

    # ------------------------------------------------------------ the model's own output
    def context_row(self, prepared: Seq2SeqBatch, b: int) -> Seq2SeqBatch:
        """Row ``b`` alone, cut to its context: its real source tokens, its real prefix up to ``p`` (the features
        the Captum baselines perturb, in the row as it is explained alone)."""
        return _unpadded_row(prepared, b, upto_read=True)

    def own_pieces(self, prepared: Seq2SeqBatch) -> list:
        """Each row alone, its source and its prefix without their padding (read at the same real token)."""
        return [(torch.tensor([b]), _unpadded_row(prepared, b)) for b in range(prepared.size)]

    def own_inputs(self, prepared: Seq2SeqBatch) -> dict:
        """The model's keyword inputs (the source, the prefix, their masks)."""
        return {
            "input_ids": prepared.input_ids,
            "attention_mask": prepared.attention_mask,
            "decoder_input_ids": prepared.decoder_input_ids,
            "decoder_attention_mask": prepared.decoder_attention_mask,
        }

    def own_output(self, prepared: Seq2SeqBatch) -> Tensor:
        """(B, V) the model's own logits at each row's read prefix position."""
        logits = self.model(**self.own_inputs(prepared), use_cache=False).logits
        return logits[torch.arange(prepared.size), prepared.read.to(logits.device)]

    # ------------------------------------------------------------ forward
    def embed(self, prepared: Seq2SeqBatch, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """Both stacks' inputs side by side (B, S + P, D); ``embeds`` the word embeddings (source, then prefix)."""
        words = prepared.inputs_embeds
        if words is None:
            assert prepared.input_ids is not None, "a text encoder-decoder's batch has source tokens"
            src = self.word_embeddings(self.encoder, prepared.input_ids)
            words = torch.cat([src, self.word_embeddings(self.decoder, prepared.decoder_input_ids).to(src)], dim=1)
        if track:
            words = words.detach().requires_grad_(True)
        S = prepared.source_length
        src = self.embed_side(self.encoder, words[:, :S], position_ids(prepared.attention_mask), r)
        dec = self.embed_side(self.decoder, words[:, S:], position_ids(prepared.decoder_attention_mask), r)
        # a split model: both sides where the words are (the inputs' device; block 0 moves the stream on)
        return EmbeddingRecord(x0=torch.cat([src.to(words.device), dec.to(words.device)], dim=1), embeds=words)

    def forward(
        self,
        prepared: Seq2SeqBatch,
        *,
        grad: bool = False,
        composite: Any = None,
        track: bool = False,
        readout: Optional[Readout] = None,
        read_rows: bool = False,
    ) -> Trace:
        """The replay of both stacks (:meth:`Adapter.forward`'s arguments; ``read_rows`` changes nothing here)."""
        from ..rules.ops import EXPLICIT

        explicit = getattr(composite, "serves", None) == EXPLICIT
        r = Replay(composite, self._names_for(composite), fuse=False, where=self.module_name, cache=False)
        r.vjps = explicit and grad
        grad, track = grad or explicit, track or explicit
        head = self.readout_for(prepared) if readout is None else readout
        place = Placement(self.model, self.module_name)  # a split model: each module's input moved to its device
        with place.replaying(r), compute_precision(self.model), torch.set_grad_enabled(grad):
            emb = self.embed(prepared, r, track=track)
            if grad and not emb.x0.requires_grad:
                emb.x0 = emb.x0.detach().requires_grad_(True)
            trace = self._stacks_forward(emb.x0, prepared, r, head, place)
            trace.embedding = emb
        return trace

    def attention_biases(self, prepared: Seq2SeqBatch, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """(encoder self-attention (B, 1, 1, S), decoder causal (B, 1, P, P), cross-attention (B, 1, 1, S))."""
        src = prepared.attention_mask
        pad = (1.0 - src[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
        return pad, _causal_within(prepared.decoder_attention_mask, dtype), pad

    def _stacks_forward(self, x0: Tensor, prepared: Seq2SeqBatch, r: Replay, head: Readout, place: Placement) -> Trace:
        """Encoder blocks on the first S tokens, then decoder blocks on the last P (reading the memory).

        ``place``: where the model computes. Split over devices: each block on its device (the stream and the
        biases moved there), the modules between them (the encoder's final norm, the readout's) each on its own
        (``r.placement``), the logits back on x0's."""
        S = prepared.source_length
        biases = self.attention_biases(prepared, x0.dtype)
        trace = Trace(x0=x0, mask=prepared.mask, readout=head, replay=r)
        x = x0
        for b, spec in enumerate(self.blocks):
            device = place.device(f"block {b}", spec)
            x = place.move(x, device)
            enc_bias, dec_bias, cross_bias = (place.move(t, device, True) for t in biases)
            if b < self.num_encoder_blocks:
                src, dec = x[:, :S], x[:, S:]
                rec = block_forward(spec, src, enc_bias, r)
                out = rec.out
                if b == self.num_encoder_blocks - 1:
                    out = r.norm(self.encoder_norm, out)  # the memory
                rec.out = torch.cat([out, place.move(dec, out.device)], dim=1)
            else:
                memory, read = r.fork(x[:, :S], 2)
                rec = block_forward(spec, x[:, S:], dec_bias, r, memory=read, memory_bias=cross_bias)
                rec.out = torch.cat([memory, rec.out], dim=1)
            trace.blocks.append(rec)
            x = rec.out
        trace.readout_record = place.returned(head.forward(x, r), x0.device)
        return trace

    def run_blocks(self, *args: Any, **kwargs: Any) -> Trace:
        """Not defined: an encoder-decoder's blocks run from its batch (:meth:`forward`), not from one stream."""
        raise UnsupportedModelError(
            f"{type(self.model).__name__}: the blocks of an encoder-decoder run from its batch (source and prefix), "
            "so a method that replays from a changed block-0 input alone is not defined on it"
        )

    # ------------------------------------------------------------ relevance
    def input_relevance(self, trace: Trace, R: list, prepared: Seq2SeqBatch) -> tuple[Tensor, None]:
        """Relevance at both stacks' block-0 inputs, summed over channels; padding and tokens after p score 0."""
        return R[0].sum(-1) * self.context_mask(prepared).to(R[0].dtype), None


#: inputs the replay cannot honour, and why
_REFUSED_INPUTS = {
    "past_key_values": "the replay runs the whole prefix without a cache: drop past_key_values",
    "inputs_embeds": "the scores are read at the model's own embeddings of input_ids: pass input_ids",
    "decoder_inputs_embeds": "the scores are read at the model's own embeddings: pass decoder_input_ids",
    "encoder_outputs": "the source is explained through the encoder: pass input_ids (not its outputs)",
}


def _unpadded_row(prepared: Seq2SeqBatch, b: int, upto_read: bool = False) -> Seq2SeqBatch:
    """Row ``b`` alone, its source and prefix cut to their real tokens (``upto_read``: the prefix's up to ``p``)."""
    row = prepared.take(torch.tensor([b], device=prepared.attention_mask.device))
    src_keep = row.attention_mask[0].bool()
    dec_keep = row.decoder_attention_mask[0].bool()
    if upto_read:
        dec_keep = dec_keep & (torch.arange(dec_keep.shape[0], device=dec_keep.device) <= row.read[0])
    cut = {
        "input_ids": None if row.input_ids is None else row.input_ids[:, src_keep],
        "attention_mask": row.attention_mask[:, src_keep],
        "decoder_input_ids": row.decoder_input_ids[:, dec_keep],
        "decoder_attention_mask": row.decoder_attention_mask[:, dec_keep],
        "read_at": row.read_at[:, dec_keep],
    }
    if row.input_features is not None:  # speech: the encoder positions are all real
        del cut["input_ids"], cut["attention_mask"]
    return row.replace(**cut)


class PreNormSeq2SeqAdapter(Seq2SeqAdapter):
    """The BART layout with pre-LN blocks and a final norm per stack (mBART, Pegasus)."""

    pre_norm = True


class BlenderbotSmallAdapter(Seq2SeqAdapter):
    """BlenderbotSmall: the BART layout, whose decoder normalises its (unscaled) word embeddings before it adds
    the positions (the encoder: scaled, positions added, then normalised, as BART)."""

    def word_embeddings(self, stack: ModelPart, ids: Tensor) -> Tensor:
        words = stack.embed_tokens(ids)
        return words if stack is self.decoder else words * stack.embed_scale

    def embed_side(self, stack: ModelPart, words: Tensor, positions: Tensor, r: Replay) -> Tensor:
        if stack is not self.decoder:
            return super().embed_side(stack, words, positions, r)
        normed = r.norm(stack.layernorm_embedding, words)
        return r(POS_ADD, torch.add, normed, self.position_rows(stack, positions).to(words.dtype))


__all__ = ["BlenderbotSmallAdapter", "HeadView", "PreNormSeq2SeqAdapter", "SEQ2SEQ_REFUSED_METHODS", "Seq2SeqAdapter"]
