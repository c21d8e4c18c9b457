"""An attention's heads and scale as its module computes them (docs/METHODS.md §4, "Part by part").

The replay reads the number of heads, their width and the score scale of an attention from the module the user
has, not from the model's config: a model whose heads were pruned (``prune_heads``: narrower q / k / v and
output projections, the config unchanged), whose ``scaling`` was changed, or whose head width is not
``hidden / heads`` is read as its forward computes it — or refused, naming the module, where its projections
cannot be split into heads at all.

* Hugging Face encoders (BERT, RoBERTa, ELECTRA, ALBERT, DistilBERT, MPNet, ViT, DeiT, DINOv2, …): the forward
  splits each projection into heads of the module's ``attention_head_size`` / ``head_dim`` (``view(…, -1, d)``),
  so the heads are ``q.out_features // d``; the scores are scaled by the module's ``scaling`` where it has one
  (transformers 5), else by ``d^-½`` (transformers 4's ``/ √d``).
* timm (``Attention``, EVA, Swin): the fused path (``fused_attn``, torch's sdpa without ``scale``) scales by
  ``d^-½`` whatever ``attn.scale`` says; the explicit path by ``attn.scale``.
"""

from __future__ import annotations

from typing import Optional

from ..errors import UnsupportedModelError
from .parts import ModelPart

#: the attribute names a Hugging Face attention gives its head width, in the order they are looked for
HEAD_WIDTH_NAMES = ("attention_head_size", "head_dim", "head_size", "dim_per_head")


def out_features(module: ModelPart) -> Optional[int]:
    """The output width of a Linear-like projection (``out_features``, else its weight's rows); ``None``: unknown."""
    n = getattr(module, "out_features", None)
    if isinstance(n, int):
        return n
    weight = getattr(module, "weight", None)
    shape = getattr(weight, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) == 2 else None


def in_features(module: ModelPart) -> Optional[int]:
    """The input width of a Linear-like projection (``in_features``, else its weight's columns); ``None``: unknown."""
    n = getattr(module, "in_features", None)
    if isinstance(n, int):
        return n
    weight = getattr(module, "weight", None)
    shape = getattr(weight, "shape", None)
    return int(shape[1]) if shape is not None and len(shape) == 2 else None


def hf_heads(
    att: ModelPart, q: ModelPart, k: ModelPart, v: ModelPart, proj: ModelPart, where: str, head_dim: int
) -> tuple[int, int, float]:
    """(heads, head width, scale) of a Hugging Face encoder attention, as its forward computes them.

    Parameters
    ----------
    att : nn.Module
        The module whose forward splits the heads (it holds ``attention_head_size`` / ``head_dim`` and, in
        transformers 5, ``scaling``).
    q, k, v, proj : nn.Module
        Its query, key, value and output projections.
    where : str
        The layer, for the message.
    head_dim : int
        The head width the config implies, where the module names none.

    Returns
    -------
    tuple
        ``(H, d, scale)``: ``H = q.out_features // d``, ``d`` the module's head width, ``scale`` its
        ``scaling`` (``d^-½`` where it has none).

    Raises
    ------
    UnsupportedModelError
        When the projections' widths do not split into heads of width ``d`` (or disagree with each other, or
        with the output projection's input).
    """
    d = next((int(w) for w in (getattr(att, n, None) for n in HEAD_WIDTH_NAMES) if isinstance(w, int)), head_dim)
    widths = {n: out_features(m) for n, m in (("query", q), ("key", k), ("value", v))}
    widths["output projection input"] = in_features(proj)
    known = {n: w for n, w in widths.items() if w is not None}
    width = known.get("query")
    if width is None:
        raise UnsupportedModelError(f"{where}: the query projection {type(q).__name__} has no readable width")
    if len(set(known.values())) != 1 or width % d or width == 0:
        shown = ", ".join(f"{n} {w}" for n, w in known.items())
        raise UnsupportedModelError(
            f"{where} ({type(att).__name__}): its projections ({shown}) do not split into heads of width {d} "
            "(the module's head size): the replay reads as many heads as the query projection holds, each of "
            "the module's head size, with equal key, value and output widths"
        )
    scaling = getattr(att, "scaling", None)
    scale = float(scaling) if isinstance(scaling, (int, float)) else d**-0.5
    return width // d, d, scale


def timm_scale(attn: ModelPart, head_dim: int) -> float:
    """The score scale timm's attention computes with: ``head_dim^-½`` on its fused path (torch's sdpa, given no
    ``scale``: ``attn.scale`` is not read there), ``attn.scale`` on its explicit path.

    Parameters
    ----------
    attn : nn.Module
        A timm attention (``Attention``, EVA's, Swin's ``WindowAttention``) with ``scale`` and ``fused_attn``.
    head_dim : int
        Its head width (the last dimension of q).

    Returns
    -------
    float
        The scale the module's forward multiplies q (or the scores) by.
    """
    if getattr(attn, "fused_attn", False):
        return head_dim**-0.5
    return float(attn.scale)


__all__ = ["HEAD_WIDTH_NAMES", "out_features", "in_features", "hf_heads", "timm_scale"]
