"""``tiny-s2s``: a small Marian encoder-decoder with real weights, trained on the translation task.

A Hugging Face ``MarianMTModel`` (post-norm encoder and decoder, sinusoidal positions, cross-attention,
one vocabulary shared by both sides and tied to the output), small enough to ship and to explain in
milliseconds: d_model 64, 2 + 2 layers, 4 heads. It translates the synthetic language of
:mod:`lrp_core.data.translation`, whose word alignment is exact, so an explanation of each generated
word can be checked against the source word(s) it translates.

The tokenizer is a word-level ``PreTrainedTokenizerFast`` (``tokenizers``' WordLevel model) over the
source and target words: every word is one token, the source ends with ``</s>`` as Marian's does, and
the decoder starts from ``<pad>`` (Marian's ``decoder_start_token_id``). ``scripts/train_tiny_s2s.py``
trains the model from scratch and writes ``lrp_core/assets/tiny_s2s/`` (``model.safetensors`` without
the tied copies, ``tokenizer.json``, ``meta.json`` with the held-out accuracies); this module loads them
(``models.load("tiny-s2s")``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import torch

from ..errors import InputError, LRPError
from .base import LoadedModel

ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "tiny_s2s"
WEIGHTS_FILE = ASSET_DIR / "model.safetensors"
TOKENIZER_FILE = ASSET_DIR / "tokenizer.json"
META_FILE = ASSET_DIR / "meta.json"
SPECIAL = ("<pad>", "<unk>", "<s>", "</s>")
PAD, EOS = 0, 3
#: the seed of the held-out sentences (``make_translations(n, HELD_OUT_SEED, split="held_out")``)
HELD_OUT_SEED = 1_000_000
#: the longest translation generated (the task's longest target is 19 words and </s>)
MAX_NEW_TOKENS = 24

#: the model's shape (MarianConfig keywords)
CONFIG: dict[str, Any] = dict(
    d_model=64,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=128,
    decoder_ffn_dim=128,
    max_position_embeddings=64,
    activation_function="gelu",
    dropout=0.0,
    attention_dropout=0.0,
    activation_dropout=0.0,
    scale_embedding=True,
)


class TinyS2SAssetError(LRPError, FileNotFoundError):
    """The weights or the tokenizer of tiny-s2s are missing from the installed package."""


def build_tokenizer():
    """The word-level tokenizer (``PreTrainedTokenizerFast``): special tokens, source words, target words.

    Returns
    -------
    PreTrainedTokenizerFast
        Splits on whitespace, appends ``</s>``, pads on the right with ``<pad>`` (id 0).
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from ..data.translation import source_vocabulary, target_vocabulary

    words = list(SPECIAL) + source_vocabulary() + target_vocabulary()
    vocab = {w: i for i, w in enumerate(words)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS)])
    return _fast(core)


def _fast(core):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tok.padding_side = "right"
    return tok


def saved_tokenizer():
    """The tokenizer shipped with the weights (``tokenizer.json``).

    Raises
    ------
    TinyS2SAssetError
        If ``tokenizer.json`` is missing.
    """
    from tokenizers import Tokenizer

    if not TOKENIZER_FILE.exists():
        raise TinyS2SAssetError(
            f"tiny-s2s's tokenizer is missing ({TOKENIZER_FILE}); reinstall the package or run "
            "`python scripts/train_tiny_s2s.py`"
        )
    return _fast(Tokenizer.from_file(str(TOKENIZER_FILE)))


def build_model(vocab_size: int, dtype: torch.dtype = torch.float32):
    """A ``MarianMTModel`` of tiny-s2s's shape, freshly initialised (eager attention).

    Parameters
    ----------
    vocab_size : int
        Number of tokens (both sides share them).
    dtype : torch.dtype, optional
        The weights' dtype.

    Returns
    -------
    MarianMTModel
        The untrained model.
    """
    from transformers import MarianConfig, MarianMTModel

    cfg = MarianConfig(
        vocab_size=vocab_size,
        decoder_vocab_size=vocab_size,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=PAD,
        forced_eos_token_id=EOS,
        **CONFIG,
    )
    cfg._attn_implementation = "eager"
    model: torch.nn.Module = MarianMTModel(cfg)
    return model.to(dtype)


def translate(model, tok, sources: Sequence[str], batch: int = 256) -> list[str]:
    """Greedy translations of ``sources`` (target words separated by spaces, without ``</s>``).

    Parameters
    ----------
    model : MarianMTModel
        tiny-s2s (or a model of its shape).
    tok : PreTrainedTokenizerFast
        Its tokenizer.
    sources : Sequence[str]
        Source sentences.
    batch : int, optional
        Sentences per ``generate`` call.

    Returns
    -------
    list[str]
        One translation per source.
    """
    out: list[str] = []
    for i in range(0, len(sources), batch):
        enc = tok(list(sources[i : i + batch]), return_tensors="pt", padding=True)
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=MAX_NEW_TOKENS, num_beams=1, do_sample=False)
        out += tok.batch_decode(ids, skip_special_tokens=True)
    return out


def accuracies(model, tok, records: Sequence[Any], batch: int = 256) -> dict[str, float]:
    """The held-out figures: greedy exact match and teacher-forced token accuracy.

    Parameters
    ----------
    model, tok
        tiny-s2s and its tokenizer.
    records : Sequence[TranslationRecord]
        Sentence pairs (:func:`lrp_core.data.translation.make_translations`).
    batch : int, optional
        Sentences per forward.

    Returns
    -------
    dict[str, float]
        ``exact_match``: share of sentences whose greedy translation equals the target;
        ``token_accuracy``: share of target tokens (``</s>`` included) whose teacher-forced argmax is right.
    """
    hits = sum(t == r.target for t, r in zip(translate(model, tok, [r.source for r in records], batch), records))
    right = total = 0
    for i in range(0, len(records), batch):
        enc, labels = encode_pairs(tok, records[i : i + batch])
        with torch.no_grad():
            pred = model(**enc, labels=labels).logits.argmax(-1)
        keep = labels != -100
        right, total = right + int((pred == labels)[keep].sum()), total + int(keep.sum())
    return {"exact_match": hits / max(len(records), 1), "token_accuracy": right / max(total, 1)}


def encode_pairs(tok, records: Sequence[Any]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The source batch and the labels (B, T) of the targets (``</s>`` appended, -100 on padding).

    Passing ``labels`` to the model shifts them right behind ``<pad>`` into ``decoder_input_ids``.
    """
    enc = dict(tok([r.source for r in records], return_tensors="pt", padding=True))
    tgt = tok([r.target for r in records], return_tensors="pt", padding=True)
    labels = tgt["input_ids"].masked_fill(tgt["attention_mask"] == 0, -100)
    return enc, labels


def load_tiny_s2s(pretrained: str | bool = "auto") -> LoadedModel:
    """Load tiny-s2s in eval mode with its tokenizer.

    Parameters
    ----------
    pretrained : str | bool, optional
        ``"auto"`` or ``True``: the trained weights; ``False``: freshly initialised weights (seed 0).

    Returns
    -------
    LoadedModel
        The encoder-decoder, its tokenizer, and a ``preprocess`` taking a source sentence or a list of them.

    Raises
    ------
    InputError
        If ``pretrained`` is not ``"auto"``, ``True`` or ``False``.
    TinyS2SAssetError
        If the trained weights or the tokenizer are missing, or the weights do not fit the model's shape.
    """
    if pretrained not in ("auto", True, False):
        raise InputError(f"pretrained must be 'auto', True or False, got {pretrained!r}")
    if pretrained is False:
        tok = build_tokenizer()
        torch.manual_seed(0)
        return _loaded(build_model(len(tok)).eval(), tok, {"weights": "random (pretrained=False)"})
    tok = saved_tokenizer()
    return _loaded(_trained(tok), tok, json.loads(META_FILE.read_text()) if META_FILE.exists() else {})


#: the parameters tied to the shared embedding (not stored)
TIED = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")


def _trained(tok):
    from safetensors.torch import load_file

    if not WEIGHTS_FILE.exists():
        raise TinyS2SAssetError(
            f"tiny-s2s's weights are missing ({WEIGHTS_FILE}); reinstall the package or run "
            "`python scripts/train_tiny_s2s.py`"
        )
    model = build_model(len(tok))
    missing, unexpected = model.load_state_dict(load_file(str(WEIGHTS_FILE)), strict=False)
    if unexpected or [k for k in missing if k not in TIED]:
        raise TinyS2SAssetError(f"tiny-s2s's weights do not fit its shape: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model.eval()


def state_to_save(model) -> dict[str, torch.Tensor]:
    """The state dict written to ``model.safetensors``: every tensor but the tied copies of the embedding."""
    return {k: v.detach().contiguous() for k, v in model.state_dict().items() if k not in TIED}


def _loaded(model, tok, meta: dict) -> LoadedModel:
    def preprocess(texts: Sequence[str] | str) -> dict[str, Any]:
        if isinstance(texts, str):
            texts = [texts]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise InputError("tiny-s2s's preprocess takes a source sentence or a list of them (strings)")
        return dict(tok(list(texts), return_tensors="pt", padding=True))

    return LoadedModel(
        name="tiny-s2s",
        model=model,
        preprocess=preprocess,
        labels=tok.convert_ids_to_tokens(list(range(len(tok)))),
        kind="seq2seq",
        tokenizer=tok,
        info={
            "source": "trained by scripts/train_tiny_s2s.py on lrp_core.data.translation",
            "architecture": "Marian",
            "task": "translation with exact word alignment (lrp_core.data.translation)",
            **meta,
        },
    )


__all__ = [
    "load_tiny_s2s",
    "build_tokenizer",
    "saved_tokenizer",
    "build_model",
    "translate",
    "accuracies",
    "encode_pairs",
    "state_to_save",
    "CONFIG",
    "HELD_OUT_SEED",
    "TinyS2SAssetError",
]
