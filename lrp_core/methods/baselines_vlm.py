"""The Captum baselines on vision-language models (docs/METHODS.md §2g.5).

A VLM has two inputs, attributed together in one replay: the pixels the vision tower reads (``pixel_values`` as the
adapter prepares it: (B, k, 3, H, W) images, or Qwen-VL's flattened patches (B, k, N, C · T · p · p)) and the text's
word embeddings (B, T, D), substituted for the output of the language model's token embedding (an engine hook
that lives for one replay). The explained output is the decoder's: the logit at each row's read position.

* **gradient methods** (Input × Gradient, Integrated Gradients, SmoothGrad): every pixel value and every
  embedding entry gets an attribution; a text token scores Σ_D of its embedding's, an image patch the sum of its
  pixels', and an image token the sum of the patches it carries (the layout's ``image_tokens``: one patch
  (LLaVA), the pooled / shuffled / merged patches (Gemma 3, SmolVLM, Qwen-VL)).
* **feature methods** (occlusion, KernelSHAP): one feature per patch of the tower's patch grid (its pixels set
  to the baseline together) and one per text token (its embedding set to the baseline); a text token scores its
  feature's value, an image token the sum of its patches' values, a pixel its patch's value.
* **the reference** (IG, occlusion, KernelSHAP): ``baseline="zeros"`` only: zero pixels (the mean colour in
  the normalised input) and zero embeddings at the text tokens. Padding, a decoder's tokens after the read
  position and the image placeholders keep their embeddings (the placeholders' are replaced by the image
  features anyway), so no method moves them; they score 0 as text.
* **SmoothGrad's noise**: Gaussian, on every pixel value and on the text tokens' embeddings only, with standard
  deviation ``stdevs`` on the embeddings and ``PIXEL_NOISE_SCALE · stdevs`` on the pixels (the default, the text
  one 0.02, gives the pixels the image default 0.6). Drawn in float64 from a generator of its own seeded with
  ``seed`` for each row, the pixels' noise first ((n, k, ...) as one row's pixels), then the text's
  ((n, text tokens, D)): a row's noise does not depend on the batch it is in or its padding, and the global
  generator is not used.
* **one row at a time** (all but Input × Gradient): each row is attributed as a batch of one (KernelSHAP's
  coalitions drawn with the global generator seeded by ``seed`` and restored afterwards), so a row gets the same
  map whatever batch and padding it is in.

Shapes: B rows, k images per row, T tokens, D the language model's width, (h, w) the patch grid, (H, W) an image.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
from torch import Tensor, nn

from ..adapters.batches import VLMBatch
from ..errors import InputError, UnsupportedModelError
from ..runtime.fast_half import sum_dtype
from ..runtime.guard import engine_hook
from .call import Call, MethodResult

#: SmoothGrad on a VLM: the pixels' noise σ over the embeddings' (the image default 0.6 over the text default 0.02)
PIXEL_NOISE_SCALE = 30.0


def contrast(logits: Tensor, negative: Optional[Tensor]) -> Tensor:
    """The logits, or each class's logit minus the contrast class's.

    Parameters
    ----------
    logits : Tensor
        (B, C) logits.
    negative : Optional[Tensor]
        (B,) a contrast class per row, or ``None``.

    Returns
    -------
    Tensor
        (B, C): ``logits``, or ``y_c − y_negative`` for every class c (Captum's target then picks
        ``y_t − y_negative``).
    """
    return logits if negative is None else logits - logits.gather(1, negative[:, None].to(logits.device))


@contextmanager
def output_replaced(module: nn.Module, value: Tensor) -> Iterator[None]:
    """``module`` returns ``value`` instead of its output while the context lasts.

    An engine hook, removed on exit whatever ends the context; the user's hooks on ``module`` run before it and
    stay.

    Parameters
    ----------
    module : nn.Module
        The module (a word embedding).
    value : Tensor
        What it returns, shaped as its output.

    Raises
    ------
    InputError
        If ``value``'s shape is not the output's.
    """

    def hook(mod: nn.Module, args: Any, out: Tensor) -> Tensor:
        if out.shape != value.shape:
            raise InputError(
                f"embeddings of shape {tuple(value.shape)} given for a batch whose word embeddings "
                f"have shape {tuple(out.shape)}"
            )
        return value

    with engine_hook(module, hook):
        yield


@dataclass
class VLMInputs:
    """What Captum attributes on a vision-language model: ``forward(pixels, words, *args)`` → logits (B, C).

    Attributes:
        forward: the replay from the pixels and the word embeddings (B, T, D) to the (contrasted) logits;
            ``words`` stand in for the output of the language model's token embedding (an engine hook for that
            replay).
        inputs: (pixels, words), detached copies of the method's own; pixels as the batch holds them, (B, k, 3, H, W) or
            (B, k, N, F).
        args: the batch's per-sample fields besides the pixels, and the contrast class.
        text: (B, T) bool, the text features: context tokens that are not image placeholders.
    """

    forward: Callable[..., Tensor]
    inputs: tuple
    args: tuple
    text: Tensor

    def row(self, i: int, n: int = 1) -> tuple:
        """The additional forward arguments of row ``i``, repeated ``n`` times.

        Parameters
        ----------
        i : int
            The row.
        n : int, optional
            The batch they are for (default 1).

        Returns
        -------
        tuple
            ``args`` with each tensor cut to row ``i`` and expanded to ``n`` rows; other arguments as they are.
        """
        return tuple(a[i : i + 1].expand(n, *a.shape[1:]) if isinstance(a, Tensor) else a for a in self.args)


def is_vlm(c: Call) -> bool:
    """Whether a call is a vision-language model's: its batch is a :class:`VLMBatch` (text with images).

    Parameters
    ----------
    c : Call
        The method call.

    Returns
    -------
    bool
        True for a VLM's call.
    """
    return isinstance(c.prepared, VLMBatch)


def _batch(c: Call) -> VLMBatch:
    assert isinstance(c.prepared, VLMBatch), "the VLM baselines run on a VLM's batch"
    return c.prepared


def vlm_inputs(c: Call) -> VLMInputs:
    """The forward function and the two inputs of a vision-language model's call.

    Parameters
    ----------
    c : Call
        The method call.

    Returns
    -------
    VLMInputs
        The forward function, the (pixels, words) inputs, the additional arguments and the text features.

    Raises
    ------
    UnsupportedModelError
        If the adapter's images of the batch's ``pixel_values`` are not (B, k, C', H, W).
    """
    adapter: Any = c.adapter  # a VLMAdapter (its ``text`` decoder, ``image_token_id``, ``images_of``)
    prepared = _batch(c)
    images = prepared.pixel_values
    if _to_images(c, images[:1]).dim() != 5:
        raise UnsupportedModelError(
            f"{type(adapter.model).__name__}: its pixel_values are neither images (B, k, 3, "
            "H, W) nor flattened patches on a patch grid, so the Captum baselines have no "
            "pixel map to give"
        )
    module = adapter.text.model.get_input_embeddings()
    ids = prepared.input_ids
    with torch.no_grad():
        words = module(ids).detach().to(ids.device)  # a split model: where the batch is
    given = {k: v for k, v in prepared.per_sample().items() if k != "pixel_values" and v is not None}
    keys = tuple(given)

    def forward(pixels: Tensor, embeds: Tensor, *values: Any) -> Tensor:
        *entries, neg = values
        with output_replaced(module, embeds):
            batch = prepared.replace(**dict(zip(keys, entries)), pixel_values=pixels)
            trace = adapter.forward(batch, grad=torch.is_grad_enabled())
        return contrast(trace.logits, neg)

    mask = adapter.layout(prepared).mask  # a decoder's layout always has one
    text = (ids != adapter.image_token_id) & mask.bool().to(ids.device)
    return VLMInputs(forward, (images.detach().clone(), words.clone()), tuple(given.values()) + (c.negative,), text)


# ----------------------------------------------------------------------------
# pixels <-> images, features, scores
# ----------------------------------------------------------------------------
def _grid(c: Call) -> tuple[int, int]:
    grid = c.adapter.layout(c.prepared).grid
    assert grid is not None, "a VLM's layout carries its patch grid"
    return grid


def _to_images(c: Call, x: Tensor) -> Tensor:
    """A tensor shaped like the pixels (B, k, ...) -> (B, k, C', H, W) on the images (Qwen-VL: the frames' channels
    side by side, C' = C · T)."""
    B, k = x.shape[:2]
    adapter: Any = c.adapter  # a VLMAdapter
    images = adapter.images_of(x.flatten(0, 1), _grid(c))
    return images.reshape(B, k, *images.shape[1:])


def _from_images(c: Call, images: Tensor) -> Tensor:
    """The inverse of :func:`_to_images`: (B, k, C', H, W) -> shaped like the pixels."""
    B, k = images.shape[:2]
    adapter: Any = c.adapter  # a VLMAdapter
    pixels = adapter.pixels_of(images.flatten(0, 1), _grid(c))
    return pixels.reshape(B, k, *pixels.shape[1:])


def _features(c: Call, v: VLMInputs, i: int) -> tuple[Tensor, Tensor]:
    """The feature ids of row ``i`` (Captum's ``feature_mask``), one id space over both inputs.

    Patches first: image j's patch (r, col) is ``j · h · w + r · w + col`` on all of its pixel values (1, ...,
    shaped like one row's pixels); then the text tokens, ``k · h · w`` onwards along the row (1, T, 1). The other
    positions share the first text id (or 0): their baseline is their own value, so they change nothing.
    """
    h, w = _grid(c)
    shape = _to_images(c, v.inputs[0][i : i + 1]).shape  # (1, k, C', H, W)
    k, H, W = shape[1], shape[-2], shape[-1]
    device = v.inputs[0].device
    ids = torch.arange(k * h * w, device=device).reshape(k, h, w)
    ids = ids.repeat_interleave(H // h, 1).repeat_interleave(W // w, 2)
    pixels = _from_images(c, ids[None, :, None].expand(shape).contiguous())
    text = v.text[i].to(device)
    first = k * h * w if bool(text.any()) else 0
    words = torch.where(text, k * h * w + text.long().cumsum(0) - 1, first)
    return pixels, words[None, :, None]


def _reference(c: Call, v: VLMInputs, method: str) -> tuple[Tensor, Tensor]:
    """Zero pixels and zero embeddings at the text features (the other positions keep theirs)."""
    if c.method.baseline != "zeros":
        raise InputError(
            f"baseline={c.method.baseline!r}: on a vision-language model {method} starts from "
            "baseline='zeros' only (zero pixels and zero text embeddings)"
        )
    pixels, words = v.inputs
    return torch.zeros_like(pixels), torch.where(v.text[..., None].to(words.device), 0.0, words)


def vlm_result(
    c: Call, v: VLMInputs, attr: tuple, target: Tensor, logits: Tensor, per_feature: bool = False, **extra: Any
) -> MethodResult:
    """Scores (B, T) and pixels (B, H, W) from the attributions of the pixels and the word embeddings.

    Parameters
    ----------
    c : Call
        The method call.
    v : VLMInputs
        The inputs attributed.
    attr : tuple
        The attributions, shaped like ``v.inputs``.
    target : Tensor
        (B,) the explained class.
    logits : Tensor
        (B, C) the logits at the read position.
    per_feature : bool, optional
        Occlusion / KernelSHAP: every element of a feature carries its value (a token's and a patch's value is
        read once); else a token's and a patch's value is the sum of its elements' (default).
    **extra
        Further fields of the result.

    Returns
    -------
    MethodResult
        ``scores`` (B, T): a text token its embedding's value, an image token the sum of its patches', other
        positions 0; ``pixels`` (B, H, W) (each pixel summed over the channels, or its patch's value) with one
        image per row, else ``None``.
    """
    pixels, words = v.inputs
    attr_pixels = attr[0].detach().to(sum_dtype(pixels.dtype))  # KernelSHAP's regression returns float32
    attr_words = attr[1].detach().to(sum_dtype(words.dtype))  # the fast half mode: summed in float32
    scores = (attr_words[..., 0] if per_feature else attr_words.sum(-1)) * v.text.to(attr_words.dtype)
    layout: Any = c.adapter.layout(c.prepared)  # a VLM's: with its patch grid and image tokens
    h, w = layout.grid
    images = _to_images(c, attr_pixels)  # (B, k, C', H, W)
    B, k, _, H, W = images.shape
    per_pixel = images[:, :, 0] if per_feature else images.sum(dim=2)  # (B, k, H, W)
    blocks = per_pixel.reshape(B, k, h, H // h, w, W // w)
    patches = (blocks[:, :, :, 0, :, 0] if per_feature else blocks.sum(dim=(3, 5))).reshape(B, k * h * w)
    scores = scores.scatter_add(1, layout.image_tokens.to(scores.device), patches.to(scores.dtype))
    return MethodResult(
        scores=scores, target=target, logits=logits, pixels=per_pixel[:, 0] if k == 1 else None, **extra
    )


def _start(c: Call) -> tuple[VLMInputs, Tensor, Tensor]:
    """The inputs, the target (B,) and the logits (B, C) of a vision-language model's call."""
    with torch.no_grad():
        logits = c.adapter.forward(c.prepared).logits
    return vlm_inputs(c), c.resolve(logits).to(logits.device), logits


def seeded_rows(seed: int, device: torch.device, n: int, attribute: Callable[[int], Any]) -> list:
    """``attribute(i)`` for ``i`` in ``0 … n−1``, each with the global generator seeded by ``seed`` (its state, and
    ``device``'s where that is a GPU, restored afterwards), so a row's draws do not depend on its batch.

    Parameters
    ----------
    seed : int
        The seed every row starts from.
    device : torch.device
        The device whose generator is forked with the CPU's (CUDA only).
    n : int
        The number of rows.
    attribute : Callable[[int], Any]
        Row index → that row's attribution(s).

    Returns
    -------
    list
        The n results, in row order.
    """
    rows = []
    for i in range(n):
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            rows.append(attribute(i))
    return rows


def _each_row(c: Call, v: VLMInputs, attribute: Callable[[int], tuple]) -> tuple:
    """``attribute(i)`` for every row (:func:`seeded_rows`, with the method's ``seed``; a method that draws nothing
    owns none and runs with 0), the rows' pixel and embedding parts concatenated."""
    rows = seeded_rows(getattr(c.method, "seed", 0), v.inputs[0].device, v.inputs[0].shape[0], attribute)
    return tuple(torch.cat([r[j] for r in rows]) for j in range(2))


def _feature_rows(
    c: Call, v: VLMInputs, target: Tensor, method: str, attribute: Callable[..., tuple], **extra: Any
) -> tuple:
    """A feature method (Captum's ``attribute`` of occlusion or KernelSHAP) on each row alone (:func:`_each_row`):
    the row's patches and text tokens as features (:func:`_features`), set to the reference of ``method``."""
    ref = _reference(c, v, method)

    def one(i: int) -> tuple:
        return attribute(
            tuple(t[i : i + 1] for t in v.inputs),
            baselines=tuple(r[i : i + 1] for r in ref),
            target=target[i : i + 1],
            additional_forward_args=v.row(i),
            feature_mask=_features(c, v, i),
            perturbations_per_eval=c.method.batch_size,
            **extra,
        )

    return _each_row(c, v, one)


# ----------------------------------------------------------------------------
# the methods
# ----------------------------------------------------------------------------
def vlm_input_x_gradient(c: Call, InputXGradient: Any) -> MethodResult:
    """Input × gradient at the pixels and the word embeddings at once, in one replay.

    Parameters
    ----------
    c : Call
        The method call.
    InputXGradient : Any
        Captum's class.

    Returns
    -------
    MethodResult
        As :func:`vlm_result`.
    """
    v, target, logits = _start(c)
    inputs = tuple(t.requires_grad_(True) for t in v.inputs)
    attr = InputXGradient(v.forward).attribute(inputs, target=target, additional_forward_args=v.args)
    return vlm_result(c, v, attr, target, logits)


def vlm_integrated_gradients(c: Call, IntegratedGradients: Any) -> MethodResult:
    """Integrated Gradients from zero pixels and zero text embeddings, each row alone.

    Parameters
    ----------
    c : Call
        The method call (options ``baseline``, ``n_steps``, ``batch_size``).
    IntegratedGradients : Any
        Captum's class.

    Returns
    -------
    MethodResult
        As :func:`vlm_result`, with ``convergence_delta`` (B,).
    """
    v, target, logits = _start(c)
    ref, ig, deltas = _reference(c, v, "integrated_gradients"), IntegratedGradients(v.forward), []

    def one(i: int) -> tuple:
        x = tuple(t[i : i + 1].requires_grad_(True) for t in v.inputs)
        attr, delta = ig.attribute(
            x,
            baselines=tuple(r[i : i + 1] for r in ref),
            target=target[i : i + 1],
            additional_forward_args=v.row(i),
            n_steps=c.method.n_steps,
            internal_batch_size=c.method.batch_size,
            return_convergence_delta=True,
        )
        deltas.append(delta.detach())
        return attr

    attr = _each_row(c, v, one)
    return vlm_result(
        c,
        v,
        attr,
        target,
        logits,
        convergence_delta=torch.cat(deltas),
        used={"baseline": c.method.baseline, "n_steps": c.method.n_steps},
    )


def _noisy(c: Call, v: VLMInputs, i: int) -> tuple[Tensor, Tensor]:
    """Row ``i``'s ``n_samples`` noisy copies: pixels (n, ...) and word embeddings (n, T, D) (module docstring)."""
    pixels, words = (t[i : i + 1].detach() for t in v.inputs)
    text = v.text[i].to(words.device)
    n, sigma = c.method.n_samples, float(c.method.stdevs)
    g = torch.Generator().manual_seed(c.method.seed)
    noise_pixels = torch.randn((n, *pixels.shape[1:]), generator=g, dtype=torch.float64)
    noise_words = torch.randn((n, int(text.sum()), words.shape[-1]), generator=g, dtype=torch.float64)
    noisy_pixels = pixels + PIXEL_NOISE_SCALE * sigma * noise_pixels.to(pixels.device, pixels.dtype)
    noisy_words = words.repeat(n, 1, 1)
    noisy_words[:, text] += sigma * noise_words.to(words.device, words.dtype)
    return noisy_pixels, noisy_words


def vlm_smoothgrad(c: Call, InputXGradient: Any) -> MethodResult:
    """SmoothGrad of input × gradient: the mean of input × gradient over noisy copies of both inputs.

    Each copy's attribution is its own (noisy) input times its gradient, as Captum's ``NoiseTunnel`` over
    ``InputXGradient`` computes; the noise is the module docstring's.

    Parameters
    ----------
    c : Call
        The method call (options ``n_samples``, ``stdevs``, ``seed``, ``batch_size``).
    InputXGradient : Any
        Captum's class.

    Returns
    -------
    MethodResult
        As :func:`vlm_result`.
    """
    v, target, logits = _start(c)
    ixg = InputXGradient(v.forward)

    def one(i: int) -> tuple:
        pixels, words = _noisy(c, v, i)
        n, total = pixels.shape[0], [torch.zeros_like(t[i : i + 1]) for t in v.inputs]
        for s in range(0, n, c.method.batch_size):
            m = min(c.method.batch_size, n - s)
            x = (pixels[s : s + m].requires_grad_(True), words[s : s + m].requires_grad_(True))
            attr = ixg.attribute(x, target=target[i : i + 1].expand(m), additional_forward_args=v.row(i, m))
            total = [t + a.detach().sum(0, keepdim=True) for t, a in zip(total, attr)]
        return tuple(t / n for t in total)

    attr = _each_row(c, v, one)
    used = {"n_samples": c.method.n_samples, "stdevs": c.method.stdevs, "seed": c.method.seed}
    return vlm_result(c, v, attr, target, logits, used=used)


def vlm_occlusion(c: Call, FeatureAblation: Any) -> MethodResult:
    """Occlusion: ``y_t(x) − y_t(x with one patch or one text token set to the baseline)``, each row alone.

    Parameters
    ----------
    c : Call
        The method call (options ``baseline``, ``batch_size``).
    FeatureAblation : Any
        Captum's class.

    Returns
    -------
    MethodResult
        As :func:`vlm_result` (per feature).
    """
    v, target, logits = _start(c)
    attr = _feature_rows(c, v, target, "occlusion", FeatureAblation(v.forward).attribute)
    return vlm_result(c, v, attr, target, logits, per_feature=True, used={"baseline": c.method.baseline})


def vlm_kernel_shap(c: Call, KernelShap: Any) -> MethodResult:
    """KernelSHAP over the patches and the text tokens together, each row alone.

    Parameters
    ----------
    c : Call
        The method call (options ``baseline``, ``n_samples``, ``seed``, ``batch_size``).
    KernelShap : Any
        Captum's class.

    Returns
    -------
    MethodResult
        As :func:`vlm_result` (per feature).
    """
    v, target, logits = _start(c)
    # a VLM row has at least one image of several patches: never a single feature
    attr = _feature_rows(c, v, target, "kernel_shap", KernelShap(v.forward).attribute, n_samples=c.method.n_samples)
    return vlm_result(
        c,
        v,
        attr,
        target,
        logits,
        per_feature=True,
        used={"baseline": c.method.baseline, "n_samples": c.method.n_samples, "seed": c.method.seed},
    )


__all__ = [
    "PIXEL_NOISE_SCALE",
    "seeded_rows",
    "VLMInputs",
    "contrast",
    "output_replaced",
    "is_vlm",
    "vlm_inputs",
    "vlm_result",
    "vlm_input_x_gradient",
    "vlm_integrated_gradients",
    "vlm_smoothgrad",
    "vlm_occlusion",
    "vlm_kernel_shap",
]
