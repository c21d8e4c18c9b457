"""Transformer blocks as descriptions, their replay, and their relevance drivers.

An adapter describes each block of its model with a :class:`BlockSpec` — which
of the model's own submodules plays which part, in which layout — and the
code here replays it (:func:`block_forward`) and walks it backward
(:func:`block_relprop`), asking a composite for every rule; the attention's part is
:mod:`.attention` (:class:`~.attention.AttentionSpec`). Three layouts:

* ``"pre_ln"`` (ViT): ``mid = x + ls1(attn(norm1(x)))``, ``out = mid + ls2(mlp(norm2(mid)))``.
* ``"post_ln"`` (BERT): ``mid = norm1(x + attn(x))``, ``out = norm2(mid + mlp(mid))``.
* ``"parallel"`` (GPT-NeoX, Phi-1/2, Falcon): ``out = (ls1(attn(norm1(x))) + ls2(mlp(norm2(x)))) + x``, one sum of
  three operands (``norm2`` may be ``norm1`` itself: one norm feeding both branches).

Shapes: B batch, N tokens, D width, H heads, d head width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, Literal, Mapping, Optional, cast, overload

import torch
from torch import Tensor, nn

from ..errors import InputError
from ..rules.composites import Composite, Propagation, RuleChoice
from ..rules.functional import take_rows
from ..rules.norms import check_norm_value, norm_kind
from ..rules.ops import (
    ADD,
    ELEMENTWISE,
    EXPERT_SUM,
    GATE_MUL,
    LAYERNORM,
    LINEAR,
    MODIFIED_GRADIENT,
    RMSNORM,
    ROUTE,
    SCALE,
    GradientRule,
)
from ..rules.views import linear_call
from .attention import AttentionSpec, attention_forward, attention_relprop
from .kernels import parallel_sum, parallel_sum_skip_first, plus, times
from .parts import IDENTITY, ModelPart
from .records import BlockRecord, ExpertRun, MlpRecord, MoeRecord

LAYOUTS = ("pre_ln", "post_ln", "parallel")
#: the operation kinds whose modified-gradient rules recompute the model's norm from its parameters
NORM_KINDS = (LAYERNORM, RMSNORM)


@dataclass
class MlpSpec:
    """``fc2(mid_norm(act(fc1(x))))``, or gated: ``fc2(mid_norm(act(gate(x)) ⊙ fc1(x)))``.

    Gated MLPs (SwiGLU, GeGLU) name ``gate`` (the gate projection; ``fc1`` is then the up projection), or set
    ``fused_gate`` when ``fc1`` computes gate and up in one Linear (Phi-3's ``gate_up_proj``: gate first).
    ``up_act``: an element-wise function of the up projection before the product (GPT-OSS's clamp), identity
    where absent: ``fc2(act(gate(x)) ⊙ up_act(fc1(x)))``.
    """

    fc1: ModelPart  # Linear-like, as AttentionSpec's projections (an expert's: a view of the stacked weights)
    act: nn.Module
    fc2: ModelPart
    mid_norm: nn.Module = IDENTITY
    gate: Optional[ModelPart] = None
    fused_gate: bool = False
    up_act: nn.Module = IDENTITY

    @property
    def gated(self) -> bool:
        return self.gate is not None or self.fused_gate


@dataclass
class MoeSpec:
    """A mixture-of-experts MLP (docs/METHODS.md §2c.4): ``Σ_{e ∈ top-k} w_e · expert_e(x)``, plus
    ``sigmoid(shared_gate(x)) · shared(x)`` where there is a shared expert (Qwen2-MoE).

    ``router``: Linear-like, x (…, D) -> logits (…, E); the routing weights are ``softmax`` of the logits (in
    float32, as Hugging Face computes them), the ``top_k`` largest kept and, where ``normalise``, divided by their
    sum; or, where ``softmax_of_chosen`` (GPT-OSS), the ``top_k`` largest logits are chosen and the weights are the
    softmax over those k logits alone (in the logits' dtype). ``experts``: one gated :class:`MlpSpec` per expert
    (views of the model's stacked expert weights);
    ``module``: the model's own MoE module (it names the MLP, :attr:`fc1`). Only the chosen experts run, each on
    the tokens routed to it.
    """

    router: nn.Module
    experts: list
    top_k: int
    normalise: bool
    module: nn.Module
    shared: Optional[MlpSpec] = None
    shared_gate: Optional[nn.Module] = None
    softmax_of_chosen: bool = False
    gated: ClassVar[bool] = True

    @property
    def fc1(self) -> nn.Module:
        """The model's MoE module: what tells one block's MLP from another's (a layer used twice shares it)."""
        return self.module

    @property
    def hidden_width(self) -> int:
        """Hidden units kept per token: the k chosen experts' gate and up outputs (and the shared expert's)."""
        width = self.top_k * int(self.experts[0].fc1.out_features)
        if self.shared is not None:
            width += int(self.shared.fc1.out_features) * 2
        return width


@dataclass
class BlockSpec:
    """One block: its layout, attention, MLP, norms and LayerScales (identity where absent).

    ``post1`` / ``post2``: norms on the attention / MLP branch output before its residual Add (Gemma 3's
    sandwich norms, OLMo-2's branch-output norms with identity pre-norms; pre-LN layout).
    ``"parallel"`` layout: ``norm1`` feeds the attention, ``norm2`` the MLP, both from the block input; the same
    module for both where the model has one norm (it is then computed once and its output is a Clone);
    ``skip_first``: the sum is ``(x + attn) + mlp`` (StableLM, Cohere) rather than ``(attn + mlp) + x``.
    """

    layout: str
    attn: AttentionSpec
    mlp: "MlpSpec | MoeSpec"
    norm1: nn.Module
    norm2: nn.Module
    ls1: nn.Module = IDENTITY
    ls2: nn.Module = IDENTITY
    post1: nn.Module = IDENTITY
    post2: nn.Module = IDENTITY
    skip_first: bool = False

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise InputError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")


# ----------------------------------------------------------------------------
# the replay
# ----------------------------------------------------------------------------
class Replay(RuleChoice):
    """Runs each operation of the forward pass through its rule's ``forward``.

    ``Replay(None)`` computes every operation plainly (the model's own arithmetic); with a
    modified-gradient composite (AttnLRP, CP-LRP) each operation keeps its value and gets the gradient its
    rule prescribes. An explicit-pass composite (TRANSFORMER_ATTRIBUTION, LRP_BASELINE) is refused at once
    (:class:`~lrp_core.errors.RuleSetError`): its rules define no gradient.

    ``first`` records the first module of each operation kind the replay meets (input order): the
    first-layer rules of a composite, in this replay and in a later explicit pass (``Trace.first``).
    ``names``: the model's module → qualified name, for a composite that chooses rules by name.
    ``fuse``: attention of models that run sdpa is computed fused (the ATTENTION kind; no attention map is
    recorded) — for passes that never read A.
    ``where``: the model's module → its qualified name, for refusals. With a composite, every norm the rules
    recompute from its parameters is checked against the module's own output on the input the forward gives
    it (:func:`lrp_core.rules.norms.check_norm_value`): a misread norm is refused naming the module.
    """

    serves = MODIFIED_GRADIENT

    def __init__(
        self,
        composite: Optional[Composite] = None,
        names: Optional[Mapping[nn.Module, str]] = None,
        record: bool = True,
        fuse: bool = False,
        where: Optional[Callable[[nn.Module], str]] = None,
    ):
        self.fuse = fuse
        self.where = where or (lambda m: type(m).__name__)
        self.first: Optional[dict] = {} if record else None
        self.composite = None
        if composite is not None:
            super().__init__(composite, names, self.first)

    def __call__(
        self, kind: str, fn: Callable[..., Tensor], *inputs: Tensor, module: Optional[nn.Module] = None
    ) -> Tensor:
        if self.composite is None:
            return fn(*inputs)
        rule = cast(GradientRule, self.rule(kind, module))  # a gradient rule set
        out = rule.forward(fn, *inputs, module=module)
        if kind in NORM_KINDS and module is not None:  # the rule recomputed the norm from its parameters
            check_norm_value(module, inputs[0], out, self.where, rule.name)
        return out

    def module(self, kind: str, module: nn.Module, x: Tensor) -> Tensor:
        """A submodule of the model; identities are skipped."""
        if isinstance(module, nn.Identity):
            return x
        if self.first is not None:
            self.first.setdefault(kind, module)
        # a quantised Linear: its own forward, with the gradient of the dequantised map the rules read
        fn = linear_call(module) if kind == LINEAR else module
        return self(kind, fn, x, module=module)

    def norm(self, module: nn.Module, x: Tensor) -> Tensor:
        """A normalisation of the model (LayerNorm or RMSNorm: its kind from the module); identities skipped."""
        return self.module(norm_kind(module), module, x)


#: the plain replay of code that needs no record of the order (a module-level default: it keeps nothing)
NO_RECORD = Replay(record=False)


def _mlp_forward(p: MlpSpec, m: Tensor, r: Replay) -> tuple[dict, Tensor, Optional[Tensor], Optional[Tensor]]:
    """The MLP's hidden units from its input m (B, N, D) -> (Linear outputs, g, gate, up); gate/up for gated MLPs."""
    if not p.gated:
        lin = {"fc1": r.module(LINEAR, p.fc1, m)}
        return lin, r.norm(p.mid_norm, r.module(ELEMENTWISE, p.act, lin["fc1"])), None, None
    if p.gate is not None:
        lin = {"gate": r.module(LINEAR, p.gate, m), "fc1": r.module(LINEAR, p.fc1, m)}
        pre_gate, up = lin["gate"], lin["fc1"]
    else:
        lin = {"fc1": r.module(LINEAR, p.fc1, m)}
        pre_gate, up = lin["fc1"].chunk(2, dim=-1)
    gate = r.module(ELEMENTWISE, p.act, pre_gate)
    if not isinstance(p.up_act, nn.Identity):  # not a module of the model: not recorded as a first layer
        up = r(ELEMENTWISE, p.up_act, up, module=p.up_act)
    return lin, r.norm(p.mid_norm, r(GATE_MUL, times, gate, up)), gate, up


def block_forward(
    p: BlockSpec,
    x: Tensor,
    bias: Optional[Tensor],
    r: Replay = NO_RECORD,
    rope: Optional[tuple] = None,
    rows: Optional[Tensor] = None,
) -> BlockRecord:
    """One Transformer block on ``x`` (pre-LN, post-LN or parallel layout).

    Parameters
    ----------
    p : BlockSpec
        The block's modules and layout.
    x : Tensor
        The block's input ``(B, N, D)``.
    bias : Tensor or None
        The additive mask, or ``None``.
    r : Replay
        Runs (and records) each operation through its rule; :data:`NO_RECORD` computes plainly.
    rope : tuple of Tensor or None
        The rotary tables ``(cos, sin)``, or ``None`` without rotary positions.
    rows : Tensor or None
        ``(B,)`` long: the output at row ``rows[b]`` of each sample only (its attention reads every row), for a
        causal block whose other rows reach nothing that is read; ``None``: every row.

    Returns
    -------
    BlockRecord
        The block's forward quantities; its output ``(B, N, D)`` is ``out`` (``(B, 1, D)`` with ``rows``; the
        record's ``x`` is then the input's rows too).
    """
    if p.layout == "parallel":
        return _parallel_forward(p, x, bias, r, rope, rows)
    pre = p.layout == "pre_ln"
    att = attention_forward(p.attn, r.norm(p.norm1, x) if pre else x, bias, r, rope, rows)
    if rows is not None:
        x = take_rows(x, rows, 1)
    a = r.module(SCALE, p.ls1, r.norm(p.post1, att.lin["proj"]))
    mid = r(ADD, plus, x, a)
    if not pre:
        mid = r.norm(p.norm1, mid)
    m = r.norm(p.norm2, mid) if pre else mid
    moe = None
    lin: dict[str, Tensor]
    if isinstance(p.mlp, MoeSpec):
        moe = moe_forward(p.mlp, m.reshape(-1, m.shape[-1]), r)
        lin, g, gate, up = {}, moe.out.reshape(m.shape), None, None
        branch = g
    else:
        lin, g, gate, up = _mlp_forward(p.mlp, m, r)
        lin["fc2"] = branch = r.module(LINEAR, p.mlp.fc2, g)
    f = r.module(SCALE, p.ls2, r.norm(p.post2, branch))
    out = r(ADD, plus, mid, f)
    if not pre:
        out = r.norm(p.norm2, out)
    return BlockRecord(x=x, attn=att, a=a, mid=mid, m=m, g=g, f=f, out=out, lin=lin, gate=gate, up=up, moe=moe)


def _mlp_run(p: MlpSpec, x: Tensor, r: Replay) -> MlpRecord:
    """A whole MLP (an expert) on ``x`` (P, D): its record, the output in ``lin["fc2"]`` (P, D)."""
    lin, g, gate, up = _mlp_forward(p, x, r)
    lin["fc2"] = r.module(LINEAR, p.fc2, g)
    return MlpRecord(m=x, lin=lin, g=g, gate=gate, up=up)


def _routing(normalise: bool, of_chosen: bool = False) -> Callable[[Tensor, Tensor], Tensor]:
    """logits (T, E), chosen (T, k) -> the chosen experts' weights (T, k): Hugging Face's arithmetic (softmax in
    float32, renormalised there where ``normalise``, cast back to the logits' dtype; ``of_chosen``: the softmax
    of the k chosen logits, in their dtype)."""

    def route(logits: Tensor, chosen: Tensor) -> Tensor:
        if of_chosen:
            return logits.gather(-1, chosen).softmax(dim=-1, dtype=logits.dtype)
        w = logits.softmax(dim=-1, dtype=torch.float32).gather(-1, chosen)
        if normalise:
            w = w / w.sum(dim=-1, keepdim=True)
        return w.to(logits.dtype)

    return route


def _summed(T: int) -> Callable[[Tensor, Tensor], Tensor]:
    """parts (P, D), tokens (P,) -> (T, D) the parts added up per token, in order (as Hugging Face's index_add)."""

    def add_up(parts: Tensor, tokens: Tensor) -> Tensor:
        return parts.new_zeros((T, parts.shape[-1])).index_add(0, tokens, parts)

    return add_up


def moe_forward(p: MoeSpec, x: Tensor, r: Replay = NO_RECORD) -> MoeRecord:
    """A mixture-of-experts MLP on flattened tokens: router, top-k, then the chosen experts.

    Each chosen expert runs on its own tokens only (never every expert on every token), and the weighted outputs
    are summed per token. The choice (top-k of the routing probabilities) is made without gradient and carries
    no relevance; the routing weights (ROUTE), each product ``w_e · expert_e(x)`` (GATE_MUL) and the sum
    (EXPERT_SUM) get the composite's rules.

    Parameters
    ----------
    p : MoeSpec
        The router, the experts (and a shared expert), top-k and whether the weights are renormalised.
    x : Tensor
        The tokens ``(T, D)``, the batch flattened (``T = B·N``).
    r : Replay
        Runs (and records) each operation through its rule; :data:`NO_RECORD` computes plainly.

    Returns
    -------
    MoeRecord
        The forward quantities; its output ``(T, D)`` is ``out``.
    """
    T = x.shape[0]
    logits = r.module(LINEAR, p.router, x)  # (T, E)
    with torch.no_grad():
        scores = logits.detach() if p.softmax_of_chosen else logits.detach().softmax(dim=-1, dtype=torch.float32)
        chosen = torch.topk(scores, p.top_k, dim=-1).indices
    weights = r(ROUTE, _routing(p.normalise, p.softmax_of_chosen), logits, chosen)  # (T, k)
    runs = []
    for e in torch.unique(chosen).tolist():  # the experts that receive a token, in order
        slots, tokens = torch.where(chosen.T == e)  # Hugging Face's order: by rank, then token
        mlp = _mlp_run(p.experts[e], x[tokens], r)
        w = weights[tokens, slots, None]  # (P, 1)
        runs.append(
            ExpertRun(
                expert=e, tokens=tokens, slots=slots, mlp=mlp, weight=w, out=r(GATE_MUL, times, w, mlp.lin["fc2"])
            )
        )
    parts, where = [run.out for run in runs], [run.tokens for run in runs]
    shared = shared_logit = shared_weight = shared_out = None
    if p.shared is not None:
        assert p.shared_gate is not None, "a shared expert has its gate"
        shared = _mlp_run(p.shared, x, r)
        shared_logit = r.module(LINEAR, p.shared_gate, x)  # (T, 1)
        shared_weight = r(ROUTE, torch.sigmoid, shared_logit)
        shared_out = r(GATE_MUL, times, shared_weight, shared.lin["fc2"])
        parts.append(shared_out)
        where.append(torch.arange(T, device=x.device))
    parts_all, tokens_all = torch.cat(parts), torch.cat(where)
    out = r(EXPERT_SUM, _summed(T), parts_all, tokens_all)
    return MoeRecord(
        x=x,
        logits=logits,
        chosen=chosen,
        weights=weights,
        runs=runs,
        parts=parts_all,
        tokens=tokens_all,
        out=out,
        shared=shared,
        shared_logit=shared_logit,
        shared_weight=shared_weight,
        shared_out=shared_out,
    )


def _parallel_forward(
    p: BlockSpec, x: Tensor, bias: Optional[Tensor], r: Replay, rope: Optional[tuple], rows: Optional[Tensor] = None
) -> BlockRecord:
    """A parallel block: attention and MLP both read the (normalised) block input, one sum of three operands.

    The record's ``mid`` is the block input itself (no stream between the branches) and ``m`` the MLP's input.
    ``rows``: as :func:`block_forward`'s.
    """
    h = r.norm(p.norm1, x)
    m = h if p.norm2 is p.norm1 else r.norm(p.norm2, x)
    att = attention_forward(p.attn, h, bias, r, rope, rows)
    if rows is not None:
        x, m = take_rows(x, rows, 1), take_rows(m, rows, 1)
    a = r.module(SCALE, p.ls1, r.norm(p.post1, att.lin["proj"]))
    assert isinstance(p.mlp, MlpSpec), "a parallel block's MLP is no mixture of experts"
    lin, g, gate, up = _mlp_forward(p.mlp, m, r)
    lin["fc2"] = r.module(LINEAR, p.mlp.fc2, g)
    f = r.module(SCALE, p.ls2, r.norm(p.post2, lin["fc2"]))
    out = r(ADD, parallel_sum_skip_first if p.skip_first else parallel_sum, x, a, f)
    return BlockRecord(x=x, attn=att, a=a, mid=x, m=m, g=g, f=f, out=out, lin=lin, gate=gate, up=up)


# ----------------------------------------------------------------------------
# the relevance driver
# ----------------------------------------------------------------------------
@overload
def block_relprop(
    p: BlockSpec, rec: BlockRecord, R: Tensor, prop: Propagation, deeper: Literal[True] = True
) -> tuple[Tensor, Tensor]: ...
@overload
def block_relprop(
    p: BlockSpec, rec: BlockRecord, R: Tensor, prop: Propagation, deeper: bool
) -> tuple[Optional[Tensor], Tensor]: ...
def block_relprop(
    p: BlockSpec, rec: BlockRecord, R: Tensor, prop: Propagation, deeper: bool = True
) -> tuple[Optional[Tensor], Tensor]:
    """Propagate the relevance of a block's output to its input and its attention map.

    ``deeper=False`` stops at the attention map: R^A is the halved relevance of
    A at the ``A·V`` product (docs/METHODS.md §1.9), and the input relevance is ``None``.

    Parameters
    ----------
    p : BlockSpec
        The block's modules and layout.
    rec : BlockRecord
        The block's forward record (:func:`block_forward`).
    R : Tensor
        The relevance of the block's output ``(B, N, D)``.
    prop : Propagation
        The composite's rules, applied operation by operation.
    deeper : bool
        Whether to continue past the attention map to the block's input.

    Returns
    -------
    tuple
        ``(R_x, R_A)``: the relevance of the block's input ``(B, N, D)`` (``None`` when ``deeper`` is false) and
        that of the attention map ``(B, H, N, N)``.
    """
    if p.layout == "parallel":
        return _parallel_relprop(p, rec, R, prop, deeper)
    pre = p.layout == "pre_ln"
    if not pre:
        R = prop.unary(norm_kind(p.norm2), rec.out, R, p.norm2)
    # MLP branch | skip
    R_mid, R_f = prop(ADD, (rec.mid, rec.f), R)
    branch = rec.g if rec.moe is not None else rec.lin["fc2"]
    R_fc2 = prop.unary(SCALE, branch, R_f, p.ls2)
    R_fc2 = prop.unary(norm_kind(p.post2), branch, R_fc2, p.post2)
    if rec.moe is not None:
        assert isinstance(p.mlp, MoeSpec), "a mixture of experts' record comes from its MoeSpec"
        R_m = moe_relprop(p.mlp, rec.moe, R_fc2.reshape(rec.moe.out.shape), prop).reshape(rec.m.shape)
    else:
        assert isinstance(p.mlp, MlpSpec), "an MLP's record comes from its MlpSpec"
        R_g = prop.linear(p.mlp.fc2, rec.g, R_fc2, out=rec.lin["fc2"])
        R_m = _mlp_relprop(p.mlp, rec, prop.unary(norm_kind(p.mlp.mid_norm), rec.g, R_g, p.mlp.mid_norm), prop)
    if pre:
        R_m = prop.unary(norm_kind(p.norm2), rec.mid, R_m, p.norm2)
    R_mid = prop.clone(rec.mid, R_mid, R_m)
    if not pre:
        R_mid = prop.unary(norm_kind(p.norm1), rec.mid, R_mid, p.norm1)
    # attention branch | skip
    R_x, R_a = prop(ADD, (rec.x, rec.a), R_mid)
    R_proj = prop.unary(SCALE, rec.attn.lin["proj"], R_a, p.ls1)
    R_proj = prop.unary(norm_kind(p.post1), rec.attn.lin["proj"], R_proj, p.post1)
    R_A, R_h = attention_relprop(p.attn, rec.attn, R_proj, prop, deeper)
    if not deeper:
        return None, R_A
    assert R_h is not None, "deeper: the attention passes relevance on to its input"
    if pre:
        R_h = prop.unary(norm_kind(p.norm1), rec.x, R_h, p.norm1)
    return prop.clone(rec.x, R_x, R_h), R_A


def _parallel_relprop(
    p: BlockSpec, rec: BlockRecord, R: Tensor, prop: Propagation, deeper: bool
) -> tuple[Optional[Tensor], Tensor]:
    """:func:`block_relprop` of a parallel block: the three-operand Add (docs/METHODS.md §2f), each branch down to
    its norm, and the block input a Clone of the skip and the norms (one norm feeding both branches: a Clone of
    its output first)."""
    R_x, R_a, R_f = prop(ADD, (rec.x, rec.a, rec.f), R, output=rec.out)
    assert isinstance(p.mlp, MlpSpec), "a parallel block's MLP is no mixture of experts"
    R_fc2 = prop.unary(SCALE, rec.lin["fc2"], R_f, p.ls2)
    R_fc2 = prop.unary(norm_kind(p.post2), rec.lin["fc2"], R_fc2, p.post2)
    R_g = prop.linear(p.mlp.fc2, rec.g, R_fc2, out=rec.lin["fc2"])
    R_m = _mlp_relprop(p.mlp, rec, prop.unary(norm_kind(p.mlp.mid_norm), rec.g, R_g, p.mlp.mid_norm), prop)
    R_proj = prop.unary(SCALE, rec.attn.lin["proj"], R_a, p.ls1)
    R_proj = prop.unary(norm_kind(p.post1), rec.attn.lin["proj"], R_proj, p.post1)
    R_A, R_h = attention_relprop(p.attn, rec.attn, R_proj, prop, deeper)
    if not deeper:
        return None, R_A
    assert R_h is not None, "deeper: the attention passes relevance on to its input"
    if p.norm2 is p.norm1:
        R_n = prop.unary(norm_kind(p.norm1), rec.x, prop.clone(rec.attn.h, R_h, R_m), p.norm1)
        return prop.clone(rec.x, R_x, R_n), R_A
    R_n1 = prop.unary(norm_kind(p.norm1), rec.x, R_h, p.norm1)
    R_n2 = prop.unary(norm_kind(p.norm2), rec.x, R_m, p.norm2)
    return prop.clone(rec.x, R_x, R_n1, R_n2), R_A


def _mlp_relprop(p: MlpSpec, rec: BlockRecord | MlpRecord, R_g: Tensor, prop: Propagation) -> Tensor:
    """Relevance of the MLP's hidden units (B, N, F) -> relevance of its input m (B, N, D)."""
    if not p.gated:
        R_g = prop.unary(ELEMENTWISE, rec.lin["fc1"], R_g, p.act)
        return prop.linear(p.fc1, rec.m, R_g, out=rec.lin["fc1"])
    product = rec.g if isinstance(p.mid_norm, nn.Identity) else None
    R_gate, R_up = prop(GATE_MUL, (rec.gate, rec.up), R_g, output=product)
    if not isinstance(p.up_act, nn.Identity):  # the up projection's element-wise function
        pre_up = rec.lin["fc1"] if p.gate is not None else rec.lin["fc1"][..., R_gate.shape[-1] :]
        R_up = prop.unary(ELEMENTWISE, pre_up, R_up, p.up_act)
    if p.gate is not None:  # x feeds gate and up: a Clone
        R_pre = prop.unary(ELEMENTWISE, rec.lin["gate"], R_gate, p.act)
        return prop.clone(
            rec.m,
            prop.linear(p.gate, rec.m, R_pre, out=rec.lin["gate"]),
            prop.linear(p.fc1, rec.m, R_up, out=rec.lin["fc1"]),
        )
    pre_gate = rec.lin["fc1"][..., : R_gate.shape[-1]]
    R_pre = prop.unary(ELEMENTWISE, pre_gate, R_gate, p.act)  # one fused Linear: its outputs' relevance side by side
    return prop.linear(p.fc1, rec.m, torch.cat([R_pre, R_up], dim=-1), out=rec.lin["fc1"])


def _expert_relprop(p: MlpSpec, rec: MlpRecord, R: Tensor, prop: Propagation) -> Tensor:
    """Relevance of an expert's output (P, D) -> of its input (P, D): down projection, then the gated MLP's rules."""
    return _mlp_relprop(p, rec, prop.linear(p.fc2, rec.g, R, out=rec.lin["fc2"]), prop)


def moe_relprop(p: MoeSpec, rec: MoeRecord, R: Tensor, prop: Propagation) -> Tensor:
    """Propagate the relevance of a mixture-of-experts MLP's output to its input (docs/METHODS.md §2c.4).

    The per-token sum (EXPERT_SUM) shares R among the k (+1) summands; each ``w_e · expert_e(x)`` is a product
    of two operands (GATE_MUL): the expert's share goes through its MLP to its tokens, the weight's through the
    routing (ROUTE: to the chosen logits only) and the router's Linear; x, read by the router, the experts (and
    the shared expert and its gate), is a Clone of those branches.

    Parameters
    ----------
    p : MoeSpec
        The router and the experts.
    rec : MoeRecord
        The forward record (:func:`moe_forward`).
    R : Tensor
        The relevance of the output ``(T, D)``.
    prop : Propagation
        The composite's rules, applied operation by operation.

    Returns
    -------
    Tensor
        The relevance of the input ``(T, D)``.
    """
    R_parts, _ = prop(EXPERT_SUM, (rec.parts, rec.tokens), R, output=rec.out)
    R_experts = torch.zeros_like(R)
    R_w = R.new_zeros(rec.weights.shape)
    start = 0
    for run in rec.runs:
        n = run.tokens.numel()
        R_w_run, R_y = prop(GATE_MUL, (run.weight, run.mlp.lin["fc2"]), R_parts[start : start + n], output=run.out)
        start += n
        R_w[run.tokens, run.slots] = R_w_run[:, 0]
        R_experts.index_add_(0, run.tokens, _expert_relprop(p.experts[run.expert], run.mlp, R_y, prop))
    R_logits, _ = prop(ROUTE, (rec.logits, rec.chosen), R_w)
    branches = [R_experts, prop.linear(p.router, rec.x, R_logits, out=rec.logits)]
    if rec.shared is not None:
        R_sw, R_sy = prop(GATE_MUL, (rec.shared_weight, rec.shared.lin["fc2"]), R_parts[start:], output=rec.shared_out)
        (R_slogit,) = prop(ROUTE, (rec.shared_logit,), R_sw)
        assert p.shared is not None and p.shared_gate is not None, "the shared expert's record comes from its spec"
        branches += [
            _expert_relprop(p.shared, rec.shared, R_sy, prop),
            prop.linear(p.shared_gate, rec.x, R_slogit, out=rec.shared_logit),
        ]
    return prop.clone(rec.x, *branches)


__all__ = [
    "AttentionSpec",
    "MlpSpec",
    "MoeSpec",
    "BlockSpec",
    "Replay",
    "NO_RECORD",
    "LAYOUTS",
    "block_forward",
    "block_relprop",
    "moe_forward",
    "moe_relprop",
]
