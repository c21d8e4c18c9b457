"""Transformer blocks as descriptions, and their replay.

An adapter describes each block of its model with a :class:`BlockSpec` — which
of the model's own submodules plays which part, in which layout — and the
code here replays it (:func:`block_forward`), every operation through the replay ``r``
(:mod:`.replay`: its rules give the gradient or, in an explicit pass, the relevance of each step);
the attention's part is :mod:`.attention` (:class:`~.attention.AttentionSpec`). Three layouts:

* ``"pre_ln"`` (ViT): ``mid = x + ls1(attn(norm1(x)))``, ``out = mid + ls2(mlp(norm2(mid)))``.
* ``"post_ln"`` (BERT): ``mid = norm1(x + attn(x))``, ``out = norm2(mid + mlp(mid))``.
* ``"parallel"`` (GPT-NeoX, Phi-1/2, Falcon): ``out = (ls1(attn(norm1(x))) + ls2(mlp(norm2(x)))) + x``, one sum of
  three operands (``norm2`` may be ``norm1`` itself: one norm feeding both branches).

Shapes: B batch, N tokens, D width, H heads, d head width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, Optional

import torch
from torch import Tensor, nn

from ..errors import InputError
from ..rules.ops import ADD, ELEMENTWISE, EXPERT_SUM, GATE_MUL, LINEAR, ROUTE, SCALE
from ..rules.tensors import take_rows
from .attention import AttentionSpec, attention_forward
from .kernels import parallel_sum, parallel_sum_skip_first, plus, times
from .parts import IDENTITY, ModelPart
from .records import AttentionRecord, BlockRecord, ExpertRun, MlpRecord, MoeRecord
from .replay import NO_RECORD, Replay

LAYOUTS = ("pre_ln", "post_ln", "parallel")


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
    ``cross``: an encoder-decoder's cross-attention after the self-attention (queries from the stream, keys and
    values from the encoder's output, :func:`block_forward`'s ``memory``), with its own residual and its norm
    ``norm_cross`` (pre-LN: on the branch input; post-LN: after the Add, as ``norm1``).
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
    cross: Optional[AttentionSpec] = None
    norm_cross: nn.Module = IDENTITY

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise InputError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")


# ----------------------------------------------------------------------------
# the replay (each operation through r: lrp_core.adapters.replay)
# ----------------------------------------------------------------------------
def _mlp_forward(p: MlpSpec, m: Tensor, r: Replay) -> tuple[dict, Tensor, Optional[Tensor], Optional[Tensor]]:
    """The MLP's hidden units from its input m (B, N, D) -> (Linear outputs, g, gate, up); gate/up for gated MLPs."""
    if not p.gated:
        lin = {"fc1": r.module(LINEAR, p.fc1, m)}
        return lin, r.norm(p.mid_norm, r.module(ELEMENTWISE, p.act, lin["fc1"])), None, None
    if p.gate is not None:
        m_gate, m_up = r.fork(m, 2)
        lin = {"gate": r.module(LINEAR, p.gate, m_gate), "fc1": r.module(LINEAR, p.fc1, m_up)}
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
    memory: Optional[Tensor] = None,
    memory_bias: Optional[Tensor] = None,
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
    memory : Tensor or None
        ``(B, M, D)`` the encoder's output a cross-attention block (``p.cross``) reads its keys and values from.
    memory_bias : Tensor or None
        ``(B, 1, 1, M)`` the cross-attention's additive mask (the source's padding), or ``None``.

    Returns
    -------
    BlockRecord
        The block's forward quantities; its output ``(B, N, D)`` is ``out`` (``(B, 1, D)`` with ``rows``; the
        record's ``x`` is then the input's rows too).
    """
    if p.layout == "parallel":
        return _parallel_forward(p, x, bias, r, rope, rows)
    pre = p.layout == "pre_ln"
    skip, x_in = r.fork(x, 2)
    att = attention_forward(p.attn, r.norm(p.norm1, x_in) if pre else x_in, bias, r, rope, rows)
    if rows is not None:
        x, skip = take_rows(x, rows, 1), take_rows(skip, rows, 1)
    a = r.module(SCALE, p.ls1, r.norm(p.post1, att.lin["proj"]))
    mid = r(ADD, plus, skip, a)
    if not pre:
        mid = r.norm(p.norm1, mid)
    cross = None
    if p.cross is not None:
        assert memory is not None, "a cross-attention block reads the encoder's output"
        mid, cross = _cross_forward(p, p.cross, mid, memory, memory_bias, r)
    mid_skip, mid_in = r.fork(mid, 2)
    m = r.norm(p.norm2, mid_in) if pre else mid_in
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
    out = r(ADD, plus, mid_skip, f)
    if not pre:
        out = r.norm(p.norm2, out)
    return BlockRecord(
        x=x, attn=att, a=a, mid=mid, m=m, g=g, f=f, out=out, lin=lin, gate=gate, up=up, moe=moe, cross=cross
    )


def _cross_forward(
    p: BlockSpec, spec: AttentionSpec, x: Tensor, memory: Tensor, bias: Optional[Tensor], r: Replay
) -> tuple[Tensor, AttentionRecord]:
    """The cross-attention sub-block on the stream x (B, N, D): ``x + cross(norm(x), memory)`` (pre-LN) or
    ``norm(x + cross(x, memory))`` (post-LN) -> (its output, its attention record)."""
    pre = p.layout == "pre_ln"
    skip, x_in = r.fork(x, 2)
    att = attention_forward(spec, r.norm(p.norm_cross, x_in) if pre else x_in, bias, r, kv=memory)
    out = r(ADD, plus, skip, att.lin["proj"])
    return (out if pre else r.norm(p.norm_cross, out)), att


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
    x_all = x
    x, x_router, *x_shared = r.fork(x, 2 if p.shared is None else 4)
    logits = r.module(LINEAR, p.router, x_router)  # (T, E)
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
        shared = _mlp_run(p.shared, x_shared[0], r)
        shared_logit = r.module(LINEAR, p.shared_gate, x_shared[1])  # (T, 1)
        shared_weight = r(ROUTE, torch.sigmoid, shared_logit)
        shared_out = r(GATE_MUL, times, shared_weight, shared.lin["fc2"])
        parts.append(shared_out)
        where.append(torch.arange(T, device=x.device))
    parts_all, tokens_all = torch.cat(parts), torch.cat(where)
    out = r(EXPERT_SUM, _summed(T), parts_all, tokens_all)
    return MoeRecord(
        x=x_all,
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
    if p.norm2 is p.norm1:  # one norm feeding both branches: its output read twice
        skip, x_n = r.fork(x, 2)
        h, m = r.fork(r.norm(p.norm1, x_n), 2)
    else:
        skip, x_n1, x_n2 = r.fork(x, 3)
        h, m = r.norm(p.norm1, x_n1), r.norm(p.norm2, x_n2)
    att = attention_forward(p.attn, h, bias, r, rope, rows)
    if rows is not None:
        x, skip, m = take_rows(x, rows, 1), take_rows(skip, rows, 1), take_rows(m, rows, 1)
    a = r.module(SCALE, p.ls1, r.norm(p.post1, att.lin["proj"]))
    assert isinstance(p.mlp, MlpSpec), "a parallel block's MLP is no mixture of experts"
    lin, g, gate, up = _mlp_forward(p.mlp, m, r)
    lin["fc2"] = r.module(LINEAR, p.mlp.fc2, g)
    f = r.module(SCALE, p.ls2, r.norm(p.post2, lin["fc2"]))
    out = r(ADD, parallel_sum_skip_first if p.skip_first else parallel_sum, skip, a, f)
    return BlockRecord(x=x, attn=att, a=a, mid=x, m=m, g=g, f=f, out=out, lin=lin, gate=gate, up=up)


__all__ = [
    "AttentionSpec",
    "MlpSpec",
    "MoeSpec",
    "BlockSpec",
    "Replay",
    "NO_RECORD",
    "LAYOUTS",
    "block_forward",
    "moe_forward",
]
