"""Tiny headless encoders (BERT family, ViT / DeiT) and SentenceTransformer pipelines, built from configs in ms."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

BERT_LIKE = dict(
    vocab_size=60,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=42,
)


def _bert(pooler: bool = True):
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(**BERT_LIKE), add_pooling_layer=pooler)


def _roberta():
    from transformers import RobertaConfig, RobertaModel

    return RobertaModel(RobertaConfig(pad_token_id=1, type_vocab_size=1, **BERT_LIKE))


def _electra():
    from transformers import ElectraConfig, ElectraModel

    return ElectraModel(ElectraConfig(embedding_size=16, **BERT_LIKE))


def _distilbert():
    from transformers import DistilBertConfig, DistilBertModel

    cfg = DistilBertConfig(vocab_size=60, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=40)
    return DistilBertModel(cfg)


def _mpnet():
    from transformers import MPNetConfig, MPNetModel

    return MPNetModel(MPNetConfig(**BERT_LIKE))


def _vit():
    from transformers import ViTConfig, ViTModel

    return ViTModel(
        ViTConfig(
            image_size=32,
            patch_size=8,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
        )
    )


def _deit():
    from transformers import DeiTConfig, DeiTModel

    return DeiTModel(
        DeiTConfig(
            image_size=32,
            patch_size=8,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
        )
    )


TEXT = {
    "bert": _bert,
    "bert_no_pooler": lambda: _bert(pooler=False),
    "roberta": _roberta,
    "electra": _electra,
    "distilbert": _distilbert,
    "mpnet": _mpnet,
}
IMAGE = {"vit": _vit, "deit": _deit}


def make(family: str, seed: int = 0) -> torch.nn.Module:
    """The tiny model of ``family`` in float64, eval mode."""
    torch.manual_seed(seed)
    return {**TEXT, **IMAGE}[family]().double().eval()


def text_batch(model: torch.nn.Module) -> dict:
    """Three texts of lengths 7, 4 and 6, right-padded with the model's padding id."""
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    rows = [[5, 11, 12, 13, 14, 15, 6], [5, 21, 22, 6], [5, 31, 32, 33, 34, 6]]
    T = max(map(len, rows))
    ids = torch.tensor([r + [pad] * (T - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
    return {"input_ids": ids, "attention_mask": mask}


def images(n: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def inputs_for(family: str, model: torch.nn.Module):
    return images() if family in IMAGE else text_batch(model)


def without_additive_constants(model: torch.nn.Module) -> torch.nn.Module:
    """Every bias (Linear, LayerNorm β), the position / token-type tables and the prefix tokens set to 0."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            last = name.split(".")[-1]
            if (
                last == "bias"
                or "position" in name
                or "token_type" in name
                or last in ("cls_token", "distillation_token")
            ):
                p.zero_()
    return model


def sentence_transformer(tmp: Path, pooling: str = "mean", normalize: bool = True, seed: int = 0, dense: bool = False):
    """A SentenceTransformer (Transformer → Pooling → [Normalize]) on a tiny BertModel with the embedded
    MiniLM tokenizer, in float64."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import BertConfig, BertModel

    from lrp_core.models.minilm import encoder_dir

    torch.manual_seed(seed)
    cfg = BertConfig(**{**BERT_LIKE, "vocab_size": 30522, "max_position_embeddings": 64})
    BertModel(cfg).save_pretrained(tmp)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(encoder_dir() / f, tmp / f)
    modules = [Transformer(str(tmp)), Pooling(32, pooling)] + ([Normalize()] if normalize else [])
    if dense:
        from sentence_transformers.sentence_transformer.modules import Dense

        modules.append(Dense(32, 8))
    return SentenceTransformer(modules=modules).double().eval()


def st_batch(st, texts=("a cat sat on the mat", "dogs run", "the cat and the dog")) -> dict:
    """The pipeline's own tokenisation, padded: input_ids, token_type_ids, attention_mask."""
    out = st.preprocess(list(texts))
    return {k: v for k, v in out.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
