"""GPT-OSS (docs/METHODS.md §2c.5): attention sinks, biased q/k/v/o, alternating sliding / full layers, YaRN, a
biased router with the softmax over the top-k logits, and clamped SwiGLU experts stored transposed, interleaved
and with biases.

Tiny seeded model (tests/decoders.py ``GPT_OSS``: hidden 32, 2 blocks, 4 experts, top-2, SwiGLU limit 1 so the
clamps bind), float64. transformers runs GPT-OSS eager only on CPU (no sdpa path; flex refuses sinks on CPU), so
the eager model is the reference. No LXT reference exists for GPT-OSS (LXT has no patch for it).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from decoders import batch, make_decoder, model_logits, quick, rows  # noqa: E402

import lrp_core  # noqa: E402
from lrp_core.adapters import get_adapter  # noqa: E402
from lrp_core.adapters.blocks import NO_RECORD, MoeSpec, Replay, moe_forward  # noqa: E402
from lrp_core.adapters.gpt_oss import AttentionSinks, GptOssAdapter  # noqa: E402
from lrp_core.errors import UnsupportedModelError  # noqa: E402
from lrp_core.methods.registry import DECODER_METHODS  # noqa: E402
from lrp_core.rules import composites as C  # noqa: E402

TOL = 1e-10  # float64, relative to the row's largest |score|


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs().max() / b.abs().max().clamp(min=1e-300)).detach())


# ----------------------------------------------------------------------------- the replay is the model
@pytest.mark.parametrize("head", ["causal", "seq"])
def test_replay_logits_equal_the_models_own(head):
    model = make_decoder("gpt_oss", head=head)
    adapter = get_adapter(model)
    assert isinstance(adapter, GptOssAdapter) and all(isinstance(s.mlp, MoeSpec) for s in adapter.blocks)
    assert [s.attn.window for s in adapter.blocks] == [4, None]  # sliding, then full
    seqs = rows(lengths=(5, 9, 20))  # 20 > the window and > YaRN's original 16 positions
    alone = torch.cat([model_logits(model, batch([s])) for s in seqs])
    for side in ("left", "right"):
        inputs = batch(seqs, side)
        got = adapter.forward(adapter.check_inputs(inputs)).logits
        assert _rel(got, alone) < 1e-12, (side, _rel(got, alone))
        assert _rel(got, model_logits(model, inputs)) < 1e-12


def test_float32_replay_equals_the_float32_model():
    model = make_decoder("gpt_oss", dtype=torch.float32)
    adapter = get_adapter(model)
    inputs = batch(rows(), "left")
    assert _rel(adapter.forward(adapter.check_inputs(inputs)).logits, model_logits(model, inputs)) < 1e-6


def test_attention_map_is_the_softmax_without_the_sink_column():
    """A of every block is the model's own attention weights (``output_attentions``: the sink column dropped), and
    each real row sums to 1 minus the sink's share ``exp(s_h) / (exp(s_h) + Σ_j exp(score_j))``."""
    model = make_decoder("gpt_oss")
    inputs = batch(rows(), "right")
    adapter = get_adapter(model)
    trace = adapter.forward(adapter.check_inputs(inputs))
    mask = inputs["attention_mask"]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        theirs = model(**inputs, position_ids=pos, output_attentions=True).attentions
    real = mask.bool()[:, None, :, None] & mask.bool()[:, None, None, :]  # (B, 1, T, T) real query and key
    for rec, ref in zip(trace.blocks, theirs):
        A = rec.attn.A
        assert _rel(A.masked_select(real), ref.masked_select(real)) < 1e-13
        rows_real = A.sum(-1).masked_select(mask.bool()[:, None, :])
        assert (rows_real < 1).all() and float(rows_real.min()) < 0.5  # the sink takes mass
    sinks = model.model.layers[0].self_attn.sinks
    with torch.no_grad():
        scores = torch.randn(1, 4, 3, 3, dtype=torch.float64)
        A = AttentionSinks(model.model.layers[0].self_attn)(scores)
        share = sinks.exp()[None, :, None] / (sinks.exp()[None, :, None] + scores.exp().sum(-1))
    assert torch.allclose(A.sum(-1), 1 - share, rtol=1e-13, atol=0)


def test_routing_is_the_models_top_k_of_the_logits_then_their_softmax():
    """The replay's choice and weights are the router's own (``GptOssTopKRouter``: top-k of the biased logits, the
    softmax over those k), bit for bit."""
    model = make_decoder("gpt_oss")
    adapter = get_adapter(model)
    prepared = adapter.check_inputs(batch(rows(), "right"))
    trace = adapter.forward(prepared)
    for layer, rec in zip(model.model.layers, trace.blocks):
        with torch.no_grad():
            _, scores, indices = layer.mlp.router(rec.m.reshape(-1, rec.m.shape[-1]))
        assert torch.equal(rec.moe.chosen, indices) and torch.equal(rec.moe.weights, scores)


def test_clamps_bind_and_the_expert_replay_is_the_models_expert():
    """With limit 1, gate and up are clamped on many entries; one expert's replay (gate first, up + 1 carried in the
    bias, the shifted clamp) equals ``GptOssExperts``'s own arithmetic bit for bit."""
    model = make_decoder("gpt_oss")
    experts = model.model.layers[0].mlp.experts
    spec = get_adapter(model).blocks[0].mlp.experts[2]
    x = torch.randn(12, 32, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    with torch.no_grad():
        gate_up = x @ experts.gate_up_proj[2] + experts.gate_up_proj_bias[2]
        theirs = experts._apply_gate(gate_up) @ experts.down_proj[2] + experts.down_proj_bias[2]
        from lrp_core.adapters.blocks import _mlp_run

        ours = _mlp_run(spec, x, NO_RECORD).lin["fc2"]
    assert (gate_up[:, 0::2] > 1).float().mean() > 0.1 and (gate_up[:, 1::2].abs() > 1).float().mean() > 0.1
    assert torch.equal(ours, theirs)


# ----------------------------------------------------------------------------- every method, batch-invariant
@pytest.mark.parametrize("method", DECODER_METHODS)
def test_every_method_left_right_alone(method):
    model = make_decoder("gpt_oss")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    seqs = rows(lengths=(5, 8))
    left, right = batch(seqs, "left"), batch(seqs, "right")
    el, er = (lrp_core.explain(model, b, method=method, **quick(method)) for b in (left, right))
    for exp, inputs in ((el, left), (er, right)):
        assert exp.scores.shape == inputs["input_ids"].shape
        assert torch.isfinite(exp.scores).all()
        assert (exp.scores[inputs["attention_mask"] == 0] == 0).all()
    for i, s in enumerate(seqs):
        one = lrp_core.explain(model, batch([s]), method=method, **quick(method)).scores[0]
        scale = one.abs().max().clamp(min=1e-12)
        for exp, inputs in ((el, left), (er, right)):
            got = exp.scores[i][inputs["attention_mask"][i].bool()]
            assert float((got - one).abs().max() / scale) < TOL, (method, i)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not model.training and all(p.grad is None for p in model.parameters())


# ----------------------------------------------------------------------------- conservation and the rules
def _constants_off(model: torch.nn.Module, up_bias: float) -> torch.nn.Module:
    """Every bias 0 (q/k/v/o, router, experts), except the experts' up biases set to ``up_bias``: −1 cancels the
    ``+ 1`` of ``up + 1`` (the up projection's bias in the replay is ``b_up + 1``). The sinks stay."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj_bias[:, 1::2] = up_bias
    return model


def test_cp_lrp_conserves_once_the_up_shift_is_cancelled():
    """CP-LRP detaches the routing weights, the gates and the attention weights (the sinks only scale A): with every
    additive constant 0 — the ``+ 1`` of ``up + 1`` included, cancelled by an up bias of −1 — Σ scores = y_t up to
    the float32 RMSNorm's round-off and the clamps' identity-rule stabiliser. With the ``+ 1`` left in place it
    absorbs its share (a constant, like a bias), and the sum is not y_t."""
    inputs = batch(rows(), "left")
    exp = lrp_core.explain(_constants_off(make_decoder("gpt_oss"), -1.0), inputs, method="cp_lrp")
    y = exp.logits.gather(1, exp.target[:, None]).squeeze(1)
    assert torch.allclose(exp.scores.sum(-1), y, rtol=1e-6, atol=0)
    shifted = lrp_core.explain(_constants_off(make_decoder("gpt_oss"), 0.0), inputs, method="cp_lrp")
    y = shifted.logits.gather(1, shifted.target[:, None]).squeeze(1)
    assert not torch.allclose(shifted.scores.sum(-1), y, rtol=1e-3, atol=0)
    # AttnLRP sends half of each routed product's relevance into the router (not detached): it does not conserve
    a = lrp_core.explain(_constants_off(make_decoder("gpt_oss"), -1.0), inputs, method="attnlrp")
    y = a.logits.gather(1, a.target[:, None]).squeeze(1)
    assert not torch.allclose(a.scores.sum(-1), y, rtol=1e-3)


@pytest.mark.parametrize("composite", [C.ATTNLRP, C.CP_LRP])
def test_clamped_entries_pass_their_relevance_whole(composite):
    """The clamps are element-wise non-linearities under the identity rule: the relevance of the clamped up
    (``clamp(u + 1)``) equals that of the up projection's output ``u + 1`` entry by entry, clamped entries included
    (up to the rule's stabiliser, 1e-10 / |x| relative: 1.2e-8 at the smallest |u + 1| here), and the gate's likewise
    under AttnLRP. (A plain gradient would give the clamped entries none: a constant.)"""
    model = make_decoder("gpt_oss")
    spec = get_adapter(model).blocks[0].mlp
    x = torch.randn(12, 32, generator=torch.Generator().manual_seed(4), dtype=torch.float64, requires_grad=True)
    kept = {}

    def keep(name, t):
        t.retain_grad()
        kept[name] = t

    from lrp_core.adapters import blocks

    expert = spec.experts[1]
    rec = blocks._mlp_run(expert, x, Replay(composite))
    F_ = rec.up.shape[-1]
    pre = rec.lin["fc1"]
    pre.retain_grad()
    for n, t in (("up", rec.up), ("gate", rec.gate)):
        keep(n, t)
    seed = torch.randn(rec.lin["fc2"].shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    (rec.lin["fc2"] * seed).sum().backward()
    R_pre = (pre * pre.grad).detach()
    R_up = (kept["up"] * kept["up"].grad).detach()
    clamped = (pre[:, F_:] > 2) | (pre[:, F_:] < 0)  # u + 1 outside [1 − L, 1 + L], L = 1
    assert clamped.any()
    assert (R_up[clamped] != 0).any()
    assert torch.allclose(R_pre[:, F_:], R_up, rtol=1e-6, atol=1e-12)
    if composite is C.ATTNLRP:
        R_gate = (kept["gate"] * kept["gate"].grad).detach()
        assert (pre[:, :F_] > 1).any()
        assert torch.allclose(R_pre[:, :F_], R_gate, rtol=1e-6, atol=1e-12)
    else:  # CP-LRP: the gate is a constant
        assert kept["gate"].grad is None or torch.equal(R_pre[:, :F_], torch.zeros_like(R_pre[:, :F_]))


def test_sinks_change_the_maps_and_take_no_relevance():
    """The sinks are part of the function (changing one changes the logits and the AttnLRP map), they are constants
    of the relevance pass (no gradient reaches the parameter)."""
    model = make_decoder("gpt_oss")
    inputs = batch(rows(), "right")
    base = lrp_core.explain(model, inputs, method="attnlrp")
    assert model.model.layers[0].self_attn.sinks.grad is None
    with torch.no_grad():
        model.model.layers[1].self_attn.sinks.add_(2.0)
    moved = lrp_core.explain(model, inputs, method="attnlrp")
    assert not torch.allclose(moved.logits, base.logits) and not torch.allclose(moved.scores, base.scores)


def test_an_expert_that_receives_no_token_changes_no_map():
    model = make_decoder("gpt_oss")
    adapter = get_adapter(model)
    for seed in range(100):
        inputs = batch(rows(seed, lengths=(3, 4)), "right")
        unused = sorted(
            set(range(4)) - set(adapter.forward(adapter.check_inputs(inputs)).blocks[1].moe.chosen.unique().tolist())
        )
        if unused:
            break
    assert unused, "no batch of the search leaves an expert without a token"

    def perturbed(expert: int) -> torch.nn.Module:
        import copy

        other = copy.deepcopy(model)
        with torch.no_grad():
            ex = other.model.layers[1].mlp.experts
            ex.gate_up_proj[expert].mul_(-3.0)
            ex.down_proj_bias[expert].add_(0.5)
        return other

    for method in ("attnlrp", "cp_lrp", "lrp", "transformer_attribution"):
        a, b = (lrp_core.explain(m, inputs, method=method).scores for m in (model, perturbed(unused[0])))
        assert torch.equal(a, b), method
    used = adapter.forward(adapter.check_inputs(inputs)).blocks[1].moe.chosen[0, 0].item()
    assert not torch.allclose(
        lrp_core.explain(perturbed(used), inputs, method="attnlrp").scores,
        lrp_core.explain(model, inputs, method="attnlrp").scores,
    )


def test_name_patterns_reach_the_expert_and_router_views():
    model = make_decoder("gpt_oss")
    names = set(get_adapter(model).module_names.values())
    assert {
        "model.layers.1.mlp.experts.3.gate_up_proj",
        "model.layers.1.mlp.experts.3.down_proj",
        "model.layers.1.mlp.router",
    } <= names


def test_moe_forward_runs_only_the_chosen_experts():
    model = make_decoder("gpt_oss")
    spec = get_adapter(model).blocks[0].mlp
    x = torch.randn(7, 32, dtype=torch.float64)
    rec = moe_forward(spec, x)
    assert sum(run.tokens.numel() for run in rec.runs) == 7 * 2
    with torch.no_grad():
        ref, _ = model.model.layers[0].mlp(x[None])
    assert _rel(rec.out, ref[0]) < 1e-14


def test_other_heads_of_gpt_oss_are_refused():
    import transformers as T
    from decoders import GPT_OSS

    with torch.device("meta"):
        tokens = T.GptOssForTokenClassification(T.GptOssConfig(**GPT_OSS))
    with pytest.raises(UnsupportedModelError, match="mixture-of-experts"):
        get_adapter(tokens)
