"""Decoder-only language models (docs/METHODS.md §2c): the base every decoder family builds on.

What is explained: the logit of a vocabulary entry (a causal LM's next-token
logit) or of a class (``*ForSequenceClassification``), read at one position
per row — by default each row's last real token, whichever side the batch is
padded on; ``explain(..., position=p)`` names another. Position ids follow the
attention mask as ``generate`` computes them, so a row's explanation does not
depend on its padding. Every input position gets a score; padding scores 0.

A family subclasses :class:`DecoderAdapter` and describes its blocks
(``_block(i, layer) -> BlockSpec``); the Llama layout (``model.model`` with
``embed_tokens``, ``layers``, ``norm``, ``rotary_emb``; ``lm_head`` or ``score``)
is the default here.

Shapes: B batch, T tokens (padding included), D width, V vocabulary, H heads, d head width.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

import torch
from torch import Tensor, nn

from ..rules.composites import LINEAR, Propagation
from ..errors import InputError, UnsupportedModelError
from .base import Adapter
from .blocks import PLAIN, AttentionSpec, BlockSpec, MlpSpec, Replay
from .checks import tokenized
from .readouts import HeadLayer, PositionReadout
from .records import EmbeddingRecord, TokenLayout, Trace
from .linear import is_linear


def position_ids(mask: Tensor) -> Tensor:
    """(B, T) position ids from the 0/1 mask, as ``generate`` computes them: real tokens count 0, 1, …"""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def last_real(mask: Tensor) -> Tensor:
    """(B,) the index of each row's last real token (padding on either side)."""
    idx = torch.arange(mask.shape[1], device=mask.device)
    return (idx[None, :] * mask).argmax(dim=-1)


def causal_bias(mask: Tensor, positions: Tensor, window: Optional[int], dtype: torch.dtype) -> Tensor:
    """(B, 1, T, T) additive mask: 0 where query i may attend key j, the dtype's minimum elsewhere.

    Allowed: j ≤ i, key j real, and (sliding window) ``pos_i − pos_j < window``. A padding query row
    attends itself only, so no row is fully masked (its output reaches no real token either way).
    """
    T = mask.shape[1]
    idx = torch.arange(T, device=mask.device)
    allowed = (idx[None, :] <= idx[:, None])[None] & mask[:, None, :].bool()
    if window is not None:
        allowed &= (positions[:, :, None] - positions[:, None, :]) < window
    allowed |= torch.eye(T, dtype=torch.bool, device=mask.device)[None] & ~mask[:, :, None].bool()
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]


class DecoderAdapter(Adapter):
    """A Hugging Face decoder-only LM (``*ForCausalLM``) or its ``*ForSequenceClassification``."""

    modality = "text"
    is_decoder = True
    #: text with a padding mask; the additive values are the dtype's minimum (:func:`causal_bias`)
    mask_value = float("-inf")

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.config = getattr(model, "config", None)
        self.base, layers, final_norm = self._stack()
        self.sdpa = getattr(self.config, "_attn_implementation", "eager") == "sdpa"
        self.blocks = [self._block(i, layer) for i, layer in enumerate(layers)]
        # the head; a batch is read at its rows' positions (readout_for), this one at token 0 only names the head
        self.readout = PositionReadout(final_norm, [HeadLayer(LINEAR, self._head())], torch.zeros(1))
        self.vocab_size = int(self.config.vocab_size)
        self.max_length = int(getattr(self.config, "max_position_embeddings", 0) or 0) or None

    # ------------------------------------------------------------ the family's part
    def _stack(self) -> tuple[nn.Module, Sequence[nn.Module], nn.Module]:
        """(the decoder stack, its layers, its final norm): the Llama layout ``model.model`` with ``layers``
        and ``norm`` (GPT-2 overrides: ``model.transformer`` with ``h`` and ``ln_f``)."""
        base = getattr(self.model, "model", None)
        if self.config is None or base is None or not hasattr(base, "layers"):
            raise UnsupportedModelError(f"{type(self.model).__name__}: not a decoder language model (expected "
                                        "model.model.layers)")
        return base, base.layers, base.norm

    def _head(self) -> nn.Linear:
        """The LM head (``lm_head``, tied or not) or the sequence classifier (``score``)."""
        head = getattr(self.model, "lm_head", None) or getattr(self.model, "score", None)
        if not is_linear(head):
            raise UnsupportedModelError(f"{type(self.model).__name__}: no LM head (lm_head) or classifier (score)")
        return head

    def _block(self, i: int, layer: nn.Module) -> BlockSpec:
        """A Llama-layout decoder layer: RMSNorm → attention (GQA, RoPE) → RMSNorm → gated MLP, pre-norm."""
        try:
            att, mlp = layer.self_attn, layer.mlp
            return BlockSpec(layout="pre_ln", norm1=layer.input_layernorm, norm2=layer.post_attention_layernorm,
                             attn=self._attention(att), mlp=MlpSpec(gate=mlp.gate_proj, fc1=mlp.up_proj,
                                                                    act=mlp.act_fn, fc2=mlp.down_proj))
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have the Llama layout (input_layernorm, self_attn "
                f"with q/k/v/o_proj, post_attention_layernorm, mlp with gate/up/down_proj): {e}") from None

    def _attention(self, att: nn.Module, **extra: Any) -> AttentionSpec:
        """An HF decoder attention: q/k/v/o projections, shared kv heads, RoPE, the model's scale and window."""
        cfg = self.config
        window = extra.pop("window", getattr(att, "sliding_window", None))
        return AttentionSpec(q=att.q_proj, k=att.k_proj, v=att.v_proj, proj=att.o_proj,
                             num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
                             head_dim=att.head_dim, scale=float(att.scaling), rotary=True,
                             q_norm=getattr(att, "q_norm", nn.Identity()), k_norm=getattr(att, "k_norm", nn.Identity()),
                             window=int(window) if window else None,
                             softmax_dtype=None if self.sdpa else torch.float32, sdpa=self.sdpa, causal=True,
                             **extra)

    def embed_tokens(self, ids: Tensor) -> Tensor:
        """e = ``model.get_input_embeddings()(ids)`` (B, T, D): what AttnLRP / CP-LRP read relevance at."""
        return self.model.get_input_embeddings()(ids)

    def rotary_tables(self, x0: Tensor, positions: Tensor, key: str) -> tuple[Tensor, Tensor]:
        """(cos, sin) (B, T, r) of the rotary embedding ``key`` at ``positions``, from the model's own module."""
        return self.base.rotary_emb(x0, positions)

    # ------------------------------------------------------------ validation
    def check_inputs(self, inputs) -> dict:
        ids, mask = tokenized(inputs, type(self.model).__name__)
        B, T = ids.shape
        if self.max_length is not None and T > self.max_length:
            raise InputError(f"the text is {T} tokens long; {type(self.model).__name__} accepts at most "
                             f"{self.max_length} (max_position_embeddings)")
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise InputError(f"input_ids must lie in [0, {self.vocab_size}) (the vocabulary size)")
        read = torch.zeros_like(mask)
        read[torch.arange(B), last_real(mask)] = 1
        return {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids(mask), "read_at": read}

    def at_position(self, prepared: dict, position: Any) -> dict:
        """``prepared`` read at ``position``: an int (every row) or one int per row; negative counts from the end.

        A position must be a real token of its row (not padding, not past the row).
        """
        mask = prepared["attention_mask"]
        B, T = mask.shape
        pos = torch.as_tensor(position, device=mask.device)
        if pos.dim() == 0:
            pos = pos.expand(B)
        if pos.shape != (B,) or pos.dtype not in (torch.int64, torch.int32):
            raise InputError(f"position must be an int or one int per row ({B} rows), got {position!r}")
        pos = torch.where(pos < 0, pos + T, pos).long()
        bad = torch.nonzero((pos < 0) | (pos >= T)).flatten().tolist()
        if bad:
            raise InputError(f"position {pos[bad[0]].item()} of row {bad[0]} is past the row (the batch has {T} "
                             f"tokens: use 0 … {T - 1}, or -{T} … -1 from the end)")
        pad = torch.nonzero(mask[torch.arange(B), pos] == 0).flatten().tolist()
        if pad:
            raise InputError(f"position {pos[pad[0]].item()} of row {pad[0]} is padding: name a real token")
        read = torch.zeros_like(mask)
        read[torch.arange(B), pos] = 1
        return {**prepared, "read_at": read}

    def layout(self, prepared: dict) -> TokenLayout:
        """The tokens a row's map covers: its real tokens up to the one read (``position=``), the context of the
        explained prediction — so a map read inside a longer sequence is that of the row cut after it (token
        ablation removes, and Grad-CAM averages and min-max scales over, the context only)."""
        mask, read = prepared["attention_mask"], prepared["read_at"].argmax(dim=-1)
        context = mask * (torch.arange(mask.shape[1], device=mask.device)[None, :] <= read[:, None]).to(mask.dtype)
        return TokenLayout(modality="text", num_tokens=mask.shape[1], output_start=0, readout_tokens=(), mask=context,
                           readout_rows=read, readout_minimum_applies=False)

    def readout_for(self, prepared: dict) -> PositionReadout:
        """The readout of this batch: the head at each row's read position."""
        return PositionReadout(self.readout.norm, self.readout.head, prepared["read_at"].argmax(dim=-1))

    # ------------------------------------------------------------ forward
    def embed(self, prepared: dict, r: Replay = PLAIN, track: bool = False) -> EmbeddingRecord:
        words = self.embed_tokens(prepared["input_ids"])
        if track:
            words = words.detach().requires_grad_(True)
        return EmbeddingRecord(x0=words, embeds=words)

    def block_context(self, x0: Tensor, mask: Tensor, positions: Optional[Tensor], fused: bool = False) -> list:
        """Per block (bias, rope): the causal (+ window) mask and the rotary tables of this batch.

        A fused replay of an unpadded batch gets no mask for its full-attention blocks: the kernel's own
        causal mask, so long sequences hold no N×N tensor at all.
        """
        if positions is None:
            positions = position_ids(mask)
        plain = fused and self.sdpa and bool(mask.all())
        biases = {w: None if plain and w is None else causal_bias(mask, positions, w, x0.dtype)
                  for w in {s.attn.window for s in self.blocks}}
        ropes = {k: self.rotary_tables(x0, positions, k) for k in {s.attn.rope_key for s in self.blocks if s.attn.rotary}}
        return [(biases[s.attn.window], ropes.get(s.attn.rope_key)) for s in self.blocks]

    # ------------------------------------------------------------ relevance
    def input_relevance(self, trace: Trace, R0: Tensor, prop: Propagation,
                        prepared: dict) -> tuple[Tensor, None]:
        """Relevance at the embedding output, summed over channels; padding scores 0."""
        return R0.sum(-1) * prepared["attention_mask"].to(R0.dtype), None


__all__ = ["DecoderAdapter", "position_ids", "last_real", "causal_bias"]
