"""The field's attribution baselines, computed by Captum on the adapter's replay (docs/METHODS.md §2d).

Input × Gradient, Integrated Gradients, SmoothGrad, occlusion and KernelSHAP
are what papers compare relevance methods with. Captum implements them; this
module only hands Captum a forward function and reads its attributions back:

* **where**: the same input-space tensors as AttnLRP — the pixels of an image
  (``pixels`` (B, H, W) = Σ over colour channels, ``scores`` = patch sums) and
  the word-embedding output of a text model (``scores`` = Σ over channels,
  padding 0). Nothing in the adapters changes: the forward function replays
  the model with :meth:`Adapter.forward`; for text it substitutes the given
  embeddings for the output of the model's word-embedding module (found by
  identity, :func:`word_embedding_module`) with a forward hook that lives
  only for that replay (:func:`~lrp_core.runtime.guard.engine_hook`: removed
  on every path, and never taken by the model guard for a change of the
  user's hooks to undo).
* **what**: ``f(x, *args)`` returns the logits (B, C) — minus the logit of
  the contrast class where the target is a ``Contrast`` — and Captum's
  ``target`` picks the explained class. ``args`` are the per-sample entries
  of the prepared batch (ids, masks); Captum repeats them with the samples it
  builds (integration steps, perturbations, noise).
* **padding**: the baselines equal the input at padding positions, so no
  method moves them (the integration path, an ablated token and a KernelSHAP
  coalition leave them as they are); their scores are set to 0.
* **decoders** (``adapter.is_decoder``): the explained output is the logit at
  each row's read position (``read_at``, ``explain(..., position=p)``); the
  features are the row's *context* — its real tokens up to the one read
  (``adapter.layout(prepared).mask``). Tokens after the read position are
  treated like padding: they keep their embeddings and score 0.
* **vision-language models**: the pixels and the text's word embeddings are attributed together, in one replay;
  an image token scores its patches' (:mod:`lrp_core.methods.baselines_vlm`).
* **one sample at a time** (all but Input × Gradient): each sample is
  attributed alone, cut to its features where the cut row is the row alone
  (:class:`_Row`), with the generator seeded by ``seed`` (the global generator
  is left as it was): its noise, coalitions and Captum's chunks of steps /
  perturbations are those of the sample alone, so a sample gets the same map
  whatever batch (and padding) it is in.

:func:`forward_function` is public so that a test (or a reader) can call
Captum directly on the very function the methods use.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..adapters.base import Adapter
from ..adapters.batches import Batch, ImageBatch, TextBatch
from ..errors import InputError, UnsupportedModelError
from ..runtime.extras import require
from ..runtime.guard import engine_hook
from .baselines_vlm import contrast as _contrast
from .baselines_vlm import (
    is_vlm,
    seeded_rows,
    vlm_input_x_gradient,
    vlm_integrated_gradients,
    vlm_kernel_shap,
    vlm_occlusion,
    vlm_smoothgrad,
)
from .baselines_vlm import output_replaced as _output_replaced
from .call import Call, MethodResult

#: What ``baseline`` may name: images "zeros" | "blur", text "zeros" | "pad" | "mask" (or a token id).
IMAGE_BASELINES = ("zeros", "blur")
TEXT_BASELINES = ("zeros", "pad", "mask")
#: σ of the Gaussian blur of the "blur" baseline, in patches (one patch: the detail inside a patch is gone).
BLUR_SIGMA_PATCHES = 1.0


@dataclass
class Attributed:
    """What Captum attributes: ``forward(inputs, *args)`` → logits (B, C).

    Attributes:
        forward: the adapter's replay from ``inputs`` to the (contrasted) logits.
        inputs: (B, 3, H, W) pixels or (B, T, E) word embeddings, detached.
        args: the per-sample additional forward arguments (text: the prepared entries; the contrast class).
        mask: (B, T) 1 = a feature (text: a real token; decoders: a context token), else ``None``.
        module: the word-embedding module (text), else ``None``.
        cut_anywhere: a row may be cut to its features wherever they lie (decoders: position ids follow the
            mask, so a row cut to its context is the row alone); else only a leading run is cut (encoders'
            position ids count from the first token).
    """

    forward: Callable[..., Tensor]
    inputs: Tensor
    args: tuple
    mask: Optional[Tensor] = None
    module: Optional[nn.Module] = None
    cut_anywhere: bool = False

    @property
    def image(self) -> bool:
        return self.mask is None and self.inputs.dim() == 4

    def row(self, i: int) -> tuple:
        """The additional forward arguments of one sample, as a batch of one.

        Parameters
        ----------
        i : int
            The sample's index.

        Returns
        -------
        tuple
            ``args`` with each tensor cut to row ``i`` (``[i:i + 1]``); other arguments as they are.
        """
        return tuple(a[i : i + 1] if isinstance(a, Tensor) else a for a in self.args)


def word_embedding_module(adapter: Adapter, prepared: Batch) -> nn.Module:
    """The ``nn.Embedding`` whose output the adapter reads as the word embeddings (``EmbeddingRecord.embeds``).

    It is found by identity during one embedding pass, with temporary hooks on the model's ``nn.Embedding``
    modules, so no family needs to name it.

    Parameters
    ----------
    adapter : Adapter
        The text model's adapter.
    prepared : Batch
        A batch of the adapter's.

    Returns
    -------
    nn.Module
        The embedding module.

    Raises
    ------
    UnsupportedModelError
        If no ``nn.Embedding`` module outputs the word embeddings.
    """
    outputs: list = []
    with ExitStack() as hooks, torch.no_grad():
        for m in adapter.model.modules():
            if isinstance(m, nn.Embedding):
                hooks.enter_context(engine_hook(m, lambda mod, a, out: outputs.append((mod, out))))
        embeds = adapter.embed(prepared).embeds
    for mod, out in outputs:
        if out is embeds:
            return mod
    raise UnsupportedModelError(
        f"{type(adapter.model).__name__}: its word embeddings are not the output of one "
        "nn.Embedding module, so the Captum baselines cannot attribute at them"
    )


def forward_function(adapter: Adapter, prepared: Batch, negative: Optional[Tensor] = None) -> Attributed:
    """The forward function the baselines give Captum, with its inputs and additional arguments.

    Images: ``f(pixels, negative)``. Text: ``f(embeddings, *the batch's per-sample fields, negative)``, where for
    one replay ``embeddings`` stands in for the word-embedding module's output (for decoders the fields include
    ``read_at``, so the logits are read at each row's read position). Calling Captum as
    ``Method(a.forward).attribute(a.inputs, target=..., additional_forward_args=a.args)`` computes the methods.

    Parameters
    ----------
    adapter : Adapter
        The model's adapter.
    prepared : Batch
        The batch (B rows).
    negative : Optional[Tensor], optional
        (B,) a contrast class per row: the forward then returns ``y_c - y_negative`` for every class c.

    Returns
    -------
    Attributed
        ``forward(inputs, *args)`` -> (B, C) logits; ``inputs`` (B, 3, H, W) pixels or (B, T, E) word
        embeddings, detached.

    Raises
    ------
    UnsupportedModelError
        If the word embeddings are not the output of one ``nn.Embedding`` module (text).
    """
    if isinstance(prepared, ImageBatch):
        batch = prepared

        def forward_images(images: Tensor, neg: Optional[Tensor] = None) -> Tensor:
            trace = adapter.forward(batch.replace(images=images), grad=torch.is_grad_enabled())
            return _contrast(trace.logits, neg)

        return Attributed(forward_images, prepared.images.detach(), (negative,))

    assert isinstance(prepared, TextBatch), "a batch holds images or tokens"
    # per-sample fields travel with the samples (Captum repeats / slices them); shared ones (CLIP's images of the
    # text side) are the batch's fact and stay whole
    given = {k: v for k, v in prepared.per_sample().items() if v is not None}
    keys = tuple(given)
    module = word_embedding_module(adapter, prepared)

    def forward(embeds: Tensor, *values: Any) -> Tensor:
        *entries, neg = values
        with _output_replaced(module, embeds):
            trace = adapter.forward(prepared.replace(**dict(zip(keys, entries))), grad=torch.is_grad_enabled())
        return _contrast(trace.logits, neg)

    with torch.no_grad():
        embeds = adapter.embed(prepared).embeds
    assert embeds is not None, "word_embedding_module found the output of this embedding pass"
    embeds = embeds.detach()
    decoder = adapter.is_decoder
    # a decoder's features are the context of the prediction read (the layout's mask), an encoder's its real tokens
    features = adapter.layout(prepared).mask if decoder else prepared.attention_mask
    return Attributed(forward, embeds, tuple(given.values()) + (negative,), features, module, cut_anywhere=decoder)


# ----------------------------------------------------------------------------
# reference inputs
# ----------------------------------------------------------------------------
def gaussian_blur(images: Tensor, sigma: float) -> Tensor:
    """Blur images channel by channel with a Gaussian kernel, reflecting at the borders.

    Parameters
    ----------
    images : Tensor
        (B, C, H, W) images.
    sigma : float
        The Gaussian's standard deviation, in pixels.

    Returns
    -------
    Tensor
        (B, C, H, W) the blurred images.
    """
    radius = max(1, min(int(3 * sigma + 0.5), min(images.shape[-2:]) - 1))
    x = torch.arange(-radius, radius + 1, dtype=images.dtype, device=images.device)
    k = torch.exp(-0.5 * (x / sigma) ** 2)
    k = k / k.sum()
    C = images.shape[1]
    out = F.pad(images, (radius, radius, radius, radius), mode="reflect")
    out = F.conv2d(out, k.view(1, 1, 1, -1).expand(C, 1, 1, -1), groups=C)  # along the width
    return F.conv2d(out, k.view(1, 1, -1, 1).expand(C, 1, -1, 1), groups=C)  # along the height


def _special_token(adapter: Adapter, name: str) -> int:
    """``config.<name>_token_id`` of the model (or of its text tower), else an error saying what to pass."""
    config = getattr(adapter.model, "config", None)
    for cfg in (config, getattr(config, "text_config", None)):
        tok = getattr(cfg, f"{name}_token_id", None)
        if isinstance(tok, int):
            return tok
    raise InputError(
        f"baseline={name!r}: {type(adapter.model).__name__}'s config names no {name} token; pass its id "
        f"instead, e.g. baseline=tokenizer.{name}_token_id"
    )


def _grid(c: Call) -> tuple[int, int]:
    """(h, w): the patch grid of an image call's layout."""
    assert c.layout.grid is not None, "an image layout carries its patch grid"
    return c.layout.grid


def _mask(a: Attributed) -> Tensor:
    """(B, T): the feature mask of text inputs."""
    assert a.mask is not None, "text inputs carry their feature mask"
    return a.mask


def reference(c: Call, a: Attributed) -> Tensor:
    """The baseline input of IG, occlusion and KernelSHAP.

    Images: ``"zeros"`` (0 in the normalised input, i.e. the mean colour) or ``"blur"`` (the image blurred with
    σ = one patch). Text: ``"zeros"`` (zero vectors), or ``"pad"`` / ``"mask"`` / a token id (that token's
    embedding) at the features (the real tokens; for decoders the context tokens). Padding positions, and a
    decoder's tokens after the read position, keep their own embeddings.

    Parameters
    ----------
    c : Call
        The method call; its ``baseline`` option picks the reference.
    a : Attributed
        The forward function and its inputs (:func:`forward_function`).

    Returns
    -------
    Tensor
        Shaped like ``a.inputs``: (B, 3, H, W) or (B, T, E).

    Raises
    ------
    InputError
        If the baseline is not one for the input kind, names a token the model's config lacks, or is a
        token id outside the vocabulary.
    """
    choice: Union[str, int] = c.opt.baseline
    if a.image:
        if choice not in IMAGE_BASELINES:
            raise InputError(f"baseline={choice!r} is not one for images: use one of {IMAGE_BASELINES}")
        if choice == "zeros":
            return torch.zeros_like(a.inputs)
        sigma = BLUR_SIGMA_PATCHES * a.inputs.shape[-1] / _grid(c)[1]
        return gaussian_blur(a.inputs.detach(), sigma)
    if choice == "blur":
        raise InputError(f"baseline='blur' is for images; for text use one of {TEXT_BASELINES} or a token id")
    if choice == "zeros":
        ref = torch.zeros_like(a.inputs)
    else:
        tok = choice if isinstance(choice, int) else _special_token(c.adapter, choice)
        embedding = a.module
        assert isinstance(embedding, nn.Embedding), "text inputs carry their word-embedding module"
        if not 0 <= tok < embedding.num_embeddings:
            raise InputError(f"baseline token id {tok} is outside the vocabulary (0 … {embedding.num_embeddings - 1})")
        ids = torch.full(a.inputs.shape[:2], tok, dtype=torch.long, device=a.inputs.device)
        with torch.no_grad():
            ref = embedding(ids).to(a.inputs.dtype)
    real = _mask(a).bool()[..., None].to(a.inputs.device)
    return torch.where(real, ref, a.inputs.detach())  # padding stays as it is: no method moves it


def feature_mask(c: Call, a: Attributed) -> Tensor:
    """The features of occlusion and KernelSHAP: one per patch, or one per feature token.

    A padding position (or a decoder's token after the read position) shares a feature token's id: its
    baseline is its own value, so removing that feature leaves it unchanged at no extra forward pass. Ids
    count 0, 1, ... along each row's feature tokens.

    Parameters
    ----------
    c : Call
        The method call (its layout gives an image's patch grid).
    a : Attributed
        The forward function and its inputs (:func:`forward_function`).

    Returns
    -------
    Tensor
        (1, 1, H, W) patch ids for images, (B, T, 1) token ids for text.
    """
    if a.image:
        h, w = _grid(c)
        H, W = a.inputs.shape[-2:]
        ids = torch.arange(h * w, device=a.inputs.device).reshape(h, w)
        return ids.repeat_interleave(H // h, 0).repeat_interleave(W // w, 1)[None, None]
    mask = _mask(a).to(a.inputs.device).long()
    return (mask.cumsum(dim=1) - 1).clamp(min=0)[..., None]


# ----------------------------------------------------------------------------
# the methods
# ----------------------------------------------------------------------------
def _start(c: Call, grad: bool = False) -> tuple[Attributed, Tensor, Tensor]:
    """The forward function, the target (B,) and the logits (B, C) of one call.

    ``grad``: the inputs are made to require gradients (as Captum would, with a warning, for a gradient method).
    """
    with torch.no_grad():
        logits = c.adapter.forward(c.prepared).logits
    target = c.resolve(logits)
    a = forward_function(c.adapter, c.prepared, c.negative)
    if grad:
        a.inputs.requires_grad_(True)  # a detached tensor of the method's own: the caller's stays as it is
    return a, target.to(logits.device), logits


def _result(
    c: Call, a: Attributed, attr: Tensor, target: Tensor, logits: Tensor, per_feature: bool, **extra: Any
) -> MethodResult:
    """Scores (and pixels) from Captum's attributions ``attr`` (shaped like ``a.inputs``).

    ``per_feature`` (occlusion, KernelSHAP): every element of a patch / token carries the feature's value, and
    that value is the score (a pixel shows its patch's value); else scores are sums over the patch / channels.
    """
    attr = attr.detach().to(a.inputs.dtype)  # KernelSHAP's regression returns float32
    if a.image:
        h, w = _grid(c)
        B, _, H, W = attr.shape
        pixels = attr[:, 0] if per_feature else attr.sum(dim=1)
        patches = pixels.reshape(B, h, H // h, w, W // w)
        scores = (patches[:, :, 0, :, 0] if per_feature else patches.sum(dim=(2, 4))).reshape(B, h * w)
        return MethodResult(scores=scores, target=target, logits=logits, pixels=pixels, **extra)
    scores = attr[..., 0] if per_feature else attr.sum(dim=-1)
    scores = scores * _mask(a).to(scores.device, scores.dtype)
    return MethodResult(scores=scores, target=target, logits=logits, **extra)


def _per_sample(c: Call, a: Attributed, attribute: Callable[[int], Tensor]) -> Tensor:
    """``attribute(i)`` for every sample (:func:`~.baselines_vlm.seeded_rows`), concatenated."""
    return torch.cat(seeded_rows(c.opt.seed, a.inputs.device, a.inputs.shape[0], attribute))


def input_x_gradient(c: Call) -> MethodResult:
    """Input × gradient (Captum ``InputXGradient``) at the pixels or the word embeddings.

    Parameters
    ----------
    c : Call
        The method call (adapter, prepared batch, resolved options).

    Returns
    -------
    MethodResult
        ``scores`` (B, N) per patch, or (B, T) per token (zero outside the features); for images also ``pixels``
        (B, H, W); the target (B,) and the logits (B, C).
    """
    InputXGradient = require("captum.attr", extra="baselines", what="input_x_gradient").InputXGradient
    if is_vlm(c):
        return vlm_input_x_gradient(c, InputXGradient)
    a, target, logits = _start(c, grad=True)
    attr = InputXGradient(a.forward).attribute(a.inputs, target=target, additional_forward_args=a.args)
    return _result(c, a, attr, target, logits, per_feature=False)


def integrated_gradients(c: Call) -> MethodResult:
    """Integrated Gradients (Captum ``IntegratedGradients``, Gauss–Legendre) from the ``baseline`` reference.

    Parameters
    ----------
    c : Call
        The method call (adapter, prepared batch, resolved options: ``baseline``, ``n_steps``, ``batch_size``).

    Returns
    -------
    MethodResult
        ``scores`` (B, N) per patch, or (B, T) per token (zero outside the features); for images also ``pixels``
        (B, H, W); ``convergence_delta`` (B,); the target (B,) and the logits (B, C).

    Raises
    ------
    InputError
        If the ``baseline`` option does not fit the input kind or names no token of the model.
    """
    IntegratedGradients = require("captum.attr", extra="baselines", what="integrated_gradients").IntegratedGradients
    if is_vlm(c):
        return vlm_integrated_gradients(c, IntegratedGradients)
    a, target, logits = _start(c, grad=True)
    ref, ig, deltas = reference(c, a), IntegratedGradients(a.forward), []

    def one(i: int) -> Tensor:
        row = _Row.of(a, i)  # alone: Captum's chunks of steps are those of the sample alone, whatever the batch
        attr, delta = ig.attribute(
            row.x,
            baselines=row.cut(ref[i : i + 1]),
            target=target[i : i + 1],
            additional_forward_args=row.args,
            n_steps=c.opt.n_steps,
            internal_batch_size=c.opt.batch_size,
            return_convergence_delta=True,
        )
        deltas.append(delta.detach())
        return row.back(attr)

    attr = _per_sample(c, a, one)
    return _result(
        c,
        a,
        attr,
        target,
        logits,
        per_feature=False,
        convergence_delta=torch.cat(deltas),
        used={"baseline": c.opt.baseline, "n_steps": c.opt.n_steps},
    )


def smoothgrad(c: Call) -> MethodResult:
    """SmoothGrad of input × gradient (Captum ``NoiseTunnel``): the mean over ``n_samples`` noisy copies.

    Parameters
    ----------
    c : Call
        The method call (adapter, prepared batch, resolved options: ``n_samples``, ``stdevs``, ``seed``).

    Returns
    -------
    MethodResult
        ``scores`` (B, N) per patch, or (B, T) per token (zero outside the features); for images also ``pixels``
        (B, H, W); the target (B,) and the logits (B, C).
    """
    captum = require("captum.attr", extra="baselines", what="smoothgrad")
    InputXGradient, NoiseTunnel = captum.InputXGradient, captum.NoiseTunnel
    if is_vlm(c):
        return vlm_smoothgrad(c, InputXGradient)
    a, target, logits = _start(c, grad=True)
    tunnel = NoiseTunnel(InputXGradient(a.forward))

    def one(i: int) -> Tensor:
        row = _Row.of(a, i)  # the noise is drawn for the features only: padding changes nothing
        got = tunnel.attribute(
            row.x,
            nt_type="smoothgrad",
            nt_samples=c.opt.n_samples,
            nt_samples_batch_size=c.opt.batch_size,
            stdevs=float(c.opt.stdevs),
            target=target[i : i + 1],
            additional_forward_args=row.args,
        )
        return row.back(got)

    attr = _per_sample(c, a, one)
    return _result(
        c,
        a,
        attr,
        target,
        logits,
        per_feature=False,
        used={"n_samples": c.opt.n_samples, "stdevs": c.opt.stdevs, "seed": c.opt.seed},
    )


def occlusion(c: Call) -> MethodResult:
    """Occlusion: ``y_t(x) − y_t(x with one patch or token set to the baseline)`` (Captum ``FeatureAblation``).

    Parameters
    ----------
    c : Call
        The method call (adapter, prepared batch, resolved options: ``baseline``, ``batch_size``).

    Returns
    -------
    MethodResult
        ``scores`` (B, N) per patch, or (B, T) per token (zero outside the features); for images also ``pixels``
        (B, H, W); the target (B,) and the logits (B, C).

    Raises
    ------
    InputError
        If the ``baseline`` option does not fit the input kind or names no token of the model.
    """
    FeatureAblation = require("captum.attr", extra="baselines", what="occlusion").FeatureAblation
    if is_vlm(c):
        return vlm_occlusion(c, FeatureAblation)
    a, target, logits = _start(c)
    ref, mask, ablation = reference(c, a), feature_mask(c, a), FeatureAblation(a.forward)

    def one(i: int) -> Tensor:
        row = _Row.of(a, i)  # alone: its perturbations are evaluated in the chunks of the sample alone
        m = mask if a.image else row.cut(mask[i : i + 1])  # images: one mask for all
        return row.back(
            ablation.attribute(
                row.x,
                baselines=row.cut(ref[i : i + 1]),
                target=target[i : i + 1],
                additional_forward_args=row.args,
                feature_mask=m,
                perturbations_per_eval=c.opt.batch_size,
            )
        )

    attr = _per_sample(c, a, one)
    return _result(c, a, attr, target, logits, per_feature=True, used={"baseline": c.opt.baseline})


def kernel_shap(c: Call) -> MethodResult:
    """KernelSHAP over the patches or tokens (Captum ``KernelShap``).

    Parameters
    ----------
    c : Call
        The method call (adapter, prepared batch, resolved options: ``baseline``, ``n_samples`` coalitions per
        sample, ``seed``).

    Returns
    -------
    MethodResult
        ``scores`` (B, N) per patch, or (B, T) per token (zero outside the features); for images also ``pixels``
        (B, H, W); the target (B,) and the logits (B, C).

    Raises
    ------
    InputError
        If the ``baseline`` option does not fit the input kind or names no token of the model.
    """
    KernelShap = require("captum.attr", extra="baselines", what="kernel_shap").KernelShap
    if is_vlm(c):
        return vlm_kernel_shap(c, KernelShap)
    a, target, logits = _start(c)
    ref, mask = reference(c, a), feature_mask(c, a)
    shap = KernelShap(a.forward)

    def one(i: int) -> Tensor:
        # a row cut to its features (text), so that its coalitions are those of the row alone
        row = _Row.of(a, i)
        r = row.cut(ref[i : i + 1])
        m = mask if a.image else row.cut(mask[i : i + 1])  # images: one mask for all
        if int(m.max()) == 0:  # one feature: its Shapley value is f(x) − f(reference) (efficiency);
            return row.back(_whole_input_value(a.forward, row, r, target[i]))  # Captum's weights are undefined
        return row.back(
            shap.attribute(
                row.x,
                baselines=r,
                target=target[i : i + 1],
                additional_forward_args=row.args,
                feature_mask=m,
                n_samples=c.opt.n_samples,
                perturbations_per_eval=c.opt.batch_size,
            )
        )

    attr = _per_sample(c, a, one)
    return _result(
        c,
        a,
        attr,
        target,
        logits,
        per_feature=True,
        used={"baseline": c.opt.baseline, "n_samples": c.opt.n_samples, "seed": c.opt.seed},
    )


@dataclass
class _Row:
    """Sample ``i`` of an :class:`Attributed`, cut to the span of its features where that is the row alone.

    Text: right-padded encoder rows lose their padding (positions unchanged); decoder rows (``cut_anywhere``)
    are cut to their context — the first to the last feature, padding on either side and the tokens after the
    read position dropped (position ids follow the mask, so the cut row is the row alone). Images and other
    text stay as they are (``span = None``).

    Attributes:
        x: (1, n, D) the cut input (or (1, ...) as is).
        args: its additional forward arguments, cut alike.
        span: ``(start, end)`` of the cut in the row, or ``None``.
        length: T, the row's length before the cut.
    """

    x: Tensor
    args: tuple
    span: Optional[tuple[int, int]]
    length: int

    @staticmethod
    def of(a: Attributed, i: int) -> "_Row":
        x, args = a.inputs[i : i + 1], a.row(i)
        if a.image or a.mask is None:
            return _Row(x, args, None, 0)
        m = a.mask[i].bool()
        T = m.shape[0]
        where = torch.nonzero(m).flatten().tolist()
        if not where:  # no feature at all: nothing to cut to
            return _Row(x, args, None, T)
        start, end = (where[0], where[-1] + 1) if a.cut_anywhere else (0, len(where))
        if (start, end) == (0, T) or not bool(m[start:end].all()):
            return _Row(x, args, None, T)  # nothing to cut, or features that are not one run
        row = _Row(x, args, (start, end), T)
        return _Row(row.cut(x), tuple(row.cut(v) for v in args), (start, end), T)

    def cut(self, v: Any) -> Any:
        """``v`` (1, T, ...) cut to the span; another value (shared entries, ``None``) as it is."""
        if self.span is None or not isinstance(v, Tensor) or v.dim() < 2 or v.shape[1] != self.length:
            return v
        return v[:, self.span[0] : self.span[1]]

    def back(self, attr: Tensor) -> Tensor:
        """Attributions of the cut row (1, n, D) padded back with zeros to the row's length (1, T, D)."""
        if self.span is None:
            return attr
        return F.pad(attr, (0, 0, self.span[0], self.length - self.span[1]))


def _whole_input_value(forward: Callable[..., Tensor], row: _Row, ref: Tensor, target: Tensor) -> Tensor:
    """``y_t(x) − y_t(reference)`` of one (cut) row, on every element of its input (1, ...)."""
    with torch.no_grad():
        x = row.x.detach()
        drop = forward(x, *row.args)[0, target] - forward(ref, *row.args)[0, target]
    return torch.full_like(x, float(drop))


#: The methods of this module, in the order of the registry.
CAPTUM_METHODS: tuple[str, ...] = ("input_x_gradient", "integrated_gradients", "smoothgrad", "occlusion", "kernel_shap")

__all__ = [
    "Attributed",
    "forward_function",
    "word_embedding_module",
    "gaussian_blur",
    "reference",
    "feature_mask",
    "input_x_gradient",
    "integrated_gradients",
    "smoothgrad",
    "occlusion",
    "kernel_shap",
    "CAPTUM_METHODS",
    "IMAGE_BASELINES",
    "TEXT_BASELINES",
]
