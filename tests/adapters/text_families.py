"""Tiny Hugging Face text classifiers of every supported family, built in milliseconds (no downloads)."""

from __future__ import annotations

import torch
from conftest import _perturb_norms

#: shared sizes: 2 heads of width 16, 3 classes, room for 40 positions
SIZES = dict(vocab_size=60, num_labels=3, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
BERT_LIKE = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=42,
    **SIZES,
)


def _bert(impl):
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(BertConfig(attn_implementation=impl, **BERT_LIKE))


def _roberta(impl):
    from transformers import RobertaConfig, RobertaForSequenceClassification

    return RobertaForSequenceClassification(
        RobertaConfig(attn_implementation=impl, pad_token_id=1, type_vocab_size=1, **BERT_LIKE)
    )


def _xlm_roberta(impl):
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    return XLMRobertaForSequenceClassification(XLMRobertaConfig(attn_implementation=impl, pad_token_id=1, **BERT_LIKE))


def _electra(impl):
    """embedding_size 16 != hidden 32: the embeddings_project Linear is in the replay."""
    from transformers import ElectraConfig, ElectraForSequenceClassification

    return ElectraForSequenceClassification(ElectraConfig(attn_implementation=impl, embedding_size=16, **BERT_LIKE))


def _distilbert(impl, sinusoidal: bool = False):
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    cfg = DistilBertConfig(
        attn_implementation=impl,
        vocab_size=60,
        dim=32,
        n_layers=2,
        n_heads=2,
        hidden_dim=64,
        max_position_embeddings=40,
        num_labels=3,
        dropout=0.1,
        attention_dropout=0.1,
        sinusoidal_pos_embds=sinusoidal,
    )
    return DistilBertForSequenceClassification(cfg)


def _albert(impl, groups: int = 1, inner: int = 1, layers: int = 3):
    """One layer shared by ``layers`` uses (default), or several groups of several layers."""
    from transformers import AlbertConfig, AlbertForSequenceClassification

    cfg = AlbertConfig(
        attn_implementation=impl,
        embedding_size=16,
        num_hidden_groups=groups,
        inner_group_num=inner,
        **{**BERT_LIKE, "num_hidden_layers": layers},
    )
    return AlbertForSequenceClassification(cfg)


def _mpnet(impl):
    from transformers import MPNetConfig, MPNetForSequenceClassification

    return MPNetForSequenceClassification(MPNetConfig(attn_implementation=impl, **BERT_LIKE))


def _modernbert(impl, pooling: str = "cls"):
    """3 layers, the first global and the other two sliding-window (±2 tokens: shorter than the texts)."""
    from transformers import ModernBertConfig, ModernBertForSequenceClassification

    cfg = ModernBertConfig(
        attn_implementation=impl,
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=48,
        global_attn_every_n_layers=3,
        local_attention=4,
        classifier_pooling=pooling,
        num_labels=3,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        max_position_embeddings=40,
    )
    return ModernBertForSequenceClassification(cfg)


#: family -> (builder(impl), attention implementations the model has)
FAMILIES = {
    "bert": (_bert, ("eager", "sdpa")),
    "roberta": (_roberta, ("eager", "sdpa")),
    "xlm_roberta": (_xlm_roberta, ("eager", "sdpa")),
    "electra": (_electra, ("eager", "sdpa")),
    "distilbert": (_distilbert, ("eager", "sdpa")),
    "distilbert_sinusoidal": (lambda impl: _distilbert(impl, sinusoidal=True), ("eager", "sdpa")),
    "albert": (_albert, ("eager", "sdpa")),
    "albert_groups": (lambda impl: _albert(impl, groups=2, inner=2, layers=4), ("eager", "sdpa")),
    "mpnet": (_mpnet, ("eager",)),  # MPNet has no sdpa path in transformers
    "modernbert": (_modernbert, ("eager", "sdpa")),
    "modernbert_mean": (lambda impl: _modernbert(impl, "mean"), ("eager", "sdpa")),
}

CASES = [(f, impl) for f, (_, impls) in FAMILIES.items() for impl in impls]


def make(family: str, impl: str = "eager", seed: int = 0) -> torch.nn.Module:
    """A tiny random classifier of ``family`` in eval mode, LayerNorms perturbed."""
    torch.manual_seed(seed)
    model = FAMILIES[family][0](impl).eval()
    _perturb_norms(model, seed)
    return model


def text_batch(model: torch.nn.Module) -> dict:
    """Three texts of lengths 7, 4 and 6, right-padded with the model's padding id."""
    cfg = model.config
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else 0
    rows = [[5, 11, 12, 13, 14, 15, 6], [5, 21, 22, 6], [5, 31, 32, 33, 34, 6]]
    T = max(map(len, rows))
    ids = torch.tensor([r + [pad] * (T - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
    return {"input_ids": ids, "attention_mask": mask}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


__all__ = ["FAMILIES", "CASES", "make", "text_batch", "rel_err"]
