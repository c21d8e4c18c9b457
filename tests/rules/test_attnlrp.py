"""AttnLRP and CP-LRP: agreement with LXT 2.1, conservation where the papers state it, and where it fails.

The LXT outputs in ``tests/fixtures/lxt`` were computed by LXT 2.1 itself
(``scripts/check_against_lxt.py``, run in a separate virtualenv; LXT is not a
dependency of the tests), on the stored weights and inputs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import make_tiny_bert, make_tiny_vit
from hypothesis import given, settings
from hypothesis import strategies as st

from lrp_core import explain
from lrp_core.rules.composites import ATTNLRP, CP_LRP
from lrp_core.rules.gradient import HalvedGradient, IdentityRule
from lrp_core.rules.ops import MATMUL_QK

FIXTURES = Path(__file__).parents[1] / "fixtures" / "lxt"
METHODS = ("attnlrp", "cp_lrp")


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


# ----------------------------------------------------------------------------
# agreement with LXT 2.1 (float64, the batch explained at once, padding included)
# ----------------------------------------------------------------------------
def _lxt_vit():
    from safetensors.torch import load_file
    from timm.models.vision_transformer import VisionTransformer

    model = VisionTransformer(
        img_size=32, patch_size=8, embed_dim=48, depth=3, num_heads=3, num_classes=5, qkv_bias=True, mlp_ratio=4.0
    )
    model.load_state_dict(load_file(str(FIXTURES / "vit_tiny.safetensors")))
    return model.double().eval(), torch.load(FIXTURES / "vit_tiny__inputs.pt")["images"].double()


def _lxt_bert(attn: str):
    from safetensors.torch import load_file
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=40,
        type_vocab_size=2,
        num_labels=3,
        pad_token_id=0,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
    )
    cfg._attn_implementation = attn
    model = BertForSequenceClassification(cfg)
    model.load_state_dict(load_file(str(FIXTURES / "bert_eager.safetensors")), strict=False)
    return model.double().eval(), torch.load(FIXTURES / "bert_eager__inputs.pt")


@pytest.mark.parametrize("method", METHODS)
def test_timm_vit_equals_lxt(method):
    model, images = _lxt_vit()
    ref = torch.load(FIXTURES / f"ref__vit_tiny__{method}__float64.pt")
    exp = explain(model, images, method=method, target=ref["target"])
    assert rel_err(exp.scores, ref["scores"]) < 1e-8
    assert rel_err(exp.pixels, ref["pixels"]) < 1e-8
    assert rel_err(exp.token_relevance, ref["token_relevance"]) < 1e-8


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("method", METHODS)
def test_bert_padded_batch_equals_lxt_one_by_one(method, attn):
    model, inputs = _lxt_bert(attn)
    ref = torch.load(FIXTURES / f"ref__bert_{attn}__{method}__float64.pt")
    exp = explain(model, inputs, method=method, target=ref["target"])
    mask = inputs["attention_mask"].bool()
    assert rel_err(exp.scores, ref["scores"]) < 1e-8
    assert (exp.scores[~mask] == 0).all()
    assert rel_err(exp.token_relevance, ref["token_relevance"]) < 1e-8


# ----------------------------------------------------------------------------
# conservation (float64)
# ----------------------------------------------------------------------------
def _without_additive_constants(model: torch.nn.Module) -> torch.nn.Module:
    """Every bias, LayerNorm β, position embedding and the [CLS] token set to 0."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name in ("pos_embed", "cls_token"):
                p.zero_()
    return model


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_cp_lrp_conserves_exactly_without_additive_constants(seed):
    model = _without_additive_constants(make_tiny_vit(seed=seed % 7)).double()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    exp = explain(model, x, method="cp_lrp")
    c = exp.conservation
    y = c.output.abs()
    # every stage — the logit, each block's residual stream, the patch embeddings, the pixels — holds y_t;
    # the residue is the identity rule's 1e-10 stabiliser: about 1e-10 per GELU unit, absolute (≤ 1e-9 here)
    tol = 1e-8 * y + 1e-9
    assert (c.absorbed().abs().max(dim=1).values < tol).all()
    assert ((c.pixels - c.output).abs() < tol).all()


def test_attnlrp_does_not_conserve_through_the_softmax():
    """On the same bias-free model AttnLRP loses relevance: the softmax rule gives part of it to its implicit bias."""
    model = _without_additive_constants(make_tiny_vit(seed=3)).double()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    attn, cp = (explain(model, x, method=m).conservation for m in METHODS)
    gap_attn = (attn.input - attn.output).abs() / attn.output.abs()
    gap_cp = (cp.input - cp.output).abs() / cp.output.abs()
    assert (gap_cp < 1e-8).all() and (gap_attn > 1e-3).all()
    # the loss happens inside the blocks (where the softmax is), not at the readout or the embedding
    steps = attn.absorbed().abs() / attn.output.abs()[:, None]
    assert (steps[:, 1:-1].max(dim=1).values > 1e-3).all()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_uniform_rule_conserves_at_a_product(seed):
    """÷2 at ``Z = a @ b``: Σ a⊙∂a + Σ b⊙∂b = Σ Z⊙∂Z (Euler: the product is homogeneous of degree 2)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(2, 4, 5, dtype=torch.float64, generator=g).requires_grad_(True)
    b = torch.randn(2, 5, 3, dtype=torch.float64, generator=g).requires_grad_(True)
    upstream = torch.randn(2, 4, 3, dtype=torch.float64, generator=g)
    z = ATTNLRP.rule(MATMUL_QK).forward(torch.matmul, a, b)
    assert isinstance(ATTNLRP.rule(MATMUL_QK), HalvedGradient)
    ga, gb = torch.autograd.grad(z, [a, b], grad_outputs=upstream)
    R_in = (a * ga).sum() + (b * gb).sum()
    assert torch.allclose(R_in, (z * upstream).sum(), rtol=1e-12, atol=1e-12)
    # without the halving each operand alone receives all of it: twice the relevance
    ga2, gb2 = torch.autograd.grad(torch.matmul(a, b), [a, b], grad_outputs=upstream)
    assert torch.allclose((a * ga2).sum() + (b * gb2).sum(), 2 * R_in, rtol=1e-12, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_softmax_gradient_times_input_loses_the_implicit_bias(seed):
    """x ⊙ ∂/∂x of softmax: Σ_i R_i = Σ_i s_i A_i (g_i − ⟨A, g⟩) ≠ Σ_i A_i g_i in general — by how much, exactly."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(6, dtype=torch.float64, generator=g).requires_grad_(True)
    up = torch.randn(6, dtype=torch.float64, generator=g)
    A = s.softmax(-1)
    (grad,) = torch.autograd.grad(A, [s], grad_outputs=up)
    R_in = (s * grad).detach()
    expected = s.detach() * A.detach() * (up - (A.detach() * up).sum())
    assert torch.allclose(R_in, expected, rtol=1e-12, atol=1e-12)
    R_out = (A * up).sum().item()
    assert abs(R_in.sum().item() - R_out) > 1e-6  # not conserved


def test_identity_rule_passes_relevance_unchanged():
    x = torch.linspace(-3, 3, 11, dtype=torch.float64).requires_grad_(True)
    up = torch.randn(11, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = IdentityRule().forward(torch.nn.functional.gelu, x)
    (g,) = torch.autograd.grad(y, [x], grad_outputs=up)
    assert torch.allclose(x.detach() * g, y.detach() * up, rtol=1e-8, atol=1e-12)


# ----------------------------------------------------------------------------
# the engine's guarantees
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_vit_batch_equals_single(method, tiny_vit, images):
    model, x = tiny_vit.double(), images.double()
    batch = explain(model, x, method=method)
    for i in range(x.shape[0]):
        one = explain(model, x[i : i + 1], method=method, target=int(batch.target[i]))
        assert rel_err(batch.scores[i : i + 1], one.scores) < 1e-10
        assert rel_err(batch.pixels[i : i + 1], one.pixels) < 1e-10


@pytest.mark.parametrize("method", METHODS)
def test_text_padded_batch_equals_single(method, text_batch):
    model = make_tiny_bert(weight_scale=5.0).double()
    batch = explain(model, text_batch, method=method)
    for i, n in enumerate(text_batch["attention_mask"].sum(1).tolist()):
        one = {k: v[i : i + 1, :n] for k, v in text_batch.items()}
        single = explain(model, one, method=method, target=int(batch.target[i]))
        assert torch.equal(batch.scores[i, :n], single.scores[0])
        assert (batch.scores[i, n:] == 0).all()
        assert torch.allclose(batch.conservation.output[i], single.conservation.output[0])


@pytest.mark.parametrize("method", METHODS)
def test_one_backward_pass_and_no_parameter_gradients(method, tiny_vit, images):
    calls = []
    tiny_vit.head.register_full_backward_hook(lambda m, gi, go: calls.append(1))
    explain(tiny_vit, images, method=method)
    assert len(calls) == 1
    assert all(p.grad is None for p in tiny_vit.parameters())


def test_gradient_rules_refuse_an_explicit_pass(tiny_vit, images):
    from lrp_core.adapters import get_adapter

    a = get_adapter(tiny_vit)
    trace = a.forward(a.check_inputs(images))
    from lrp_core.errors import RuleSetError

    with pytest.raises(RuleSetError, match="'cp_lrp' is a rule set for a modified-gradient replay"):
        a.relprop(trace, torch.eye(5)[:3], CP_LRP)


def test_options_are_refused(tiny_vit, images):
    from lrp_core import InputError

    with pytest.raises(
        InputError,
        match=r"'attnlrp' does not take option\(s\) \['start_layer'\]; method 'attnlrp' "
        r"accepts: composite \(the rule set",
    ):
        explain(tiny_vit, images, method="attnlrp", start_layer=1)
