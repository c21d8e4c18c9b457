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

What Captum is handed (the forward function, the references, the features, a row cut to its features) is
:mod:`lrp_core.methods.captum_inputs`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import Tensor

from ..runtime.extras import require
from ..runtime.fast_half import sum_dtype
from .baselines_vlm import (
    is_vlm,
    seeded_rows,
    vlm_input_x_gradient,
    vlm_integrated_gradients,
    vlm_kernel_shap,
    vlm_occlusion,
    vlm_smoothgrad,
)
from .call import Call, MethodResult
from .captum_inputs import Attributed, Row, feature_mask, forward_function, grid, mask_of, reference

if TYPE_CHECKING:
    from .objects import IntegratedGradients, KernelShap, Occlusion, SmoothGrad


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
    # KernelSHAP's regression returns float32; the fast half mode sums in float32
    attr = attr.detach().to(sum_dtype(a.inputs.dtype))
    if a.image:
        h, w = grid(c)
        B, _, H, W = attr.shape
        pixels = attr[:, 0] if per_feature else attr.sum(dim=1)
        patches = pixels.reshape(B, h, H // h, w, W // w)
        scores = (patches[:, :, 0, :, 0] if per_feature else patches.sum(dim=(2, 4))).reshape(B, h * w)
        return MethodResult(scores=scores, target=target, logits=logits, pixels=pixels, **extra)
    scores = attr[..., 0] if per_feature else attr.sum(dim=-1)
    scores = scores * mask_of(a).to(scores.device, scores.dtype)
    return MethodResult(scores=scores, target=target, logits=logits, **extra)


def _per_sample(c: Call, a: Attributed, attribute: Callable[[int], Tensor]) -> Tensor:
    """``attribute(i)`` for every sample (:func:`~.baselines_vlm.seeded_rows`, with the method's ``seed``; a method
    that draws nothing owns none and runs with 0), concatenated."""
    return torch.cat(seeded_rows(getattr(c.method, "seed", 0), a.inputs.device, a.inputs.shape[0], attribute))


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


def integrated_gradients(c: Call[IntegratedGradients]) -> MethodResult:
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
        row = Row.of(a, i)  # alone: Captum's chunks of steps are those of the sample alone, whatever the batch
        attr, delta = ig.attribute(
            row.x,
            baselines=row.cut(ref[i : i + 1]),
            target=target[i : i + 1],
            additional_forward_args=row.args,
            n_steps=c.method.n_steps,
            internal_batch_size=c.method.batch_size,
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
        used={"baseline": c.method.baseline, "n_steps": c.method.n_steps},
    )


def smoothgrad(c: Call[SmoothGrad]) -> MethodResult:
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
    tunnel, sigma = NoiseTunnel(InputXGradient(a.forward)), c.method.stdevs
    assert sigma is not None, "SmoothGrad.defaults sets it for every modality"

    def one(i: int) -> Tensor:
        row = Row.of(a, i)  # the noise is drawn for the features only: padding changes nothing
        got = tunnel.attribute(
            row.x,
            nt_type="smoothgrad",
            nt_samples=c.method.n_samples,
            nt_samples_batch_size=c.method.batch_size,
            stdevs=float(sigma),
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
        used={"n_samples": c.method.n_samples, "stdevs": c.method.stdevs, "seed": c.method.seed},
    )


def occlusion(c: Call[Occlusion]) -> MethodResult:
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
        row = Row.of(a, i)  # alone: its perturbations are evaluated in the chunks of the sample alone
        m = mask if a.image else row.cut(mask[i : i + 1])  # images: one mask for all
        return row.back(
            ablation.attribute(
                row.x,
                baselines=row.cut(ref[i : i + 1]),
                target=target[i : i + 1],
                additional_forward_args=row.args,
                feature_mask=m,
                perturbations_per_eval=c.method.batch_size,
            )
        )

    attr = _per_sample(c, a, one)
    return _result(c, a, attr, target, logits, per_feature=True, used={"baseline": c.method.baseline})


def kernel_shap(c: Call[KernelShap]) -> MethodResult:
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
        row = Row.of(a, i)
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
                n_samples=c.method.n_samples,
                perturbations_per_eval=c.method.batch_size,
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
        used={"baseline": c.method.baseline, "n_samples": c.method.n_samples, "seed": c.method.seed},
    )


def _whole_input_value(forward: Callable[..., Tensor], row: Row, ref: Tensor, target: Tensor) -> Tensor:
    """``y_t(x) − y_t(reference)`` of one (cut) row, on every element of its input (1, ...)."""
    with torch.no_grad():
        x = row.x.detach()
        drop = forward(x, *row.args)[0, target] - forward(ref, *row.args)[0, target]
    return torch.full_like(x, float(drop))


#: The methods of this module, in the order of the registry.
CAPTUM_METHODS: tuple[str, ...] = ("input_x_gradient", "integrated_gradients", "smoothgrad", "occlusion", "kernel_shap")

__all__ = [
    "input_x_gradient",
    "integrated_gradients",
    "smoothgrad",
    "occlusion",
    "kernel_shap",
    "CAPTUM_METHODS",
]
