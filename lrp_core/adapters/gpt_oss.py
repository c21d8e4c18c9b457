"""GPT-OSS decoders: ``GptOssForCausalLM`` and ``GptOssForSequenceClassification`` (eager or flex attention).

The Llama layout (RMSNorms, grouped key/value heads, rotary q/k: YaRN by default) with what GPT-OSS adds
(docs/METHODS.md §2c.5):

* biases on the q, k, v and o projections (ordinary Linears);
* attention sinks: every head's learned logit joins each row's softmax as a column without a value
  (:class:`AttentionSinks`);
* sliding-window and full-attention layers alternating (``config.layer_types``; each attention's
  ``sliding_window``);
* rotary tables of half the head width, applied to the halves ``(x₁, x₂)`` of each head: the replay's rotation
  with the table repeated, the same products;
* a mixture-of-experts MLP in every layer: the router is a Linear with a bias, the ``top_k`` largest logits are
  chosen and their softmax (over those k alone) weights the experts; each expert's ``gate_up_proj`` (D, 2F) is
  stored transposed with gate and up interleaved (gate the even columns), with biases, and computes
  ``(clamp(up, −L, L) + 1) · c · σ(α·c)`` with ``c = min(gate, L)``, then ``down_proj`` (F, D) with a bias.

Shapes: E experts, F an expert's hidden width, D the model width, H heads, d head width.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from ..rules.linear import LinearView
from .blocks import AttentionSpec, MlpSpec, MoeSpec
from .moe import MoeDecoderAdapter
from .parts import ModelPart


class AttentionSinks(nn.Module):
    """The softmax of an attention with sinks (GPT-OSS): each head's learned logit ``s_h`` joins every row's
    softmax as one more column that takes probability mass and carries no value; that column is then dropped.

    ``A = softmax([scores, s_h] − max)[..., :N]``, each row summing to ``1 − `` the sink's share, in the model's
    order of operations (concatenated, the row maximum subtracted, the softmax in the scores' dtype). The sink
    logits and the shift are constants (detached): under AttnLRP the sink is a constant inside the softmax, like a
    bias, and takes no relevance; the explicit passes and the layer-product methods read ``A`` without the sink
    column (docs/METHODS.md §2c.5). ``owner``: the model's attention module, its ``sinks`` (H,) read at every call
    (not a child module: no parameters of its own).
    """

    owner: ModelPart  # the model's attention (set in __init__: a plain attribute)

    def __init__(self, owner: nn.Module):
        super().__init__()
        object.__setattr__(self, "owner", owner)

    def forward(self, scores: Tensor) -> Tensor:
        """(B, H, N, M) masked scores -> (B, H, N, M) attention weights without the sink column."""
        B, H, N, _ = scores.shape
        sinks = self.owner.sinks.detach().to(scores.dtype).reshape(1, H, 1, 1).expand(B, H, N, 1)
        combined = torch.cat([scores, sinks], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values.detach()
        return combined.softmax(dim=-1, dtype=combined.dtype)[..., :-1]


class ExpertLinear(LinearView):
    """A read-only Linear view of one expert's slice of GPT-OSS's stacked, transposed weights: ``y = x · W[e] + b[e]``
    (``W`` (E, D_in, D_out), ``b`` (E, D_out)), in the model's arithmetic (a product, then the bias added).

    ``interleaved`` (``gate_up_proj``): the outputs are reordered gate first, up second (the model's gate is the
    even columns, up the odd ones), and ``shift`` (the ``+ 1`` of ``up + 1``) is added to the up half — so the
    expert is a fused gated MLP whose up projection carries the ``+ 1`` in its bias. Since rounding is monotone,
    ``clamp(u + 1, 1 − L, 1 + L)`` is ``clamp(u, −L, L) + 1`` bit for bit. The owner is not a child module and is
    read at every call (after ``model.double()`` too).
    """

    owner: ModelPart  # the model's experts module (set in __init__: plain attributes)
    pname: str
    index: int

    def __init__(self, owner: nn.Module, name: str, index: int, interleaved: bool = False, shift: float = 0.0):
        super().__init__()
        object.__setattr__(self, "owner", owner)
        object.__setattr__(self, "pname", name)
        object.__setattr__(self, "index", index)
        self.interleaved, self.shift = interleaved, float(shift)
        w = getattr(owner, name)[index]
        self.in_features, self.out_features = int(w.shape[0]), int(w.shape[1])

    def _order(self, y: Tensor) -> Tensor:
        """(…, 2F) in the model's interleaved order -> (…, 2F) gate then up, the up half shifted."""
        return torch.cat([y[..., 0::2], y[..., 1::2] + self.shift], dim=-1) if self.interleaved else y

    @property
    def weight(self) -> Tensor:
        """(D_out, D_in): the slice transposed (and reordered gate first where interleaved)."""
        w = getattr(self.owner, self.pname)[self.index].T
        return torch.cat([w[0::2], w[1::2]]) if self.interleaved else w

    @property
    def bias(self) -> Tensor:
        """(D_out,): the slice's bias (gate first, the up half shifted, where interleaved)."""
        return self._order(getattr(self.owner, f"{self.pname}_bias")[self.index])

    def linear_parts(self) -> tuple[Tensor, Tensor]:
        return self.weight, self.bias

    def forward(self, x: Tensor) -> Tensor:
        """(P, D_in) -> (P, D_out): ``x @ W[e] + b[e]`` as the model computes it, then reordered."""
        return self._order(
            x @ getattr(self.owner, self.pname)[self.index] + getattr(self.owner, f"{self.pname}_bias")[self.index]
        )


class RouterLinear(LinearView):
    """GPT-OSS's router as a Linear: ``logits = x · Wᵀ + b`` (``W`` (E, D), ``b`` (E,)), read at every call."""

    owner: ModelPart  # the model's router (set in __init__: a plain attribute)

    def __init__(self, owner: ModelPart):
        super().__init__()
        object.__setattr__(self, "owner", owner)
        self.out_features, self.in_features = (int(n) for n in owner.weight.shape)

    @property
    def weight(self) -> Tensor:
        return self.owner.weight

    @property
    def bias(self) -> Tensor:
        return self.owner.bias

    def linear_parts(self) -> tuple[Tensor, Tensor]:
        return self.owner.weight, self.owner.bias

    def forward(self, x: Tensor) -> Tensor:
        return torch.nn.functional.linear(x, self.owner.weight, self.owner.bias)


class ClampedSwiGLU(nn.Module):
    """The experts' gate activation ``c · σ(α·c)``, ``c = min(g, limit)``: one element-wise non-linearity
    (operation kind ELEMENTWISE; the clamp a piecewise identity inside it), in the model's order of operations."""

    def __init__(self, alpha: float, limit: float):
        super().__init__()
        self.alpha, self.limit = float(alpha), float(limit)

    def forward(self, g: Tensor) -> Tensor:
        c = g.clamp(min=None, max=self.limit)
        return c * torch.sigmoid(c * self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:g}, limit={self.limit:g}"


class ShiftedClamp(nn.Module):
    """The experts' up clamp on the shifted up projection: ``clamp(x, 1 − limit, 1 + limit)`` with ``x = up + 1``
    (:class:`ExpertLinear` adds the 1), the bounds formed in x's dtype as the model forms them
    (``±limit`` then ``+ 1``). An element-wise non-linearity (ELEMENTWISE)."""

    def __init__(self, limit: float):
        super().__init__()
        self.limit = float(limit)

    def forward(self, x: Tensor) -> Tensor:
        limit = torch.tensor(self.limit, dtype=x.dtype, device=x.device)
        return torch.clamp(x, min=1 - limit, max=limit + 1)

    def extra_repr(self) -> str:
        return f"limit={self.limit:g}"


class GptOssAdapter(MoeDecoderAdapter):
    """Hugging Face GPT-OSS decoders (eager or flex attention; transformers runs GPT-OSS without sdpa)."""

    family = "GPT-OSS"

    def _attention(self, att: nn.Module, **extra) -> AttentionSpec:
        """The Llama attention with biases, the model's window for this layer, and its sinks (whose softmax is
        computed in the scores' dtype, as the model computes it)."""
        if not isinstance(getattr(att, "sinks", None), Tensor):
            raise UnsupportedModelError(f"{type(att).__name__} has no attention sinks (sinks (H,))")
        return super()._attention(att, sinks=AttentionSinks(att), **extra)

    def rotary_tables(
        self, x0: Tensor, positions: Tensor, key: str, mask: Optional[Tensor] = None
    ) -> tuple[Tensor, Tensor]:
        """(cos, sin) (B, T, d): the model's half-width tables (B, T, d/2) repeated, so the rotation of the halves
        ``(x₁ cos − x₂ sin, x₂ cos + x₁ sin)`` is the replay's ``x·cos + rotate_half(x)·sin``, product for product."""
        cos, sin = super().rotary_tables(x0, positions, key, mask)
        return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)

    def _moe(self, i: int, mlp: ModelPart) -> MoeSpec:
        router: ModelPart = getattr(mlp, "router", None)
        experts = mlp.experts
        names = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
        parts: list[ModelPart] = [getattr(experts, n, None) for n in names]
        if (
            any(not isinstance(t, Tensor) for t in parts)
            or parts[0].dim() != 3
            or parts[2].dim() != 3
            or not hasattr(experts, "alpha")
            or not hasattr(experts, "limit")
        ):
            raise UnsupportedModelError(
                f"layer {i}: mlp.experts ({type(experts).__name__}) does not hold GPT-OSS's stacked experts "
                "(gate_up_proj (E, D, 2F) and down_proj (E, F, D) with their biases, alpha, limit)"
            )
        if not isinstance(getattr(router, "weight", None), Tensor) or not isinstance(
            getattr(router, "bias", None), Tensor
        ):
            raise UnsupportedModelError(
                f"layer {i}: mlp.router ({type(router).__name__}) is not a router with a weight (E, D) and a bias (E,)"
            )
        E = int(parts[0].shape[0])
        if int(router.weight.shape[0]) != E:
            raise UnsupportedModelError(
                f"layer {i}: the router scores {router.weight.shape[0]} experts, the stack holds {E}"
            )
        act, up_act = ClampedSwiGLU(experts.alpha, experts.limit), ShiftedClamp(experts.limit)
        return MoeSpec(
            router=RouterLinear(router),
            top_k=int(router.top_k),
            normalise=False,
            module=mlp,
            softmax_of_chosen=True,
            experts=[
                MlpSpec(
                    fc1=ExpertLinear(experts, "gate_up_proj", e, interleaved=True, shift=1.0),
                    fused_gate=True,
                    act=act,
                    up_act=up_act,
                    fc2=ExpertLinear(experts, "down_proj", e),
                )
                for e in range(E)
            ],
        )


__all__ = ["GptOssAdapter", "AttentionSinks", "ExpertLinear", "RouterLinear", "ClampedSwiGLU", "ShiftedClamp"]
