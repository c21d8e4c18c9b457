"""BiLRP: which pairs of tokens make two inputs similar (Eberle et al., *Building and Interpreting Deep Similarity
Models*, TPAMI 2022; docs/METHODS.md §2h).

For an embedding model ``e(x)`` (D,) the similarity ``⟨e(a), e(b)⟩`` is a sum over the D dimensions of a product
of two first-order quantities. With ``M(x; e_k)`` (T,) the token map of ``Projection(one-hot k)`` (what
``explain(model, x, target=Projection(e_k))`` gives),

    R_ij = Σ_k M_i(a; e_k) · M_j(b; e_k)            (T_a, T_b) per pair,

so ``Σ_ij R_ij = Σ_k (Σ_i M_i(a; e_k)) (Σ_j M_j(b; e_k)) = ⟨e(a), e(b)⟩`` wherever ``M`` conserves (CP-LRP on a
model without additive constants: exactly; with biases their share is absorbed). For a SentenceTransformer that
ends in Normalize, and with ``normalise=True``, ``e`` is the unit embedding (its norm a constant, as for
``Similarity``) and the sum is the cosine similarity.

The D maps of a side are one :func:`~lrp_core.explain` call per group of ``dims_per_call`` dimensions: the batch is
repeated once per dimension in the group and row ``(b, k)`` explains ``e_k(x_b)`` — one modified backward per
dimension, batched (the call's ``max_memory`` cuts it further where needed). Padding rows and columns score 0.

Methods: the first-order maps that conserve or are linear in the start relevance — ``cp_lrp`` (default),
``attnlrp``, ``lrp``, ``input_x_gradient`` (:data:`BILRP_METHODS`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import torch
from torch import Tensor, nn

from .adapters import Basis, embedding_width, get_adapter
from .api import explain
from .errors import InputError
from .methods import registry
from .methods.registry import MethodLike
from .runtime.utils import progress_bar

#: the methods whose maps BiLRP multiplies (first-order maps, linear in the relevance they start from)
BILRP_METHODS = ("cp_lrp", "attnlrp", "lrp", "input_x_gradient")


@dataclass
class SimilarityExplanation:
    """What :func:`bilrp` returns.

    Attributes:
        scores: (B, T_a, T_b) ``R_ij``, the relevance of token pair (i of a, j of b); padding rows / columns 0.
        maps_a, maps_b: (B, D, T) the first-order maps ``M(x; e_k)`` of each side.
        embeddings_a, embeddings_b: (B, D) ``e(a)``, ``e(b)`` as the replay computed them.
        similarity: (B,) ``⟨e(a), e(b)⟩`` (the cosine where the embedding is normalised).
        conservation: (B,) ``Σ_ij R_ij − similarity`` (0 where the maps conserve).
        mask_a, mask_b: (B, T) 1 = real token (text), else ``None``.
        method: the method's name; seconds: the wall time of the two sides; calls: ``explain`` calls made.
    """

    scores: Tensor
    maps_a: Tensor
    maps_b: Tensor
    embeddings_a: Tensor
    embeddings_b: Tensor
    similarity: Tensor
    conservation: Tensor
    mask_a: Optional[Tensor]
    mask_b: Optional[Tensor]
    method: str
    seconds: float = 0.0
    calls: int = 0
    options: dict = field(default_factory=dict)

    def pair(self, b: int = 0) -> Tensor:
        """(n_a, n_b) the interaction map of pair ``b`` on its real tokens (padding cut)."""
        s = self.scores[b]
        na = int(self.mask_a[b].sum()) if self.mask_a is not None else s.shape[0]
        nb = int(self.mask_b[b].sum()) if self.mask_b is not None else s.shape[1]
        return s[:na, :nb]


def _repeat(inputs: Any, k: int) -> Any:
    """Each sample repeated ``k`` times in a row (rows b·k … b·k + k − 1 are sample b)."""
    if isinstance(inputs, Tensor):
        return inputs.repeat_interleave(k, dim=0)
    if isinstance(inputs, Mapping):
        return {n: v.repeat_interleave(k, dim=0) if isinstance(v, Tensor) and v.dim() else v for n, v in inputs.items()}
    raise InputError(f"bilrp takes images (B, 3, H, W) or a tokenizer output (a mapping); got {type(inputs).__name__}")


def _side(
    model: nn.Module,
    x: Any,
    width: int,
    step: int,
    method: MethodLike,
    pooling: Optional[str],
    normalise: bool,
    progress: bool,
    label: str,
    options: dict,
) -> tuple[Tensor, Tensor, Optional[Tensor], int]:
    """(maps (B, D, T), embedding (B, D), mask (B, T) or None, calls) of one side."""
    maps, embedding, mask, calls = [], [], None, 0
    groups = [range(k0, min(k0 + step, width)) for k0 in range(0, width, step)]
    for dims in progress_bar(groups, progress, desc=f"bilrp {label}", unit="call", leave=False):
        target = Basis(width, dims, pooling, normalise)
        exp = explain(model, _repeat(x, len(dims)), method=method, target=target, **options)
        calls += 1
        B = exp.scores.shape[0] // len(dims)
        maps.append(exp.scores.detach().reshape(B, len(dims), -1))
        rows = torch.arange(exp.scores.shape[0])
        embedding.append(exp.logits.detach()[rows, rows % len(dims)].reshape(B, len(dims)))
        if exp.attention_mask is not None:
            mask = exp.attention_mask[:: len(dims)]
    return torch.cat(maps, dim=1), torch.cat(embedding, dim=1), mask, calls


def bilrp(
    model: nn.Module,
    a: Any,
    b: Any,
    method: MethodLike = "cp_lrp",
    *,
    pooling: Optional[str] = None,
    normalise: bool = False,
    dims_per_call: int = 64,
    progress: Optional[bool] = None,
    **options: Any,
) -> SimilarityExplanation:
    """The BiLRP interaction map of each pair (a_b, b_b): ``R_ij = Σ_k M_i(a; e_k) M_j(b; e_k)``.

    Parameters
    ----------
    model : nn.Module
        An embedding model explained with ``Projection`` targets (a base model, a SentenceTransformer, a ViTModel).
    a, b : Tensor or Mapping[str, Tensor]
        The two sides, B pairs: images (B, 3, H, W) or tokenizer outputs (B, T_a) and (B, T_b).
    method : str or Method
        One of :data:`BILRP_METHODS` (default ``cp_lrp``), by name or as an object.
    pooling : str, optional
        The embedding (``None``: the model's own; ``"cls"``, ``"mean"``, ``"pooler"``).
    normalise : bool
        Explain the unit embedding ``e/‖e‖`` (the norm a constant): ``Σ R`` is then the cosine similarity. A
        SentenceTransformer ending in Normalize is normalised anyway.
    dims_per_call : int
        Embedding dimensions explained per :func:`~lrp_core.explain` call (the batch is repeated that often).
    progress : bool, optional
        A progress bar over the calls; default: shown when a side takes more than one call.
    **options
        Passed to :func:`~lrp_core.explain` (``dtype=``, ``max_memory=``, ``unverified=``, ...).

    Returns
    -------
    SimilarityExplanation
        ``scores`` (B, T_a, T_b), the maps of both sides, the embeddings, ``similarity`` and ``conservation``.
    """
    name = registry.name_of(method)
    if name not in BILRP_METHODS:
        raise InputError(f"bilrp multiplies first-order maps: method must be one of {BILRP_METHODS}, not {name!r}")
    if not (isinstance(dims_per_call, int) and dims_per_call >= 1):
        raise InputError(f"dims_per_call must be an int ≥ 1; got {dims_per_call!r}")
    if "target" in options:
        raise InputError("bilrp explains every embedding dimension: it takes no target")
    adapter = get_adapter(model)
    width = embedding_width(adapter, adapter.check_inputs(a), pooling)
    show = progress if progress is not None else width > dims_per_call
    start = time.perf_counter()
    Ma, ea, mask_a, na = _side(model, a, width, dims_per_call, method, pooling, normalise, show, "a", options)
    Mb, eb, mask_b, nb = _side(model, b, width, dims_per_call, method, pooling, normalise, show, "b", options)
    if Ma.shape[0] != Mb.shape[0]:
        raise InputError(f"a has {Ma.shape[0]} samples, b {Mb.shape[0]}: bilrp explains pairs (the same B)")
    seconds = time.perf_counter() - start
    R = torch.einsum("bki,bkj->bij", Ma, Mb)
    sim = (ea * eb).sum(dim=-1)
    return SimilarityExplanation(
        scores=R,
        maps_a=Ma,
        maps_b=Mb,
        embeddings_a=ea,
        embeddings_b=eb,
        similarity=sim,
        conservation=R.sum(dim=(1, 2)) - sim,
        mask_a=mask_a,
        mask_b=mask_b,
        method=name,
        seconds=seconds,
        calls=na + nb,
        options={"pooling": pooling, "normalise": normalise, "dims_per_call": dims_per_call},
    )


__all__ = ["BILRP_METHODS", "SimilarityExplanation", "bilrp"]
