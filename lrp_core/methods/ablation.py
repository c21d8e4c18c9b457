"""Ablation methods on sources (docs/METHODS.md §2s): what the output loses when sources of the context go.

Both take the sources of ``explain(..., sources=spans)`` (token spans of the context) and score each one:

* ``leave_one_out``: ``y(full) − y(without source s)``, one forward pass per source;
* ``context_cite`` (Cohen-Wang et al., "ContextCite: Attributing Model Generation to Context", NeurIPS 2024):
  ``n_ablations`` random masks over the S sources (each source kept with probability ``keep_prob``, drawn
  from ``seed``, the same masks for every row), ``y`` recorded for each, and a Lasso fit
  ``y ≈ b + Σ_s β_s m_s`` as the authors' ``LassoRegression`` fits it (the masks standardised, penalty
  ``alpha``, the weights rescaled to mask units); ``β`` is the source score.

Removing a source deletes its tokens: they leave the attention mask and the position ids of the later tokens
follow (the row as if the tokens had never been written); ``filler=<token id>`` replaces them instead
(positions unchanged). The ablated rows are replayed batched, ``batch_size`` sequences per forward pass.
``scores`` (B, T) spreads each source's score evenly over its tokens, so the sum over a span is its score
(where sources do not overlap). ``Explanation.options["forward_passes"]`` is the cost per row.

Shapes: B batch, T tokens, S sources, M ablated copies of a row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from ..adapters.batches import DecoderBatch
from ..errors import InputError, UnsupportedModelError
from ..runtime.extras import require
from ..runtime.utils import progress_bar
from ..sources import membership
from .call import Call, MethodResult

if TYPE_CHECKING:
    from .objects import ContextCite


def _sources_of(c: Call, name: str) -> Tensor:
    """The call's source columns (B, S, 2); a decoder LM only (an encoder has no prefix to remove from)."""
    if not getattr(c.adapter, "is_decoder", False):
        raise UnsupportedModelError(
            f"{name} removes sources from the context of a decoder language model's "
            f"prediction; {type(c.adapter.model).__name__} is not one"
        )
    if c.shared.sources is None:
        raise InputError(
            f"{name} scores sources: give them with sources=[(start, end), ...] (token spans of the "
            "context; lrp_core.sources.sentences / documents find them in a text)"
        )
    return c.shared.sources


def ablated_outputs(c: Call, target: Tensor, drop: Tensor) -> Tensor:
    """(B, M) the explained output of each row with the tokens ``drop`` (B, M, T) bool ablated.

    Removal (``filler=None``): the tokens leave the attention mask and every later token's position id is
    lowered by the number of removed tokens before it. Replacement: the tokens' ids become ``filler``.
    The read position stays (a source never covers it).

    Parameters
    ----------
    c : Call
        The method call (adapter, a decoder batch, options with ``filler``).
    target : Tensor
        (B,) the explained class (token) per row.
    drop : Tensor
        (B, M, T) bool, the tokens removed in each of M ablations per row.

    Returns
    -------
    Tensor
        (B, M) the explained output of every ablated copy.

    Raises
    ------
    InputError
        If ``filler`` is not a token id of the model.
    """
    a, p, opt = c.adapter, decoder_batch(c), c.method
    ids, mask, pos, read = p.input_ids, p.attention_mask, p.position_ids, p.read_at
    B, M, T = drop.shape
    dev = ids.device
    rows = torch.arange(B, device=dev).repeat_interleave(M)
    flat = drop.reshape(B * M, T).to(dev)
    out = torch.empty(B * M, dtype=torch.float64)
    vocab = getattr(a, "vocab_size", None)  # a decoder adapter's (the source methods run on decoders only)
    if opt.filler is None and not getattr(a, "removes_tokens", True):
        raise InputError(
            f"{type(a.model).__name__}: removing a source's tokens would shift its multi-axis position "
            "ids, which the replay does not describe; give filler=<a token id> to replace the tokens "
            "instead"
        )
    if opt.filler is not None and vocab is not None and opt.filler >= vocab:
        raise InputError(f"filler={opt.filler} is not a token id of the model (0 … {vocab - 1})")
    chunks = torch.arange(B * M, device=dev).split(opt.batch_size)
    for chunk in progress_bar(chunks, bool(c.shared.progress), desc="ablations", unit="batch", leave=False):
        b, d = rows[chunk], flat[chunk]
        rest = p.take(b)  # every per-row field (a VLM's images and token types too), then the ablated text
        if opt.filler is None:
            m = mask[b] * (~d).to(mask.dtype)
            ps = (pos[b] - (d & (mask[b] != 0)).long().cumsum(-1)).clamp(min=0)
            sub = rest.replace(input_ids=ids[b], attention_mask=m, position_ids=ps, read_at=read[b])
        else:
            sub = rest.replace(input_ids=ids[b].masked_fill(d, opt.filler))
        out[chunk.cpu()] = c.output(logits_only(c, sub), target[b], rows=b).detach().double().cpu()
    return out.reshape(B, M)


def decoder_batch(c: Call) -> DecoderBatch:
    """The call's batch, which the source methods (decoders only) read as a :class:`DecoderBatch`."""
    assert isinstance(c.prepared, DecoderBatch), "the source methods run on decoder language models only"
    return c.prepared


def logits_only(c: Call, prepared: DecoderBatch) -> Tensor:
    """(B, C) the logits of a replay of ``prepared`` that keeps no block record.

    Each block's record is dropped once the next block has its output, so the pass holds one block's activations
    at a time (a full trace of a long context holds an H·N² map per block).

    Parameters
    ----------
    c : Call
        The method call (its adapter).
    prepared : DecoderBatch
        A decoder batch.

    Returns
    -------
    Tensor
        (B, C) the logits at each row's read position.
    """
    a = c.adapter
    x0 = a.embed(prepared).x0
    return a.run_blocks(
        x0, prepared.attention_mask, keep=False, readout=a.readout_for(prepared), positions=prepared.position_ids
    ).logits


def _spread(scores: Tensor, inside: Tensor) -> Tensor:
    """(B, T) token scores: each source's score (B, S) divided evenly over its tokens (``inside`` (B, S, T))."""
    size = inside.sum(-1).clamp(min=1)
    return torch.einsum("bs,bst->bt", scores / size, inside)


def _result(c: Call, trace_logits: Tensor, target: Tensor, scores: Tensor, inside: Tensor, passes: int) -> MethodResult:
    dtype = trace_logits.dtype
    src = scores.to(dtype)
    return MethodResult(
        scores=_spread(src, inside.to(dtype)),
        target=target,
        logits=trace_logits,
        sources=src,
        used={"forward_passes": passes},
    )


def leave_one_out(c: Call) -> MethodResult:
    """``y(full) − y(without source s)`` per source (B, S): one forward pass per source, batched.

    Parameters
    ----------
    c : Call
        The method call; its options name the sources.

    Returns
    -------
    MethodResult
        The result: ``sources`` (B, S) the differences, ``scores`` (B, T) spread over
        the sources' tokens, the target and the logits.
    """
    cols = _sources_of(c, "leave_one_out")
    with torch.no_grad():
        logits = logits_only(c, decoder_batch(c))
        target = c.resolve(logits)
        full = c.output(logits, target).detach().double().cpu()
        inside = membership(cols, decoder_batch(c).input_ids.shape[1], torch.float64).cpu()  # (B, S, T)
        without = ablated_outputs(c, target, inside.bool())
    return _result(c, logits, target, full[:, None] - without, inside, cols.shape[1] + 1)


def ablation_masks(S: int, n: int, keep_prob: float, seed: int) -> Tensor:
    """(n, S) bool: which sources each of the ``n`` ablations keeps.

    Each source is kept with probability ``keep_prob``, drawn from ``seed`` (CPU generator: the same masks
    on every device).

    Parameters
    ----------
    S : int
        Number of sources.
    n : int
        Number of ablations.
    keep_prob : float
        Probability that an ablation keeps a source.
    seed : int
        Seed of the CPU generator.

    Returns
    -------
    Tensor
        (n, S) bool, ``True`` = kept.
    """
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, S, generator=g, dtype=torch.float64) < keep_prob


def fit_surrogate(masks: np.ndarray, y: np.ndarray, alpha: float) -> tuple[np.ndarray, float]:
    """The linear surrogate ``y ≈ b + masks @ β`` of ContextCite: ``(β (S,), b)``.

    The masks (n, S) are standardised (mean 0, standard deviation 1 per source over the n ablations; a source
    kept or removed in every mask keeps scale 1 and gets weight 0), a Lasso with intercept and penalty
    ``alpha`` is fitted (scikit-learn: ``(1/2n)‖y − b − Zw‖² + alpha·‖w‖₁``), and ``β = w / scale``,
    ``b`` moved back to mask units. ``alpha = 0``: ordinary least squares (no scikit-learn needed).

    Parameters
    ----------
    masks : np.ndarray
        (n, S) 0/1.
    y : np.ndarray
        (n,) the output of each ablation.
    alpha : float
        The Lasso penalty (>= 0).

    Returns
    -------
    tuple[np.ndarray, float]
        ``(β, b)``: β (S,) the weights and b the intercept, in mask units.
    """
    X = masks.astype(np.float64)
    mean, scale = X.mean(0), X.std(0)
    scale = np.where(scale > 0, scale, 1.0)
    Z = (X - mean) / scale
    if alpha == 0:
        design = np.concatenate([np.ones((len(Z), 1)), Z], axis=1)
        sol = np.linalg.lstsq(design, y, rcond=None)[0]
        w, b0 = sol[1:], float(sol[0])
    else:
        linear_model = require("sklearn.linear_model", "sources", "context_cite")
        lasso = linear_model.Lasso(alpha=alpha, fit_intercept=True, random_state=0)
        lasso.fit(Z, y)
        w, b0 = np.asarray(lasso.coef_, dtype=np.float64), float(lasso.intercept_)
    beta = w / scale
    return beta, b0 - float((mean / scale) @ w)


def context_cite(c: Call[ContextCite]) -> MethodResult:
    """ContextCite's surrogate weights per source (B, S): ``n_ablations`` seeded masks, a Lasso fit per row.

    Parameters
    ----------
    c : Call
        The method call; its options give the sources, ``n_ablations``,
        ``keep_prob``, ``seed`` and the Lasso penalty ``alpha``.

    Returns
    -------
    MethodResult
        The result: ``sources`` (B, S) the surrogate weights, ``scores`` (B, T)
        spread over the sources' tokens, the target and the logits.
    """
    cols = _sources_of(c, "context_cite")
    opt = c.method
    if opt.alpha > 0:  # a missing scikit-learn is said before any pass runs
        require("sklearn.linear_model", "sources", "context_cite")
    with torch.no_grad():
        logits = logits_only(c, decoder_batch(c))
        target = c.resolve(logits)
        inside = membership(cols, decoder_batch(c).input_ids.shape[1], torch.float64).cpu()  # (B, S, T)
        keep = ablation_masks(cols.shape[1], opt.n_ablations, opt.keep_prob, opt.seed)  # (M, S)
        # a token goes when a source that holds it goes
        drop = torch.einsum("ms,bst->bmt", (~keep).double(), inside) > 0
        y = ablated_outputs(c, target, drop).numpy()
    beta = np.stack([fit_surrogate(keep.numpy(), row, opt.alpha)[0] for row in y])
    return _result(c, logits, target, torch.from_numpy(beta), inside, opt.n_ablations + 1)


__all__ = ["leave_one_out", "context_cite", "ablated_outputs", "ablation_masks", "fit_surrogate"]
