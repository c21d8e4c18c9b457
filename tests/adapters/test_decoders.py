"""Decoder language models (issue #22): Llama, Mistral, Qwen2, Qwen3 — causal LM and sequence classifier.

Tiny seeded models (tests/decoders.py), float64. What is checked:
* the replay's logits are the model's own (eager and sdpa, rows padded left / right vs each row alone);
* every method runs and a row's scores do not depend on its batch or its padding (left == right == alone);
* the explicit rules conserve where docs/METHODS.md §1 / §2c say so (RoPE, shared kv heads, gated product);
* CP-LRP on a Llama with every additive constant zeroed conserves exactly;
* sdpa (fused attention) and eager give the same AttnLRP / CP-LRP;
* bad inputs are clear errors.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from decoders import batch, f64_bound, make_decoder, model_logits, quick, rows  # noqa: E402

import lrp_core  # noqa: E402
from lrp_core.adapters import get_adapter  # noqa: E402
from lrp_core.errors import InputError  # noqa: E402
from lrp_core.methods.call import Contrast  # noqa: E402
from lrp_core.methods.registry import DECODER_METHODS, METHOD_NAMES  # noqa: E402
from lrp_core.rules import composites as C  # noqa: E402
from lrp_core.rules import explicit as X
from lrp_core.rules import functional as F  # noqa: E402
from lrp_core.rules import ops as O

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
TOL = 1e-10  # float64, relative to the row's largest |score|


def _real(scores: torch.Tensor, inputs: dict, i: int) -> torch.Tensor:
    return scores[i][inputs["attention_mask"][i].bool()]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs().max() / b.abs().max().clamp(min=1e-300)).detach())


# ----------------------------------------------------------------------------- the replay is the model
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("head", ["causal", "seq"])
def test_replay_logits_equal_the_models_own(family, attn, head):
    model = make_decoder(family, attn, head=head)
    seqs = rows()
    alone = torch.cat([model_logits(model, batch([s])) for s in seqs])
    adapter = get_adapter(model)
    for side in ("left", "right"):
        inputs = batch(seqs, side)
        got = adapter.forward(adapter.check_inputs(inputs)).logits
        assert _rel(got, alone) < f64_bound(model, 1e-12), (side, _rel(got, alone))
        ref = model_logits(model, inputs)
        # HF eager in float64 casts its float64-minimum mask to float32 (-inf): fully masked padding rows give
        # NaN, which then reaches real rows; the engine's mask keeps every row finite. Compare where HF is finite.
        finite = torch.isfinite(ref).all(-1)
        assert finite.any() or attn == "eager"
        assert _rel(got[finite], ref[finite]) < f64_bound(model, 1e-12)


def test_position_reads_another_token():
    model = make_decoder("llama")
    inputs = batch(rows(), "right")
    pos = torch.tensor([2, 4, 1])
    adapter = get_adapter(model)
    got = adapter.forward(adapter.at_position(adapter.check_inputs(inputs), pos.tolist())).logits
    assert _rel(got, model_logits(model, inputs, position=pos)) < 1e-12
    exp = lrp_core.explain(model, inputs, method="attnlrp", position=pos.tolist())
    y = model_logits(model, inputs, position=pos)
    assert torch.equal(exp.target, y.argmax(-1))
    assert (exp.scores[0, 3:] == 0).all()  # causal: tokens after the read position carry nothing


# ----------------------------------------------------------------------------- every method, batch-invariant
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("head", ["causal", "seq"])
def test_every_method_left_right_alone(family, head):
    model = make_decoder(family, "eager", head=head)
    seqs = rows()
    left, right = batch(seqs, "left"), batch(seqs, "right")
    for method in DECODER_METHODS:
        el, er = (lrp_core.explain(model, b, method=method, **quick(method)) for b in (left, right))
        for exp, inputs in ((el, left), (er, right)):
            assert exp.scores.shape == inputs["input_ids"].shape
            assert (exp.scores[inputs["attention_mask"] == 0] == 0).all(), method
        for i, s in enumerate(seqs):
            one = lrp_core.explain(model, batch([s]), method=method, **quick(method)).scores[0]
            scale = one.abs().max().clamp(min=1e-12)
            for exp, inputs in ((el, left), (er, right)):
                dev = float((_real(exp.scores, inputs, i) - one).abs().max() / scale)
                assert dev < f64_bound(model, TOL), (method, i)


def test_model_untouched_and_targets():
    model = make_decoder("qwen3", "sdpa")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    inputs = batch(rows(), "left")
    for method in DECODER_METHODS:
        lrp_core.explain(model, inputs, method=method, **quick(method))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not model.training and all(p.grad is None for p in model.parameters())
    exp = lrp_core.explain(model, inputs, method="cp_lrp", target=[5, 6, 7])
    assert exp.target.tolist() == [5, 6, 7]
    c = lrp_core.explain(model, inputs, method="cp_lrp", target=Contrast(5, 6))
    d = lrp_core.explain(model, inputs, method="cp_lrp", target=6)
    a5 = lrp_core.explain(model, inputs, method="cp_lrp", target=5)
    # CP-LRP is linear in the explained output, up to the float32 round-off the model's RMSNorm puts on the
    # gradient (Hugging Face computes it in float32 inside a float64 model; measured 1.4e-7)
    assert _rel(c.scores, a5.scores - d.scores) < 1e-5


# ----------------------------------------------------------------------------- sdpa == eager, fused
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", ["attnlrp", "cp_lrp"])
def test_sdpa_equals_eager(family, method):
    """The fused path (sdpa: q, k, v gradients ÷4/÷2 or q, k detached) = the eager ÷2 rules at q·kᵀ and A·v.

    Eager HF softmax runs in float32 (cast back), sdpa in float64: they agree to float32 round-off.
    """
    inputs = batch(rows(), "left")
    eager, sdpa = (lrp_core.explain(make_decoder(family, a), inputs, method=method) for a in ("eager", "sdpa"))
    assert _rel(sdpa.scores, eager.scores) < 1e-5
    # the fused replay keeps no attention map
    adapter = get_adapter(make_decoder(family, "sdpa"))
    trace = adapter.forward(adapter.check_inputs(inputs), grad=True, composite=C.ATTNLRP)
    assert all(rec.attn.A is None for rec in trace.blocks)


def test_fused_rules_equal_explicit_rules_in_float32_softmax_free_setting():
    """With the softmax in the input dtype (sdpa model, eager replay forced), fused == eager to round-off."""
    model = make_decoder("llama", "sdpa")
    adapter = get_adapter(model)
    prepared = adapter.check_inputs(batch(rows(), "right"))
    for comp in (C.ATTNLRP, C.CP_LRP):
        grads = []
        for fuse in (True, False):
            r = lrp_core.adapters.blocks.Replay(comp, fuse=fuse)
            emb = adapter.embed(prepared, r, track=True)
            tr = adapter.run_blocks(
                emb.x0,
                prepared["attention_mask"],
                r,
                readout=adapter.readout_for(prepared),
                positions=prepared["position_ids"],
            )
            y = tr.logits.max(-1).values.sum()
            grads.append((emb.embeds * torch.autograd.grad(y, emb.embeds)[0]).sum(-1))
        assert _rel(grads[0], grads[1]) < 1e-12


# ----------------------------------------------------------------------------- conservation
def _zero_additive_constants(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    return model


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_cp_lrp_conserves_without_additive_constants(family):
    """CP-LRP is exact gradient × input of a function that is linear given the detached factors: with no bias
    (Llama has none; Qwen2's q/k/v biases zeroed) Σ scores = y_t (float64) — up to the float32 round-off of the
    model's own RMSNorm (Hugging Face computes it in float32 and casts back; the rule keeps that arithmetic,
    as LXT does), which rounds the gradient at every norm: measured ≤ 1e-7 relative."""
    model = _zero_additive_constants(make_decoder(family))
    exp = lrp_core.explain(model, batch(rows(), "left"), method="cp_lrp")
    y = exp.logits.gather(1, exp.target[:, None]).squeeze(1)
    assert torch.allclose(exp.scores.sum(-1), y, rtol=1e-6, atol=0)
    assert torch.allclose(exp.conservation.blocks[:, -1], y, rtol=1e-6, atol=0)
    # the biases matter: with Qwen2's q/k/v biases kept, their share is missing well beyond round-off
    if family == "qwen2":
        kept = lrp_core.explain(make_decoder(family), batch(rows(), "left"), method="cp_lrp")
        y_kept = kept.logits.gather(1, kept.target[:, None]).squeeze(1)
        assert not torch.allclose(kept.scores.sum(-1), y_kept, rtol=1e-3)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), partial=st.booleans())
def test_rotary_rule_conserves(seed, partial):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64)
    r = 4 if partial else 8
    ang = torch.rand(2, 5, r // 2, generator=g, dtype=torch.float64) * 6
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    z = F.apply_rotary(x, cos, sin)
    R = torch.randn(z.shape, generator=g, dtype=torch.float64)
    (Rx, _, _) = X.Rotary().relevance(O.Op(O.ROPE, (x, cos, sin), z), R)
    # the generic rule of a bias-free linear map: Σ R_x = Σ R up to the stabiliser's share
    assert torch.allclose(Rx.sum(), (R * z / (z + F.EPS)).sum(), rtol=1e-10)
    # and Rotᵀ is the transpose: ⟨Rot x, s⟩ = ⟨x, Rotᵀ s⟩
    assert torch.allclose((z * R).sum(), (x * F.rotary_transpose(R, cos, sin)).sum(), rtol=1e-12)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), groups=st.sampled_from([1, 2, 4]))
def test_shared_heads_clone_and_gated_product_conserve(seed, groups):
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(2, 2, 5, 4, generator=g, dtype=torch.float64)
    R = torch.randn(2, 2 * groups, 5, 4, generator=g, dtype=torch.float64)
    (Rkv,) = X.SharedHeads().relevance(O.Op(O.KV_REPEAT, (kv,)), R)
    # Σ over the query heads sharing each kv head, formed as the Clone's x ⊙ Σ safe_div(R_g, x) (§5.2)
    # (one query head per kv head: nothing is shared, the relevance passes as is)
    expected = R if groups == 1 else R.reshape(2, 2, groups, 5, 4).sum(2) * kv / (kv + F.EPS)
    assert torch.allclose(Rkv, expected, rtol=1e-12)
    a, b = (torch.randn(3, 7, generator=g, dtype=torch.float64) for _ in range(2))
    Rz = torch.randn(3, 7, generator=g, dtype=torch.float64)
    Ra, Rb = X.HalvedProduct().relevance(O.Op(O.GATE_MUL, (a, b)), Rz)
    z = a * b
    # each operand gets half of the product's relevance (up to the stabiliser): the two halves conserve
    assert torch.equal(Ra, Rb)
    assert torch.allclose(Ra + Rb, Rz * z / (z + F.EPS), rtol=1e-12)


def test_lrp_pass_is_finite_and_padding_stays_zero():
    """The explicit pass through RoPE, shared heads and the gated product (exactness per operation: above): the
    masks' dtype minimum must not turn into inf / NaN, and padding positions get no relevance in any block."""
    model = make_decoder("llama")
    inputs = batch(rows(), "left")
    exp = lrp_core.explain(model, inputs, method="lrp")
    assert torch.isfinite(exp.scores).all() and (exp.scores[inputs["attention_mask"] == 0] == 0).all()
    assert (
        exp.token_relevance[:, :, :][inputs["attention_mask"][:, None].expand_as(exp.token_relevance) == 0] == 0
    ).all()


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "bad, match",
    [
        ({"input_ids": torch.zeros(2, 0, dtype=torch.long)}, "empty"),
        (
            {"input_ids": torch.tensor([[1, 2], [3, 4]]), "attention_mask": torch.tensor([[1, 1], [0, 0]])},
            "all padding",
        ),
        ({"input_ids": torch.tensor([[1, 200]])}, "vocabulary"),
        ("a text", "tokenized"),
    ],
)
def test_bad_inputs(bad, match):
    with pytest.raises(InputError, match=match):
        lrp_core.explain(make_decoder("llama"), bad, method="attnlrp")


def test_bad_targets_and_positions():
    model = make_decoder("llama")
    inputs = batch(rows(), "left")
    with pytest.raises(InputError):
        lrp_core.explain(model, inputs, method="attnlrp", target=96)  # the vocabulary is 0 … 95
    with pytest.raises(InputError, match="past the row"):
        lrp_core.explain(model, inputs, method="attnlrp", position=9)
    with pytest.raises(InputError, match="padding"):
        lrp_core.explain(model, inputs, method="attnlrp", position=0)
    with pytest.raises(InputError, match="one int per row"):
        lrp_core.explain(model, inputs, method="attnlrp", position=[1, 2])
    with pytest.raises(InputError, match="does not take"):
        lrp_core.explain(model, inputs, method="attnlrp", start_layer=1)


def test_position_refused_for_encoders():
    from by_path import root_fixtures  # the root conftest by path (tests/widgets has a conftest too)

    bert = root_fixtures().make_tiny_bert()
    ids = torch.tensor([[2, 5, 6, 3]])
    with pytest.raises(InputError, match="position"):
        lrp_core.explain(bert, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, method="attnlrp", position=1)


def test_every_method_runs_on_decoders():
    """Every method of the registry explains decoders (the Captum baselines included,
    tests/methods/test_baselines_decoders.py checks them); a method marked ``decoders=False`` is refused there
    (test_every_method_runs_on_decoders_and_...)."""
    assert set(METHOD_NAMES) == set(DECODER_METHODS)
