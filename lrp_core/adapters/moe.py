"""Mixture-of-experts decoders (docs/METHODS.md §2c.4): the part every MoE family shares.

Hugging Face's MoE layers (transformers 5) keep a router (``mlp.gate``: a ``weight`` (E, D), ``top_k``) and the
experts' weights stacked in one module (``mlp.experts``: ``gate_up_proj`` (E, 2F, D), gate rows first, and
``down_proj`` (E, D, F), an activation ``act_fn``). :class:`StackedLinear` shows one slice of such a stack to the
engine as a Linear, so each expert is an ordinary gated :class:`~lrp_core.adapters.blocks.MlpSpec` and the block
is a :class:`~lrp_core.adapters.blocks.MoeSpec`. A layer whose MLP is dense (``mlp_only_layers``,
``decoder_sparse_step``) keeps the Llama layout's MLP.

Shapes: E experts, F an expert's hidden width, D the model width.
"""

from __future__ import annotations

from functools import cached_property
from typing import Optional

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from ..rules.linear import LinearView
from .blocks import BlockSpec, MlpSpec, MoeSpec
from .decoder import DecoderAdapter
from .parts import ModelPart


class StackedLinear(LinearView):
    """A read-only Linear view of one slice of a stacked weight: ``y = x · W[i]ᵀ`` (``W`` (E, D_out, D_in)).

    The owner module is not registered as a submodule (the view owns no parameters) and the slice is read at
    every call, so the view always sees the model's current tensors (after ``model.double()`` too).
    ``name`` is the owner's parameter (``"gate_up_proj"``, ``"down_proj"``, or ``"weight"`` of a router, which is
    then 2-D and taken whole: ``index`` ``None``).
    """

    owner: ModelPart  # the model's module holding the stacked weight (set in __init__: plain attributes)
    pname: str
    index: Optional[int]

    def __init__(self, owner: nn.Module, name: str, index: Optional[int] = None):
        super().__init__()
        object.__setattr__(self, "owner", owner)  # plain attributes: not a child module, no parameters of its own
        object.__setattr__(self, "pname", name)
        object.__setattr__(self, "index", index)
        w = self.weight
        self.out_features, self.in_features = int(w.shape[0]), int(w.shape[1])

    @property
    def weight(self) -> Tensor:
        """(D_out, D_in): the slice, a view sharing the owner's storage."""
        w = getattr(self.owner, self.pname)
        return w if self.index is None else w[self.index]

    @property
    def bias(self) -> None:
        return None

    def linear_parts(self) -> tuple[Tensor, None]:
        return self.weight, None

    def forward(self, x: Tensor) -> Tensor:
        return torch.nn.functional.linear(x, self.weight)


class MoeDecoderAdapter(DecoderAdapter):
    """A decoder whose layers' MLPs are (some or all) mixtures of experts; the rest as the Llama layout.

    Families set :attr:`normalise` (``None``: the router's ``norm_topk_prob``) and :attr:`family`, and may add a
    shared expert (:meth:`_shared`).
    """

    #: the chosen experts' weights are renormalised to sum 1 (``None``: read the router's ``norm_topk_prob``)
    normalise: Optional[bool] = None
    #: the layout's name, for messages
    family = "mixture-of-experts"

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        """input norm → attention → + → post-attention norm → MoE (or dense gated) MLP → +."""
        try:
            att, mlp = layer.self_attn, layer.mlp
            spec = (
                self._moe(i, mlp)
                if hasattr(mlp, "experts")
                else MlpSpec(gate=mlp.gate_proj, fc1=mlp.up_proj, act=mlp.act_fn, fc2=mlp.down_proj)
            )
            return BlockSpec(
                layout="pre_ln",
                norm1=layer.input_layernorm,
                norm2=layer.post_attention_layernorm,
                attn=self._attention(att),
                mlp=spec,
            )
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have the {self.family} layout (input_layernorm, "
                f"self_attn with q/k/v/o_proj, post_attention_layernorm, mlp with gate (router) and experts "
                f"(gate_up_proj, down_proj) or a dense gate/up/down_proj MLP): {e}"
            ) from None

    def _moe(self, i: int, mlp: ModelPart) -> MoeSpec:
        router, experts = mlp.gate, mlp.experts
        stacked: tuple[ModelPart, ModelPart] = (
            getattr(experts, "gate_up_proj", None),
            getattr(experts, "down_proj", None),
        )
        if any(not isinstance(w, Tensor) or w.dim() != 3 for w in stacked) or any(
            getattr(experts, f"{n}_bias", None) is not None for n in ("gate_up_proj", "down_proj")
        ):
            raise UnsupportedModelError(
                f"layer {i}: mlp.experts ({type(experts).__name__}) does not hold bias-free stacked gate_up_proj "
                "(E, 2F, D) and down_proj (E, D, F) weights"
            )
        if not isinstance(getattr(router, "weight", None), Tensor) or getattr(router, "bias", None) is not None:
            raise UnsupportedModelError(
                f"layer {i}: mlp.gate ({type(router).__name__}) is not a bias-free router with a weight (E, D)"
            )
        E = int(stacked[0].shape[0])
        if int(router.weight.shape[0]) != E:
            raise UnsupportedModelError(
                f"layer {i}: the router scores {router.weight.shape[0]} experts, the stack holds {E}"
            )
        normalise = self.normalise if self.normalise is not None else bool(router.norm_topk_prob)
        spec = MoeSpec(
            router=StackedLinear(router, "weight"),
            top_k=int(router.top_k),
            normalise=normalise,
            module=mlp,
            experts=[
                MlpSpec(
                    fc1=StackedLinear(experts, "gate_up_proj", e),
                    fused_gate=True,
                    act=experts.act_fn,
                    fc2=StackedLinear(experts, "down_proj", e),
                )
                for e in range(E)
            ],
        )
        self._shared(mlp, spec)
        return spec

    @cached_property
    def module_names(self) -> dict:
        """The model's module → qualified name, each view named too: the router's as the router
        (``model.layers.0.mlp.gate``), an expert's as ``model.layers.0.mlp.experts.<e>.gate_up_proj`` /
        ``.down_proj`` — the views are not modules of the model, and a composite's name patterns must reach them."""
        names = dict(self._model_module_names())
        for spec in self.blocks:
            if isinstance(spec.mlp, MoeSpec):
                names[spec.mlp.router] = names[spec.mlp.router.owner]
                for e, expert in enumerate(spec.mlp.experts):
                    for view in (expert.fc1, expert.fc2):
                        names[view] = f"{names[view.owner]}.{e}.{view.pname}"
        return names

    def _shared(self, mlp: nn.Module, spec: MoeSpec) -> None:
        """A family with a shared expert adds it to ``spec`` here (default: none)."""


__all__ = ["StackedLinear", "MoeDecoderAdapter"]
