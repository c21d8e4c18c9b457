"""The image protocols: perturbation, segmentation, class sensitivity, deletion check, CDAM statistics.

:func:`evaluate_images` scores every method on a one-object :class:`ImageSet`
(perturbation, explaining the predicted and the true class; segmentation,
explaining the predicted class) and, when given, a two-object set (class
sensitivity: explain each of the two classes; with ``removed`` scenes also the
deletion check, :func:`lrp_core.metrics.deletion_agreement`). :func:`image_maps` explains
images in batches; the reference row ``random`` uses seeded random maps.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from .. import metrics as M
from ..data.sets import ImageSet
from ..utils import logits_of, model_device, progress_bar
from . import batching
from .report import Results, metric_value

IMAGE_METRICS: tuple[str, ...] = (
    "perturbation_positive_auc_predicted", "perturbation_negative_auc_predicted",
    "perturbation_positive_auc_target", "perturbation_negative_auc_target",
    "pixel_accuracy", "miou", "map", "class_sensitivity", "class_map_correlation",
    "cdam_sparsity", "tam_correlation",
    "deletion_order", "deletion_correlation", "deletion_distraction",
)
"""Metric names of an image evaluation (keys of each method's result)."""

Curves = dict[str, dict[str, list]]
"""``curves[method][test]``: accuracies at x = 0, 0.1 … 0.9 (and per-image AUCs)."""

MapPair = tuple[Tensor, Tensor]
"""Maps (N2, H, W) of a two-object set for its first and its second class."""


# --------------------------------------------------------------------------
# maps in batches
# --------------------------------------------------------------------------
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
    device = model_device(model)
    maps, scores, targets = [], [], []
    for s in progress_bar(range(0, len(images), batch_size), progress, desc=method, leave=False):
        x = images[s:s + batch_size].to(device)
        t = None if target is None else target[s:s + batch_size].to(device)
        exp = batching.explain_batch(model, x, method, t)
        pm = exp.pixel_map().detach().float().cpu()
        if tuple(pm.shape[-2:]) != tuple(images.shape[-2:]):
            pm = M.upsample_maps(pm, tuple(images.shape[-2:]))
        maps.append(pm)
        scores.append(exp.scores.detach().float().cpu())
        targets.append(exp.target.detach().cpu())
    return torch.cat(maps), torch.cat(scores), torch.cat(targets)


def _maps_for(model: Any, images: Tensor, method: str, target: Tensor, base: Tensor,
              base_target: Tensor, batch_size: int) -> Tensor:
    """Maps (N, H, W) for ``target``, reusing ``base`` where it already explains that class."""
    out = base.clone()
    redo = torch.nonzero(base_target != target).reshape(-1)
    if redo.numel():
        out[redo] = image_maps(model, images[redo], method, target[redo], batch_size)[0]
    return out


def _pair_maps(model: Any, two: Optional[ImageSet], method: str,
               batch_size: int) -> Optional[MapPair]:
    """Maps of the two-object set for each of its classes, or ``None`` without such a set."""
    if not _has_pairs(two):
        return None
    return (image_maps(model, two.images, method, two.labels[:, 0], batch_size)[0],
            image_maps(model, two.images, method, two.labels[:, 1], batch_size)[0])


def _has_pairs(two: Optional[ImageSet]) -> bool:
    return two is not None and two.labels is not None and two.labels.shape[1] == 2


@torch.no_grad()
def predict(model: Any, images: Tensor, batch_size: int = 64) -> Tensor:
    """(N,) argmax class of ``model`` on ``images`` (N, 3, H, W)."""
    device = model_device(model)
    return torch.cat([logits_of(model, images[s:s + batch_size].to(device)).argmax(1).cpu()
                      for s in range(0, len(images), batch_size)])


# --------------------------------------------------------------------------
# the protocol
# --------------------------------------------------------------------------
def evaluate_images(model: Any, one: ImageSet, two: Optional[ImageSet], methods: Sequence[str],
                    batch_size: int = 32, progress: bool = True, baseline: bool = False,
                    drops: Optional[Tensor] = None) -> tuple[Results, Curves]:
    """All image metrics for each method.

    Args:
        model: the classifier.
        one: one-object set (perturbation, segmentation); ``labels`` may be None.
        two: two-object set of different classes (class sensitivity) or None.
        methods: method names.
        baseline: add a row ``random`` (seeded uniform random patch maps).
        drops: (N2, 2, 2) logit drops of the two-object set
            (:func:`lrp_core.metrics.deletion_drops`: class j, object k removed);
            computed here when ``two.removed`` is given and ``drops`` is not.

    Returns:
        ``results[method][metric]`` (see :data:`IMAGE_METRICS`; ``None`` = not
        applicable) and ``curves[method][test]`` = accuracies at x = 0, 0.1 … 0.9
        for tests ``positive_predicted``, ``negative_predicted``, ``positive_target``,
        ``negative_target``.
    """
    pred = predict(model, one.images, batch_size)
    truth = one.labels[:, 0] if one.labels is not None else None
    reference = truth if truth is not None else pred
    if drops is None and _has_pairs(two) and two.removed is not None:
        drops = M.deletion_drops(model, two.images, two.removed, two.labels, max(batch_size, 64))
    results: Results = {}
    curves: Curves = {}
    cache: dict[str, Tensor] = {}  # token scores (N, T) per method: TAM for CDAM, grid for random
    bar = progress_bar(batching.method_order(methods), progress, desc="methods")
    for method in bar:
        if progress and hasattr(bar, "set_postfix_str"):
            bar.set_postfix_str(method)
        maps, scores, targets = image_maps(model, one.images, method, None, batch_size, progress)
        cache[method] = scores
        variants = {"predicted": maps}
        if truth is not None:
            variants["target"] = _maps_for(model, one.images, method, truth, maps, targets,
                                           batch_size)
        pair = _pair_maps(model, two, method, batch_size)
        res, cur = _score_maps(model, one, two, variants, pair, reference, batch_size, drops)
        if method == "cdam":
            res.update(_cdam_stats(model, one.images, scores, targets, cache, batch_size))
        results[method] = {k: metric_value(v) for k, v in res.items()}
        curves[method] = cur
    if baseline:
        variants, pair = random_maps(one, two, cache, truth is not None, seed=0)
        res, cur = _score_maps(model, one, two, variants, pair, reference, batch_size, drops)
        results["random"] = {k: metric_value(v) for k, v in res.items()}
        curves["random"] = cur
        methods = [*methods, "random"]
    order = [m for m in methods if m in results]
    return {m: results[m] for m in order}, {m: curves[m] for m in order}


def _cdam_stats(model: Any, images: Tensor, scores: Tensor, targets: Tensor,
                cache: dict[str, Tensor], batch_size: int) -> dict[str, float]:
    """CDAM's sparsity and its correlation with token ablation, on scores (N, T).

    Token ablation's scores come from ``cache`` when that method ran already
    (:func:`batching.method_order` puts it first); else they are computed for
    the same ``targets`` (N,) and cached.
    """
    tam = cache.get("token_ablation")
    if tam is None:
        tam = image_maps(model, images, "token_ablation", targets, batch_size)[1]
        cache["token_ablation"] = tam
    return {"cdam_sparsity": M.sparsity(scores),
            "tam_correlation": M.pooled_correlation(scores, tam)}


def _score_maps(model: Any, one: ImageSet, two: Optional[ImageSet], variants: dict[str, Tensor],
                pair: Optional[MapPair], reference: Tensor, batch_size: int,
                drops: Optional[Tensor] = None,
                ) -> tuple[dict[str, Optional[float]], dict[str, list]]:
    """Perturbation, segmentation, class-sensitivity and deletion metrics of given maps.

    Args:
        variants: ``predicted`` (and ``target``) maps (N, H, W) of the one-object set.
        pair: maps (N2, H, W) of the two-object set for its first and second class.
        reference: (N,) labels the perturbation accuracy is measured against.
        drops: (N2, 2, 2) logit drops (class j, object k removed), or ``None``.
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
    # per image, for the bootstrap: pixel accuracy and AP average to the results; the IoUs
    # are pooled, so their counts (fg ∩, fg ∪, bg ∩, bg ∪) are kept (M.pooled_miou)
    per = M.segmentation_per_image(variants["predicted"], one.masks[:, 0])
    seg = M.segmentation_summary(per)
    res.update(pixel_accuracy=seg["pixel_accuracy"], miou=seg["miou"], map=seg["map"])
    cur["segmentation_pixel_accuracy_per_image"] = per["pixel_accuracy"].tolist()
    cur["segmentation_iou_counts_per_image"] = per["iou_counts"].tolist()
    cur["segmentation_ap_per_image"] = [None if math.isnan(a) else float(a) for a in per["ap"]]
    if pair is not None and two is not None:
        res["class_sensitivity"] = M.class_sensitivity(pair[0], pair[1], two.masks[:, 0],
                                                       two.masks[:, 1])
        res["class_map_correlation"] = M.class_map_correlation(pair[0], pair[1])
        if drops is not None:
            dres, dcur = _deletion(pair, two.masks, drops)
            res.update(dres)
            cur.update(dcur)
    return res, cur


def _deletion(pair: MapPair, masks: Tensor, drops: Tensor,
              ) -> tuple[dict[str, float], dict[str, list]]:
    """The deletion check on both classes of every two-object scene.

    Args:
        pair: maps (N2, H, W) explaining the class of object 0 and of object 1.
        masks: (N2, 2, H, W) object masks; drops: (N2, 2, 2) (class j, object k removed).

    Returns:
        the three ``deletion_*`` metrics and, for the bootstrap, the per-case
        values (2 N2 cases: class of object 0 for every scene, then object 1):
        ``deletion_order_per_case``, ``deletion_distraction_per_case``,
        ``deletion_shares`` (2 N2, 2) and ``deletion_drops`` (2 N2, 2).
    """
    n = len(pair[0])
    maps = torch.cat([pair[0], pair[1]])
    both = torch.cat([masks, masks])
    d = torch.cat([drops[:, 0], drops[:, 1]])
    own = torch.cat([torch.zeros(n, dtype=torch.long), torch.ones(n, dtype=torch.long)])
    cases = M.deletion_cases(maps, both, d, own)
    rnd = _json_floats
    cur = {"deletion_order_per_case": rnd(cases["order"]),
           "deletion_distraction_per_case": rnd(cases["distraction"]),
           "deletion_shares": rnd(cases["shares"]), "deletion_drops": rnd(d.numpy())}
    return M.deletion_agreement(maps, both, d, own), cur


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


def _json_floats(a: Any) -> list:
    """Array -> nested lists of floats rounded to 4 digits, ``None`` for NaN (valid JSON)."""
    arr = np.round(np.asarray(a, dtype=np.float64), 4)
    return np.where(np.isnan(arr), None, arr).tolist()


# --------------------------------------------------------------------------
# the reference row
# --------------------------------------------------------------------------
def random_maps(one: ImageSet, two: Optional[ImageSet], cache: dict[str, Tensor],
                with_target: bool, seed: int = 0,
                ) -> tuple[dict[str, Tensor], Optional[MapPair]]:
    """Seeded uniform random patch maps (the reference row ``random``).

    The patch grid is taken from the methods' token scores (N, T) in ``cache``
    (square grid), else the maps are random per pixel. A random map knows no
    class: the same draw serves the predicted and the true class, and both
    classes of a two-object scene.

    Returns:
        ``{"predicted": (N, H, W)[, "target": the same]}`` and the pair of the
        two-object set (the same (N2, H, W) draw twice) or ``None``.
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
    if _has_pairs(two):
        m = draw(len(two))
        pair = (m, m)
    return variants, pair


__all__ = ["IMAGE_METRICS", "Curves", "image_maps", "predict", "evaluate_images", "random_maps"]
