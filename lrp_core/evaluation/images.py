"""The image protocols: perturbation, segmentation, class sensitivity, deletion check, CDAM statistics.

:func:`evaluate_images` scores every method on a one-object :class:`ImageSet`
(perturbation, explaining the predicted and the true class; segmentation,
explaining the predicted class) and, when given, a two-object set (class
sensitivity: explain each of the two classes; with ``removed`` scenes also the
deletion check, :func:`lrp_core.metrics.deletion_agreement`). :func:`image_maps` explains
images in batches; the reference row ``random`` uses seeded random maps.

The work is done in blocks of one batch (:func:`image_protocol`, :mod:`.shards`):
each block yields per-image values (correctness under perturbation,
segmentation counts, own-mask shares, deletion cases, token scores), and the
summaries are computed from all blocks' values, concatenated in order.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from .. import metrics as M
from ..data.sets import ImageSet
from ..runtime.precision import compute_precision
from ..runtime.utils import logits_in_batches, model_device, progress_bar
from . import batching
from .reference_maps import MapPair, RandomDraws, Span, has_pairs, random_maps
from .report import Results, metric_value
from .shards import Shard, block_spans

IMAGE_METRICS: tuple[str, ...] = (
    "perturbation_positive_auc_predicted",
    "perturbation_negative_auc_predicted",
    "perturbation_positive_auc_target",
    "perturbation_negative_auc_target",
    "pixel_accuracy",
    "miou",
    "map",
    "class_sensitivity",
    "class_map_correlation",
    "cdam_sparsity",
    "tam_correlation",
    "deletion_order",
    "deletion_correlation",
    "deletion_distraction",
)
"""Metric names of an image evaluation (keys of each method's result)."""

Curves = dict[str, dict[str, list]]
"""``curves[method][test]``: accuracies at x = 0, 0.1 … 0.9 (and per-image AUCs)."""


# --------------------------------------------------------------------------
# maps in batches
# --------------------------------------------------------------------------
def image_maps(
    model: Any,
    images: Tensor,
    method: str,
    target: Optional[Tensor] = None,
    batch_size: int = 32,
    progress: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Explain ``images`` batch by batch.

    Parameters
    ----------
    model : Any
        An image model the engine supports.
    images : Tensor
        (N, 3, H, W) model inputs.
    method : str
        A name of :data:`lrp_core.METHODS`.
    target : Optional[Tensor], optional
        (N,) classes, or ``None`` for the predicted class.
    batch_size : int, optional
        Images per explanation call.
    progress : bool, optional
        Show a progress bar.

    Returns
    -------
    tuple[Tensor, Tensor, Tensor]
        ``(maps, scores, targets)``: maps (N, H, W) at image size (``pixel_map()``: the pixel relevance for
        ``lrp``, otherwise the patch map upsampled bilinearly), token scores (N, T) and the explained classes
        (N,).
    """
    device = model_device(model)
    maps, scores, targets = [], [], []
    for s in progress_bar(range(0, len(images), batch_size), progress, desc=method, leave=False):
        x = images[s : s + batch_size].to(device)
        t = None if target is None else target[s : s + batch_size].to(device)
        exp = batching.explain_batch(model, x, method, t)
        pm = exp.pixel_map().detach().float().cpu()
        if tuple(pm.shape[-2:]) != tuple(images.shape[-2:]):
            pm = M.upsample_maps(pm, (images.shape[-2], images.shape[-1]))
        maps.append(pm)
        scores.append(exp.scores.detach().float().cpu())
        targets.append(exp.target.detach().cpu())
    return torch.cat(maps), torch.cat(scores), torch.cat(targets)


def _maps_for(
    model: Any, images: Tensor, method: str, target: Tensor, base: Tensor, base_target: Tensor, batch_size: int
) -> Tensor:
    """Maps (N, H, W) for ``target``, reusing ``base`` where it already explains that class."""
    out = base.clone()
    redo = torch.nonzero(base_target != target).reshape(-1)
    if redo.numel():
        out[redo] = image_maps(model, images[redo], method, target[redo], batch_size)[0]
    return out


def _pair_maps(model: Any, two: Optional[ImageSet], method: str, batch_size: int) -> Optional[MapPair]:
    """Maps of the two-object set for each of its classes, or ``None`` without such a set."""
    if not has_pairs(two):
        return None
    labels = two.labels
    assert labels is not None, "has_pairs checked the labels"
    return (
        image_maps(model, two.images, method, labels[:, 0], batch_size)[0],
        image_maps(model, two.images, method, labels[:, 1], batch_size)[0],
    )


def predict(model: Any, images: Tensor, batch_size: int = 64) -> Tensor:
    """The argmax class of ``model`` on each image.

    Parameters
    ----------
    model : Any
        The classifier.
    images : Tensor
        (N, 3, H, W) model inputs.
    batch_size : int, optional
        Images per forward pass.

    Returns
    -------
    Tensor
        (N,) class ids.
    """
    return torch.cat([lg.argmax(1).cpu() for _, lg in logits_in_batches(model, images, batch_size)])


# --------------------------------------------------------------------------
# the protocol: per-image values block by block, then the summaries
# --------------------------------------------------------------------------
def evaluate_images(
    model: Any,
    one: ImageSet,
    two: Optional[ImageSet],
    methods: Sequence[str],
    batch_size: int = 32,
    progress: bool = True,
    baseline: bool = False,
    drops: Optional[Tensor] = None,
    dtype: Optional[torch.dtype] = None,
) -> tuple[Results, Curves]:
    """Every image metric of each method.

    Parameters
    ----------
    model : Any
        The classifier.
    one : ImageSet
        The one-object set (perturbation, segmentation); its ``labels`` may be ``None``.
    two : Optional[ImageSet]
        The two-object set, objects of different classes (class sensitivity), or ``None``.
    methods : Sequence[str]
        Method names.
    batch_size : int, optional
        Images per explanation call.
    progress : bool, optional
        Show progress bars.
    baseline : bool, optional
        Add the row ``random`` (seeded uniform random patch maps).
    drops : Optional[Tensor], optional
        (N2, 2, 2) logit drops of the two-object set (:func:`lrp_core.metrics.deletion_drops`: class j,
        object k removed); computed here when ``two.removed`` is given and ``drops`` is not.
    dtype : torch.dtype, optional
        ``torch.float64``: every explanation and every forward pass of the protocol computed in float64
        (``explain(..., dtype=)``, without copying the model), so that the figures of the ill-conditioned
        methods (``lrp``, the LRP part of ``transformer_attribution``) do not depend on the CPU's kernels.

    Returns
    -------
    tuple[Results, Curves]
        ``results[method][metric]`` (metrics in :data:`IMAGE_METRICS`; ``None`` where one does not apply) and
        ``curves[method][test]``, the accuracies at x = 0, 0.1 … 0.9 for the tests ``positive_predicted``,
        ``negative_predicted``, ``positive_target`` and ``negative_target``.
    """
    with compute_precision(model, dtype):
        out = image_protocol(model, one, two, methods, batch_size, progress, baseline, drops)
    assert out is not None  # one process holds every block
    return out[0], out[1]


def image_protocol(
    model: Any,
    one: ImageSet,
    two: Optional[ImageSet],
    methods: Sequence[str],
    batch_size: int = 32,
    progress: bool = True,
    baseline: bool = False,
    drops: Optional[Tensor] = None,
    shard: Optional[Shard] = None,
) -> Optional[tuple[Results, Curves, Tensor]]:
    """:func:`evaluate_images` in blocks of ``batch_size`` images, spread over the ranks of ``shard``.

    Each model call sees the images of one block only (:mod:`.shards`), so the per-image values do not
    depend on how many processes run.

    Parameters
    ----------
    model : Any
        The classifier.
    one : ImageSet
        The one-object set.
    two : Optional[ImageSet]
        The two-object set, or ``None``.
    methods : Sequence[str]
        Method names.
    batch_size : int, optional
        Images per block (and per explanation call).
    progress : bool, optional
        Show progress bars.
    baseline : bool, optional
        Add the row ``random``.
    drops : Optional[Tensor], optional
        (N2, 2, 2) logit drops of the two-object set, as in :func:`evaluate_images`.
    shard : Optional[Shard], optional
        The processes and the checkpoint folder; ``None``: one process.

    Returns
    -------
    Optional[tuple[Results, Curves, Tensor]]
        On rank 0 the results, the curves and the (N,) predicted classes of ``one``; ``None`` on the other
        ranks.
    """
    shard = shard or Shard()
    n_two = len(two) if has_pairs(two) else 0
    spans = _spans(len(one), n_two, batch_size)
    draws = RandomDraws(len(one), n_two)

    def block(b: int) -> dict[str, Any]:
        return _image_block(model, one, two if n_two else None, methods, spans[b], batch_size, baseline, drops, draws)

    blocks = shard.map(len(spans), block, progress, desc="image blocks")
    if blocks is None:
        return None
    names = [*methods, "random"] if baseline else list(methods)
    results: Results = {}
    curves: Curves = {}
    for m in names:
        res, cur = _summarise([b["values"][m] for b in blocks], with_cdam=m == "cdam")
        results[m] = {k: metric_value(v) for k, v in res.items()}
        curves[m] = cur
    return results, curves, torch.cat([b["pred"] for b in blocks])


def _spans(n_one: int, n_two: int, size: int) -> list[tuple[Span, Span]]:
    """Per block: its ``[start, stop)`` in the one-object and in the two-object set.

    Block b covers the same indices of both sets; the last block takes any
    two-object scenes beyond the one-object set.
    """
    one = block_spans(n_one, size)
    two = [(min(s, n_two), min(e, n_two)) for s, e in one]
    if two and n_two > n_one:
        two[-1] = (two[-1][0], n_two)
    return list(zip(one, two))


def _rows(data: ImageSet, s: int, e: int) -> ImageSet:
    """Images ``s:e`` of ``data`` (views, no copies)."""
    cut = lambda t: None if t is None else t[s:e]  # noqa: E731
    return ImageSet(data.images[s:e], cut(data.labels), data.masks[s:e], cut(data.removed))


def _image_block(
    model: Any,
    one: ImageSet,
    two: Optional[ImageSet],
    methods: Sequence[str],
    spans: tuple[Span, Span],
    batch_size: int,
    baseline: bool,
    drops: Optional[Tensor],
    draws: RandomDraws,
) -> dict[str, Any]:
    """Every model call of one block, and the per-image values they give.

    Returns:
        ``pred`` (b,) predicted classes and ``values[method]`` (see :func:`_map_values`,
        plus ``cdam``: token scores of CDAM and token ablation).
    """
    (s, e), (s2, e2) = spans
    o = _rows(one, s, e)
    t = _rows(two, s2, e2) if two is not None and e2 > s2 else None
    pred = predict(model, o.images, batch_size)
    truth = o.labels[:, 0] if o.labels is not None else None
    reference = truth if truth is not None else pred
    d = drops[s2:e2] if drops is not None else None
    if d is None and t is not None and t.removed is not None:
        assert t.labels is not None, "a block of the two-object set has its labels (has_pairs)"
        d = M.deletion_drops(model, t.images, t.removed, t.labels, max(batch_size, 64))
    values: dict[str, dict[str, Any]] = {}
    cache: dict[str, Tensor] = {}  # token scores (b, T) per method: TAM for CDAM, grid for random
    for method in batching.method_order(methods):
        maps, scores, targets = image_maps(model, o.images, method, None, batch_size)
        cache[method] = scores
        variants = {"predicted": maps}
        if truth is not None:
            variants["target"] = _maps_for(model, o.images, method, truth, maps, targets, batch_size)
        pair = _pair_maps(model, t, method, batch_size)
        values[method] = _map_values(model, o, t, variants, pair, reference, batch_size, d)
        if method == "cdam":
            values[method]["cdam"] = _cdam_scores(model, o.images, scores, targets, cache, batch_size)
    if baseline:
        variants, pair = draws.maps(
            cache,
            (o.images.shape[-2], o.images.shape[-1]),
            (s, e),
            (s2, e2) if t is not None else None,
            truth is not None,
        )
        values["random"] = _map_values(model, o, t, variants, pair, reference, batch_size, d)
    return {"pred": pred, "values": values}


def _cdam_scores(
    model: Any, images: Tensor, scores: Tensor, targets: Tensor, cache: dict[str, Tensor], batch_size: int
) -> dict[str, Tensor]:
    """CDAM's token scores (b, T) and token ablation's for the same ``targets`` (b,).

    Token ablation's come from ``cache`` when that method ran already
    (:func:`batching.method_order` puts it first); else they are computed and cached.
    """
    tam = cache.get("token_ablation")
    if tam is None:
        tam = image_maps(model, images, "token_ablation", targets, batch_size)[1]
        cache["token_ablation"] = tam
    return {"scores": scores, "tam": tam}


def _map_values(
    model: Any,
    one: ImageSet,
    two: Optional[ImageSet],
    variants: dict[str, Tensor],
    pair: Optional[MapPair],
    reference: Tensor,
    batch_size: int,
    drops: Optional[Tensor] = None,
) -> dict[str, Any]:
    """The per-image values behind every metric of given maps (one block).

    Args:
        variants: ``predicted`` (and ``target``) maps (b, H, W) of the one-object images.
        pair: maps (b2, H, W) of the two-object scenes for their first and second class.
        reference: (b,) labels the perturbation accuracy is measured against.
        drops: (b2, 2, 2) logit drops (class j, object k removed), or ``None``.

    Returns:
        ``correct[f"{sign}_{which}"]``: (1 + P, b) bool correctness of the
        perturbation tests; ``seg``: :func:`lrp_core.metrics.segmentation_per_image`;
        with a pair, ``pair``: own-mask shares ``share_a``, ``share_b`` (b2,)
        and map correlations ``r`` (b2,); with drops also ``deletion``:
        :func:`lrp_core.metrics.deletion_cases` and the drops (b2, 2), per class j.
    """
    out: dict[str, Any] = {"correct": {}}
    for sign in ("positive", "negative"):
        correct = _perturbation_correct(model, one.images, variants, reference, sign == "negative", max(batch_size, 64))
        for which, c in correct.items():
            out["correct"][f"{sign}_{which}"] = c
    out["seg"] = M.segmentation_per_image(variants["predicted"], one.masks[:, 0])
    if pair is not None and two is not None:
        a = pair[0].reshape(len(pair[0]), -1).numpy()
        b = pair[1].reshape(len(pair[1]), -1).numpy()
        out["pair"] = {
            "share_a": M.own_mask_share(pair[0], two.masks[:, 0]),
            "share_b": M.own_mask_share(pair[1], two.masks[:, 1]),
            "r": np.array([M.pearson(x, y) for x, y in zip(a, b)], dtype=np.float64),
        }
        if drops is not None:
            own = [torch.full((len(pair[j]),), j, dtype=torch.long) for j in (0, 1)]
            d = [drops[:, j].to(torch.float64) for j in (0, 1)]
            out["deletion"] = {
                "cases": [M.deletion_cases(pair[j], two.masks, d[j], own[j]) for j in (0, 1)],
                "drops": [x.numpy() for x in d],
            }
    return out


def _summarise(
    vals: list[dict[str, Any]],
    with_cdam: bool = False,
) -> tuple[dict[str, Optional[float]], dict[str, list]]:
    """One method's metrics and curves from its per-image values of every block, in block order.

    Each summary is computed from the concatenated values exactly as over the
    whole set at once (pooled counts pooled, means over all images).
    """
    res: dict[str, Optional[float]] = {k: None for k in IMAGE_METRICS}
    cur: dict[str, list] = {}
    for test in vals[0]["correct"]:
        c = np.concatenate([v["correct"][test] for v in vals], axis=1)  # (1 + P, N)
        sign, which = test.split("_")
        acc = c.mean(axis=1)
        cur[test] = acc.tolist()
        res[f"perturbation_{sign}_auc_{which}"] = M.perturbation_auc(acc)
        # the AUC is linear in the curve: it is the mean of these per-image AUCs
        cur[f"{test}_auc_per_image"] = [round(M.perturbation_auc(col), 2) for col in c.T.astype(np.float64)]
    # per image, for the bootstrap: pixel accuracy and AP average to the results; the IoUs
    # are pooled, so their counts (fg ∩, fg ∪, bg ∩, bg ∪) are kept (M.pooled_miou)
    per = {k: np.concatenate([v["seg"][k] for v in vals]) for k in ("pixel_accuracy", "iou_counts", "ap")}
    per["pixels"] = vals[0]["seg"]["pixels"]
    seg = M.segmentation_summary(per)
    res.update(pixel_accuracy=seg["pixel_accuracy"], miou=seg["miou"], map=seg["map"])
    cur["segmentation_pixel_accuracy_per_image"] = per["pixel_accuracy"].tolist()
    cur["segmentation_iou_counts_per_image"] = per["iou_counts"].tolist()
    cur["segmentation_ap_per_image"] = [None if math.isnan(a) else float(a) for a in per["ap"]]
    pairs = [v["pair"] for v in vals if "pair" in v]
    if pairs:
        # M.class_sensitivity: the shares for class a of every scene, then those for class b
        shares = np.concatenate([p["share_a"] for p in pairs] + [p["share_b"] for p in pairs])
        res["class_sensitivity"] = _nanmean(shares)
        res["class_map_correlation"] = _nanmean(np.concatenate([p["r"] for p in pairs]))
        dels = [v["deletion"] for v in vals if "deletion" in v]
        if dels:
            dres, dcur = _deletion(dels)
            res.update(dres)
            cur.update(dcur)
    if with_cdam:
        scores = torch.cat([v["cdam"]["scores"] for v in vals])
        tam = torch.cat([v["cdam"]["tam"] for v in vals])
        res.update(cdam_sparsity=M.sparsity(scores), tam_correlation=M.pooled_correlation(scores, tam))
    return res, cur


def _deletion(dels: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, list]]:
    """The deletion check on both classes of every two-object scene, from the blocks' cases.

    The cases are ordered as in :func:`lrp_core.metrics.deletion_agreement` over
    the whole set: the class of object 0 for every scene, then that of object 1
    (2 N2 cases).

    Returns:
        the three ``deletion_*`` metrics and, for the bootstrap, the per-case
        values: ``deletion_order_per_case``, ``deletion_distraction_per_case``,
        ``deletion_shares`` (2 N2, 2) and ``deletion_drops`` (2 N2, 2).
    """
    order = [(x, j) for j in (0, 1) for x in dels]  # class j of every block's scenes
    cases = {k: np.concatenate([x["cases"][j][k] for x, j in order]) for k in ("shares", "order", "distraction")}
    d = np.concatenate([x["drops"][j] for x, j in order])
    ok = ~np.isnan(cases["shares"]).any(1)
    corr = M.pearson(cases["shares"][ok].reshape(-1), d[ok].reshape(-1)) if ok.sum() >= 1 else math.nan
    rnd = _json_floats
    cur = {
        "deletion_order_per_case": rnd(cases["order"]),
        "deletion_distraction_per_case": rnd(cases["distraction"]),
        "deletion_shares": rnd(cases["shares"]),
        "deletion_drops": rnd(d),
    }
    res = {
        "deletion_order": _nanmean(cases["order"]),
        "deletion_correlation": corr,
        "deletion_distraction": _nanmean(cases["distraction"]),
    }
    return res, cur


def _nanmean(x: np.ndarray) -> float:
    """Mean of the defined values; NaN when there are none."""
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else math.nan


def _perturbation_correct(
    model: Any, images: Tensor, variants: dict[str, Tensor], labels: Tensor, negative: bool, batch_size: int
) -> dict[str, np.ndarray]:
    """(1 + P, N) correctness matrix of each map variant (``predicted``, ``target``).

    The perturbed inputs of an image are the same for two variants whose maps
    are equal (the true class is the predicted one, or a class-agnostic
    method), so only the images whose maps differ are run again.
    """
    out: dict[str, np.ndarray] = {}
    first: Optional[tuple[Tensor, np.ndarray]] = None
    for which, mp in variants.items():
        if first is None:
            c = M.perturbation_curve(
                model, images, mp, labels, negative=negative, batch_size=batch_size, return_correct=True
            )
            first = (mp, c)
        else:
            c = first[1].copy()
            differ = (mp != first[0]).reshape(len(mp), -1).any(dim=1)
            if differ.any():
                c[:, differ.numpy()] = M.perturbation_curve(
                    model,
                    images[differ],
                    mp[differ],
                    labels[differ],
                    negative=negative,
                    batch_size=batch_size,
                    return_correct=True,
                )
        out[which] = c
    return out


def _json_floats(a: Any) -> list:
    """Array -> nested lists of floats rounded to 4 digits, ``None`` for NaN (valid JSON)."""
    arr = np.round(np.asarray(a, dtype=np.float64), 4)
    return np.where(np.isnan(arr), np.array(None), arr).tolist()  # an object array: None where NaN


__all__ = [
    "IMAGE_METRICS",
    "Curves",
    "image_maps",
    "predict",
    "evaluate_images",
    "image_protocol",
    "random_maps",
    "RandomDraws",
]
