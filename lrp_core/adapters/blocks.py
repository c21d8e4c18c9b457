"""Transformer blocks as descriptions, their replay, and their relevance drivers.

An adapter describes each block of its model with a :class:`BlockSpec` — which
of the model's own submodules plays which part, in which layout — and the
code here replays it (:func:`block_forward`) and walks it backward
(:func:`block_relprop`), asking a composite for every rule. Two layouts:

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
from ..rules.functional import apply_rotary, query_row_bias, repeat_kv, take_rows
from ..rules.ops import (
    ADD,
    ATTENTION,
    ELEMENTWISE,
    EXPERT_SUM,
    GATE_MUL,
    KV_REPEAT,
    LINEAR,
    MASK_ADD,
    MATMUL_AV,
    MATMUL_QK,
    MODIFIED_GRADIENT,
    ROPE,
    ROUTE,
    SCALE,
    SOFTMAX,
    GradientRule,
    norm_kind,
)
from .kernels import (
    SoftCap,
    computed_rotary,
    fused_attention,
    halves_to_pairs,
    matmul,
    pairs_to_halves,
    parallel_sum,
    parallel_sum_skip_first,
    plus,
    rounded_rotary,
    segmented_softmax,
    softmax_float32,
    softmax_rows,
    times,
)
from .parts import ModelPart
from .records import AttentionRecord, BlockRecord, ExpertRun, MlpRecord, MoeRecord

IDENTITY = nn.Identity()
LAYOUTS = ("pre_ln", "post_ln", "parallel")
#: how a fused qkv projection orders its outputs: "split" (all query heads, then the key heads, then the value
#: heads: timm, Phi-3, GPT-2), "grouped" (per key/value head its query heads, then its key, then its value:
#: GPT-NeoX's and Falcon's per-head ``[q, k, v]``, Falcon's new decoder architecture's ``[q…, k, v]``)
QKV_LAYOUTS = ("split", "grouped")


@dataclass
class AttentionSpec:
    """The parts of one multi-head self-attention.

    Either ``qkv`` (one fused Linear, timm, Phi-3) or ``q``, ``k``, ``v`` (Hugging Face).
    ``scale_queries_first``: timm scales q before ``q·kᵀ``; Hugging Face scales the product.

    Decoders (docs/METHODS.md §2c): ``num_kv_heads`` key/value heads shared by ``num_heads // num_kv_heads``
    consecutive query heads each (``None``: as many as query heads); ``rotary``: q and k are rotated by the
    batch's rotary tables (``rope_key`` names which, for models with several, e.g. Gemma 3's local and global
    bases); ``window``: sliding-window attention over that many positions (the adapter builds the mask);
    ``softmax_dtype``: the dtype the model's softmax computes in (Hugging Face eager: float32, cast back);
    ``sdpa``: the model runs fused attention, so a modified-gradient replay may too (no N×N map in memory);
    ``causal``: causal attention — where the fused replay gets no mask (no padding, no window), the kernel's own;
    ``rotary_dtype``: the dtype q and k are rounded to before they are rotated (ModernBERT rotates float32 copies,
    so a float64 model's rotated q and k carry float32 round-off); ``None``: rotated as they are;
    ``rotary_compute``: the dtype the whole rotation is computed in, q, k and the tables cast to it and the result
    cast back (Qwen2.5-VL's vision tower rotates in float32); ``None``: in q's dtype; ``segmented``: the additive
    mask leaves contiguous diagonal blocks open (Qwen2.5-VL's windows) and the model runs one attention per block,
    so a float32 softmax is computed block by block, its sums those of the model's (over the whole masked row they
    would be summed in another order);
    ``norm_whole``: ``q_norm`` / ``k_norm`` normalise the whole projection (every head together, OLMoE) before
    it is split into heads, not each head's d channels (OLMo-2, OLMoE); ``qkv_layout``: the order of a fused
    ``qkv``'s outputs (:data:`QKV_LAYOUTS`); ``softcap``: the scaled scores are soft-capped (:class:`SoftCap`)
    before the mask is added (Gemma 2; never fused); ``sinks``: the softmax with attention sinks, masked scores
    (B, H, N, M) -> weights (B, H, N, M) (:class:`lrp_core.adapters.gpt_oss.AttentionSinks`: one learned logit
    per head in every row's denominator, no value; never fused), the map ``A`` then the softmax without the sink
    column.

    ``pad_tokens``: the attention reads that many zero tokens after the N tokens of its input (keys and values,
    whose outputs are dropped): the padding a windowed model adds to fill its windows (Swin). The bias then covers
    all N + pad_tokens tokens; the record keeps the unpadded input ``h`` and the cropped output projection
    (``lin["proj_all"]``: the uncropped one). ``softmax``: the model's own softmax of the masked scores
    (B, H, N, N) -> A, where it is not one over each whole row (Swin's eager attention: per window, in float32);
    ``None``: per row, in ``softmax_dtype``.

    Vision rotary embeddings (timm EVA): ``rope_skip`` leading tokens (class, register tokens) are not rotated,
    and the rotary tables then cover the other tokens only, (B or 1, N − rope_skip, d); ``rope_interleaved``:
    the rotation turns the channel pairs (2i, 2i+1) (timm's default) instead of (i, i + d/2) — the replay
    gathers each head's even channels then its odd ones, rotates them in the halves layout (the tables given in
    that order) and puts them back: the same products, element by element, as the model's.
    """

    proj: ModelPart  # Linear-like parts: the model's Linears (a peft LoRA layer is none), or views (GPT-2's Conv1D)
    num_heads: int
    head_dim: int
    scale: float
    qkv: Optional[ModelPart] = None
    q: Optional[ModelPart] = None
    k: Optional[ModelPart] = None
    v: Optional[ModelPart] = None
    q_norm: nn.Module = IDENTITY
    k_norm: nn.Module = IDENTITY
    ctx_norm: nn.Module = IDENTITY
    scale_queries_first: bool = False
    num_kv_heads: Optional[int] = None
    rotary: bool = False
    rope_key: str = "default"
    window: Optional[int] = None
    softmax_dtype: Optional[torch.dtype] = None
    sdpa: bool = False
    causal: bool = False
    rope_skip: int = 0
    rope_interleaved: bool = False
    rotary_dtype: Optional[torch.dtype] = None
    rotary_compute: Optional[torch.dtype] = None
    segmented: bool = False
    norm_whole: bool = False
    qkv_layout: str = "split"
    softcap: Optional[SoftCap] = None
    pad_tokens: int = 0
    softmax: Optional[Callable[[Tensor], Tensor]] = None
    sinks: Optional[nn.Module] = None

    def __post_init__(self) -> None:
        if self.qkv_layout not in QKV_LAYOUTS:
            raise InputError(f"qkv_layout must be one of {QKV_LAYOUTS}, got {self.qkv_layout!r}")

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def groups(self) -> int:
        """Query heads per key/value head."""
        return self.num_heads // self.kv_heads


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
    """

    serves = MODIFIED_GRADIENT

    def __init__(
        self,
        composite: Optional[Composite] = None,
        names: Optional[Mapping[nn.Module, str]] = None,
        record: bool = True,
        fuse: bool = False,
    ):
        self.fuse = fuse
        self.first: Optional[dict] = {} if record else None
        self.composite = None
        if composite is not None:
            super().__init__(composite, names, self.first)

    def __call__(
        self, kind: str, fn: Callable[..., Tensor], *inputs: Tensor, module: Optional[nn.Module] = None
    ) -> Tensor:
        if self.composite is None:
            return fn(*inputs)
        return cast(GradientRule, self.rule(kind, module)).forward(fn, *inputs, module=module)  # a gradient rule set

    def module(self, kind: str, module: nn.Module, x: Tensor) -> Tensor:
        """A submodule of the model; identities are skipped."""
        if isinstance(module, nn.Identity):
            return x
        if self.first is not None:
            self.first.setdefault(kind, module)
        return self(kind, module, x, module=module)

    def norm(self, module: nn.Module, x: Tensor) -> Tensor:
        """A normalisation of the model (LayerNorm or RMSNorm: its kind from the module); identities skipped."""
        return self.module(norm_kind(module), module, x)


#: the plain replay of code that needs no record of the order (a module-level default: it keeps nothing)
NO_RECORD = Replay(record=False)


def _project(p: AttentionSpec, h: Tensor, r: Replay) -> tuple[dict, Tensor, Tensor, Tensor]:
    """The q, k, v projections of h (B, N, D) -> (Linear outputs by role, q (B, H, N, d), k, v (B, Hkv, N, d)).

    q/k norms act on each head's d channels (Qwen3: before the heads are transposed, as the model does).
    """
    B, N, _ = h.shape
    H, Hkv, d = p.num_heads, p.kv_heads, p.head_dim
    if p.qkv is not None:
        lin = {"qkv": r.module(LINEAR, p.qkv, h)}  # (B, N, (H + 2·Hkv)·d)
        if p.qkv_layout == "grouped":  # per key/value head: its query heads, its key, its value
            parts = lin["qkv"].reshape(B, N, Hkv, p.groups + 2, d)
            q = parts[:, :, :, : p.groups].reshape(B, N, H, d).transpose(1, 2)
            k, v = parts[:, :, :, p.groups].transpose(1, 2), parts[:, :, :, p.groups + 1].transpose(1, 2)
        elif Hkv == H:
            q, k, v = lin["qkv"].reshape(B, N, 3, H, d).permute(2, 0, 3, 1, 4).unbind(0)
        else:  # fused GQA projection (Phi-3): the query heads, then the key heads, then the value heads
            q, k, v = (
                t.reshape(B, N, -1, d).transpose(1, 2) for t in lin["qkv"].split([H * d, Hkv * d, Hkv * d], dim=-1)
            )
        return lin, r.norm(p.q_norm, q), r.norm(p.k_norm, k), v
    assert p.q is not None and p.k is not None and p.v is not None, "an attention without qkv has q, k and v"
    lin = {n: r.module(LINEAR, m, h) for n, m in (("q", p.q), ("k", p.k), ("v", p.v))}
    if p.norm_whole:  # the norms over all heads' channels at once, then the heads
        q, k, v = (
            t.reshape(B, N, -1, d).transpose(1, 2)
            for t in (r.norm(p.q_norm, lin["q"]), r.norm(p.k_norm, lin["k"]), lin["v"])
        )
        return lin, q, k, v
    q, k, v = (lin[n].reshape(B, N, -1, d) for n in "qkv")
    return lin, r.norm(p.q_norm, q).transpose(1, 2), r.norm(p.k_norm, k).transpose(1, 2), v.transpose(1, 2)


def _rotate(p: AttentionSpec, x: Tensor, cos: Tensor, sin: Tensor, r: Replay) -> Tensor:
    """x (B, H, N, d) rotated by the tables: the first ``p.rope_skip`` tokens pass, pairs per ``p.rope_interleaved``."""
    n = p.rope_skip
    body = x[:, :, n:] if n else x
    if p.rope_interleaved:
        body = pairs_to_halves(body)
    rotate = apply_rotary if p.rotary_dtype is None else rounded_rotary(p.rotary_dtype)
    if p.rotary_compute is not None:
        rotate = computed_rotary(p.rotary_compute)
    out = r(ROPE, rotate, body, cos, sin)
    if p.rope_interleaved:
        out = halves_to_pairs(out)
    return torch.cat((x[:, :, :n], out), dim=2) if n else out


def _rotate_relprop(
    p: AttentionSpec, x: Tensor, rotated: Tensor, cos: Tensor, sin: Tensor, R: Tensor, prop: Propagation
) -> Tensor:
    """Relevance of the rotated q or k (B, H, N, d) -> of the unrotated one (the skipped tokens' passes as is)."""
    n = p.rope_skip
    parts = [t[:, :, n:] if n else t for t in (x, rotated, R)]
    if p.rope_interleaved:
        parts = [pairs_to_halves(t) for t in parts]
    R_body = prop(ROPE, (parts[0], cos, sin), parts[2], output=parts[1])[0]
    if p.rope_interleaved:
        R_body = halves_to_pairs(R_body)
    return torch.cat((R[:, :, :n], R_body), dim=2) if n else R_body


def _padded(p: AttentionSpec, t: Tensor) -> Tensor:
    """(B, N, D) -> (B, N + p.pad_tokens, D): the zero tokens the attention reads after the N tokens."""
    if not p.pad_tokens:
        return t
    return torch.cat([t, t.new_zeros(t.shape[0], p.pad_tokens, t.shape[-1])], dim=1)


def _unpadded(p: AttentionSpec, t: Tensor, n: int) -> Tensor:
    """(B, n + p.pad_tokens, D) -> (B, n, D): the padding's entries dropped."""
    return t[:, :n] if p.pad_tokens else t


def attention_forward(
    p: AttentionSpec,
    h: Tensor,
    bias: Optional[Tensor],
    r: Replay,
    rope: Optional[tuple] = None,
    rows: Optional[Tensor] = None,
) -> AttentionRecord:
    """Multi-head self-attention on ``h``; the attention map is computed explicitly unless fused.

    Parameters
    ----------
    p : AttentionSpec
        The attention's modules and shape (heads, head size, groups, rotary, scale).
    h : Tensor
        The attention's input ``(B, N, D)``.
    bias : Tensor or None
        The additive mask ``(B, 1, 1, N)`` or ``(B, 1, N, N)``, or ``None``.
    r : Replay
        Runs (and records) each operation through its rule; ``r.fuse`` allows the fused sdpa kernel.
    rope : tuple of Tensor or None
        ``(cos, sin)``, each ``(B, N − p.rope_skip, r)``, where ``p.rotary``; otherwise ``None``.
    rows : Tensor or None
        ``(B,)`` long: only the query at row ``rows[b]`` of each sample is computed (keys and values at every
        row); the output, ``ctx`` and ``A`` then have one row (``(B, 1, D)``, ``(B, H, 1, d)``, ``(B, H, 1, N)``).
        ``None``: every row.

    Returns
    -------
    AttentionRecord
        The forward quantities the rules need (projections, queries, keys, values, the map ``A`` ``(B, H, N, N)``
        unless fused, the output ``(B, N, D)``).
    """
    B, N, _ = h.shape
    H, d, groups = p.num_heads, p.head_dim, p.groups
    lin, q, k, v = _project(p, _padded(p, h), r)
    q_pre = k_pre = None
    if p.rotary:
        assert rope is not None, "a rotary attention gets its tables (Adapter.block_context)"
        cos, sin = rope
        q_pre, k_pre = q, k
        q, k = _rotate(p, q, cos, sin, r), _rotate(p, k, cos, sin, r)
    causal = p.causal
    if rows is not None:  # every other query row's output reaches nothing that is read
        q = take_rows(q, rows, 2)  # (B, H, 1, d)
        bias = query_row_bias(bias, rows, N, p.causal, q)
        causal = False  # a single query row: its keys are chosen by the row mask
        N = 1
    A = None
    if p.sdpa and r.fuse and p.softcap is None and p.sinks is None:
        ctx = r(ATTENTION, fused_attention(bias, p.scale, groups, causal and bias is None), q, k, v)  # (B, H, N, d)
    else:
        k_all, v_all = (k, v) if groups == 1 else (r(KV_REPEAT, lambda t: repeat_kv(t, groups), t) for t in (k, v))
        kT = k_all.transpose(-2, -1)
        if p.scale_queries_first:
            scores = r(MATMUL_QK, matmul, q * p.scale, kT)
        else:
            scores = r(MATMUL_QK, matmul, q, kT) * p.scale
        if p.softcap is not None:  # not a module of the model: not recorded as the first element-wise layer
            scores = r(ELEMENTWISE, p.softcap, scores, module=p.softcap)
        masked = scores if bias is None else r(MASK_ADD, plus, scores, bias)
        softmax: Callable[[Tensor], Tensor] = softmax_rows if p.softmax_dtype is None else softmax_float32
        if p.segmented and bias is not None and p.softmax_dtype is not None:
            softmax = segmented_softmax(bias)
        softmax = p.sinks if p.sinks is not None else p.softmax or softmax
        A = r(SOFTMAX, softmax, masked)  # (B, H, N, N)
        ctx = r(MATMUL_AV, matmul, A, v_all)  # (B, H, N, d)
    o = r.norm(p.ctx_norm, ctx.transpose(1, 2).reshape(B, N + p.pad_tokens, H * d))
    lin["proj"] = r.module(LINEAR, p.proj, o)
    if p.pad_tokens:  # the padding's outputs are dropped
        lin["proj_all"] = lin["proj"]
        lin["proj"] = lin["proj_all"][:, :N]
    return AttentionRecord(
        h=h,
        q=q,
        k=k,
        v=v,
        A=A,
        ctx=ctx,
        o=o,
        lin=lin,
        bias=bias,
        q_pre=q_pre,
        k_pre=k_pre,
        rope=rope if p.rotary else None,
    )


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
    R_A, R_h = _attention_relprop(p.attn, rec.attn, R_proj, prop, deeper)
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
    R_A, R_h = _attention_relprop(p.attn, rec.attn, R_proj, prop, deeper)
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


def _scores(p: AttentionSpec, rec: AttentionRecord) -> Tensor:
    """(B, H, N, N) the forward's scaled ``q·kᵀ``, the same operations again: the replay does not keep it,
    so a long sequence's records hold one ``H·N²`` map per block (A), not two."""
    kT = repeat_kv(rec.k, p.groups).transpose(-2, -1)
    return matmul(rec.q * p.scale, kT) if p.scale_queries_first else matmul(rec.q, kT) * p.scale


def _attention_relprop(
    p: AttentionSpec, rec: AttentionRecord, R: Tensor, prop: Propagation, deeper: bool
) -> tuple[Tensor, Optional[Tensor]]:
    """Relevance of the output projection's output -> (R^A, relevance of the attention input or ``None``).

    With ``p.pad_tokens`` the padding's outputs get no relevance, and its inputs' relevance is dropped."""
    N_in = R.shape[1]
    R = _padded(p, R)
    B, N, _ = R.shape
    H, d, groups = p.num_heads, p.head_dim, p.groups
    h = _padded(p, rec.h)
    R_o = prop.linear(p.proj, rec.o, R, out=rec.lin.get("proj_all", rec.lin["proj"]))
    R_o = prop.unary(norm_kind(p.ctx_norm), rec.o, R_o, p.ctx_norm).reshape(B, N, H, d).transpose(1, 2)
    R_A, R_v = prop(MATMUL_AV, (rec.A, repeat_kv(rec.v, groups)), R_o, output=rec.ctx)
    if not deeper:
        return R_A, None
    (R_s,) = prop(SOFTMAX, (), R_A, output=rec.A)  # the pass keeps only the softmax's output
    if rec.bias is not None or p.softcap is not None:
        raw = _scores(p, rec)
        scores = raw if p.softcap is None else p.softcap(raw)
        if rec.bias is not None:  # keep the scores' share of the mask add
            R_s, _ = prop(MASK_ADD, (scores, rec.bias.expand_as(scores)), R_s)
        if p.softcap is not None:  # the soft-cap: an element-wise non-linearity
            R_s = prop.unary(ELEMENTWISE, raw, R_s, p.softcap)
        del raw, scores
    R_q, R_kT = prop(MATMUL_QK, (rec.q, repeat_kv(rec.k, groups).transpose(-2, -1)), R_s)
    R_k = R_kT.transpose(-2, -1)
    if groups > 1:  # the shared key/value heads: a Clone over the query heads that use them
        (R_k,), (R_v,) = prop(KV_REPEAT, (rec.k,), R_k), prop(KV_REPEAT, (rec.v,), R_v)
    q, k = rec.q, rec.k
    if rec.rope is not None:
        assert rec.q_pre is not None and rec.k_pre is not None, "a rotary attention records q and k before it"
        cos, sin = rec.rope
        R_q = _rotate_relprop(p, rec.q_pre, rec.q, cos, sin, R_q, prop)
        R_k = _rotate_relprop(p, rec.k_pre, rec.k, cos, sin, R_k, prop)
        q, k = rec.q_pre, rec.k_pre
    flat = lambda t: t.transpose(1, 2).reshape(B, N, -1)  # noqa: E731  (B, H, N, d) -> (B, N, H·d)
    if p.norm_whole:  # the norms read the whole projections: their relevance laid out as those outputs
        heads = lambda t: t.reshape(B, N, -1, d).transpose(1, 2)  # noqa: E731
        R_q = heads(prop.unary(norm_kind(p.q_norm), rec.lin["q"], flat(R_q), p.q_norm))
        R_k = heads(prop.unary(norm_kind(p.k_norm), rec.lin["k"], flat(R_k), p.k_norm))
    else:
        R_q = prop.unary(norm_kind(p.q_norm), q, R_q, p.q_norm)
        R_k = prop.unary(norm_kind(p.k_norm), k, R_k, p.k_norm)
    if p.qkv is not None:
        if p.qkv_layout == "grouped":  # per key/value head: its query heads' relevance, its key's, its value's
            Hkv = p.kv_heads
            R_qkv = torch.cat(
                [
                    R_q.transpose(1, 2).reshape(B, N, Hkv, groups, d),
                    R_k.transpose(1, 2)[:, :, :, None],
                    R_v.transpose(1, 2)[:, :, :, None],
                ],
                dim=3,
            ).reshape(B, N, -1)
        elif groups == 1:
            R_qkv = torch.stack([R_q, R_k, R_v], dim=2).transpose(1, 3).reshape(B, N, 3 * H * d)
        else:
            R_qkv = torch.cat([t.transpose(1, 2).reshape(B, N, -1) for t in (R_q, R_k, R_v)], dim=-1)
        return R_A, _unpadded(p, prop.linear(p.qkv, h, R_qkv, out=rec.lin["qkv"]), N_in)
    assert p.q is not None and p.k is not None and p.v is not None, "an attention without qkv has q, k and v"
    R_parts = [
        prop.linear(m, h, flat(r), out=rec.lin[n]) for n, m, r in (("q", p.q, R_q), ("k", p.k, R_k), ("v", p.v, R_v))
    ]
    return R_A, _unpadded(p, prop.clone(h, *R_parts), N_in)  # the three-way Clone


__all__ = [
    "AttentionSpec",
    "MlpSpec",
    "MoeSpec",
    "BlockSpec",
    "Replay",
    "NO_RECORD",
    "IDENTITY",
    "LAYOUTS",
    "attention_forward",
    "block_forward",
    "block_relprop",
    "moe_forward",
    "moe_relprop",
]
