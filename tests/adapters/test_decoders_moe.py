"""Mixture-of-experts decoders: Qwen3-MoE, Qwen2-MoE (shared expert), Mixtral, OLMoE (docs/METHODS.md §2c.4).

Tiny seeded models (tests/decoders.py: hidden 32, 2 blocks, 4 experts, top-2), float64. What is checked:
* the replay's logits are the model's own (eager and sdpa, LM head and classifier, padded left / right);
* every method of the registry runs, is finite, scores padding 0 and gives a row the same map padded left, right
  or alone; the model is bit-identical after;
* CP-LRP conserves on a model without additive constants (routing weights and gates detached);
* the explicit rules of the block (the per-token normalised sum, the routing scatter, the broadcast product);
* only the chosen experts run, on their tokens; an expert that receives no token, and the experts a top-k tie
  leaves out, change no map.
(Qwen3-MoE's AttnLRP against LXT: tests/adapters/test_decoders_lxt.py; GPT-OSS: test_decoders_gpt_oss.py; the
mixtures still refused: test_decoder_refusals.py.)
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from decoders import MOE_FAMILIES, batch, f64_bound, make_decoder, model_logits, quick, rows  # noqa: E402

import lrp_core  # noqa: E402
from lrp_core.adapters import get_adapter  # noqa: E402
from lrp_core.adapters.blocks import MoeSpec  # noqa: E402
from lrp_core.methods.registry import DECODER_METHODS  # noqa: E402
from lrp_core.rules import composites as C  # noqa: E402
from lrp_core.rules import functional as F  # noqa: E402
from lrp_core.rules.ops import Op  # noqa: E402

TOL = 1e-10  # float64, relative to the row's largest |score|
#: the relevance methods whose maps read the MLP (the layer-product methods read the attention only)
RELEVANCE = ("attnlrp", "cp_lrp", "lrp", "transformer_attribution", "partial_lrp")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs().max() / b.abs().max().clamp(min=1e-300)).detach())


def _experts(model) -> list:
    return [layer.mlp.experts for layer in model.model.layers]


# ----------------------------------------------------------------------------- the replay is the model
HEADS = [(f, h) for f in MOE_FAMILIES for h in ("causal", "seq") if h == "causal" or f != "olmoe"]


@pytest.mark.parametrize("family,head", HEADS)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_replay_logits_equal_the_models_own(family, attn, head):
    model = make_decoder(family, attn, head=head)
    adapter = get_adapter(model)
    assert all(isinstance(spec.mlp, MoeSpec) for spec in adapter.blocks)
    seqs = rows()
    alone = torch.cat([model_logits(model, batch([s])) for s in seqs])
    for side in ("left", "right"):
        inputs = batch(seqs, side)
        got = adapter.forward(adapter.check_inputs(inputs)).logits
        assert _rel(got, alone) < f64_bound(model, 1e-12), (side, _rel(got, alone))
        ref = model_logits(model, inputs)
        finite = torch.isfinite(ref).all(-1)  # HF eager float64: fully masked padding rows may give NaN
        assert _rel(got[finite], ref[finite]) < f64_bound(model, 1e-12)


def test_dense_layers_of_a_sparse_model_keep_the_gated_mlp():
    """Qwen3-MoE's ``mlp_only_layers``: layer 0 dense, layer 1 a mixture; the replay is still the model."""
    model = make_decoder("qwen3_moe", mlp_only_layers=[0])
    adapter = get_adapter(model)
    assert not isinstance(adapter.blocks[0].mlp, MoeSpec) and isinstance(adapter.blocks[1].mlp, MoeSpec)
    inputs = batch(rows(), "right")
    assert _rel(adapter.forward(adapter.check_inputs(inputs)).logits, model_logits(model, inputs)) < 1e-12


# ----------------------------------------------------------------------------- every method, batch-invariant
@pytest.mark.parametrize("family", MOE_FAMILIES)
@pytest.mark.parametrize("method", DECODER_METHODS)
def test_every_method_left_right_alone(family, method):
    model = make_decoder(family)
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


# ----------------------------------------------------------------------------- conservation
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_cp_lrp_conserves_without_additive_constants(family):
    """CP-LRP detaches the routing weights, the shared expert's gate and every expert's gate: the rest is linear
    in the embeddings, so with no bias (Qwen2-MoE's q/k/v biases zeroed) Σ scores = y_t up to the float32
    round-off of the model's own RMSNorm (as for the dense decoders)."""
    model = make_decoder(family)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    exp = lrp_core.explain(model, batch(rows(), "left"), method="cp_lrp")
    y = exp.logits.gather(1, exp.target[:, None]).squeeze(1)
    assert torch.allclose(exp.scores.sum(-1), y, rtol=1e-6, atol=0)
    # AttnLRP sends half of each routed product's relevance into the router (not detached): it does not conserve
    a = lrp_core.explain(model, batch(rows(), "left"), method="attnlrp")
    assert not torch.allclose(a.scores.sum(-1), y, rtol=1e-3)


def test_normalised_sum_conserves_per_token_and_bounds_each_share():
    g = torch.Generator().manual_seed(0)
    tokens = torch.tensor([0, 1, 0, 2, 1, 2, 0, 1, 2])  # 3 tokens, 3 operands each, interleaved
    parts = torch.randn(9, 6, generator=g, dtype=torch.float64)
    out = torch.zeros(3, 6, dtype=torch.float64).index_add(0, tokens, parts)
    R = torch.randn(3, 6, generator=g, dtype=torch.float64)
    Rp = F.sum_normalized(parts, tokens, R, out)
    per_token = torch.zeros(3, dtype=torch.float64).index_add(0, tokens, Rp.sum(-1))
    assert torch.allclose(per_token, R.sum(-1), rtol=1e-12)
    share = Rp.sum(-1) / R.sum(-1)[tokens]
    assert (share.abs() <= 1 + 1e-12).all()
    generic = F.sum_generic(parts, tokens, R, out)  # the LRP baseline: each operand its share of R_t
    assert torch.allclose(generic, parts * R[tokens] / (out[tokens] + F.EPS), rtol=1e-12)
    (Rn, _), (Rg, _) = (
        rule.relevance(Op(C.EXPERT_SUM, (parts, tokens), out), R) for rule in (C.NormalizedSum(), C.GenericSum())
    )
    assert torch.equal(Rn, Rp) and torch.equal(Rg, generic)


def test_routing_rule_gives_the_chosen_logits_their_weights_relevance_and_the_product_halves():
    logits = torch.randn(4, 5, dtype=torch.float64)
    chosen = torch.tensor([[1, 3], [0, 4], [2, 1], [3, 0]])
    R = torch.randn(4, 2, dtype=torch.float64)
    R_logits, _ = C.Routing().relevance(Op(C.ROUTE, (logits, chosen)), R)
    assert torch.equal(R_logits.gather(1, chosen), R) and R_logits.abs().sum() == R.abs().sum()
    (R_gate,) = C.Routing().relevance(Op(C.ROUTE, (logits[:, :1],)), R[:, :1])  # the shared expert's gate
    assert torch.equal(R_gate, R[:, :1])
    w, y = torch.rand(4, 1, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    Rz = torch.randn(4, 3, dtype=torch.float64)
    Rw, Ry = C.HalvedProduct().relevance(Op(C.GATE_MUL, (w, y)), Rz)
    z = w * y
    assert Rw.shape == w.shape and torch.allclose(Rw[:, 0], Ry.sum(-1), rtol=1e-12)
    assert torch.allclose(Rw.sum() + Ry.sum(), (Rz * z / (z + F.EPS)).sum(), rtol=1e-12)


def test_explicit_pass_conserves_through_the_block_up_to_the_router():
    """lrp (generic sums, signed Linear rules without biases): each block's input gets its output's relevance up
    to the attention and router shares the rules keep (no NaN, padding 0 in every block)."""
    model = make_decoder("qwen3_moe")
    inputs = batch(rows(), "left")
    exp = lrp_core.explain(model, inputs, method="lrp")
    assert torch.isfinite(exp.scores).all() and (exp.scores[inputs["attention_mask"] == 0] == 0).all()
    pad = inputs["attention_mask"][:, None].expand_as(exp.token_relevance) == 0
    assert (exp.token_relevance[pad] == 0).all()


# ----------------------------------------------------------------------------- only the chosen experts
def test_only_the_chosen_experts_run_on_their_tokens():
    model = make_decoder("qwen2_moe")
    adapter = get_adapter(model)
    prepared = adapter.check_inputs(batch(rows(), "left"))
    trace = adapter.forward(prepared)
    T = prepared.input_ids.numel()
    for rec in trace.blocks:
        moe = rec.moe
        assert sum(run.tokens.numel() for run in moe.runs) == T * 2  # top-2: T·k expert rows, not T·E
        for run in moe.runs:
            assert torch.equal(moe.chosen[run.tokens, run.slots], torch.full_like(run.tokens, run.expert))
            assert run.mlp.m.shape[0] == run.tokens.numel()
        assert moe.parts.shape[0] == T * 2 + T  # the shared expert: one more summand per token


def _perturbed_expert(model, layer: int, expert: int) -> torch.nn.Module:
    import copy

    other = copy.deepcopy(model)
    with torch.no_grad():
        ex = other.model.layers[layer].mlp.experts
        ex.gate_up_proj[expert].mul_(-3.0)
        ex.down_proj[expert].add_(0.5)
    return other


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_an_expert_that_receives_no_token_changes_no_map(family):
    """Short rows leave an expert of block 1 without a token (the first such batch of a seeded search): changing
    that expert's weights changes neither the model's logits nor any relevance map."""
    model = make_decoder(family)
    adapter = get_adapter(model)
    for seed in range(100):
        inputs = batch(rows(seed, lengths=(3, 4)), "right")
        unused = sorted(
            set(range(4)) - set(adapter.forward(adapter.check_inputs(inputs)).blocks[1].moe.chosen.unique().tolist())
        )
        if unused:
            break
    assert unused, "no batch of the search leaves an expert without a token"
    other = _perturbed_expert(model, 1, unused[0])
    assert torch.allclose(model_logits(model, inputs), model_logits(other, inputs), rtol=0, atol=0, equal_nan=True)
    for method in RELEVANCE:
        a, b = (lrp_core.explain(m, inputs, method=method).scores for m in (model, other))
        assert torch.equal(a, b), method
    # a used expert's weights do change the maps (the comparison can fail)
    used = adapter.forward(adapter.check_inputs(inputs)).blocks[1].moe.chosen[0, 0].item()
    assert not torch.allclose(
        lrp_core.explain(_perturbed_expert(model, 1, used), inputs, method="attnlrp").scores,
        lrp_core.explain(model, inputs, method="attnlrp").scores,
    )


def test_top_k_ties_follow_the_models_choice_and_leave_the_others_out():
    """A router of zeros (Hugging Face's initialisation) ties every expert for every token: the replay takes the
    experts ``torch.topk`` gives the model (the same logits), the experts left out change no map, and a chosen
    one does."""
    model = make_decoder("qwen3_moe")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.zero_()
    inputs = batch(rows(), "right")  # (HF eager float64 gives NaN rows under left padding)
    adapter = get_adapter(model)
    got = adapter.forward(adapter.check_inputs(inputs))
    assert _rel(got.logits, model_logits(model, inputs)) < 1e-12
    chosen = {e for rec in got.blocks for e in rec.moe.chosen.unique().tolist()}
    left_out = sorted(set(range(4)) - chosen)
    assert left_out and len(chosen) == 2  # every token chose the same two tied experts
    for method in RELEVANCE:
        base = lrp_core.explain(model, inputs, method=method).scores
        assert torch.isfinite(base).all()
        assert torch.equal(
            lrp_core.explain(_perturbed_expert(model, 1, left_out[0]), inputs, method=method).scores, base
        ), method
        assert not torch.allclose(
            lrp_core.explain(_perturbed_expert(model, 1, min(chosen)), inputs, method=method).scores, base
        ), method


# ----------------------------------------------------------------------------- names
def test_name_patterns_reach_the_experts_and_the_router():
    """A composite's name patterns see the expert and router views by the names of the weights they read."""
    from lrp_core.rules import GammaGradient

    model = make_decoder("qwen3_moe")
    names = set(get_adapter(model).module_names.values())
    assert {
        "model.layers.1.mlp.experts.3.gate_up_proj",
        "model.layers.1.mlp.experts.3.down_proj",
        "model.layers.1.mlp.gate",
    } <= names
    inputs = batch(rows(), "right")
    plain = lrp_core.explain(model, inputs, method="attnlrp").scores
    gamma = lrp_core.explain(
        model,
        inputs,
        method="attnlrp",
        composite=C.ATTNLRP.with_rules(by_name={"*.mlp.experts.*": GammaGradient(0.25)}),
    ).scores
    assert torch.isfinite(gamma).all() and not torch.allclose(gamma, plain)
