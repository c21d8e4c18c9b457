"""Embedding readouts: ``target=Projection(v)`` explains ``⟨e(x), v⟩``, ``target=Similarity(e_ref)`` explains
``cos(e(x), e_ref)`` (docs/METHODS.md §2h).

``e(x)`` is the model's own pooled embedding: a headless model's readout (a bare ``BertModel``'s pooler output,
or its [CLS] token where it has no pooler; a ``SentenceTransformer``'s Pooling and Normalize), or another pooling
named by ``pooling=``: ``"cls"`` (token 0 after the final norm), ``"mean"`` (the normalised sum over the
non-padding tokens; images: over the patch tokens), ``"pooler"`` (the model's pooler on [CLS]).

One mechanism for every adapter: a target turns the adapter into :func:`with_target`'s copy whose batch readout
is :class:`EmbeddingReadout` — the embedding readout, then (Similarity, or a Normalize module) ``e / ‖e‖`` with the
norm a constant (detached, as LayerNorm's std, so relevance is conserved into ``e``; plain gradients see the true
normalisation), then a LINEAR by the constant vectors ``V`` (K, D) without bias. The logits are ``(B, K)``: ``K = 1``
for one vector, ``K = B`` for one per row (row b explains column b). The end-to-end check holds them against
the model's own embedding (:meth:`~lrp_core.adapters.base.Adapter.own_embedding`) times ``V``.

Models with a classification head: the target applies to the input of the head's last Linear (the pooled
embedding the classifier reads, as for concept targets) when ``pooling`` is ``None``; ``"cls"`` / ``"mean"``
read the final hidden states. Shapes: B batch, N tokens, D embedding width, K vectors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import Tensor, nn

from ..errors import InputError
from ..rules.ops import LINEAR
from ..rules.views import check_output
from .readouts import HeadLayer, MaskedMeanReadout, MeanReadout, Readout, TokenReadout
from .records import ReadoutRecord
from .replay import NO_RECORD, Replay

if TYPE_CHECKING:
    from .base import Adapter

#: the poolings ``Projection`` / ``Similarity`` accept (``None``: the model's own)
POOLINGS = (None, "cls", "mean", "pooler")


class EmbeddingTarget:
    """A readout passed as the target: the explained output is linear in the pooled embedding ``e`` (D,)."""

    #: ``e / ‖e‖`` (norm detached) before the projection
    normalise: bool = False

    def __init__(self, vectors: Any, pooling: Optional[str] = None, name: str = "v"):
        v = torch.as_tensor(vectors)
        if not v.is_floating_point() or v.dim() not in (1, 2) or v.shape[-1] == 0:
            raise InputError(f"{name} must be a float vector (D,) or one per row (B, D); got {_shape(vectors)}")
        if not torch.isfinite(v).all():
            raise InputError(f"{name} has entries that are not finite")
        if pooling not in POOLINGS:
            raise InputError(f"pooling={pooling!r} is not one of {POOLINGS}")
        self.vectors: Tensor = v.detach()
        self.pooling = pooling

    @property
    def width(self) -> int:
        """D, the embedding width the vectors expect."""
        return int(self.vectors.shape[-1])

    def matrix(self) -> Tensor:
        """(K, D) the rows of the projection (K = 1 for one vector)."""
        return self.vectors.reshape(-1, self.width)

    def class_ids(self, batch: int) -> list[int]:
        """The column of the logits each row explains: 0 for one vector, b for one vector per row."""
        k = self.matrix().shape[0]
        if self.vectors.dim() == 1:
            return [0] * batch
        if k != batch:
            raise InputError(f"{k} vectors for a batch of {batch}: give one vector (D,) or one per row ({batch}, D)")
        return list(range(batch))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({tuple(self.vectors.shape)}, pooling={self.pooling!r})"


def _shape(x: Any) -> str:
    shape = getattr(x, "shape", None)
    return f"{type(x).__name__} of shape {tuple(shape)}" if shape is not None else type(x).__name__


class Projection(EmbeddingTarget):
    """``target=Projection(v)``: explain ``⟨e(x), v⟩``, ``v`` (D,) for every row or (B, D) one per row.

    ``pooling``: ``None`` (the model's own embedding), ``"cls"``, ``"mean"`` or ``"pooler"``."""

    def __init__(self, v: Any, pooling: Optional[str] = None):
        super().__init__(v, pooling, "v")


class Similarity(EmbeddingTarget):
    """``target=Similarity(e_ref)``: explain ``cos(e(x), e_ref)`` with ``e_ref`` (D,) or (B, D) fixed and
    ``1/‖e(x)‖`` a constant (so relevance is conserved into ``e``); ``pooling`` as for :class:`Projection`."""

    normalise = True

    def __init__(self, e_ref: Any, pooling: Optional[str] = None):
        super().__init__(e_ref, pooling, "e_ref")
        if bool((super().matrix().norm(dim=-1) == 0).any()):
            raise InputError("e_ref has a zero vector: the cosine with it is not defined")

    def matrix(self) -> Tensor:
        """(K, D) the reference embeddings, each of unit length."""
        m = super().matrix()
        return m / m.norm(dim=-1, keepdim=True)


def unit(e: Tensor, r: Replay = NO_RECORD) -> Tensor:
    """``e / ‖e‖`` (B, D): the norm is a constant in a rule pass (explicit: relevance passes unchanged; modified
    gradient: its gradient with the norm detached); the plain replay normalises as ``F.normalize`` does."""
    if r.composite is None:
        return torch.nn.functional.normalize(e, dim=-1)
    return r.transparent(lambda x: x / x.norm(dim=-1, keepdim=True).clamp(min=1e-12).detach(), e)


class EmbeddingReadout(Readout):
    """The embedding readout ``inner`` (its head ends at ``e``), then ``e/‖e‖`` where ``normalise``, then the
    bias-free Linear ``project`` (K outputs): logits (B, K). Token weights, pooling and removal are ``inner``'s."""

    def __init__(self, inner: Readout, project: nn.Linear, normalise: bool):
        self.inner, self.project, self.normalise = inner, project, normalise
        self.norm = inner.norm
        self.head_layers = list(inner.head_layers) + [HeadLayer(LINEAR, project)]

    @property
    def tokens(self) -> tuple:
        return self.inner.tokens

    @property
    def positions(self) -> Optional[Tensor]:
        return self.inner.positions

    def pool(self, normed: Tensor) -> Tensor:
        return self.inner.pool(normed)

    def pool_replay(self, normed: Tensor, r: Replay) -> Tensor:
        return self.inner.pool_replay(normed, r)

    def weights(self, num_tokens: int) -> Tensor:
        return self.inner.weights(num_tokens)

    def row(self, M: Tensor) -> Tensor:
        return self.inner.row(M)

    def after_removal(self, rows: Tensor, removed: Tensor) -> "EmbeddingReadout":
        return EmbeddingReadout(self.inner.after_removal(rows, removed), self.project, self.normalise)

    def forward(self, hidden: Tensor, r: Replay = NO_RECORD) -> ReadoutRecord:
        rec = self.inner.forward(hidden, r)
        if rec.logits.shape[-1] != self.project.in_features:
            raise InputError(
                f"the target's vectors have width {self.project.in_features}, the model's embedding "
                f"{rec.logits.shape[-1]}"
            )
        e = unit(rec.logits, r) if self.normalise else rec.logits
        logits = r.module(LINEAR, self.project, e, reuse=False)
        if r.explicit:
            check_output(self.project, e, logits)
        return ReadoutRecord(hidden=hidden, token=rec.token, inputs=list(rec.inputs) + [e], pooled=e, logits=logits)


def projection_layer(V: Tensor, like: Tensor) -> nn.Linear:
    """A bias-free Linear (D -> K) whose weight is ``V`` (K, D), on ``like``'s device and dtype, without gradient."""
    lin = nn.Linear(V.shape[1], V.shape[0], bias=False, device=like.device, dtype=like.dtype)
    with torch.no_grad():
        lin.weight.copy_(V.to(device=like.device, dtype=like.dtype))
    lin.weight.requires_grad_(False)
    return lin


# ------------------------------------------------------------------ the pooled embedding of a batch
def embedding_readout(adapter: "Adapter", head: Readout, prepared: Any, pooling: Optional[str]) -> Readout:
    """The readout whose output is ``e`` (B, D) for ``pooling``: ``head`` is the family's readout of the batch.

    ``None``: the model's own embedding (a headless model's readout; a SentenceTransformer's Pooling mode);
    ``"cls"``: token 0 after the final norm; ``"mean"``: the masked mean over real tokens (images: the patches);
    ``"pooler"``: the adapter's :attr:`~lrp_core.adapters.base.Adapter.pooler_layers` on [CLS]."""
    pooling = pooling or adapter.sentence_pooling
    if pooling is None:
        if head.num_classes:
            raise InputError(
                f"{type(adapter.model).__name__} has a classification head: Projection / Similarity explain an "
                "embedding, so name the pooled one (pooling='cls', 'mean' or 'pooler'), or load the base model"
            )
        return head
    if pooling == "cls":
        return TokenReadout(head.norm, [], 0)
    if pooling == "pooler":
        layers = list(adapter.pooler_layers)
        if not layers:
            raise InputError(f"{type(adapter.model).__name__} has no pooler: use pooling='cls' or 'mean'")
        return TokenReadout(head.norm, layers, 0)
    mask = getattr(prepared, "attention_mask", None)
    if mask is not None:
        return MaskedMeanReadout(head.norm, [], mask)
    return MeanReadout(head.norm, [], adapter.layout(prepared).output_start)


def own_embedding(adapter: "Adapter", prepared: Any, pooling: Optional[str]) -> Tensor:
    """(B, D) the model's own embedding for ``pooling``: a SentenceTransformer's ``sentence_embedding``; else from
    a Hugging Face model's output (its base model's for a classifier): ``pooler_output`` where it has one
    (``None``, ``"pooler"``), else the first token of ``last_hidden_state``; ``"mean"``: its masked mean (images:
    over the patches)."""
    inputs = adapter.own_inputs(prepared)
    if adapter.sentence is not None and pooling is None:
        return adapter.sentence(dict(inputs))["sentence_embedding"]
    pooling = pooling or adapter.sentence_pooling
    model = adapter.model
    if pooling is None and not hasattr(model, "config") and isinstance(inputs.get("pixel_values"), Tensor):
        return model(inputs["pixel_values"])  # timm without a head (num_classes=0): its pooled features
    base: Any = getattr(model, "base_model", None) or model
    out = base(**inputs)
    hidden = out.last_hidden_state
    pooled = getattr(out, "pooler_output", None)
    if pooling in (None, "pooler") and pooled is not None:
        return pooled
    if pooling == "mean":
        mask = getattr(prepared, "attention_mask", None)
        if mask is None:
            return hidden[:, adapter.layout(prepared).output_start :].mean(dim=1)
        m = mask.to(hidden)[..., None]  # its dtype, and its device (a split model: where the last block is)
        return (hidden * m).sum(dim=1) / m.sum(dim=1)
    return hidden[:, 0]


class Basis(EmbeddingTarget):
    """The unit vectors ``e_k`` for ``k`` in ``dims`` (BiLRP): rows come in groups of ``len(dims)``, row ``i``
    explains ``e(x)_{dims[i mod K]}`` (after the pipeline's own Normalize where it has one; ``normalise``: of
    ``e/‖e‖``, the norm a constant)."""

    def __init__(self, width: int, dims: range, pooling: Optional[str] = None, normalise: bool = False):
        super().__init__(torch.eye(width, dtype=torch.float64)[list(dims)], pooling, "basis")
        self.normalise = normalise  # ⟨e/‖e‖, e_k⟩: the unit embedding's coordinates

    def class_ids(self, batch: int) -> list[int]:
        k = self.matrix().shape[0]
        return [i % k for i in range(batch)]


def embedding_width(adapter: "Adapter", prepared: Any, pooling: Optional[str]) -> int:
    """D, the width of the embedding ``pooling`` reads: one replayed row, without gradients."""
    one = prepared.take(torch.arange(1))
    with torch.no_grad():
        head = adapter.embedding_readout(adapter.readout_for(one), one, pooling)
        return int(adapter.forward(one, readout=head).logits.shape[-1])


# ------------------------------------------------------------------ the adapter that reads a target
class _Targeted:
    """Placed before the family's adapter class: the batch readout and the own output of an embedding target."""

    target: EmbeddingTarget
    model: Any

    def readout_for(self, prepared: Any) -> Readout:
        head = super().readout_for(prepared)  # type: ignore[misc]
        inner = self.embedding_readout(head, prepared, self.target.pooling)  # type: ignore[attr-defined]
        like = _parameter(self.model)
        return EmbeddingReadout(inner, projection_layer(self.target.matrix(), like), self._normalises())

    def _normalises(self) -> bool:
        """Similarity; or the pipeline's own Normalize does it (without one of its own: Projection is ⟨e, v⟩)."""
        return self.target.normalise or (self.target.pooling is None and bool(getattr(self, "normalised", False)))

    @property
    def num_classes(self) -> int:
        return int(self.target.matrix().shape[0])

    def own_output(self, prepared: Any) -> Tensor:
        e = self.own_embedding(prepared, self.target.pooling)  # type: ignore[attr-defined]
        if self.target.normalise:
            e = torch.nn.functional.normalize(e, dim=-1)
        return e @ self.target.matrix().to(device=e.device, dtype=e.dtype).T


def _parameter(model: nn.Module) -> Tensor:
    """A floating parameter of the model (its device and dtype are the projection's)."""
    for p in model.parameters():
        if p.is_floating_point():
            return p
    return torch.zeros(())


_CLASSES: dict = {}


def with_target(adapter: "Adapter", target: EmbeddingTarget) -> "Adapter":
    """A shallow copy of ``adapter`` that reads ``target``: its readout ends in ``target``'s projection and its own
    output is the model's embedding times the same vectors. The adapter given is not changed."""
    if adapter.is_decoder or adapter.is_vlm:
        raise InputError(
            f"{type(adapter.model).__name__}: Projection / Similarity explain an encoder's embedding, not a decoder's"
        )
    cls = type(adapter)
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Targeted{cls.__name__}", (_Targeted, cls), {})
    out = object.__new__(_CLASSES[cls])  # a shallow copy: the same attributes, the targeted class
    out.__dict__.update(adapter.__dict__)
    out.target = target
    return out


__all__ = [
    "POOLINGS",
    "EmbeddingTarget",
    "Projection",
    "Similarity",
    "Basis",
    "embedding_width",
    "EmbeddingReadout",
    "embedding_readout",
    "own_embedding",
    "unit",
    "with_target",
]
