"""Evaluation runner: every explanation method on the protocols of ``METHODS.md`` §3.

Command line::

    python -m lrp_core.evaluate --model toy-vit --methods all --n 500 --out results/toy-vit.json
    python -m lrp_core.evaluate --model minilm-sentiment --methods all --out results/minilm.json

prints a method × metric table, writes ``{method: {metric: value}}`` as JSON
(``null`` where a metric does not apply; the extra row ``random`` is a
reference of seeded random maps, ``--no-baseline`` leaves it out), the run's
facts (curves, n, seed, clean accuracy, seconds, command) to
``<out>.meta.json`` and, for image models, a plot of the perturbation curves
next to it (``perturbation_<model>.png``).

From a notebook::

    from lrp_core.evaluate import evaluate
    results = evaluate("toy-vit", methods=["rollout", "cdam"], n=32)

Image models (``kind == "image"``)
    *Perturbation* (positive / negative, explaining the predicted and the true
    class) and *segmentation* on one-object scenes, *class sensitivity* on
    two-object scenes, *CDAM statistics* for ``cdam``. The toy ViT uses
    :func:`lrp_core.data.make_scenes` with held-out seeds (:data:`SCENE_SEED`,
    distinct from the training seeds); segmentation explains the predicted class.

Text models (``kind == "text"``)
    Token-level rationale precision / recall / F1 at k = 10 … 80 on
    :func:`lrp_core.data.load_rationales`, explaining the true label, and
    ``token_f1@gold`` (k = the size of each human rationale), which stays
    informative on texts shorter than k words.

``--data PATH`` evaluates on your own data instead (see :func:`load_data_folder`):

- images: ``PATH/images/<name>.<png|jpg|jpeg>`` and ``PATH/masks/<name>.png``
  (any non-zero pixel = object); optional ``PATH/labels.csv`` with rows
  ``name,label`` (class index or class name; a header row is allowed).
  Without labels the perturbation accuracy is measured against the model's
  clean prediction and the ``*_target`` metrics are ``null``. ImageNet-
  segmentation (Guillaumin et al.) exported to PNGs fits this layout.
- ERASER (e.g. ``movies``): ``PATH/docs/<docid>`` (whitespace-tokenised text)
  and ``PATH/val.jsonl`` or ``PATH/test.jsonl`` (choose with ``--split``;
  ``classification`` POS/NEG, ``evidences`` with ``start_token``/``end_token``).
- simple text JSONL: ``PATH/rationales.jsonl``, one ``{"words": [...],
  "rationale": [0/1 per word], "label": int|name}`` per line (``"text"``
  optional, default: words joined by spaces).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from . import metrics as M
from .errors import InputError, LRPError

SCENE_SEED = 20_000_003
"""Seed of the held-out one-object scenes (the two-object scenes use ``SCENE_SEED + 1``).

Outside the toy ViT's training seeds (``seed * 10^6 + step * 2 + {0, 1} < 10^7``) and
distinct from its own evaluation seeds (``10_000_019`` …)."""

IMAGE_METRICS: tuple[str, ...] = (
    "perturbation_positive_auc_predicted", "perturbation_negative_auc_predicted",
    "perturbation_positive_auc_target", "perturbation_negative_auc_target",
    "pixel_accuracy", "miou", "map", "class_sensitivity", "class_map_correlation",
    "cdam_sparsity", "tam_correlation",
)
"""Metric names of an image evaluation (keys of each method's result)."""


def text_metric_names(ks: Sequence[int] = M.TOP_K) -> tuple[str, ...]:
    """Metric names of a text evaluation: ``token_f1@k`` (+ precision, recall) per k."""
    names = [f"token_{m}@{k}" for m in ("f1", "precision", "recall") for k in ks]
    return tuple(names) + ("token_f1@gold", "cdam_sparsity", "tam_correlation")


# --------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------
@dataclass
class ImageSet:
    """Images for perturbation / segmentation (and, with ``n_objects == 2``, class sensitivity).

    Attributes:
        images: (N, 3, H, W) model inputs (normalised).
        labels: (N, k) true classes, or ``None`` when unknown.
        masks: (N, k, H, W) bool object masks (object j has class ``labels[:, j]``).
    """

    images: Tensor
    labels: Optional[Tensor]
    masks: Tensor

    def __len__(self) -> int:
        return self.images.shape[0]


@dataclass
class TextRecord:
    """One document: its words, the human rationale per word, the label id."""

    text: str
    words: list[str]
    rationale: np.ndarray
    label: int
    spans: Optional[list[tuple[int, int]]] = None
    """(W,) character span of each word in ``text``; found by search when ``None``."""


@dataclass
class TextSet:
    records: list[TextRecord] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.records)


def scene_sets(n: int, seed: int = SCENE_SEED) -> tuple[ImageSet, ImageSet]:
    """Held-out toy scenes: ``n`` one-object and ``n`` two-object scenes."""
    from .data import make_scenes
    one = make_scenes(n, seed=seed, n_objects=1)
    two = make_scenes(n, seed=seed + 1, n_objects=2)
    return (ImageSet(one.images, one.labels, one.masks),
            ImageSet(two.images, two.labels, two.masks))


def _label_id(label: Any, names: Sequence[str]) -> int:
    """Class id from an int or a (case-insensitive, prefix-tolerant) class name."""
    if isinstance(label, (int, np.integer)) and not isinstance(label, bool):
        return int(label)
    s = str(label).strip()
    if s.lstrip("-").isdigit():
        return int(s)
    low = [str(n).lower() for n in names]
    if s.lower() in low:
        return low.index(s.lower())
    hits = [i for i, n in enumerate(low) if n.startswith(s.lower()) or s.lower().startswith(n)]
    if len(hits) == 1:  # "POS" -> "positive", "neg" -> "negative"
        return hits[0]
    raise InputError(f"label {label!r} is not a class id or one of {list(names)}")


def _as_record(rec: Any, names: Sequence[str]) -> TextRecord:
    """A :class:`TextRecord` from an object or dict with words / rationale / label (/ text)."""
    get = (lambda k, d=None: rec.get(k, d)) if isinstance(rec, dict) else (
        lambda k, d=None: getattr(rec, k, d))
    words = [str(w) for w in get("words")]
    rationale = np.asarray(get("rationale"), dtype=bool).reshape(-1)
    if len(words) != rationale.shape[0]:
        raise InputError(f"{len(words)} words but {rationale.shape[0]} rationale flags")
    text = get("text") or " ".join(words)
    spans = get("offsets")
    spans = [(int(a), int(b)) for a, b in spans] if spans is not None else None
    if spans is not None and len(spans) != len(words):
        raise InputError(f"{len(words)} words but {len(spans)} offsets")
    return TextRecord(text=str(text), words=words, rationale=rationale,
                      label=_label_id(get("label"), names), spans=spans)


def load_data_folder(path: str | Path, kind: str, preprocess: Any = None,
                     labels: Sequence[str] = (), split: str = "val") -> ImageSet | TextSet:
    """Load a user data folder (layouts in the module docstring).

    Args:
        path: the folder.
        kind: ``"image"`` or ``"text"`` (the model's kind).
        preprocess: image models: PIL image -> (1, 3, H, W) model input (the
            loaded model's ``preprocess``); masks go through it too, so crops
            and resizes apply to both alike.
        labels: class names, to read labels given by name.
        split: ERASER split file (``val`` / ``test`` / ``train``).
    """
    root = Path(path)
    if not root.is_dir():
        raise InputError(f"--data {root}: not a folder")
    if kind == "image":
        return _load_image_folder(root, preprocess, labels)
    if (root / "rationales.jsonl").is_file():
        with open(root / "rationales.jsonl", encoding="utf-8") as f:
            return TextSet([_as_record(json.loads(line), labels) for line in f if line.strip()])
    if (root / "docs").is_dir() and (root / f"{split}.jsonl").is_file():
        return _load_eraser(root, split, labels)
    raise InputError(f"--data {root}: expected rationales.jsonl, or ERASER's docs/ and "
                     f"{split}.jsonl")


def _load_image_folder(root: Path, preprocess: Any, names: Sequence[str]) -> ImageSet:
    from PIL import Image
    if preprocess is None:
        raise InputError("loading images needs the model's preprocess")
    img_dir, mask_dir = root / "images", root / "masks"
    if not img_dir.is_dir() or not mask_dir.is_dir():
        raise InputError(f"--data {root}: expected sub-folders images/ and masks/")
    files = sorted(p for p in img_dir.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
    if not files:
        raise InputError(f"no .png / .jpg images in {img_dir}")
    table: dict[str, int] = {}
    if (root / "labels.csv").is_file():
        with open(root / "labels.csv", newline="", encoding="utf-8") as f:
            for row in csv.reader(f):
                if len(row) < 2 or row[0].strip().lower() in ("name", "filename", "file", "image"):
                    continue
                table[Path(row[0].strip()).stem] = _label_id(row[1], names)
    images, masks, labels = [], [], []
    for p in files:
        mp = mask_dir / (p.stem + ".png")
        if not mp.is_file():
            raise InputError(f"no mask {mp} for image {p.name}")
        img = Image.open(p).convert("RGB")
        mask = np.asarray(Image.open(mp).convert("L").resize(img.size, Image.NEAREST)) > 0
        images.append(_first(preprocess(img)))
        masks.append(_transform_mask(mask, preprocess))
        if table:
            if p.stem not in table:
                raise InputError(f"labels.csv has no row for {p.name}")
            labels.append(table[p.stem])
    return ImageSet(torch.stack(images), torch.tensor(labels).view(-1, 1) if table else None,
                    torch.stack(masks).unsqueeze(1))


def _transform_mask(mask: np.ndarray, preprocess: Any) -> Tensor:
    """Send a bool mask (h, w) through an image preprocess (resize / crop / normalise).

    The mask becomes a black/white image; after ``preprocess`` a pixel is
    object where channel 0 is nearer the value of white than that of black.
    """
    from PIL import Image
    bw = Image.fromarray(np.where(mask, 255, 0).astype(np.uint8)).convert("RGB")
    black = Image.new("RGB", bw.size, (0, 0, 0))
    white = Image.new("RGB", bw.size, (255, 255, 255))
    x, lo, hi = (_first(preprocess(im))[0] for im in (bw, black, white))
    return (x - lo).abs() > (x - hi).abs()


def _first(x: Any) -> Tensor:
    """(1, C, H, W) or (C, H, W) preprocess output -> (C, H, W) float tensor."""
    x = torch.as_tensor(x, dtype=torch.float32)
    return x.reshape(-1, *x.shape[-3:])[0]


def _load_eraser(root: Path, split: str, names: Sequence[str]) -> TextSet:
    records = []
    with open(root / f"{split}.jsonl", encoding="utf-8") as f:
        anns = [json.loads(line) for line in f if line.strip()]
    for ann in anns:
        evid = [e for group in ann.get("evidences", []) for e in group]
        docid = (evid[0]["docid"] if evid else ann.get("docids", [ann["annotation_id"]])[0])
        words = (root / "docs" / docid).read_text(encoding="utf-8").split()
        rationale = np.zeros(len(words), dtype=bool)
        for e in evid:
            if e.get("docid", docid) == docid:
                rationale[int(e["start_token"]):int(e["end_token"])] = True
        records.append(TextRecord(" ".join(words), words, rationale,
                                  _label_id(ann["classification"], names)))
    if not records:
        raise InputError(f"{root / (split + '.jsonl')} has no annotations")
    return TextSet(records)


# --------------------------------------------------------------------------
# explanations in batches
# --------------------------------------------------------------------------
TAM_BATCH = 256
"""Sequences per forward pass of ``token_ablation``."""


def _explain(model: Any, inputs: Any, method: str, target: Any) -> Any:
    from . import explain
    extra = {"batch_size": TAM_BATCH} if method == "token_ablation" else {}
    return explain(model, inputs, method=method, target=target, progress=False, **extra)


def image_maps(model: Any, images: Tensor, method: str, target: Optional[Tensor] = None,
               batch_size: int = 32, progress: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Explain ``images`` in batches.

    Args:
        model: an image model the engine supports.
        images: (N, 3, H, W).
        method: a name of :data:`lrp_core.METHODS`.
        target: (N,) classes, or ``None`` for the predicted class.

    Returns:
        maps (N, H, W) at image size (``pixel_map()``: pixel relevance for
        ``lrp``, else the bilinearly upsampled patch map), token scores (N, T)
        and the explained targets (N,).
    """
    device = M._model_device(model)
    maps, scores, targets = [], [], []
    for s in M._tqdm(range(0, len(images), batch_size), progress, desc=method, leave=False):
        x = images[s:s + batch_size].to(device)
        t = None if target is None else target[s:s + batch_size].to(device)
        exp = _explain(model, x, method, t)
        pm = exp.pixel_map().detach().float().cpu()
        if tuple(pm.shape[-2:]) != tuple(images.shape[-2:]):
            pm = M.upsample_maps(pm, tuple(images.shape[-2:]))
        maps.append(pm)
        scores.append(exp.scores.detach().float().cpu())
        targets.append(exp.target.detach().cpu())
    return torch.cat(maps), torch.cat(scores), torch.cat(targets)


def _maps_for(model: Any, images: Tensor, method: str, target: Tensor, base: Tensor,
              base_target: Tensor, batch_size: int) -> Tensor:
    """Maps for ``target``, reusing ``base`` where it already explains that class."""
    out = base.clone()
    redo = torch.nonzero(base_target != target).reshape(-1)
    if redo.numel():
        out[redo] = image_maps(model, images[redo], method, target[redo], batch_size)[0]
    return out


# --------------------------------------------------------------------------
# image evaluation
# --------------------------------------------------------------------------
@torch.no_grad()
def predict(model: Any, images: Tensor, batch_size: int = 64) -> Tensor:
    """(N,) argmax class of ``model`` on ``images``."""
    device = M._model_device(model)
    return torch.cat([M._logits(model, images[s:s + batch_size].to(device)).argmax(1).cpu()
                      for s in range(0, len(images), batch_size)])


def evaluate_images(model: Any, one: ImageSet, two: Optional[ImageSet], methods: Sequence[str],
                    batch_size: int = 32, progress: bool = True, baseline: bool = False,
                    ) -> tuple[dict[str, dict[str, Optional[float]]], dict[str, dict[str, list]]]:
    """All image metrics for each method.

    Args:
        model: the classifier.
        one: one-object set (perturbation, segmentation); ``labels`` may be None.
        two: two-object set of different classes (class sensitivity) or None.
        methods: method names.
        baseline: add a row ``random`` (seeded uniform random patch maps).

    Returns:
        ``results[method][metric]`` (see :data:`IMAGE_METRICS`; ``None`` = not
        applicable) and ``curves[method][test]`` = accuracies at x = 0, 0.1 … 0.9
        for tests ``positive_predicted``, ``negative_predicted``, ``positive_target``,
        ``negative_target``.
    """
    pred = predict(model, one.images, batch_size)
    truth = one.labels[:, 0] if one.labels is not None else None
    reference = truth if truth is not None else pred
    results: dict[str, dict[str, Optional[float]]] = {}
    curves: dict[str, dict[str, list]] = {}
    cache: dict[str, Tensor] = {}
    bar = M._tqdm(_tam_first(methods), progress, desc="methods")
    for method in bar:
        if progress and hasattr(bar, "set_postfix_str"):
            bar.set_postfix_str(method)
        maps, scores, targets = image_maps(model, one.images, method, None, batch_size, progress)
        cache[method] = scores
        variants = {"predicted": maps}
        if truth is not None:
            variants["target"] = _maps_for(model, one.images, method, truth, maps, targets,
                                           batch_size)
        pair = None
        if two is not None and two.labels is not None and two.labels.shape[1] == 2:
            pair = (image_maps(model, two.images, method, two.labels[:, 0], batch_size)[0],
                    image_maps(model, two.images, method, two.labels[:, 1], batch_size)[0])
        res, cur = _score_maps(model, one, two, variants, pair, reference, batch_size)
        if method == "cdam":
            res["cdam_sparsity"] = M.sparsity(scores)
            tam = cache.get("token_ablation")
            if tam is None:
                tam = _tam_for(model, one.images, targets, batch_size)
                cache["token_ablation"] = tam
            res["tam_correlation"] = M.pooled_correlation(scores, tam)
        results[method] = {k: _clean(v) for k, v in res.items()}
        curves[method] = cur
    if baseline:
        variants, pair = _random_maps(one, two, cache, truth is not None, seed=0)
        res, cur = _score_maps(model, one, two, variants, pair, reference, batch_size)
        results["random"] = {k: _clean(v) for k, v in res.items()}
        curves["random"] = cur
        methods = [*methods, "random"]
    order = [m for m in methods if m in results]
    return {m: results[m] for m in order}, {m: curves[m] for m in order}


def _score_maps(model: Any, one: ImageSet, two: Optional[ImageSet], variants: dict[str, Tensor],
                pair: Optional[tuple[Tensor, Tensor]], reference: Tensor, batch_size: int,
                ) -> tuple[dict[str, Optional[float]], dict[str, list]]:
    """Perturbation, segmentation and class-sensitivity metrics of given maps.

    Args:
        variants: ``predicted`` (and ``target``) maps (N, H, W) of the one-object set.
        pair: maps (N2, H, W) of the two-object set for its first and second class.
        reference: (N,) labels the perturbation accuracy is measured against.
    """
    res: dict[str, Optional[float]] = {k: None for k in IMAGE_METRICS}
    cur: dict[str, list] = {}
    for sign in ("positive", "negative"):
        correct = _perturbation_correct(model, one.images, variants, reference,
                                        sign == "negative", max(batch_size, 64))
        for which, c in correct.items():
            acc = c.mean(axis=1)
            cur[f"{sign}_{which}"] = acc.tolist()
            res[f"perturbation_{sign}_auc_{which}"] = M.perturbation_auc(acc)
            # the AUC is linear in the curve: it is the mean of these per-image AUCs
            cur[f"{sign}_{which}_auc_per_image"] = [
                round(M.perturbation_auc(col), 2) for col in c.T.astype(np.float64)]
    seg = M.segmentation_scores(variants["predicted"], one.masks[:, 0])
    res.update(pixel_accuracy=seg["pixel_accuracy"], miou=seg["miou"], map=seg["map"])
    if pair is not None and two is not None:
        res["class_sensitivity"] = M.class_sensitivity(pair[0], pair[1], two.masks[:, 0],
                                                       two.masks[:, 1])
        res["class_map_correlation"] = M.class_map_correlation(pair[0], pair[1])
    return res, cur


def _random_maps(one: ImageSet, two: Optional[ImageSet], cache: dict[str, Tensor],
                 with_target: bool, seed: int = 0,
                 ) -> tuple[dict[str, Tensor], Optional[tuple[Tensor, Tensor]]]:
    """Seeded uniform random patch maps (the reference row ``random``).

    The patch grid is taken from the methods' token scores (square grid), else
    the maps are random per pixel. A random map knows no class: the same draw
    serves the predicted and the true class, and both classes of a two-object
    scene.
    """
    g = torch.Generator().manual_seed(seed)
    size = tuple(one.images.shape[-2:])
    t = next(iter(cache.values())).shape[1] if cache else 0
    side = int(round(math.sqrt(t))) if t else 0
    grid = (side, side) if side * side == t and t else size

    def draw(n: int) -> Tensor:
        return M.upsample_maps(torch.rand(n, *grid, generator=g), size)

    variants = {"predicted": draw(len(one))}
    if with_target:
        variants["target"] = variants["predicted"]
    pair = None
    if two is not None and two.labels is not None and two.labels.shape[1] == 2:
        m = draw(len(two))
        pair = (m, m)
    return variants, pair


def _perturbation_correct(model: Any, images: Tensor, variants: dict[str, Tensor],
                          labels: Tensor, negative: bool, batch_size: int) -> dict[str, np.ndarray]:
    """(1 + P, N) correctness matrix of each map variant (``predicted``, ``target``).

    The perturbed inputs of an image are the same for two variants whose maps
    are equal (the true class is the predicted one, or a class-agnostic
    method), so only the images whose maps differ are run again.
    """
    out: dict[str, np.ndarray] = {}
    first: Optional[tuple[Tensor, np.ndarray]] = None
    for which, mp in variants.items():
        if first is None:
            c = M.perturbation_curve(model, images, mp, labels, negative=negative,
                                     batch_size=batch_size, return_correct=True)
            first = (mp, c)
        else:
            c = first[1].copy()
            differ = (mp != first[0]).reshape(len(mp), -1).any(dim=1)
            if differ.any():
                c[:, differ.numpy()] = M.perturbation_curve(
                    model, images[differ], mp[differ], labels[differ], negative=negative,
                    batch_size=batch_size, return_correct=True)
        out[which] = c
    return out


def _tam_first(methods: Sequence[str]) -> list[str]:
    """``methods`` with ``token_ablation`` moved before ``cdam`` (its scores are reused)."""
    names = list(methods)
    if "token_ablation" in names and "cdam" in names:
        names.remove("token_ablation")
        names.insert(names.index("cdam"), "token_ablation")
    return names


def _tam_for(model: Any, images: Tensor, targets: Tensor, batch_size: int) -> Tensor:
    return image_maps(model, images, "token_ablation", targets, batch_size)[1]


def _clean(v: Any) -> Optional[float]:
    if v is None:
        return None
    v = float(v)
    return None if math.isnan(v) else v


# --------------------------------------------------------------------------
# text evaluation
# --------------------------------------------------------------------------
def _max_length(tokenizer: Any, model: Any) -> int:
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", 512) or 512
    mml = getattr(tokenizer, "model_max_length", limit) or limit
    return int(min(limit, mml if mml < 1e6 else limit))


def text_word_scores(model: Any, tokenizer: Any, records: Sequence[TextRecord], method: str,
                     target: str = "true", batch_size: int = 16, progress: bool = False,
                     ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Word scores (max over word-pieces) of each document for one method.

    Args:
        target: ``"true"`` (explain the document's label) or ``"predicted"``.

    Returns:
        per document: (W,) word scores and (T_i,) scores of the word-pieces
        that belong to a word (no specials, no padding).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise InputError("the rationale evaluation needs a fast tokenizer (offset mapping)")
    device = M._model_device(model)
    max_len = _max_length(tokenizer, model)
    words_out, tokens_out = [], []
    for s in M._tqdm(range(0, len(records), batch_size), progress, desc=method, leave=False):
        chunk = records[s:s + batch_size]
        enc = tokenizer([r.text for r in chunk], padding=True, truncation=True,
                        max_length=max_len, return_offsets_mapping=True, return_tensors="pt")
        inputs = {"input_ids": enc["input_ids"].to(device),
                  "attention_mask": enc["attention_mask"].to(device)}
        tgt = (torch.tensor([r.label for r in chunk], device=device)
               if target == "true" else None)
        exp = _explain(model, inputs, method, tgt)
        sc = exp.scores.detach().float().cpu().numpy()
        for i, r in enumerate(chunk):
            spans = r.spans if r.spans is not None else M.word_spans(r.text, r.words)
            wid = M.word_ids_from_offsets(enc["offset_mapping"][i].tolist(), spans)
            words_out.append(M.word_scores(sc[i], wid, len(r.words)))
            tokens_out.append(sc[i][np.array([w is not None for w in wid])])
    return words_out, tokens_out


def random_word_scores(data: TextSet, seed: int = 0) -> list[np.ndarray]:
    """Seeded uniform random word scores (the reference row ``random``)."""
    rng = np.random.default_rng(seed)
    return [rng.random(len(r.words)) for r in data.records]


@torch.no_grad()
def text_accuracy(model: Any, tokenizer: Any, data: TextSet, batch_size: int = 32) -> float:
    """Share of documents whose predicted class is their label."""
    device = M._model_device(model)
    max_len = _max_length(tokenizer, model)
    hits = 0
    for s in range(0, len(data), batch_size):
        chunk = data.records[s:s + batch_size]
        enc = tokenizer([r.text for r in chunk], padding=True, truncation=True,
                        max_length=max_len, return_tensors="pt")
        out = model(input_ids=enc["input_ids"].to(device),
                    attention_mask=enc["attention_mask"].to(device))
        logits = out.logits if hasattr(out, "logits") else out
        hits += int((logits.argmax(-1).cpu() == torch.tensor([r.label for r in chunk])).sum())
    return hits / max(len(data), 1)


def evaluate_text(model: Any, tokenizer: Any, data: TextSet, methods: Sequence[str],
                  ks: Sequence[int] = M.TOP_K, target: str = "true", batch_size: int = 16,
                  progress: bool = True, baseline: bool = False,
                  ) -> tuple[dict[str, dict[str, Optional[float]]], list[str]]:
    """Rationale token precision / recall / F1 at each k, per method.

    Methods the engine cannot apply to the model are skipped (listed in the
    second return value). ``cdam`` also gets its sparsity and its correlation
    with ``token_ablation`` (over the word-pieces of the texts, specials left
    out) when both apply.
    """
    results: dict[str, dict[str, Optional[float]]] = {}
    skipped: list[str] = []
    tokens: dict[str, list[np.ndarray]] = {}
    gold = [r.rationale for r in data.records]
    for method in M._tqdm(_tam_first(methods), progress, desc="methods"):
        try:
            ws, ts = text_word_scores(model, tokenizer, data.records, method, target,
                                      batch_size, progress)
        except LRPError as err:
            skipped.append(f"{method}: {err}")
            continue
        tokens[method] = ts
        res = _rationale_metrics(ws, gold, ks)
        if method == "cdam":
            res["cdam_sparsity"] = float(np.mean([M.sparsity(t[None]) for t in ts]))
            try:
                tam = tokens.get("token_ablation")
                if tam is None:
                    tam = text_word_scores(model, tokenizer, data.records, "token_ablation",
                                           target, batch_size)[1]
                tokens["token_ablation"] = tam
                res["tam_correlation"] = M.pooled_correlation(
                    torch.as_tensor(np.concatenate(ts)), torch.as_tensor(np.concatenate(tam)))
            except LRPError as err:
                skipped.append(f"tam_correlation: {err}")
        results[method] = {k: _clean(v) for k, v in res.items()}
    if baseline:
        methods = [*methods, "random"]
        results["random"] = _rationale_metrics(random_word_scores(data), gold, ks)
    return {m: results[m] for m in methods if m in results}, skipped


def _rationale_metrics(ws: list[np.ndarray], gold: list[np.ndarray], ks: Sequence[int],
                       ) -> dict[str, Optional[float]]:
    res: dict[str, Optional[float]] = {k: None for k in text_metric_names(ks)}
    for k, v in M.rationale_scores(ws, gold, ks).items():
        for m in ("f1", "precision", "recall"):
            res[f"token_{m}@{k}"] = v[m]
    res["token_f1@gold"] = M.rationale_f1_at_gold_size(ws, gold)
    return {k: _clean(v) for k, v in res.items()}


# --------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------
SHORT = {
    "perturbation_positive_auc_predicted": "pos↓ pred", "perturbation_negative_auc_predicted":
    "neg↑ pred", "perturbation_positive_auc_target": "pos↓ true",
    "perturbation_negative_auc_target": "neg↑ true", "pixel_accuracy": "pix acc",
    "miou": "mIoU", "map": "mAP", "class_sensitivity": "class sens", "class_map_correlation":
    "class corr", "cdam_sparsity": "sparsity", "tam_correlation": "r(TAM)",
    **{f"token_f1@{k}": f"F1@{k}" for k in M.TOP_K}, "token_f1@gold": "F1@gold",
}


def format_table(results: dict[str, dict[str, Optional[float]]], markdown: bool = False,
                 columns: Optional[Sequence[str]] = None) -> str:
    """A method × metric table (plain text or Markdown); ``—`` for ``None``."""
    if not results:
        return "(no results)"
    cols = list(columns or next(iter(results.values())).keys())
    head = ["method"] + [SHORT.get(c, c) for c in cols]
    rows = [[m] + ["—" if r.get(c) is None else _fmt(c, r[c]) for c in cols]
            for m, r in results.items()]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * len(cols)) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    width = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = lambda r: "  ".join(str(x).ljust(w) if i == 0 else str(x).rjust(w)  # noqa: E731
                              for i, (x, w) in enumerate(zip(r, width)))
    return "\n".join([fmt(head), "  ".join("-" * w for w in width)] + [fmt(r) for r in rows])


def _fmt(metric: str, v: float) -> str:
    return f"{v:.2f}" if metric.startswith("perturbation") else f"{v:.3f}"


def plot_curves(curves: dict[str, dict[str, list]], path: str | Path, title: str = "") -> Path:
    """Save the perturbation curves (accuracy vs. fraction removed), one panel per test."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    tests = [t for t in ("positive_predicted", "negative_predicted", "positive_target",
                         "negative_target") if any(t in c for c in curves.values())]
    x = [0.0, *M.FRACTIONS]
    cols = 2 if len(tests) > 1 else 1
    rows = (len(tests) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.0 * cols + 2.2, 3.6 * rows), squeeze=False,
                             sharey=True)
    for ax, test in zip(axes.flat, tests):
        for method, c in curves.items():
            if test in c:
                style = dict(ls="--", color="0.35", marker=None) if method == "random" else {}
                ax.plot(x, c[test], **{"marker": "o", "ms": 3, "label": method, **style})
        sign, which = test.split("_")
        ax.set_title(f"{sign} test, {'predicted' if which == 'predicted' else 'true'} class")
        ax.set_xlabel("fraction of pixels removed")
        ax.set_ylabel("top-1 accuracy")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(tests):]:
        ax.set_visible(False)
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="center right", fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1 - 2.0 / (5.0 * cols + 2.2), 1))
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------
# the whole run
# --------------------------------------------------------------------------
def resolve_methods(spec: str | Sequence[str]) -> list[str]:
    """``"all"``, a comma list or a sequence of names -> validated list."""
    from . import METHODS
    from .errors import UnknownMethodError
    names = list(METHODS) if spec == "all" else (
        [s.strip() for s in spec.split(",") if s.strip()] if isinstance(spec, str) else list(spec))
    bad = [m for m in names if m not in METHODS]
    if bad or not names:
        raise UnknownMethodError(f"unknown method(s) {bad or names}; choose from {list(METHODS)} "
                                 f"or 'all'")
    return names


def evaluate(model: str | Any = "toy-vit", methods: str | Sequence[str] = "all", n: int = 500,
             batch_size: int = 32, seed: int = SCENE_SEED, data: Optional[str] = None,
             split: str = "val", text_target: str = "true", progress: bool = True,
             baseline: bool = True) -> dict[str, Any]:
    """Run the evaluation of ``model`` (a name for :func:`lrp_core.models.load` or a LoadedModel).

    ``baseline`` adds a reference row ``random`` (seeded uniform random maps
    / word scores). Returns a dict with ``results`` ({method: {metric:
    value}}), ``curves`` (image models), ``kind``, ``model``, ``n``,
    ``accuracy`` (clean accuracy on the evaluated data), ``skipped`` and
    ``seconds``.
    """
    from .models import load
    t0 = time.perf_counter()
    names = resolve_methods(methods)
    if n < 1:
        raise InputError(f"n must be >= 1, got {n}")
    loaded = load(model) if isinstance(model, str) else model
    out: dict[str, Any] = {"model": getattr(loaded, "name", str(model)), "kind": loaded.kind,
                           "methods": names, "seed": seed}
    if loaded.kind == "image":
        if data is not None:
            one = load_data_folder(data, "image", loaded.preprocess, loaded.labels)
            one = ImageSet(one.images[:n], None if one.labels is None else one.labels[:n],
                           one.masks[:n])
            two = None
        elif out["model"] == "toy-vit":
            one, two = scene_sets(n, seed)
        else:
            raise InputError(f"{out['model']} has no built-in evaluation data: pass --data with "
                             f"images/ and masks/ (see python -m lrp_core.evaluate --help)")
        pred = predict(loaded.model, one.images, batch_size)
        ref = one.labels[:, 0] if one.labels is not None else pred
        out["accuracy"] = float((pred == ref).float().mean())
        out["n"] = len(one)
        out["results"], out["curves"] = evaluate_images(loaded.model, one, two, names,
                                                        batch_size, progress, baseline)
        out["skipped"] = []
    elif loaded.kind == "text":
        if data is not None:
            ds = load_data_folder(data, "text", labels=loaded.labels, split=split)
        else:
            from .data import load_rationales
            ds = TextSet([_as_record(r, loaded.labels) for r in load_rationales()])
        ds = TextSet(ds.records[:n])
        out["n"] = len(ds)
        out["accuracy"] = text_accuracy(loaded.model, loaded.tokenizer, ds)
        out["results"], out["skipped"] = evaluate_text(
            loaded.model, loaded.tokenizer, ds, names, target=text_target,
            batch_size=min(batch_size, 16), progress=progress, baseline=baseline)
    else:
        raise InputError(f"unknown model kind {loaded.kind!r}")
    out["seconds"] = time.perf_counter() - t0
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m lrp_core.evaluate",
        description="Evaluate explanation methods (perturbation, segmentation, class "
                    "sensitivity, CDAM statistics; rationale token-F1 for text models).",
        epilog=("--data PATH" + __doc__.split("``--data PATH``", 1)[-1]) if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="toy-vit", help="a name lrp_core.models.load accepts")
    p.add_argument("--methods", default="all", help="'all' or a comma list")
    p.add_argument("--n", type=int, default=500, help="number of images / documents")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=SCENE_SEED, help="scene seed (toy-vit)")
    p.add_argument("--data", default=None, help="your own data folder (layouts above)")
    p.add_argument("--split", default="val", help="ERASER split file in --data")
    p.add_argument("--text-target", choices=("true", "predicted"), default="true",
                   help="class explained in the rationale evaluation")
    p.add_argument("--out", default=None, help="JSON file to write (plot goes next to it)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument("--no-baseline", action="store_true",
                   help="leave out the reference row 'random' (seeded random maps)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (1 is fastest on a busy machine)")
    a = p.parse_args(argv)
    if a.threads is not None:
        if a.threads < 1:
            p.error("--threads must be >= 1")
        torch.set_num_threads(a.threads)
    try:
        run = evaluate(a.model, a.methods, a.n, a.batch_size, a.seed, a.data, a.split,
                       a.text_target, progress=not a.quiet, baseline=not a.no_baseline)
    except LRPError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    results = run["results"]
    extra = f", clean accuracy {run['accuracy']:.3f}" if "accuracy" in run else ""
    print(f"{run['model']} ({run['kind']}), n={run['n']}{extra}, {run['seconds']:.0f} s")
    cols = None
    if run["kind"] == "text":  # precision / recall stay in the JSON
        cols = [c for c in text_metric_names() if not c.startswith(("token_precision",
                                                                    "token_recall"))]
    print(format_table(results, markdown=a.markdown, columns=cols))
    for s in run.get("skipped", []):
        print(f"skipped {s}")
    if a.out:
        path = Path(a.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {path}")
        meta = {k: v for k, v in run.items() if k != "results"}
        meta["command"] = "python -m lrp_core.evaluate " + " ".join(
            sys.argv[1:] if argv is None else list(argv))
        meta_path = path.with_name(path.stem + ".meta.json")
        meta_path.write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {meta_path}")
        if run.get("curves"):
            safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in run["model"])
            png = plot_curves(run["curves"], path.parent / f"perturbation_{safe}.png",
                              title=f"{run['model']}, n={run['n']}")
            print(f"wrote {png}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
