"""Parallel blocks (GPT-NeoX / Pythia, Phi-1/2, Falcon), soft-capping (Gemma 2) and post-norm blocks with
whole-projection q/k norms (OLMo-2 / OLMo-3): the pieces of docs/METHODS.md §2f.

The properties every decoder has for GPT-NeoX, Phi and Falcon's default tiny configs are tested in
test_decoders_gpt2.py; here: the n-operand Add rules, the variants of each family's config (sequential GPT-NeoX,
Falcon's original / multi-query / one-norm layouts), and Gemma 2 and OLMo-2/3 (Gemma 2 runs eager attention only).
Tiny seeded models, float64 unless the model's own eager float64 forward cannot be compared (NaN rows of a sliding
window: transformers' mask minimum overflows there, see test_decoders_gpt2.py).
"""

from __future__ import annotations

import pytest
import torch
from decoders import VOCAB, batch, f64_bound, model_logits, perturb, quick, rows
from untouched import assert_untouched, snapshot

from lrp_core import explain
from lrp_core.adapters import get_adapter
from lrp_core.adapters.kernels import SoftCap
from lrp_core.methods.registry import DECODER_METHODS
from lrp_core.rules import functional as F
from lrp_core.rules.composites import TRANSFORMER_ATTRIBUTION
from lrp_core.rules.explicit import GenericAdd, NormalizedAdd
from lrp_core.rules.ops import ADD, Op


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def _build(cls: str, config: str, dtype=torch.float64, **kw) -> torch.nn.Module:
    import transformers as T

    torch.manual_seed(0)
    common = dict(
        vocab_size=VOCAB,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    return perturb(getattr(T, cls)(getattr(T, config)(**{**common, **kw})), 0).to(dtype).eval()


def _zero_biases(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    return model


# ---------------------------------------------------------------- the n-operand Add (§2f)
@pytest.mark.parametrize("seed", range(5))
def test_three_operand_normalised_add_conserves_with_shares_in_zero_one(seed):
    g = torch.Generator().manual_seed(seed)
    zs = [torch.randn(2, 5, 8, generator=g, dtype=torch.float64) for _ in range(3)]
    R = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)
    out = zs[1] + zs[2] + zs[0]
    shares = NormalizedAdd().relevance(Op(ADD, tuple(zs), out), R)
    sums = torch.stack([s.sum((1, 2)) for s in shares])  # (3, B)
    total = R.sum((1, 2))
    assert torch.allclose(sums.sum(0), total, rtol=1e-8, atol=0)  # per sample, up to the stabiliser (1e-9)
    frac = sums / total
    assert (frac >= -1e-12).all() and (frac <= 1 + 1e-12).all()
    # the pattern inside each operand is the generic rule's: z_i ⊙ R / Σ z, rescaled by one factor per sample
    generic = GenericAdd().relevance(Op(ADD, tuple(zs), out), R)
    for s, q in zip(shares, generic):
        ratio = s / q
        assert torch.allclose(ratio, ratio[:, :1, :1].expand_as(ratio), rtol=1e-8)
    # the generic shares conserve up to the stabiliser
    assert torch.allclose(sum(generic), R * out / (out + F.EPS), rtol=1e-12)


def test_two_operand_normalised_add_is_the_papers():
    g = torch.Generator().manual_seed(0)
    u, v, R = (torch.randn(3, 4, 6, generator=g, dtype=torch.float64) for _ in range(3))
    a = F.add_normalized(u, v, R)
    b = F.add_normalized_n([u, v], R)
    for x, y in zip(a, b):
        assert torch.allclose(x, y, rtol=1e-13, atol=1e-15)


def test_a_parallel_block_hands_its_add_the_three_operands():
    """transformer_attribution through Pythia's parallel blocks: each block's residual Add is one normalised add of
    (x, attn, mlp) — three operands, and the relevance of their sum conserved per sample (to round-off)."""
    seen = []

    class Spy(NormalizedAdd):
        def relevance(self, op, R, cache=None):
            out = super().relevance(op, R, cache)
            seen.append((len(op.inputs), float(sum(o.sum() for o in out).detach()), float(R.sum().detach())))
            return out

    model = _build(
        "GPTNeoXForCausalLM",
        "GPTNeoXConfig",
        hidden_size=32,
        intermediate_size=48,
        use_parallel_residual=True,
        attn_implementation="sdpa",
    )
    adapter = get_adapter(model)
    assert [b.layout for b in adapter.blocks] == ["parallel", "parallel"]
    prepared = adapter.check_inputs({"input_ids": rows()[1][None]})
    spied = TRANSFORMER_ATTRIBUTION.with_rules(by_kind={ADD: Spy()})
    trace = adapter.forward(prepared, composite=spied)
    R = torch.zeros_like(trace.logits)
    R[0, trace.logits[0].argmax()] = 1.0
    adapter.relprop(trace, R, spied, to_input=True, prepared=prepared)
    assert [n for n, _, _ in seen] == [3, 3]
    for _, got, want in seen:
        assert abs(got - want) <= 1e-8 * max(1.0, abs(want))


# ---------------------------------------------------------------- family variants: replay = model, batch = alone
NEOX = dict(
    hidden_size=32,
    intermediate_size=48,
    attention_bias=True,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
)
FALCON = dict(hidden_size=32, ffn_hidden_size=48, alibi=False, bias=True)
VARIANTS = {
    "gpt_neox sequential": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(NEOX, use_parallel_residual=False), "pre_ln"),
    "phi without q/k norms": (
        "PhiForCausalLM",
        "PhiConfig",
        dict(hidden_size=32, intermediate_size=48, num_key_value_heads=4, qk_layernorm=False),
        "parallel",
    ),
    "falcon original": (
        "FalconForCausalLM",
        "FalconConfig",
        dict(FALCON, new_decoder_architecture=False, multi_query=False, parallel_attn=True),
        "parallel",
    ),
    "falcon multi-query": (
        "FalconForCausalLM",
        "FalconConfig",
        dict(FALCON, new_decoder_architecture=False, multi_query=True, parallel_attn=True),
        "parallel",
    ),
    "falcon sequential": (
        "FalconForCausalLM",
        "FalconConfig",
        dict(FALCON, new_decoder_architecture=False, multi_query=False, parallel_attn=False),
        "pre_ln",
    ),
    "falcon new, one norm": (
        "FalconForCausalLM",
        "FalconConfig",
        dict(FALCON, new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1),
        "parallel",
    ),
    "olmo2": (
        "Olmo2ForCausalLM",
        "Olmo2Config",
        dict(hidden_size=32, intermediate_size=48, num_key_value_heads=2),
        "pre_ln",
    ),
    "olmo3": (
        "Olmo3ForCausalLM",
        "Olmo3Config",
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_key_value_heads=2,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
        ),
        "pre_ln",
    ),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_replay_is_the_model_and_each_row_is_explained_alone(name):
    cls, config, kw, layout = VARIANTS[name]
    model = _build(cls, config, attn_implementation="sdpa", **kw)
    adapter = get_adapter(model)
    assert adapter.blocks[0].layout == layout
    seqs = rows()
    for side in ("left", "right"):
        inputs = batch(seqs, side)
        with torch.no_grad():
            got = adapter.forward(adapter.check_inputs(inputs)).logits
        assert (got - model_logits(model, inputs)).abs().max() <= 1e-12, side
    before = snapshot(model)
    for method in ("attnlrp", "cp_lrp", "transformer_attribution", "lrp", "rollout"):
        alone = [explain(model, {"input_ids": s[None]}, method=method).scores[0] for s in seqs]
        for side in ("left", "right"):
            inputs = batch(seqs, side)
            exp = explain(model, inputs, method=method)
            mask = inputs["attention_mask"].bool()
            assert torch.isfinite(exp.scores).all() and (exp.scores[~mask] == 0).all(), (method, side)
            for i, one in enumerate(alone):
                assert _rel(exp.scores[i][mask[i]], one) <= 1e-8, (name, method, side, i)
    assert_untouched(before, snapshot(model))
    # CP-LRP conserves the logit without additive constants (the identity rule's 1e-10 stabiliser aside; OLMo's
    # RMSNorms compute in float32)
    exp = explain(_zero_biases(model), batch(seqs, "left"), method="cp_lrp")
    y = exp.logits.gather(1, exp.target[:, None])[:, 0]
    assert ((exp.scores.sum(1) - y).abs() / y.abs()).max() <= (1e-5 if "olmo" in name else 1e-8)


def test_olmo_q_k_norms_act_on_the_whole_projection():
    model = _build("Olmo2ForCausalLM", "Olmo2Config", hidden_size=32, intermediate_size=48, num_key_value_heads=2)
    spec, layer = get_adapter(model).blocks[0], model.model.layers[0]
    assert spec.attn.norm_whole and spec.attn.q_norm is layer.self_attn.q_norm
    assert spec.attn.q_norm.weight.numel() == 32 and spec.attn.k_norm.weight.numel() == 16  # 4 and 2 heads of 8
    assert spec.post1 is layer.post_attention_layernorm and spec.post2 is layer.post_feedforward_layernorm
    assert isinstance(spec.norm1, torch.nn.Identity) and isinstance(spec.norm2, torch.nn.Identity)


def test_falcon_with_alibi_is_refused():
    from lrp_core.errors import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="alibi"):
        get_adapter(_build("FalconForCausalLM", "FalconConfig", dtype=torch.float32, **dict(FALCON, alibi=True)))


# ---------------------------------------------------------------- Gemma 2: soft-capping
GEMMA2 = dict(
    hidden_size=32,
    intermediate_size=48,
    num_key_value_heads=2,
    head_dim=8,
    query_pre_attn_scalar=12,
    sliding_window=4,
    layer_types=["sliding_attention", "full_attention"],
    attn_implementation="eager",
    attn_logit_softcapping=2.0,
    final_logit_softcapping=3.0,
)


def _gemma2(dtype=torch.float64, head: str = "causal", **kw) -> torch.nn.Module:
    cls = "Gemma2ForCausalLM" if head == "causal" else "Gemma2ForSequenceClassification"
    return _build(cls, "Gemma2Config", dtype=dtype, **{**GEMMA2, **kw})


@pytest.mark.parametrize("head", ["causal", "seq"])
def test_gemma2_replay_is_the_model_with_both_caps(head):
    """float32 (the model's eager float64 forward is NaN on sliding-window padding rows). The caps matter: the
    scores reach the cap (|logits| close to 3) and a replay without the attention cap is far off."""
    model = _gemma2(torch.float32, head)
    adapter = get_adapter(model)
    assert all(isinstance(b.attn.softcap, SoftCap) and b.attn.softcap.cap == 2.0 for b in adapter.blocks)
    for side in ("left", "right"):
        inputs = batch(rows(), side)
        expected = model_logits(model, inputs)
        with torch.no_grad():
            got = adapter.forward(adapter.check_inputs(inputs)).logits
        assert (got - expected).abs().max() <= 1e-5, side
    if head == "causal":
        assert expected.abs().max() <= 3.0 and expected.abs().max() > 2.5  # the final cap is active
        for b in adapter.blocks:
            b.attn.softcap = None
        with torch.no_grad():
            uncapped = adapter.forward(adapter.check_inputs(inputs)).logits
        assert (uncapped - expected).abs().max() > 1e-2


@pytest.mark.parametrize("head", ["causal", "seq"])
def test_gemma2_every_method_gives_each_row_its_own_map_and_leaves_the_model(head):
    model = _gemma2(head=head)
    seqs = rows()
    before = snapshot(model)
    for method in DECODER_METHODS:
        alone = [explain(model, {"input_ids": s[None]}, method=method, **quick(method)).scores[0] for s in seqs]
        for side in ("left", "right"):
            inputs = batch(seqs, side)
            exp = explain(model, inputs, method=method, **quick(method))
            mask = inputs["attention_mask"].bool()
            assert torch.isfinite(exp.scores).all() and (exp.scores[~mask] == 0).all(), (method, side)
            for i, one in enumerate(alone):
                assert _rel(exp.scores[i][mask[i]], one) <= f64_bound(model, 1e-8), (method, side, i)
        assert_untouched(before, snapshot(model))


def test_gemma2_cp_lrp_conserves_the_capped_logit():
    """Bias-free (Gemma 2 has none): Σ scores = the capped logit the model outputs — the attention cap lies on the
    detached q·kᵀ path, the final cap takes the identity rule (to the float32 RMSNorm's round-off)."""
    model = _gemma2()
    exp = explain(model, batch(rows(), "left"), method="cp_lrp")
    y = exp.logits.gather(1, exp.target[:, None])[:, 0]
    assert y.abs().max() <= 3.0
    assert ((exp.scores.sum(1) - y).abs() / y.abs()).max() <= 1e-5


def test_gemma2_final_cap_takes_the_identity_rule():
    """AttnLRP with the final cap is the uncapped model's AttnLRP map times cap(z) / z for the explained logit z
    (the identity rule passes the capped logit's relevance unchanged through the cap; without it the factor would
    be the tanh's derivative 1 − tanh²(z/c), 0.2 … 0.6 here)."""
    capped, plain = _gemma2(), _gemma2(final_logit_softcapping=None)
    inputs = batch(rows(), "right")
    a = explain(capped, inputs, method="attnlrp")
    b = explain(plain, inputs, method="attnlrp", target=a.target)
    z = b.logits.gather(1, a.target[:, None])[:, 0]
    y = a.logits.gather(1, a.target[:, None])[:, 0]
    torch.testing.assert_close(y, 3.0 * torch.tanh(z / 3.0), rtol=1e-12, atol=0)
    factor = y / (z + 1e-10)
    # float64, but the gradient passes Gemma's RMSNorms in float32 (the model's arithmetic): a starting gradient
    # scaled by cap(z)/z rounds differently there (measured 1.0e-7)
    assert _rel(a.scores, b.scores * factor[:, None]) <= 1e-6


# ---------------------------------------------------------------- an unlisted parallel decoder: recognised, probed
def test_an_unlisted_parallel_decoder_is_recognised_and_checked_by_the_probe():
    """StableLM with use_parallel_residual (no row of its own): one input_layernorm feeding both branches, the sum
    ``(x + attn) + mlp``; the open recogniser replays it as a parallel block, the probe confirms it (before: refused
    by name as a parallel block)."""
    from lrp_core.adapters.recognise import OpenDecoderAdapter

    model = _build(
        "StableLmForCausalLM",
        "StableLmConfig",
        hidden_size=32,
        intermediate_size=48,
        num_key_value_heads=2,
        use_parallel_residual=True,
        attn_implementation="sdpa",
    )
    adapter = get_adapter(model)
    assert isinstance(adapter, OpenDecoderAdapter)
    assert all(b.layout == "parallel" and b.skip_first and b.norm2 is b.norm1 for b in adapter.blocks)
    for side in ("left", "right"):
        inputs = batch(rows(), side)
        with torch.no_grad():
            got = adapter.forward(adapter.check_inputs(inputs)).logits
        assert (got - model_logits(model, inputs)).abs().max() <= 1e-12, side
        exp = explain(model, inputs, method="transformer_attribution")
        assert torch.isfinite(exp.scores).all() and (exp.scores[inputs["attention_mask"] == 0] == 0).all()
