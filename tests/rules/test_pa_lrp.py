"""pa_lrp (PA-LRP, Bakish et al. 2025; docs/METHODS.md §2e): positions take relevance; conservation counts them."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_vit
from decoders import batch, f64_bound, make_decoder, rows

from lrp_core import explain
from lrp_core.errors import LRPError
from lrp_core.rules.functional import apply_rotary
from lrp_core.rules.gradient import PositionalRotary, PositionLeaves


def _zero_biases(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
    return model


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cp_base_conserves_tokens_plus_learned_positions(seed):
    """GPT-2 without biases under CP-LRP is linear in the embeddings: Σ tokens + Σ positions = the logit."""
    model = _zero_biases(make_decoder("gpt2", seed=seed))
    e = explain(model, batch(rows(seed + 1), "left"), method="pa_lrp", base="cp_lrp")
    c = e.conservation
    assert c.positional.abs().min() > 1e-3  # the positions do take a share
    assert torch.allclose(c.input + c.positional, c.output, rtol=0, atol=1e-8 * c.output.abs().max().item())
    assert torch.allclose(c.stages()[:, -1], c.output, atol=1e-8 * c.output.abs().max().item())
    # the per-token field is the masked positions' relevance: it sums to the total
    assert torch.allclose(e.positional.sum(-1), c.positional, atol=1e-12)


def test_rotary_rule_gives_positions_half():
    """At one RoPE step: R_x = R_y / 2 and R_cos + R_sin = R_y / 2 (the uniform rule on x·cos and rot(x)·sin)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64, requires_grad=True)
    ang = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)
    cos, sin = ang.cos(), ang.sin()
    w = torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64)
    leaves = PositionLeaves()
    y = PositionalRotary(leaves).forward(apply_rotary, x, cos, sin)
    assert torch.equal(y, apply_rotary(x, cos, sin))  # the value is the model's
    (y * w).sum().backward()
    R_y = (y * w).sum()
    R_x = (x * x.grad).sum()
    R_pos = sum((t * t.grad).sum() for t in leaves.leaves)
    assert torch.allclose(R_x, R_y / 2, atol=1e-12) and torch.allclose(R_pos, R_y / 2, atol=1e-12)


def test_rope_families_attnlrp_base_shares_and_cp_base_gives_none():
    model = make_decoder("llama")
    inp = batch(rows(), "left")
    e = explain(model, inp, method="pa_lrp")
    assert e.positional.abs().max() > 1e-3
    cp = explain(model, inp, method="pa_lrp", base="cp_lrp")
    ref = explain(model, inp, method="cp_lrp")
    # CP-LRP holds the attention weights constant: nothing reaches q, k, so the rotary tables get nothing
    assert torch.equal(cp.positional, torch.zeros_like(cp.positional))
    assert torch.allclose(cp.scores, ref.scores, atol=1e-12)


@pytest.mark.parametrize("family", ["llama", "gpt2", "phi3"])
def test_batch_equals_single_and_padding_sides(family):
    model = make_decoder(family)
    seqs = rows()
    left, right = (explain(model, batch(seqs, s), method="pa_lrp") for s in ("left", "right"))
    for i, s in enumerate(seqs):
        one = explain(model, {"input_ids": s[None]}, method="pa_lrp")
        n = len(s)
        for got in (left.positional[i, -n:], right.positional[i, :n]):
            assert torch.allclose(got, one.positional[0], atol=f64_bound(model, 1e-10))
        assert torch.allclose(left.scores[i, -n:], right.scores[i, :n], atol=f64_bound(model, 1e-10))
    assert torch.equal(
        left.positional[1:][batch(seqs, "left")["attention_mask"][1:] == 0],
        torch.zeros(int((batch(seqs, "left")["attention_mask"][1:] == 0).sum()), dtype=torch.float64),
    )


def test_vit_positions_and_model_untouched():
    model = make_tiny_vit().double()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = {k: p.requires_grad for k, p in model.named_parameters()}
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    e = explain(model, x, method="pa_lrp")
    assert e.positional.shape == e.scores.shape == (2, 16)
    ref = explain(model, x, method="attnlrp")  # an added embedding's plain gradient leaves tokens and pixels alone
    assert torch.allclose(e.scores, ref.scores, atol=1e-12) and torch.allclose(e.pixels, ref.pixels, atol=1e-12)
    single = explain(model, x[1:], method="pa_lrp")
    assert torch.allclose(e.positional[1], single.positional[0], atol=1e-12)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None and p.requires_grad == flags[k] for k, p in model.named_parameters())


def test_bad_options_and_models_without_positions_refused():
    model = make_decoder("llama")
    inp = batch(rows(), "left")
    with pytest.raises(LRPError, match="base must be one of"):
        explain(model, inp, method="pa_lrp", base="lrp")
    with pytest.raises(LRPError, match="does not take"):
        explain(model, inp, method="attnlrp", base="cp_lrp")
    vit = make_tiny_vit()
    vit.pos_embed = None  # no position embedding: nothing for pa_lrp to give relevance to
    with pytest.raises(LRPError, match="adds none"):
        explain(vit, torch.randn(1, 3, 32, 32), method="pa_lrp")


def test_agrees_with_the_authors_code_fixture():
    """The held-out reference of scripts/check_against_pa_lrp.py ("float64" mode): the authors' llama_PE + their
    LXT in float64 (their softmax cast and +eps stabilisers removed), ours with sdpa (softmax in float64). What is
    left is RMSNorm's float32 round-off, which their explicit rule passes on and gradient × input reads at x
    (measured 9.6e-8 tokens, 1.1e-7 positions; 1.3e-10 / 2.0e-10 with RMSNorm in float64 on both sides:
    scripts/pa_lrp_findings.md), so the bound is 1e-6 of max |reference|."""
    from pathlib import Path

    from transformers import LlamaConfig, LlamaForCausalLM

    fx = torch.load(Path(__file__).parents[1] / "fixtures" / "pa_lrp" / "llama.pt")
    model = LlamaForCausalLM(LlamaConfig(**fx["config"], attn_implementation="sdpa"))
    model.load_state_dict(fx["state_dict"])
    model = model.double().eval()
    for ids, ref in zip(fx["rows"], fx["reference"]):
        e = explain(model, {"input_ids": ids[None]}, method="pa_lrp", target=ref["target"])
        pos = ref["positional_per_layer"].sum(0)
        assert (e.scores[0] - ref["tokens"]).abs().max() <= 1e-6 * ref["tokens"].abs().max()
        assert (e.positional[0] - pos).abs().max() <= 1e-6 * pos.abs().max()


def test_pieces_merge_positional_like_scores():
    """explain in pieces (chunk_size=1) gives the same positional field and totals as one batch."""
    model = make_decoder("llama")
    inp = batch(rows(), "right")
    whole = explain(model, inp, method="pa_lrp")
    parts = explain(model, inp, method="pa_lrp", chunk_size=1)
    assert torch.allclose(parts.positional, whole.positional, atol=1e-10)
    assert torch.allclose(parts.conservation.positional, whole.conservation.positional, atol=1e-10)


# ----------------------------------------------------------------------------------------------------------------
# DeiT: the authors' vision code (scripts/check_against_pa_lrp.py --family deit, scripts/pa_lrp_findings.md)
# ----------------------------------------------------------------------------------------------------------------
def _fixture_deit():
    from pathlib import Path

    from timm.models.vision_transformer import VisionTransformer

    fx = torch.load(Path(__file__).parents[1] / "fixtures" / "pa_lrp" / "deit.pt")
    model = VisionTransformer(**fx["config"], qkv_bias=True)
    model.load_state_dict(fx["state_dict"])
    return model.double().eval(), fx


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("base", ["cp_halved", "cp_lrp", "attnlrp"])
def test_agrees_with_the_authors_vit_fixture(base, monkeypatch):
    """The authors' ViT relprop (models/model.py, method custom_lrp, epsilon_rule; float64, their stabilisers at 0):
    "cp_halved" is their cp_rule as written, "cp_lrp" their cp_rule with v's ½ undone, "attnlrp" their attention
    path with AttnLRP's softmax rule in place of theirs (R passed unchanged). Their relevance is seeded with 1 at
    the logit: the fixture holds it × the logit. Tokens and positions per patch, and every position's total (the
    cls position's too). Rules equal: 1e-15 with the GELU identity rule's stabiliser (1e-10) at 0 as theirs;
    the engine as is: 1.8e-8 (scripts/pa_lrp_findings.md)."""
    from lrp_core.rules import gradient as gradient_rules

    model, fx = _fixture_deit()
    ref = fx["reference"][base]
    x, t = fx["images"], fx["targets"]
    as_is = explain(model, x, method="pa_lrp", base=base, target=t)
    monkeypatch.setattr(gradient_rules, "IDENTITY_RULE_EPS", 0.0)
    exact = explain(model, x, method="pa_lrp", base=base, target=t)
    for e, tol in ((exact, 1e-8), (as_is, 1e-7)):
        assert _rel(e.scores, ref["tokens"][:, 1:]) <= tol
        assert _rel(e.positional, ref["positional"][:, 1:]) <= tol
        assert _rel(e.conservation.positional, ref["positional"].sum(-1)) <= tol
    with torch.no_grad():
        assert _rel(model(x).gather(1, t[:, None])[:, 0], ref["logit"]) <= 1e-12


def test_vit_cp_base_conserves_and_cp_halved_drops_half_the_attention():
    """Biases and the cls token 0: under CP-LRP a ViT is linear in patches and positions, so Σ patches + Σ positions
    (the cls position's included) is the logit. The authors' rules (cp_halved) drop the attention weights' half at
    every A·V: less reaches the input (measured 61-70% on the fixture's model)."""
    model, fx = _fixture_deit()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") or name == "cls_token":
                p.zero_()
    x = fx["images"]
    c = explain(model, x, method="pa_lrp", base="cp_lrp").conservation
    assert c.positional.abs().min() > 0.1 * c.output.abs().min()  # the positions take a real share
    assert torch.allclose(c.input + c.positional, c.output, rtol=1e-8, atol=0)
    h = explain(model, x, method="pa_lrp", base="cp_halved").conservation
    assert torch.all((h.input + h.positional) / h.output < 0.9)


def test_fused_cp_halved_rule_is_the_explicit_one():
    """On a fused attention (sdpa models) "cp_halved" is q, k detached and v's gradient ÷2: the same as
    ``softmax(q kᵀ s)`` held constant times v under the uniform rule (explicit path: MATMUL_AV halved)."""
    from lrp_core.rules.gradient import FusedAttentionCPHalved

    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, 6, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    w = torch.randn(2, 3, 6, 8, generator=g, dtype=torch.float64)
    y = FusedAttentionCPHalved().forward(torch.nn.functional.scaled_dot_product_attention, q, k, v)
    (y * w).sum().backward()
    v2 = v.detach().clone().requires_grad_(True)
    A = torch.softmax(q.detach() @ k.detach().transpose(-1, -2) / 8**0.5, dim=-1)
    y2 = A @ v2
    (y2 * w).sum().backward()
    assert torch.allclose(y, y2, atol=1e-12)
    assert torch.allclose(v.grad, v2.grad / 2, atol=1e-12)
    assert q.grad is None and k.grad is None
