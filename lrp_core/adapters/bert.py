"""Post-LayerNorm BERT-family sequence classifiers from Hugging Face.

``BertForSequenceClassification`` (and encoders with the same layout: RoBERTa,
ELECTRA-style heads). As for ViTs, the adapter replays the forward pass from
the model's own submodules — whatever attention implementation (eager, sdpa)
the model is configured with — and never changes the model.

Shapes: B batch, T tokens (padding included), D width, H heads, d = D / H.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..rules import Composite, select
from .base import Adapter, BlockRelevance, Trace

#: Additive mask value of the reference implementation; softmax gives exactly 0 there.
MASK_VALUE = -10000.0


@dataclass
class LayerParts:
    query: nn.Linear
    key: nn.Linear
    value: nn.Linear
    attn_dense: nn.Linear
    attn_norm: nn.LayerNorm
    inter_dense: nn.Linear
    act: nn.Module
    out_dense: nn.Linear
    out_norm: nn.LayerNorm
    num_heads: int
    head_dim: int
    scale: float


class BertAdapter(Adapter):
    family = "bert"

    def __init__(self, model: nn.Module):
        self.model = model
        name = type(model).__name__
        cfg = getattr(model, "config", None)
        base = getattr(model, "base_model", None)
        if cfg is None or base is None or not hasattr(base, "embeddings") or not hasattr(base, "encoder") \
                or not hasattr(base.encoder, "layer"):
            raise UnsupportedModelError(
                f"{name}: not a BERT-family encoder (expected base_model.embeddings and base_model.encoder.layer)")
        if getattr(cfg, "is_decoder", False):
            raise UnsupportedModelError(f"{name}: decoder (causal) models are not supported")
        pet = getattr(cfg, "position_embedding_type", "absolute")
        if pet not in (None, "absolute"):
            raise UnsupportedModelError(f"{name}: position_embedding_type={pet!r} is not supported (only 'absolute')")
        self.base = base
        self.layers = [self._parts(i, layer, cfg) for i, layer in enumerate(base.encoder.layer)]
        self.pool_dense, self.pool_act, self.classifier = self._head(model, base)
        self.max_length = int(getattr(cfg, "max_position_embeddings", 512))
        pad_offset = getattr(cfg, "pad_token_id", None) if "Roberta" in name else None
        if pad_offset is not None:  # RoBERTa positions start after the padding index
            self.max_length -= int(pad_offset) + 1
        self.vocab_size = int(getattr(cfg, "vocab_size", 0)) or None

    # ------------------------------------------------------------------ facts
    @property
    def num_blocks(self) -> int:
        return len(self.layers)

    @property
    def num_heads(self) -> int:
        return self.layers[0].num_heads

    @property
    def num_classes(self) -> int:
        return self.classifier.out_features

    def output_slice(self) -> slice:
        return slice(0, None)

    @staticmethod
    def _parts(i: int, layer: nn.Module, cfg) -> LayerParts:
        try:
            sa, so = layer.attention.self, layer.attention.output
            parts = LayerParts(
                query=sa.query, key=sa.key, value=sa.value, attn_dense=so.dense, attn_norm=so.LayerNorm,
                inter_dense=layer.intermediate.dense, act=layer.intermediate.intermediate_act_fn,
                out_dense=layer.output.dense, out_norm=layer.output.LayerNorm,
                num_heads=cfg.num_attention_heads, head_dim=cfg.hidden_size // cfg.num_attention_heads,
                scale=(cfg.hidden_size // cfg.num_attention_heads) ** -0.5)
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have the BERT layout "
                f"(attention.self.query/key/value, attention.output, intermediate, output): {e}") from None
        if getattr(layer, "crossattention", None) is not None:
            raise UnsupportedModelError(f"layer {i} has cross-attention; only encoders are supported")
        return parts

    @staticmethod
    def _head(model: nn.Module, base: nn.Module) -> tuple[nn.Linear, nn.Module, nn.Linear]:
        clf = getattr(model, "classifier", None)
        pooler = getattr(base, "pooler", None)
        if isinstance(clf, nn.Linear) and pooler is not None and isinstance(getattr(pooler, "dense", None), nn.Linear):
            return pooler.dense, pooler.activation, clf  # BERT: [CLS] -> dense -> tanh -> classifier
        if clf is not None and isinstance(getattr(clf, "dense", None), nn.Linear) \
                and isinstance(getattr(clf, "out_proj", None), nn.Linear):
            act = getattr(clf, "activation", None) or nn.Tanh()  # RoBERTa's head uses tanh inline
            return clf.dense, act, clf.out_proj
        raise UnsupportedModelError(
            f"{type(model).__name__}: classification head not recognised (expected a pooler (dense + tanh) with a "
            "Linear classifier, or a classifier with dense and out_proj)")

    # ------------------------------------------------------------ validation
    def check_inputs(self, inputs) -> dict:
        if isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], str)):
            raise InputError("text must be tokenized first: pass the tokenizer's output (a dict / BatchEncoding with "
                             "input_ids and attention_mask), e.g. tokenizer(texts, padding=True, return_tensors='pt')")
        if not isinstance(inputs, Mapping) or "input_ids" not in inputs:
            raise InputError(f"{type(self.model).__name__} explains text: pass a dict / BatchEncoding with "
                             f"'input_ids' and 'attention_mask', got {type(inputs).__name__}")
        ids = torch.as_tensor(inputs["input_ids"])
        if ids.dim() == 1:
            raise InputError(f"input_ids must be batched (B, T); got shape {tuple(ids.shape)} — use ids.unsqueeze(0)")
        if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
            raise InputError(f"input_ids must be an integer tensor of shape (B, T); got {tuple(ids.shape)} {ids.dtype}")
        B, T = ids.shape
        if B == 0 or T == 0:
            raise InputError("the text is empty: no tokens to explain")
        mask = inputs.get("attention_mask")
        mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask).to(ids.device)
        if mask.shape != ids.shape:
            raise InputError(f"attention_mask has shape {tuple(mask.shape)}, input_ids {tuple(ids.shape)}")
        lengths = mask.sum(dim=1)
        if (lengths == 0).any():
            empty = torch.nonzero(lengths == 0).flatten().tolist()
            raise InputError(f"sample(s) {empty} are empty (attention_mask is all zeros)")
        if T > self.max_length:
            raise InputError(
                f"the text is {T} tokens long; {type(self.model).__name__} accepts at most {self.max_length}. "
                f"Tokenize with truncation=True, max_length={self.max_length} to cut it")
        if self.vocab_size is not None and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise InputError(f"input_ids must lie in [0, {self.vocab_size}) (the vocabulary size)")
        tt = inputs.get("token_type_ids")
        return {"input_ids": ids.long(), "attention_mask": mask.long(),
                "token_type_ids": None if tt is None else torch.as_tensor(tt).long()}

    # --------------------------------------------------------------- forward
    def forward(self, prepared: dict, *, grad: bool = False) -> Trace:
        with torch.set_grad_enabled(grad):
            kwargs = {"input_ids": prepared["input_ids"]}
            if prepared.get("token_type_ids") is not None:
                kwargs["token_type_ids"] = prepared["token_type_ids"]
            x0 = self.base.embeddings(**kwargs)
            if grad and not x0.requires_grad:
                x0 = x0.detach().requires_grad_(True)
            trace = self.run_blocks(x0, prepared["attention_mask"])
        return trace

    def run_blocks(self, x0: Tensor, mask: Optional[Tensor] = None) -> Trace:
        B, T, _ = x0.shape
        mask = torch.ones(B, T, dtype=torch.long, device=x0.device) if mask is None else mask
        bias = (1.0 - mask[:, None, None, :].to(x0.dtype)) * MASK_VALUE  # (B, 1, 1, T)
        trace = Trace(x0=x0, mask=mask)
        x = x0
        for p in self.layers:
            x, acts = _layer_forward(p, x, bias)
            trace.acts.append(acts)
        cls = x[:, 0]
        trace.pooled = self.pool_act(self.pool_dense(cls))
        trace.acts.append({"cls": cls})  # the pooler's input, for the relevance pass
        trace.logits = self.classifier(trace.pooled)
        return trace

    def cdam_tokens(self, trace: Trace) -> Tensor:
        return trace.acts[self.num_blocks - 1]["h"]

    # ------------------------------------------------------------- relevance
    def relprop(self, trace: Trace, R_out: Tensor, composite: Composite, stop_block: int = 0,
                to_pixels: bool = False, prepared: Optional[dict] = None, to_inputs: bool = False) -> BlockRelevance:
        """``to_inputs``: continue below ``stop_block``'s attention to the embeddings (``out.inputs``)."""
        if to_pixels:
            raise InputError("pixel relevance exists for images only")
        B, T, D = trace.x0.shape
        L = self.num_blocks
        cache: dict = {}  # the weights' signed parts, computed once per pass
        R_pooled = composite.linear(self.classifier, trace.pooled, R_out)  # dropout: identity
        R_cls = composite.linear(self.pool_dense, trace.acts[L]["cls"], R_pooled)  # tanh: identity
        R = torch.zeros(B, T, D, dtype=R_cls.dtype, device=R_cls.device)
        R[:, 0] = select(trace.acts[L]["cls"], R_cls)
        out = BlockRelevance(attn=[None] * L, tokens=torch.zeros(B, L, T, dtype=R.dtype, device=R.device))
        for b in range(L - 1, stop_block - 1, -1):
            out.tokens[:, b] = R.sum(-1)  # leaving layer b
            R, out.attn[b] = _layer_relprop(self.layers[b], trace.acts[b], R, composite,
                                            to_inputs or b > stop_block, cache)
        if R is not None:
            out.inputs = R.sum(-1)
        return out


def _layer_forward(p: LayerParts, x: Tensor, bias: Tensor) -> tuple[Tensor, dict]:
    B, T, D = x.shape
    H, d = p.num_heads, p.head_dim
    lin_out = {"q": p.query(x), "k": p.key(x), "v": p.value(x)}
    q, k, v = (lin_out[n].reshape(B, T, H, d).transpose(1, 2) for n in "qkv")
    s = (q @ k.transpose(-2, -1)) * p.scale  # (B, H, T, T)
    A = (s + bias).softmax(dim=-1)
    ctx = A @ v
    o = ctx.transpose(1, 2).reshape(B, T, H * d)
    d1 = p.attn_dense(o)
    a = p.attn_norm(d1 + x)
    lin_out["inter"] = p.inter_dense(a)
    g = p.act(lin_out["inter"])
    d2 = p.out_dense(g)
    out = p.out_norm(d2 + a)
    lin_out.update(attn=d1, out=d2)
    return out, {"h": x, "q": q, "k": k, "v": v, "s": s, "bias": bias, "A": A, "ctx": ctx, "o": o,
                 "d1": d1, "a": a, "g": g, "d2": d2, "out": lin_out}


def _layer_relprop(p: LayerParts, act: dict, R: Tensor, c: Composite, deeper: bool, cache: dict):
    """Relevance of the layer output -> (relevance of the layer input or None, R^A)."""
    add, matmul, clone = c.op("add"), c.op("matmul"), c.op("clone")
    B, T, D = R.shape
    H, d = p.num_heads, p.head_dim
    out = act["out"]
    lin = lambda m, name, x, r: c.linear(m, x, r, out=out[name], cache=cache)  # noqa: E731
    # output LayerNorm: identity; FFN branch | skip
    R_d2, R_a = add(act["d2"], act["a"], R)
    R_g = lin(p.out_dense, "out", act["g"], R_d2)
    R_a = clone(lin(p.inter_dense, "inter", act["a"], R_g), R_a, x=act["a"])
    # attention LayerNorm: identity; attention output dense | skip
    R_d1, R_h = add(act["d1"], act["h"], R_a)
    R_o = lin(p.attn_dense, "attn", act["o"], R_d1).reshape(B, T, H, d).transpose(1, 2)
    R_A, R_v = matmul(act["A"], act["v"], R_o, z=act["ctx"])
    if not deeper:
        return None, R_A
    s = act["s"]
    R_s, _ = c.op("mask_add")(s, act["bias"].expand_as(s), R_A)  # softmax: identity; keep the scores' share
    R_q, R_kT = matmul(act["q"], act["k"].transpose(-2, -1), R_s)
    flat = lambda t: t.transpose(1, 2).reshape(B, T, H * d)  # noqa: E731
    h = act["h"]
    R_qkv = clone(lin(p.query, "q", h, flat(R_q)), lin(p.key, "k", h, flat(R_kT.transpose(-2, -1))),
                  lin(p.value, "v", h, flat(R_v)), x=h)  # the three-way Clone
    return clone(R_qkv, R_h, x=h), R_A


__all__ = ["BertAdapter", "LayerParts", "MASK_VALUE"]
