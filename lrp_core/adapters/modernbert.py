"""ModernBERT sequence classifiers from Hugging Face (``ModernBertForSequenceClassification``).

A pre-LN encoder (docs/METHODS.md §2j): word embeddings → LayerNorm (no position embedding: positions enter
through rotary q/k), blocks ``x + Wo(attn(attn_norm(x)))`` then ``+ Wo(act(a) ⊙ g)`` with ``a, g =
Wi(mlp_norm(·))`` halves (the first block's ``attn_norm`` is the identity), fused ``Wqkv``, LayerNorms and
Linears without biases where the config says so, ``final_norm``. Attention is bidirectional; every
``global_attn_every_n_layers``-th layer attends to every token, the others to the keys within
``±local_attention // 2`` positions (``config.sliding_window``), each layer type with its own rotary base
(``rope_key`` = the layer type). The readout pools [CLS] (token 0) or the mean of the real tokens
(``classifier_pooling``), then ``head`` (dense → act → LayerNorm) and ``classifier``.

Hugging Face's own mask is reproduced, with one difference where it cannot matter: a padding query row that
has no real key in its window attends itself only (the model's eager softmax turns it into NaN in float64 —
its float32 softmax of the float64 minimum — which then reaches the real tokens through ``0 · NaN`` in the next
``A·V``; sdpa gives it some finite row). Padding keys get weight exactly 0 either way and padding rows are
never read ([CLS] pooling of a left-padded row, which would read one, is refused), so every real token's state
is the model's. Eager attention computes its softmax in float32 and ModernBERT rotates float32 copies of q and
k; the replay does both, so a float64 model is replayed to float64 round-off.

Shapes: B batch, T tokens (padding included), D width, C classes.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..rules.linear import is_linear
from ..rules.norms import norm_kind
from ..rules.ops import ELEMENTWISE, LINEAR
from .base import Adapter
from .batches import TextBatch
from .blocks import NO_RECORD, AttentionSpec, BlockSpec, MlpSpec, Replay
from .checks import NO_EFFECT, input_keys, token_ids, tokenized
from .kernels import eager_softmax_dtype
from .parts import ModelPart
from .positions import given_position_ids, row_rotary_tables
from .readouts import HeadLayer, MaskedMeanReadout, Readout, TokenReadout
from .records import EmbeddingRecord, TokenLayout, Trace
from .task_heads import POSITION_TASKS, EncoderTaskHeads, task_of

#: the attention implementations whose padded forward the replay reproduces
_IMPLEMENTATIONS = ("eager", "sdpa")


def encoder_bias(mask: Tensor, window: Optional[int], dtype: torch.dtype) -> Tensor:
    """The additive mask of a bidirectional encoder: 0 where query i may attend key j, the dtype's minimum elsewhere.

    Allowed: key j real and (``window``) ``|i − j| ≤ window`` — transformers' bidirectional (sliding-window)
    mask, by token index. A query row with no allowed key (a padding token farther than the window from every
    real token) attends itself only, so no row is fully masked.

    Parameters
    ----------
    mask : Tensor
        The attention mask ``(B, T)``, 1 for a real token.
    window : int or None
        The sliding window in tokens (``|i − j| ≤ window``), or ``None`` for global attention.
    dtype : torch.dtype
        The scores' dtype, whose minimum marks a forbidden pair.

    Returns
    -------
    Tensor
        The bias ``(B, 1, T, T)`` in ``dtype``.
    """
    T = mask.shape[1]
    idx = torch.arange(T, device=mask.device)
    allowed = mask[:, None, :].bool().expand(-1, T, -1)
    if window is not None:
        allowed = allowed & ((idx[:, None] - idx[None, :]).abs() <= window)[None]
    empty = ~allowed.any(dim=-1, keepdim=True)  # (B, T, 1)
    allowed = allowed | (torch.eye(T, dtype=torch.bool, device=mask.device)[None] & empty)
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]


class ModernBertAdapter(EncoderTaskHeads, Adapter[TextBatch]):
    """``ModernBertForSequenceClassification`` (eager or sdpa attention; [CLS] or mean pooling), and the
    token-classification, question-answering, masked-LM and multiple-choice heads
    (:class:`~lrp_core.adapters.task_heads.EncoderTaskHeads`)."""

    modality = "text"
    #: text with a padding mask; the additive values are the dtype's minimum (:func:`encoder_bias`)
    mask_value = float("-inf")
    config: ModelPart  # the model's transformers config, read by name
    base: ModelPart  # model.model: embeddings, layers, rotary_emb
    #: the input keys the replay reads as the model does
    honoured_inputs = ("input_ids", "attention_mask", "position_ids")
    #: input keys the model reads that the replay does not, and what to pass instead
    refused_inputs = {
        "inputs_embeds": "the token scores are read at the model's own word embeddings of input_ids, so embeddings "
        "given directly are refused: pass input_ids (and attention_mask)",
    }

    def __init__(self, model: nn.Module):
        super().__init__(model)
        name = type(model).__name__
        self.task = task_of(model)
        cfg = self.config = getattr(model, "config", None)
        self.base = getattr(model, "model", None)
        if cfg is None or self.base is None or not hasattr(self.base, "layers") or not hasattr(self.base, "rotary_emb"):
            raise UnsupportedModelError(
                f"{name}: not a ModernBERT classifier (expected model.embeddings, model.layers, model.rotary_emb)"
            )
        impl = getattr(cfg, "_attn_implementation", "eager")
        if impl not in _IMPLEMENTATIONS:
            raise UnsupportedModelError(
                f"{name}: attn_implementation={impl!r} is not one the replay is checked against (eager and sdpa, "
                "both reproduced to float64 round-off; flash attention unpads the batch and bounds its window its own "
                "way, flex attention compiles its own kernel): load the model with attn_implementation='sdpa' or "
                "'eager'"
            )
        self.sdpa = impl == "sdpa"
        self.pooling = getattr(cfg, "classifier_pooling", "cls")
        if self.task == "mlm" and getattr(cfg, "sparse_prediction", False):
            raise UnsupportedModelError(
                f"{name}: sparse_prediction=True computes the logits of the labelled tokens only; load the model "
                "with sparse_prediction=False (the same function at every token)"
            )
        if self.pooling not in ("cls", "mean") and self.task in ("sequence", "choice"):
            raise UnsupportedModelError(
                f"{name}: classifier_pooling={self.pooling!r}; the model then classifies "
                "every token, not the text. Supported: 'cls', 'mean'"
            )
        self.blocks = [self._block(i, layer) for i, layer in enumerate(self.base.layers)]
        if self.task in POSITION_TASKS:
            self.readout = self._readout_of(self._task_head(self.task), norm=self.base.final_norm)
        else:
            self.readout = TokenReadout(norm=self.base.final_norm, head_layers=self._head())
        self.vocab_size = int(cfg.vocab_size)

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        """attn_norm → attention (Wqkv, RoPE, window) → + → mlp_norm → GLU MLP (Wi halves, Wo) → +."""
        cfg = self.config
        try:
            att, mlp = layer.attn, layer.mlp
            H = int(cfg.num_attention_heads)
            d = int(att.head_dim)
            local = layer.attention_type == "sliding_attention"
            return BlockSpec(
                layout="pre_ln",
                norm1=layer.attn_norm,
                norm2=layer.mlp_norm,
                attn=AttentionSpec(
                    qkv=att.Wqkv,
                    proj=att.Wo,
                    num_heads=H,
                    head_dim=d,
                    scale=d**-0.5,
                    rotary=True,
                    rope_key=layer.attention_type,
                    window=int(cfg.sliding_window) if local else None,
                    softmax_dtype=eager_softmax_dtype(self.config),
                    sdpa=self.sdpa,
                    rotary_dtype=torch.float32,
                ),
                mlp=MlpSpec(fc1=mlp.Wi, fused_gate=True, act=mlp.act, fc2=mlp.Wo),
            )
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have the ModernBERT layout (attn_norm, attn with Wqkv "
                f"/ Wo, mlp_norm, mlp with Wi / Wo, attention_type): {e}"
            ) from None

    def _task_head(self, task: str) -> list:
        """A per-token head: head.dense → head.act → head.norm, then the classifier (token classification), the
        start / end classifier (question answering) or the decoder (masked LM)."""
        out = "decoder" if task == "mlm" else "classifier"
        layers = self._head(out)
        if task == "qa" and layers[-1].module.out_features != 2:
            raise UnsupportedModelError(
                f"{type(self.model).__name__}.classifier gives {layers[-1].module.out_features} columns: a "
                "question-answering head gives two (start, end)"
            )
        return layers

    def _head(self, out: str = "classifier") -> list:
        """head.dense → head.act → head.norm → classifier (the pooled token's layers; dropout: inference)."""
        head: ModelPart = getattr(self.model, "head", None)
        clf: ModelPart = getattr(self.model, out, None)
        if not is_linear(getattr(head, "dense", None)) or not is_linear(clf):
            raise UnsupportedModelError(
                f"{type(self.model).__name__}: classification head not recognised (expected "
                "head.dense / head.act / head.norm and a Linear classifier)"
            )
        return [
            HeadLayer(LINEAR, head.dense),
            HeadLayer(ELEMENTWISE, head.act),
            HeadLayer(norm_kind(head.norm), head.norm),
            HeadLayer(LINEAR, clf),
        ]

    # ------------------------------------------------------------ validation
    def check_rows(self, inputs) -> TextBatch:
        """The tokenizer output (B, T) as a :class:`TextBatch` (``check_inputs``: the task's inputs, through this)."""
        name = type(self.model).__name__
        ids, mask = tokenized(inputs, name)
        # token_type_ids: the model has no segment table and its forward ignores them (a misshapen one is a mistake)
        input_keys(inputs, name, self.honoured_inputs, self.refused_inputs, NO_EFFECT + ("token_type_ids",))
        types = inputs.get("token_type_ids")
        types = None if types is None else token_ids(types, "token_type_ids")
        if types is not None and types.shape != ids.shape:
            raise InputError(
                f"token_type_ids has shape {tuple(types.shape)}, input_ids {tuple(ids.shape)}: they must "
                "be the same (one segment id per token; the model ignores them)"
            )
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise InputError(f"input_ids must lie in [0, {self.vocab_size}) (the vocabulary size)")
        if self.pooling == "cls" and self.task not in POSITION_TASKS:
            bad = torch.nonzero(mask[:, 0] == 0).flatten().tolist()
            if bad:
                raise InputError(
                    f"the classifier reads token 0 ([CLS]), which is padding in row {bad[0]} (the batch "
                    "is padded on the left): the model would classify a padding token's state. Pad on "
                    "the right (tokenizer.padding_side = 'right')"
                )
        given = inputs.get("position_ids")
        # the model counts its window in tokens and places RoPE at the position ids: any ids are its computation
        pos = None if given is None else given_position_ids(given, mask, None, True, False)
        return TextBatch(input_ids=ids, attention_mask=mask, position_ids=pos)

    def text_layout(self, prepared: TextBatch) -> TokenLayout:
        """Every token scored, [CLS] read where the head pools it (``layout``: the task's, through this)."""
        mask = prepared.attention_mask
        return TokenLayout(
            modality="text",
            num_tokens=mask.shape[1],
            output_start=0,
            readout_tokens=self.readout_for(prepared).tokens,
            mask=mask,
        )

    def sequence_readout(self, prepared: TextBatch) -> Readout:
        """[CLS] pooling (:attr:`readout`), or the mean over this batch's real tokens."""
        if self.pooling == "cls":
            return self.readout
        return MaskedMeanReadout(self.readout.norm, self.readout.head_layers, prepared.attention_mask)

    # --------------------------------------------------------------- forward
    def embed(self, prepared: TextBatch, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """``embeds`` (B, T, D) the word embeddings (what AttnLRP / CP-LRP read relevance at); ``x0`` = their
        LayerNorm (dropout: inference)."""
        emb = self.base.embeddings
        words = emb.tok_embeddings(prepared.input_ids)
        if track:
            words = words.detach().requires_grad_(True)
        return EmbeddingRecord(x0=r.norm(emb.norm, words), embeds=words)

    def block_context(
        self, x0: Tensor, mask: Optional[Tensor], positions: Optional[Tensor], fused: bool = False
    ) -> list:
        """Per block (bias, rope): the padding (+ window) mask and the rotary tables of its layer type.

        Positions: the given ones, else ``0 … T−1`` in every row, as the model numbers them (padding included).
        """
        assert mask is not None, "a text encoder always has a padding mask (run_blocks makes one: mask_value is set)"
        B, T = mask.shape
        if positions is None:
            positions = torch.arange(T, device=mask.device)[None].expand(B, T)
        biases = {w: encoder_bias(mask, w, x0.dtype) for w in {s.attn.window for s in self.blocks}}
        ropes = {
            k: row_rotary_tables(self.base.rotary_emb, x0, positions, mask, k)
            for k in {s.attn.rope_key for s in self.blocks}
        }
        return [(biases[s.attn.window], ropes[s.attn.rope_key]) for s in self.blocks]

    # ------------------------------------------------------------ relevance
    def input_relevance(self, trace: Trace, R: list, prepared: TextBatch) -> tuple[Tensor, None]:
        """Relevance at block 0's input (the embedding LayerNorm's output), summed over channels; padding 0."""
        return R[0].sum(-1) * prepared.attention_mask.to(R[0].dtype), None


__all__ = ["ModernBertAdapter", "encoder_bias"]
