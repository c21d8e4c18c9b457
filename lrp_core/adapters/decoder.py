"""Decoder-only language models (docs/METHODS.md §2c): the base every decoder family builds on.

What is explained: the logit of a vocabulary entry (a causal LM's next-token
logit) or of a class (``*ForSequenceClassification``), read at one position
per row — by default each row's last real token, whichever side the batch is
padded on (a sequence classifier: where it pools, its rightmost token that is
not ``config.pad_token_id``); ``explain(..., position=p)`` names another. A ``*ForTokenClassification``
(``position=`` required) and a ``*ForQuestionAnswering`` (``target="start" | "end"``) are read at that position
(:mod:`lrp_core.adapters.task_heads`).
Position ids follow the attention mask as ``generate`` computes them, so a
row's explanation does not depend on its padding — or are the ``position_ids``
given with the inputs. Rotary tables that depend on the longest position of
the batch (``dynamic``, ``longrope``) are chosen per row, as for the row
alone. Every input position gets a score; padding scores 0.

A family subclasses :class:`DecoderAdapter` and describes its blocks
(``_block(i, layer) -> BlockSpec``); the Llama layout (``model.model`` with
``embed_tokens``, ``layers``, ``norm``, ``rotary_emb``; ``lm_head`` or ``score``)
is the default here.

Shapes: B batch, T tokens (padding included), D width, V vocabulary, H heads, d head width.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Optional, TypeVar

import torch
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..rules.linear import is_linear
from ..rules.ops import LINEAR
from .base import Adapter
from .batches import DecoderBatch
from .blocks import NO_RECORD, AttentionSpec, BlockSpec, MlpSpec, Replay
from .checks import NO_EFFECT, input_keys, tokenized
from .kernels import eager_softmax_dtype
from .mlp_head import head_layers
from .parts import ModelPart
from .positions import (
    BATCH_DEPENDENT_ROPE,
    REFUSED_INPUTS,
    causal_bias,
    check_cache_position,
    given_position_ids,
    last_real,
    pooled_position,
    position_ids,
    row_rotary_tables,
)
from .readouts import HeadLayer, PositionReadout
from .records import EmbeddingRecord, TokenLayout, Trace
from .task_heads import (
    explained_logit,
    one_hot_rows,
    position_required,
    qa_head,
    qa_task_inputs,
    read_positions,
    task_of,
    token_head,
)

#: a decoder's batch, or a VLM's (a decoder batch with images) read through the VLM's language model
D = TypeVar("D", bound=DecoderBatch)


class DecoderAdapter(Adapter[DecoderBatch]):
    """A Hugging Face decoder-only LM (``*ForCausalLM``) or its ``*ForSequenceClassification``."""

    modality = "text"
    is_decoder = True
    #: text with a padding mask; the additive values are the dtype's minimum (:func:`causal_bias`)
    mask_value = float("-inf")

    def __init__(self, model: ModelPart):
        super().__init__(model)
        self.config: ModelPart = getattr(model, "config", None)  # a transformers config, read by name
        #: "sequence" (a causal LM or a sequence classifier), "token" or "qa" (lrp_core.adapters.task_heads)
        self.task = task_of(model)
        self.base, layers, final_norm = self._stack()
        assert self.config is not None, "_stack refuses a model without a config"
        self.sdpa = getattr(self.config, "_attn_implementation", "eager") == "sdpa"
        self.blocks = [self._block(i, layer) for i, layer in enumerate(layers)]
        # the head; a batch is read at its rows' positions (readout_for), this one at token 0 only names the head
        self.readout = PositionReadout(final_norm, self._head_layers(), torch.zeros(1))
        self.vocab_size = int(self.config.vocab_size)
        self.max_length = int(getattr(self.config, "max_position_embeddings", 0) or 0) or None
        if self._dynamic_rope():  # dynamic NTK scaling is there to run past max_position_embeddings
            self.max_length = None
        #: a sequence classifier pools at its last token that is not the padding id (:func:`pooled_position`)
        self.pools = self.task == "sequence" and getattr(model, "lm_head", None) is None and self._has("score")

    def _has(self, name: str) -> bool:
        """Whether the model has a submodule ``name`` (a head: ``lm_head``, ``score``)."""
        return getattr(self.model, name, None) is not None

    # ------------------------------------------------------------ the family's part
    def _stack(self) -> tuple[ModelPart, Sequence[ModelPart], ModelPart]:
        """(the decoder stack, its layers, its final norm): the Llama layout ``model.model`` (a question-answering
        head: ``model.transformer``) with ``layers`` and ``norm`` (GPT-2 overrides: ``model.transformer`` with ``h``
        and ``ln_f``)."""
        base = getattr(self.model, "model", None)
        if base is None and self.task == "qa":
            base = getattr(self.model, "transformer", None)
        if self.config is None or base is None or not hasattr(base, "layers"):
            raise UnsupportedModelError(
                f"{type(self.model).__name__}: not a decoder language model (expected model.model.layers)"
            )
        return base, base.layers, base.norm

    def _head(self) -> nn.Linear:
        """The LM head (``lm_head``, tied or not) or the sequence classifier (``score``)."""
        head: ModelPart = getattr(self.model, "lm_head", None) or getattr(self.model, "score", None)
        if not is_linear(head):
            raise UnsupportedModelError(f"{type(self.model).__name__}: no LM head (lm_head) or classifier (score)")
        return head

    def _head_layers(self) -> list[HeadLayer]:
        """The layers after the final norm: the head alone (Gemma 2 adds its logit soft-cap); a classifier
        (``score``, a token classifier's ``score`` / ``classifier``) may be an MLP head; ``qa_outputs``."""
        if self.task == "qa":
            return qa_head(self.model)
        if self.task == "token":
            return token_head(self.model, "score", "classifier")
        score = getattr(self.model, "score", None)
        if getattr(self.model, "lm_head", None) is None and isinstance(score, nn.Sequential):
            return head_layers(score, f"{type(self.model).__name__}.score")
        return [HeadLayer(LINEAR, self._head())]

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        """A Llama-layout decoder layer: RMSNorm → attention (GQA, RoPE) → RMSNorm → gated MLP, pre-norm."""
        try:
            att, mlp = layer.self_attn, layer.mlp
            return BlockSpec(
                layout="pre_ln",
                norm1=layer.input_layernorm,
                norm2=layer.post_attention_layernorm,
                attn=self._attention(att),
                mlp=MlpSpec(gate=mlp.gate_proj, fc1=mlp.up_proj, act=mlp.act_fn, fc2=mlp.down_proj),
            )
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have the Llama layout (input_layernorm, self_attn "
                f"with q/k/v/o_proj, post_attention_layernorm, mlp with gate/up/down_proj): {e}"
            ) from None

    def _attention(self, att: ModelPart, **extra: Any) -> AttentionSpec:
        """An HF decoder attention: q/k/v/o projections, shared kv heads, RoPE, the model's scale and window."""
        cfg = self.config
        window = extra.pop("window", getattr(att, "sliding_window", None))
        return AttentionSpec(
            q=att.q_proj,
            k=att.k_proj,
            v=att.v_proj,
            proj=att.o_proj,
            num_heads=cfg.num_attention_heads,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=att.head_dim,
            scale=float(att.scaling),
            rotary=True,
            q_norm=getattr(att, "q_norm", nn.Identity()),
            k_norm=getattr(att, "k_norm", nn.Identity()),
            window=int(window) if window else None,
            softmax_dtype=eager_softmax_dtype(self.config),
            sdpa=self.sdpa,
            causal=True,
            **extra,
        )

    def embed_tokens(self, ids: Tensor) -> Tensor:
        """e = ``model.get_input_embeddings()(ids)`` (B, T, D): what AttnLRP / CP-LRP read relevance at."""
        return self.model.get_input_embeddings()(ids)

    def rotary_tables(
        self, x0: Tensor, positions: Tensor, key: str, mask: Optional[Tensor] = None
    ) -> tuple[Tensor, Tensor]:
        """(cos, sin) (B, T, r) of the rotary embedding ``key`` at ``positions``, from the model's own module
        (each row's as for the row alone: :func:`row_rotary_tables`; ``mask`` (B, T) 1 = real token)."""
        return row_rotary_tables(self.base.rotary_emb, x0, positions, mask)

    def _dynamic_rope(self) -> bool:
        """Whether a rotary table of the model uses dynamic NTK scaling (its length limit is then none)."""
        kinds = getattr(getattr(self.base, "rotary_emb", None), "rope_type", None)
        kinds = kinds.values() if isinstance(kinds, Mapping) else [kinds]
        return any(isinstance(k, str) and "dynamic" in k for k in kinds)

    # ------------------------------------------------------------ validation
    #: the input keys the replay reads as the model does (``cache_position`` only as 0 … T−1: no cache)
    honoured_inputs = ("input_ids", "attention_mask", "position_ids", "cache_position")

    def check_inputs(self, inputs) -> DecoderBatch:
        name = type(self.model).__name__
        ids, mask = tokenized(inputs, name)
        # token_type_ids: no decoder embedding but GPT-2's reads them (GPT2Adapter refuses them)
        input_keys(inputs, name, self.honoured_inputs, REFUSED_INPUTS, NO_EFFECT + ("token_type_ids",))
        B, T = ids.shape
        if self.max_length is not None and T > self.max_length:
            raise InputError(
                f"the text is {T} tokens long; {name} accepts at most {self.max_length} (max_position_embeddings)"
            )
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise InputError(f"input_ids must lie in [0, {self.vocab_size}) (the vocabulary size)")
        check_cache_position(inputs.get("cache_position"), T)
        given = inputs.get("position_ids")
        positions = (
            position_ids(mask)
            if given is None
            else given_position_ids(
                given,
                mask,
                self.max_length,
                inputs.get("attention_mask") is not None,
                any(s.attn.window is not None for s in self.blocks),
            )
        )
        pad = getattr(
            self.config.get_text_config() if hasattr(self.config, "get_text_config") else self.config,
            "pad_token_id",
            None,
        )
        at = pooled_position(ids, mask, pad) if self.pools else last_real(mask)
        read = torch.zeros_like(mask)
        read[torch.arange(B), at] = 1
        return DecoderBatch(input_ids=ids, attention_mask=mask, position_ids=positions, read_at=read)

    def at_position(self, prepared: D, position: Any) -> D:
        """``prepared`` read at ``position``: an int (every row) or one int per row; negative counts from the end.

        A position must be a real token of its row (not padding, not past the row).
        """
        mask = prepared.attention_mask
        return prepared.replace(read_at=one_hot_rows(mask, read_positions(mask, position)))

    def task_inputs(self, prepared: D, position: Any, target: Any) -> tuple[D, Any]:
        """A token classifier: ``position`` required; question answering: ``target="start" | "end"``, the position
        by default each row's argmax of that logit; else the batch read at ``position`` (default: the last token)."""
        if self.task == "token" and position is None:
            raise position_required(self.model, self.task)
        if self.task == "qa":
            return qa_task_inputs(self, prepared, position, target)
        if position is not None:
            prepared = self.at_position(prepared, position)
        return prepared, target

    def task_result(self, prepared: D, result: Any) -> Any:
        """Question answering: ``logits`` (B,) the explained start or end logit."""
        if self.task != "qa":
            return result
        return dataclasses.replace(result, logits=explained_logit(result.logits, result.target))

    def layout(self, prepared: DecoderBatch) -> TokenLayout:
        """The tokens a row's map covers: its real tokens up to the one read (``position=``), the context of the
        explained prediction — so a map read inside a longer sequence is that of the row cut after it (token
        ablation removes, and Grad-CAM averages and min-max scales over, the context only)."""
        mask, read = prepared.attention_mask, prepared.read
        context = mask * (torch.arange(mask.shape[1], device=mask.device)[None, :] <= read[:, None]).to(mask.dtype)
        return TokenLayout(
            modality="text",
            num_tokens=mask.shape[1],
            output_start=0,
            readout_tokens=(),
            mask=context,
            readout_rows=read,
            readout_minimum_applies=False,
        )

    def readout_for(self, prepared: DecoderBatch) -> PositionReadout:
        """The readout of this batch: the head at each row's read position."""
        return PositionReadout(self.readout.norm, self.readout.head_layers, prepared.read)

    # ------------------------------------------------------------ the model's own output
    @property
    def length_dependent(self) -> bool:
        """Whether a rotary table of the model depends on the length of the call (:data:`BATCH_DEPENDENT_ROPE`)."""
        kinds = getattr(getattr(self.base, "rotary_emb", None), "rope_type", None)
        kinds = kinds.values() if isinstance(kinds, Mapping) else [kinds]
        return any(isinstance(k, str) and any(d in k for d in BATCH_DEPENDENT_ROPE) for k in kinds)

    def own_pieces(self, prepared: DecoderBatch) -> list:
        """Rows without their padding, rows of one length together: each as the model computes it alone."""
        from .verification import unpadded_pieces

        return unpadded_pieces(prepared, self.length_dependent)

    def own_inputs(self, prepared: DecoderBatch) -> dict:
        """The model's own keyword inputs for the batch: ``input_ids``, ``attention_mask``, ``position_ids``."""
        return {
            "input_ids": prepared.input_ids,
            "attention_mask": prepared.attention_mask,
            "position_ids": prepared.position_ids,
        }

    def own_output(self, prepared: DecoderBatch) -> Tensor:
        """(B, C) the model's own logits at each row's read position (a classifier: its head's there)."""
        from .verification import read_logits

        # a classifier's own head output at the read tokens (its pooling, or a per-token head's logits there)
        head = self.readout.head_layers[-1].module if self.pools or self.task != "sequence" else None
        return read_logits(self.model, {**self.own_inputs(prepared), "use_cache": False}, prepared.read, head)

    # ------------------------------------------------------------ forward
    def embed(self, prepared: DecoderBatch, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        words = self.embed_tokens(prepared.input_ids)
        if track:
            words = words.detach().requires_grad_(True)
        return EmbeddingRecord(x0=words, embeds=words)

    def block_context(
        self, x0: Tensor, mask: Optional[Tensor], positions: Optional[Tensor], fused: bool = False
    ) -> list:
        """Per block (bias, rope): the causal (+ window) mask and the rotary tables of this batch.

        A fused replay of an unpadded batch gets no mask for its full-attention blocks: the kernel's own
        causal mask, so long sequences hold no N×N tensor at all.
        """
        assert mask is not None, "a decoder always has a padding mask (run_blocks makes one: mask_value is set)"
        if positions is None:
            positions = position_ids(mask)
        plain = fused and self.sdpa and bool(mask.all())
        biases = {
            w: None if plain and w is None else causal_bias(mask, positions, w, x0.dtype)
            for w in {s.attn.window for s in self.blocks}
        }
        ropes = {
            k: self.rotary_tables(x0, positions, k, mask)
            for k in {s.attn.rope_key for s in self.blocks if s.attn.rotary}
        }
        return [(biases[s.attn.window], ropes.get(s.attn.rope_key)) for s in self.blocks]

    # ------------------------------------------------------------ relevance
    def input_relevance(self, trace: Trace, R: list, prepared: DecoderBatch) -> tuple[Tensor, None]:
        """Relevance at the embedding output, summed over channels; padding scores 0."""
        return R[0].sum(-1) * prepared.attention_mask.to(R[0].dtype), None


__all__ = ["DecoderAdapter"]
