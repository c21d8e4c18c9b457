"""The vision-language evidence metrics (``docs/METHODS.md`` §3c): does a VLM's map point at the asked object?

On a question whose answer is decided by one object with a known (H, W) mask, one method's explanation of
the answer gives an image map (the upsampled patch map, :meth:`Explanation.upsample`) and a text map (the
prompt's token scores). Per question:

* ``pointing``: the image map's maximum lies inside the mask (0 / 1);
* ``mask_share``: the positive image relevance inside the mask over all positive image relevance (0 where
  the map has no positive value: nothing points at the object);
* ``text_rank``: the rank of the deciding word among the prompt's text tokens (1 = the highest score);
* ``morf_auc`` / ``lerf_auc``: the k = 0 … K highest- (lowest-) scoring patches are painted with a fill
  colour and the answer's probability recorded; the area under that curve over k / K (trapezoid).

These functions take plain tensors and a probability function, so they are tested on hand-made maps;
:func:`vlm_protocol` runs a model over held-out questions with them: on the questions with a deciding object
that the model answers correctly (argmax of the next-token logits = the answer), every method explains the
answer's logit at the last position (explanations in batches); the *deciding word* is the question's last word
before ``?`` (the anchor shape of ``where``, the colour of ``which``, the shape of ``colour`` and ``exists``);
the fill colour is the image's mean colour outside both objects' masks, in the model's normalised pixel space
(the background under the objects is unknown). A seeded ``random`` row (uniform token scores) is the
reference; the per-question values feed the paired bootstrap. A method whose explanation has pixel maps
(``exp.pixels``: the LRP family, the gradient baselines) gets a second row, ``"<method> (pixels)"``, with the
pointing and mask share of that map at pixel resolution (against the same mask), and the random row its
counterpart ``random (pixels)`` (seeded uniform scores per pixel). Occlusion and KernelSHAP get none
(:data:`PATCH_FEATURE_METHODS`): their features are the patches, so their pixel map is the patch map with every
pixel of a patch equal — nothing finer, and a pointing game on it only reads how ties are broken.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import InputError
from ..runtime.utils import model_device, progress_bar
from . import batching
from .lm import curve_auc
from .report import Results, metric_value
from .vlm_metrics import MAX_PATCHES, mask_share, paint_patches, patch_curve, patch_order, pointing_hit, text_rank

VLM_METRICS = ("pointing", "mask_share", "text_rank", "morf_auc", "lerf_auc")
#: the metrics of a pixel map (``exp.pixels``), scored at the pixels against the same mask
PIXEL_METRICS = ("pointing", "mask_share")
#: a method's pixel-map row is the method's name with this suffix (:func:`pixel_row`)
PIXEL_SUFFIX = " (pixels)"
#: methods whose image features are whole patches: their pixel maps repeat the patch map, scored once
PATCH_FEATURE_METHODS = ("occlusion", "kernel_shap")


def question_values(
    image_map: Tensor,
    mask: Tensor,
    patch_map: Tensor,
    scores: Tensor,
    text_positions: Tensor,
    word_positions: Tensor,
    probability: Callable[[Tensor], Tensor],
    pixels: Tensor,
    patch: int,
    fill: Tensor,
    K: int = MAX_PATCHES,
) -> dict[str, float]:
    """The five metrics of one question for one method's maps.

    Parameters
    ----------
    image_map : Tensor
        (H, W) the upsampled image relevance.
    mask : Tensor
        (H, W) bool, the deciding object's pixels.
    patch_map : Tensor
        (h, w) the image relevance per patch (what MoRF / LeRF rank).
    scores : Tensor
        (T,) the token scores over every input position.
    text_positions, word_positions : Tensor
        The prompt's text tokens and the deciding word's tokens (positions in ``scores``).
    probability : Callable[[Tensor], Tensor]
        (n, 3, H, W) images → (n,) the answer's probability.
    pixels : Tensor
        (3, H, W) the model's input image.
    patch : int
        The patch side in pixels.
    fill : Tensor
        (3,) the fill value per channel.
    K : int, optional
        Most patches painted.

    Returns
    -------
    dict[str, float]
        One value per name of :data:`VLM_METRICS`.
    """
    order = patch_order(patch_map)
    return {
        "pointing": pointing_hit(image_map, mask),
        "mask_share": mask_share(image_map, mask),
        "text_rank": float(text_rank(scores, text_positions, word_positions)),
        "morf_auc": curve_auc(patch_curve(probability, pixels, order, patch, fill, K)),
        "lerf_auc": curve_auc(patch_curve(probability, pixels, order.flip(0), patch, fill, K)),
    }


def mean_values(values: Sequence[dict[str, float]]) -> dict[str, float]:
    """The mean of each metric over questions (NaN for none).

    Parameters
    ----------
    values : Sequence[dict[str, float]]
        Per question, the output of :func:`question_values`.

    Returns
    -------
    dict[str, float]
        Metric name → mean.
    """
    return {k: float(np.mean([v[k] for v in values])) if values else float("nan") for k in VLM_METRICS}


def deciding_word(question: str) -> str:
    """The word of a question that names what decides its answer: its last word before the final ``?``.

    ``"what is left of the ring ?"`` → ``ring`` (the anchor that locates the answered object), ``"which shape
    is red ?"`` → ``red``, ``"what colour is the cross ?"`` and ``"is there a cross ?"`` → ``cross``.

    Parameters
    ----------
    question : str
        Words separated by spaces, ending in ``" ?"`` (:func:`lrp_core.data.make_vqa`).

    Returns
    -------
    str
        The word.
    """
    words = question.split()
    if len(words) < 2 or words[-1] != "?":
        raise InputError(f"a question is words ending in ' ?', got {question!r}")
    return words[-2]


def background_fill(pixels: Tensor, masks: np.ndarray) -> Tensor:
    """The image's mean colour outside every object's mask, per channel, in the model's pixel space.

    Parameters
    ----------
    pixels : Tensor
        (3, H, W) the model's input image (normalised).
    masks : np.ndarray
        (k, H, W) bool, the scene's objects.

    Returns
    -------
    Tensor
        (3,) the fill value.
    """
    if masks.ndim != 3 or tuple(masks.shape[1:]) != tuple(pixels.shape[1:]):
        raise InputError(
            f"the objects' masks {tuple(masks.shape)} must be (k, H, W) at the model's image size "
            f"{tuple(pixels.shape[1:])}"
        )
    outside = ~torch.as_tensor(masks, device=pixels.device).any(0)
    if not bool(outside.any()):
        raise InputError("the objects cover the whole image: there is no background colour to paint with")
    return pixels[:, outside].mean(1)


def _encode(processor: Any, model: Any, records: Sequence[Any], device: torch.device) -> dict:
    """The processor's batch on ``device``, the answers' and deciding words' tokens, the text positions (on the
    CPU, where the token scores are ranked), per record."""
    from ..models.tiny_vlm import prompt

    tok = processor.tokenizer
    enc = dict(
        processor(
            images=[r.image for r in records],
            text=[prompt(r.question) for r in records],
            return_tensors="pt",
            padding=True,
        )
    )
    image_id = int(model.config.image_token_index)
    special = torch.tensor(sorted(set(tok.all_special_ids) | {image_id}))
    text, word, answers = [], [], []
    for b, r in enumerate(records):
        ids = enc["input_ids"][b]
        positions = torch.nonzero((enc["attention_mask"][b] == 1) & ~torch.isin(ids, special)).flatten()
        w = tok(deciding_word(r.question), add_special_tokens=False)["input_ids"]
        row = ids[positions].tolist()
        starts = [i for i in range(len(row) - len(w) + 1) if row[i : i + len(w)] == w]
        if not starts:
            raise InputError(f"question {b}'s deciding word {deciding_word(r.question)!r} is not among its tokens")
        text.append(positions)
        word.append(positions[starts[-1] : starts[-1] + len(w)])
        answers.append(tok(r.answer, add_special_tokens=False)["input_ids"][0])
    enc_out = {k: enc[k].to(device) for k in ("input_ids", "attention_mask", "pixel_values")}
    return {
        "batch": enc_out,
        "text": text,
        "word": word,
        "answers": torch.tensor(answers, dtype=torch.long),
        "image": [torch.nonzero(enc["input_ids"][b] == image_id).flatten() for b in range(len(records))],
    }


def _answered(model: Any, batch: dict, answers: Tensor, batch_size: int) -> list[int]:
    """The indices of the questions whose next-token argmax is the answer (``answers`` on the CPU)."""
    correct: list[int] = []
    with torch.no_grad():
        for s in range(0, len(answers), batch_size):
            sl = slice(s, s + batch_size)
            logits = model(**{k: v[sl] for k, v in batch.items()}).logits[:, -1]
            hit = logits.argmax(-1).cpu() == answers[sl]
            correct += [s + int(i) for i in torch.nonzero(hit).flatten()]
    return correct


def _probability(model: Any, batch: dict, b: int, answer: int, chunk: int = 17) -> Callable[[Tensor], Tensor]:
    """(n, 3, H, W) images on the model's device → (n,) p(answer) on the CPU for question ``b``'s text; painted
    images seen before are not re-run (the methods of one question share many of their curves' images: k = 0
    always, often the first patches)."""
    seen: dict[str, float] = {}

    @torch.no_grad()
    def probability(images: Tensor) -> Tensor:
        keys = [hashlib.sha1(im.contiguous().numpy().tobytes()).hexdigest() for im in images.detach().cpu()]
        new = [i for i, k in enumerate(keys) if k not in seen and keys.index(k) == i]
        for s in range(0, len(new), chunk):
            idx = new[s : s + chunk]
            n = len(idx)
            logits = model(
                input_ids=batch["input_ids"][b : b + 1].repeat(n, 1),
                attention_mask=batch["attention_mask"][b : b + 1].repeat(n, 1),
                pixel_values=images[idx],
            ).logits[:, -1]
            p = logits.float().softmax(-1)[:, answer]
            for i, v in zip(idx, p.tolist()):
                seen[keys[i]] = v
        return torch.tensor([seen[k] for k in keys], dtype=torch.float64)

    return probability


@dataclass
class _Questions:
    """The answered questions of a run and what every method's row reads: the encoded batch (on the model's
    device), the masks, the curves' fill colours and probability functions, the random rows' scores (CPU)."""

    records: list
    enc: dict
    correct: list[int]
    curved: set[int]
    fills: dict[int, Tensor]
    probs: dict[int, Callable[[Tensor], Tensor]]
    patch: int
    size: tuple[int, int]
    random_tokens: dict[int, Tensor]
    random_pixels: dict[int, Tensor]
    K: int


def _questions(
    model: Any, processor: Any, records: list, batch_size: int, seed: int, K: int, curve_questions: Optional[int]
) -> _Questions:
    """Encode the questions, find those answered, and prepare their curves and random maps."""
    enc = _encode(processor, model, records, model_device(model))
    batch = enc["batch"]
    correct = _answered(model, batch, enc["answers"], batch_size)
    curved = set(correct if curve_questions is None else correct[:curve_questions])
    H, W = batch["pixel_values"].shape[-2:]
    rng = np.random.default_rng(seed)
    # the token scores are drawn first, as they were before the pixel row existed: the random row keeps its values
    random_tokens = {b: torch.as_tensor(rng.random(batch["input_ids"].shape[1])) for b in correct}
    random_pixels = {b: torch.as_tensor(rng.random((H, W))) for b in correct}
    return _Questions(
        records=records,
        enc=enc,
        correct=correct,
        curved=curved,
        fills={b: background_fill(batch["pixel_values"][b], records[b].masks) for b in curved},
        probs={b: _probability(model, batch, b, int(enc["answers"][b])) for b in curved},
        patch=int(model.config.vision_config.patch_size),
        size=(int(H), int(W)),
        random_tokens=random_tokens,
        random_pixels=random_pixels,
        K=K,
    )


def _maps(model: Any, method: str, q: _Questions, rows: list[int]) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """One method's maps of the questions ``rows``, float64 on the CPU: token scores (B, T), patch maps (B, h, w),
    upsampled maps (B, H, W) and pixel maps (B, H, W, ``None`` for a method without them)."""
    from ..api import explain

    if method == "random":
        h, w = q.size[0] // q.patch, q.size[1] // q.patch
        scores = torch.stack([q.random_tokens[b] for b in rows])
        pmaps = torch.stack([q.random_tokens[b][q.enc["image"][b]].reshape(h, w) for b in rows])
        imaps = F.interpolate(pmaps[:, None], size=q.size, mode="bilinear", align_corners=False)[:, 0]
        return scores, pmaps, imaps, torch.stack([q.random_pixels[b] for b in rows])
    exp = explain(
        model,
        {k: v[rows] for k, v in q.enc["batch"].items()},
        method=method,
        target=q.enc["answers"][rows].tolist(),
        progress=False,
    )
    pixels = None if exp.pixels is None else exp.pixels.detach().double().cpu()
    return (
        exp.scores.detach().double().cpu(),
        exp.patch_map().detach().double().cpu(),
        exp.upsample().detach().double().cpu(),
        pixels,
    )


def _method_values(model: Any, method: str, q: _Questions, batch_size: int) -> tuple[dict, Optional[dict]]:
    """Per question, one method's :data:`VLM_METRICS` and, for a method with pixel maps, the
    :data:`PIXEL_METRICS` of those (``None`` without)."""
    values: dict[str, list] = {m: [] for m in VLM_METRICS}
    pixel: Optional[dict[str, list]] = None
    batch = q.enc["batch"]
    for start in range(0, len(q.correct), batch_size):
        rows = q.correct[start : start + batch_size]
        scores, pmaps, imaps, pixels = _maps(model, method, q, rows)
        for i, b in enumerate(rows):
            mask = torch.as_tensor(q.records[b].mask)
            values["pointing"].append(pointing_hit(imaps[i], mask))
            values["mask_share"].append(mask_share(imaps[i], mask))
            values["text_rank"].append(float(text_rank(scores[i], q.enc["text"][b], q.enc["word"][b])))
            if pixels is not None and method not in PATCH_FEATURE_METHODS:
                pixel = pixel if pixel is not None else {m: [] for m in PIXEL_METRICS}
                pixel["pointing"].append(pointing_hit(pixels[i], mask))
                pixel["mask_share"].append(mask_share(pixels[i], mask))
            if b in q.curved:
                order = patch_order(pmaps[i])
                px, fill, prob = batch["pixel_values"][b], q.fills[b], q.probs[b]
                values["morf_auc"].append(curve_auc(patch_curve(prob, px, order, q.patch, fill, q.K)))
                values["lerf_auc"].append(curve_auc(patch_curve(prob, px, order.flip(0), q.patch, fill, q.K)))
    return values, pixel


def pixel_row(method: str) -> str:
    """The name of a method's pixel-map row: ``"attnlrp"`` → ``"attnlrp (pixels)"``.

    Parameters
    ----------
    method : str
        A method name, or ``"random"``.

    Returns
    -------
    str
        The row's name in the results and curves.
    """
    return f"{method}{PIXEL_SUFFIX}"


def _mean(v: list) -> Optional[float]:
    return metric_value(float(np.mean(v)) if v else None)


def vlm_methods(model: Any) -> list[str]:
    """The methods a VLM's run takes by default: every method of the registry its adapter does not refuse.

    Read from the engine (:data:`lrp_core.METHODS` less ``Adapter.refused_methods`` of the model's adapter), so a
    method that becomes defined on a VLM joins the run without a change here.

    Parameters
    ----------
    model : Any
        A vision-language model :func:`lrp_core.adapters.get_adapter` recognises.

    Returns
    -------
    list[str]
        The method names, in the registry's order.
    """
    from ..adapters import get_adapter
    from ..methods import registry

    refused = get_adapter(model).refused_methods
    return [m for m in registry.METHODS if m not in refused]


def vlm_protocol(
    model: Any,
    processor: Any,
    records: Sequence[Any],
    methods: Sequence[str],
    batch_size: int = 8,
    progress: bool = True,
    baseline: bool = True,
    seed: int = 0,
    K: int = MAX_PATCHES,
    curve_questions: Optional[int] = None,
) -> tuple[Results, dict, float, int]:
    """Run every method on the questions with a deciding object that the model answers correctly.

    The questions go to the model's device (that of its first parameter); the maps come back to the CPU to be
    scored, and the random rows are drawn on the CPU, so their values do not depend on the device.

    Parameters
    ----------
    model : Any
        A LLaVA-shaped VLM (``LlavaForConditionalGeneration``) whose answer is the next token after the prompt.
    processor : Any
        Its processor (``images=``, ``text=``; the tokenizer pads on the left).
    records : Sequence[Any]
        :class:`lrp_core.data.vqa.VQARecord` questions; those without a deciding object are left out.
    methods : Sequence[str]
        Method names that run on a VLM.
    batch_size : int, optional
        Questions per explanation call.
    progress : bool, optional
        Show progress bars.
    baseline : bool, optional
        Add the row ``random`` (seeded uniform random token scores, upsampled as a method's are) and, where a
        method has a pixel row, ``random (pixels)`` (seeded uniform random scores per pixel).
    seed : int, optional
        Seed of the random rows.
    K : int, optional
        Patches painted at the last point of the MoRF / LeRF curves.
    curve_questions : Optional[int], optional
        Compute the MoRF / LeRF curves on the first this many answered questions only (each costs 2·K model
        forwards per method); ``None``: on all.

    Returns
    -------
    tuple[Results, dict, float, int]
        ``(results, curves, accuracy, n_correct)``: ``results[method][metric]`` the means over the answered
        questions (:data:`VLM_METRICS`) and ``seconds``, the method's wall time in the run; a method whose
        explanation has pixel maps (``exp.pixels``) also has the row :func:`pixel_row` with the
        :data:`PIXEL_METRICS` of those maps (its other metrics ``None``). ``curves[row][metric +
        "_per_question"]`` the values per question (for the bootstrap; ``morf_auc`` / ``lerf_auc`` on the first
        ``curve_questions``), the share of the questions with a deciding object answered correctly and the number
        answered.

    Raises
    ------
    InputError
        If no record has a deciding object, or a question's deciding word is not among its tokens.
    """
    records = [r for r in records if r.has_evidence]
    if not records:
        raise InputError("no question has a deciding object: nothing to score (make_vqa's 'no' answers have none)")
    q = _questions(model, processor, records, batch_size, seed, K, curve_questions)
    names = batching.method_order(methods) + (["random"] if baseline else [])
    results: Results = {}
    curves: dict[str, dict[str, list]] = {}
    pixel_rows = False
    for method in progress_bar(names, progress, desc="methods"):
        t0 = time.perf_counter()
        values, pixel = _method_values(model, method, q, batch_size)
        seconds = time.perf_counter() - t0
        curves[method] = {f"{k}_per_question": v for k, v in values.items()}
        results[method] = {**{k: _mean(v) for k, v in values.items()}, "seconds": seconds}
        if pixel is not None and (method != "random" or pixel_rows):  # random's pixel row: a reference for others
            pixel_rows = True
            curves[pixel_row(method)] = {f"{k}_per_question": v for k, v in pixel.items()}
            results[pixel_row(method)] = {
                **{k: None for k in VLM_METRICS},
                **{k: _mean(v) for k, v in pixel.items()},
                "seconds": None,
            }
    return results, curves, len(q.correct) / len(records), len(q.correct)


__all__ = [
    "vlm_protocol",
    "vlm_methods",
    "deciding_word",
    "background_fill",
    "VLM_METRICS",
    "PIXEL_METRICS",
    "PIXEL_SUFFIX",
    "PATCH_FEATURE_METHODS",
    "MAX_PATCHES",
    "pixel_row",
    "pointing_hit",
    "mask_share",
    "text_rank",
    "patch_order",
    "paint_patches",
    "patch_curve",
    "question_values",
    "mean_values",
]
