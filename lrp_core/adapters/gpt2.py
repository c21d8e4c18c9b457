"""GPT-2 (Hugging Face ``GPT2LMHeadModel``, ``GPT2ForSequenceClassification``; DistilGPT-2 too).

Pre-LN blocks with LayerNorm, one fused ``c_attn`` projection (q, k, v, each H·d wide), a GELU MLP
(``gelu_new``), a learned position embedding added to the token embedding, ``ln_f`` and the tied LM head (or the
``score`` classifier read at the last real token). Its projections are ``Conv1D`` layers — a Linear whose
weight is stored transposed, ``(D_in, D_out)`` —; :class:`Conv1DLinear` shows each to the engine as a Linear
without touching the model. docs/METHODS.md §2c: the position add is the ViT one (``lrp`` keeps the token part);
AttnLRP / CP-LRP read relevance at the token embedding ``wte(ids)``, before the positions are added.

Shapes: B batch, T tokens (padding included), D width.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import torch
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..rules.linear import LinearView, effective_linear
from ..rules.ops import POS_ADD
from .batches import DecoderBatch
from .blocks import NO_RECORD, AttentionSpec, BlockSpec, MlpSpec, Replay
from .decoder import DecoderAdapter
from .parts import ModelPart
from .records import EmbeddingRecord, Trace


class Conv1DLinear(LinearView):
    """A read-only Linear view of a GPT-2 ``Conv1D`` (``y = x W + b`` with ``W`` (D_in, D_out)).

    ``weight`` is ``conv.weight.T`` — a view (D_out, D_in), no copy — and ``bias`` the conv's own, so the Linear
    rules (signed, baseline, plain gradient) read the facts they expect. A peft layer on the conv (LoRA with
    ``fan_in_fan_out``, IA³) is viewed the same way, its adapters added in (:func:`effective_linear`). The conv
    is not registered as a submodule: the view owns no parameters, and always reads the conv's current tensors
    (after ``model.double()`` too). ``forward`` runs the conv itself, so the replay computes exactly what the
    model does and hooks the user put on the conv fire as they would.
    """

    conv: ModelPart  # the model's Conv1D (set in __init__: a plain attribute, not a child module)

    def __init__(self, conv: nn.Module):
        super().__init__()
        weight = getattr(conv, "weight", None)
        if weight is None or weight.dim() != 2:
            raise UnsupportedModelError(f"expected a transformers Conv1D with a 2-D weight (D_in, D_out), got {conv!r}")
        object.__setattr__(self, "conv", conv)  # plain attribute: not a child module, no parameters of its own

    @property
    def weight(self) -> Tensor:
        """(D_out, D_in): the conv's weight transposed, a view sharing its storage (a new view object per access:
        a pass that caches weight parts by identity, ``Replay(cache=True)``, is for shared layers only);
        with a peft adapter on the conv, the weight its forward applies."""
        return self.linear_parts()[0]

    @property
    def bias(self) -> Tensor | None:
        """(D_out,): the conv's bias (with a peft adapter, the bias its forward adds)."""
        return self.linear_parts()[1]

    def linear_parts(self) -> tuple[Tensor, Tensor | None]:
        """(weight (D_out, D_in), bias (D_out,)) of the map the conv (with its adapters, if any) computes."""
        return effective_linear(self.conv)

    @property
    def in_features(self) -> int:
        return int(self.conv.weight.shape[0])

    @property
    def out_features(self) -> int:
        return int(self.conv.weight.shape[1])

    def forward(self, x: Tensor) -> Tensor:
        """(..., D_in) -> (..., D_out), by the conv itself (``addmm`` of the model, bit for bit)."""
        return self.conv(x)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, view of {self.conv!r}"


class GPT2Adapter(DecoderAdapter):
    """Hugging Face GPT-2 decoders (eager or sdpa attention)."""

    def __init__(self, model: nn.Module):
        cfg = getattr(model, "config", None)
        if getattr(cfg, "add_cross_attention", False):
            raise UnsupportedModelError(
                f"{type(model).__name__}: GPT-2 with cross-attention (add_cross_attention) "
                "is an encoder-decoder's decoder; only the self-attention GPT-2 is supported"
            )
        super().__init__(model)

    @cached_property
    def module_names(self) -> dict:
        """The model's module → qualified name, each Conv1D view named as its Conv1D (``transformer.h.0.mlp.c_fc``):
        the views are not modules of the model, and a composite's name patterns must reach them."""
        names = dict(self._model_module_names())
        for spec in self.blocks:
            for view in (spec.attn.qkv, spec.attn.proj, spec.mlp.fc1, spec.mlp.fc2):
                names[view] = names[view.conv]
        return names

    def _stack(self) -> tuple[ModelPart, Sequence[ModelPart], ModelPart]:
        base = getattr(self.model, "transformer", None)
        if self.config is None or base is None or not hasattr(base, "h"):
            raise UnsupportedModelError(f"{type(self.model).__name__}: not a GPT-2 (expected model.transformer.h)")
        return base, base.h, base.ln_f

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        """ln_1 → attention (fused c_attn, c_proj) → + → ln_2 → c_fc → GELU → c_proj → +; pre-LN."""
        try:
            att, mlp = layer.attn, layer.mlp
            H = int(att.num_heads)
            return BlockSpec(
                layout="pre_ln",
                norm1=layer.ln_1,
                norm2=layer.ln_2,
                attn=AttentionSpec(
                    qkv=Conv1DLinear(att.c_attn),
                    proj=Conv1DLinear(att.c_proj),
                    num_heads=H,
                    head_dim=int(att.head_dim),
                    scale=float(att.scaling),
                    sdpa=self.sdpa,
                    causal=True,
                ),
                mlp=MlpSpec(fc1=Conv1DLinear(mlp.c_fc), act=mlp.act, fc2=Conv1DLinear(mlp.c_proj)),
            )
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have the GPT-2 layout (ln_1, "
                f"attn.c_attn / c_proj, ln_2, mlp.c_fc / act / c_proj): {e}"
            ) from None

    def check_inputs(self, inputs) -> DecoderBatch:
        prepared = super().check_inputs(inputs)
        if inputs.get("token_type_ids") is not None:  # GPT-2 would add wte(token_type_ids) to every token
            raise InputError(
                "GPT-2 is explained without token_type_ids (the model would add their token embeddings "
                "to the input): pass input_ids and attention_mask only"
            )
        return prepared

    def embed(self, prepared: DecoderBatch, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """``wte(ids)`` (the tokens e, read by AttnLRP / CP-LRP) + ``wpe(position ids)``: block 0's input (B, T, D)."""
        tokens = self.embed_tokens(prepared.input_ids)
        if track:
            tokens = tokens.detach().requires_grad_(True)
        x0 = r(POS_ADD, torch.add, tokens, self.base.wpe(prepared.position_ids))  # dropout: inference
        return EmbeddingRecord(x0=x0, embeds=tokens, tokens=tokens, x_pos=x0)

    def relevance_inputs(self, trace: Trace) -> list:
        """Block 0's input and the word embeddings (the token part of the position add)."""
        assert trace.embedding is not None and trace.embedding.tokens is not None, "forward records the embedding"
        return [trace.x0, trace.embedding.tokens]

    def input_relevance(self, trace: Trace, R: list, prepared: DecoderBatch) -> tuple[Tensor, None]:
        """The word embeddings' relevance (their share of the position add), summed over channels; padding 0."""
        return R[1].sum(-1) * prepared.attention_mask.to(R[1].dtype), None


__all__ = ["Conv1DLinear", "GPT2Adapter"]
