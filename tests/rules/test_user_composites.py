"""A user's rule set through ``explain(..., composite=...)``: the γ- and ε-rules of a Linear in both kinds of pass,
chosen by operation kind, module name or position, checked when built and refused where it changes nothing."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_bert, make_tiny_vit

from lrp_core import InputError, explain
from lrp_core.adapters import get_adapter
from lrp_core.errors import RuleSetError
from lrp_core.rules import (
    ATTNLRP,
    CP_LRP,
    LINEAR,
    LRP_BASELINE,
    PATCH_CONV,
    SOFTMAX,
    TRANSFORMER_ATTRIBUTION,
    Composite,
    EpsilonGradient,
    EpsilonLinear,
    ExplicitRule,
    GammaGradient,
    GammaLinear,
    Gradient,
)
from lrp_core.rules import functional as F

DT = torch.float64


def _vit(seed: int = 0, bias: bool = True) -> torch.nn.Module:
    model = make_tiny_vit(seed=seed).double()
    if not bias:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
    return model


def _images(n: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, dtype=DT, generator=torch.Generator().manual_seed(seed))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


# ---------------------------------------------------------------- the formulas, by hand
def _by_hand(x, W, b, R, gamma: float, eps: float) -> torch.Tensor:
    """The generalised γ-rule with ε, one unit and one input at a time (Python loops): each unit boosts by γ
    the contributions x_i·w_ji (and its bias) that share the sign of its output; ε is sign-matched."""
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        for j in range(W.shape[0]):
            z = float(x[n] @ W[j] + b[j])
            if z == 0:
                continue
            sign = 1.0 if z > 0 else -1.0
            boost = lambda c, sign=sign: c + gamma * c if c * sign > 0 else c  # noqa: E731  (a contribution of z's sign)
            parts = [boost(float(x[n, i] * W[j, i])) for i in range(W.shape[1])]
            den = sum(parts) + boost(float(b[j])) + eps * sign
            for i in range(W.shape[1]):
                out[n, i] += parts[i] / den * float(R[n, j])
    return out


def test_gamma_and_epsilon_on_one_linear_match_the_hand_computation():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, dtype=DT, generator=g)  # inputs of both signs, as after a LayerNorm
    W, b, R = (torch.randn(*s, dtype=DT, generator=g) for s in ((4, 5), (4,), (3, 4)))
    for gamma, eps in ((0.25, 1e-9), (1.0, 0.1), (0.0, 0.3)):
        want = _by_hand(x, W, b, R, gamma, eps)
        assert torch.allclose(F.linear_gamma(x, W, R, gamma, eps, bias=b), want, rtol=0, atol=1e-12)
    assert torch.allclose(F.linear_epsilon(x, W, R, 0.3, bias=b), _by_hand(x, W, b, R, 0.0, 0.3), rtol=0, atol=1e-12)
    # the rule objects of both kinds of pass compute the same formula: explicit directly, modified-gradient as
    # input ⊙ gradient with the relevance z ⊙ g arriving at the output
    lin = torch.nn.Linear(5, 4).double()
    with torch.no_grad():
        lin.weight.copy_(W), lin.bias.copy_(b)
    from lrp_core.rules.ops import Op

    z = lin(x)
    for explicit, gradient in (
        (GammaLinear(0.5, epsilon=0.01), GammaGradient(0.5, epsilon=0.01)),
        (EpsilonLinear(0.2), EpsilonGradient(0.2)),
    ):
        gamma = getattr(explicit, "gamma", 0.0)
        want = _by_hand(x, W, b, R, gamma, explicit.epsilon)
        (got,) = explicit.relevance(Op(LINEAR, (x,), z, lin), R)
        assert torch.allclose(got, want, rtol=0, atol=1e-12)
        xl = x.clone().requires_grad_(True)
        out = gradient.forward(lin, xl, module=lin)
        assert torch.equal(out, z)  # the forward value is the layer's, bit for bit
        (grad,) = torch.autograd.grad(out, xl, grad_outputs=R / z)  # relevance R = z ⊙ (R / z) arrives
        assert torch.allclose(xl.detach() * grad, want, rtol=0, atol=1e-12)


def test_gamma_zero_is_epsilon_and_epsilon_zero_is_the_generic_rule():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 8, dtype=DT, generator=g)
    W, b, R = (torch.randn(*s, dtype=DT, generator=g) for s in ((7, 8), (7,), (6, 7)))
    assert torch.allclose(
        F.linear_gamma(x, W, R, 0.0, 0.05, bias=b), F.linear_epsilon(x, W, R, 0.05, bias=b), rtol=0, atol=1e-13
    )
    # linear_generic adds the project's +1e-9 to z: 1e-9 / min|z| = 2.3e-8 here
    assert _rel(F.linear_epsilon(x, W, R, 0.0), F.linear_generic(x, W, R)) < 1e-7
    # γ > 0 with no negative contributions anywhere (x ≥ 0, W ≥ 0, b ≥ 0): every unit is boosted uniformly by
    # 1 + γ, so the shares are LRP-0's
    xp, Wp, bp = x.abs(), W.abs(), b.abs()
    assert torch.allclose(
        F.linear_gamma(xp, Wp, R, 3.0, 0.0, bias=bp), F.linear_epsilon(xp, Wp, R, 0.0, bias=bp), rtol=0, atol=1e-12
    )


# ---------------------------------------------------------------- reduction: γ = 0 / ε = 0 give the default maps
@pytest.mark.parametrize("method, default", [("attnlrp", ATTNLRP), ("cp_lrp", CP_LRP)])
@pytest.mark.parametrize("rule", [GammaGradient(0.0, epsilon=0.0), EpsilonGradient(0.0)])
def test_modified_gradient_gamma_and_epsilon_at_zero_are_the_plain_gradient(method, default, rule):
    """The methods' Linear rule is the plain gradient (ε → 0, the bias absorbing its share): γ = ε = 0 on every
    Linear gives the default map to float64 round-off, on a model with biases."""
    model, x = _vit(), _images()
    base = explain(model, x, method=method)
    got = explain(model, x, method=method, composite=default.with_rules(by_kind={LINEAR: rule}))
    assert _rel(got.scores, base.scores) < 1e-12 and _rel(got.pixels, base.pixels) < 1e-12
    assert _rel(got.token_relevance, base.token_relevance) < 1e-12


class GenericLinear(ExplicitRule):
    """LRP-0, the generic DTD rule of a bias-free Linear, ``x ⊙ Wᵀ(R / xWᵀ)``, written out without a stabiliser
    (:func:`lrp_core.rules.functional.linear_generic` adds 1e-9 to the denominator, which the pass amplifies to a
    3e-6 relative difference on this model)."""

    def relevance(self, op, R, cache=None):
        x, W = op.inputs[0], op.module.weight
        return (x * ((R / (x @ W.T)) @ W),)


@pytest.mark.parametrize("rule", [GammaLinear(0.0, epsilon=0.0), EpsilonLinear(0.0)])
def test_explicit_gamma_and_epsilon_at_zero_are_the_generic_rule(rule):
    """Bias-free model: γ = ε = 0 in the explicit pass is LRP-0, the generic rule, to float64 round-off."""
    model, x = _vit(bias=False), _images()
    ref = explain(model, x, method="lrp", composite=LRP_BASELINE.with_rules(by_kind={LINEAR: GenericLinear()}))
    got = explain(model, x, method="lrp", composite=LRP_BASELINE.with_rules(by_kind={LINEAR: rule}))
    assert _rel(got.scores, ref.scores) < 1e-10 and _rel(got.token_relevance, ref.token_relevance) < 1e-10


# ---------------------------------------------------------------- where a rule set changes the map
def test_gamma_on_the_mlps_reaches_exactly_fc1_and_fc2():
    """``"blocks.*.mlp.*"`` with a Linear rule: the rule runs at every block's fc1 and fc2 and nowhere else (not
    at the GELU the pattern also names); the same rules named one layer at a time give the same map."""
    model, x = _vit(), _images()
    met: list = []

    class Spy(GammaGradient):
        def forward(self, fn, x, module=None):
            met.append(names[module])
            return super().forward(fn, x, module=module)

    names = get_adapter(model).module_names
    spied = explain(model, x, method="attnlrp", composite=ATTNLRP.with_rules(by_name={"blocks.*.mlp.*": Spy(0.5)}))
    assert sorted(set(met)) == [f"blocks.{b}.mlp.{fc}" for b in range(3) for fc in ("fc1", "fc2")]
    one_by_one = ATTNLRP.with_rules(
        by_name={f"blocks.{b}.mlp.{fc}": GammaGradient(0.5) for b in range(3) for fc in ("fc1", "fc2")}
    )
    assert torch.equal(explain(model, x, method="attnlrp", composite=one_by_one).scores, spied.scores)
    everywhere = explain(model, x, method="attnlrp", composite=ATTNLRP.with_rules(by_kind={LINEAR: GammaGradient(0.5)}))
    assert _rel(everywhere.scores, spied.scores) > 1e-3  # the attention's Linears and the head too: another map


@pytest.mark.parametrize(
    "method, default, gamma", [("attnlrp", ATTNLRP, GammaGradient(0.5)), ("lrp", LRP_BASELINE, GammaLinear(0.5))]
)
def test_gamma_on_one_blocks_mlp_changes_the_relevance_below_it_only(method, default, gamma):
    """γ on block 1's MLP: the relevance leaving blocks 2 and 1 (above the rule in the backward pass) is the
    default's bit for bit; below it — leaving block 0, and the map — it differs."""
    model, x = _vit(), _images()
    base = explain(model, x, method=method)
    got = explain(model, x, method=method, composite=default.with_rules(by_name={"blocks.1.mlp.*": gamma}))
    assert torch.equal(got.token_relevance[:, 1:], base.token_relevance[:, 1:])
    assert _rel(got.token_relevance[:, 0], base.token_relevance[:, 0]) > 1e-3
    assert _rel(got.scores, base.scores) > 1e-3
    assert got.options == {"composite": f"{default.name}[blocks.1.mlp.*: {gamma!r}]"}
    assert base.options == {}


def test_epsilon_at_the_head_scales_the_map_by_its_measured_conservation_loss():
    """AttnLRP with the ε-rule at the head: the one-hot gradient at logit t becomes ``z_t/(z_t + ε sign z_t)``,
    and every relevance below is linear in it — the map is the default's times that factor, and the relevance
    lost is ``1 − z_t/(z_t + ε)`` of it (measured: the input total over the default's)."""
    model, x = _vit(seed=2), _images(3, seed=4)
    eps = 0.5
    base = explain(model, x, method="attnlrp")
    got = explain(model, x, method="attnlrp", composite=ATTNLRP.with_rules(by_name={"head": EpsilonGradient(eps)}))
    z = base.logits.gather(1, base.target[:, None]).squeeze(1)
    factor = z / (z + eps * torch.where(z >= 0, 1.0, -1.0).to(z.dtype))
    assert _rel(got.scores, base.scores * factor[:, None]) < 1e-12
    kept = got.conservation.input / base.conservation.input
    assert torch.allclose(kept, factor, rtol=1e-12, atol=0)
    assert (1 - kept).abs().min() > 0.01  # a real loss: 1 − z/(z + 0.5) for these logits


def test_explicit_epsilon_at_the_head_conserves_what_the_formula_says():
    """``lrp`` with the ε-rule at the head, from the one-hot at t: the relevance entering the [CLS] token sums to
    ``(z_t − b_t) / (z_t + ε sign z_t)`` — the bias's share and ε's are lost (Select's 1e-9 stabiliser aside)."""
    model, x = _vit(seed=3), _images(2, seed=5)
    eps = 0.25
    got = explain(model, x, method="lrp", composite=LRP_BASELINE.with_rules(by_name={"head": EpsilonLinear(eps)}))
    z = got.logits.gather(1, got.target[:, None]).squeeze(1)
    b = model.head.bias.detach()[got.target]
    want = (z - b) / (z + eps * torch.where(z >= 0, 1.0, -1.0).to(z.dtype))
    assert torch.allclose(got.token_relevance[:, -1].sum(-1), want, rtol=1e-6, atol=0)


def test_a_text_model_takes_a_gamma_rule_set_too():
    """BERT: the pooler, the classifier and every Linear under the γ-rule, both kinds of pass; the batch equals its
    samples one by one."""
    model = make_tiny_bert().double()
    ids = torch.tensor([[2, 11, 12, 13, 3], [2, 21, 22, 3, 0]])
    inputs = {"input_ids": ids, "attention_mask": (ids != 0).long()}
    for method, composite in (
        ("attnlrp", ATTNLRP.with_rules(by_kind={LINEAR: GammaGradient(0.25)})),
        ("lrp", LRP_BASELINE.with_rules(by_kind={LINEAR: GammaLinear(0.25)})),
    ):
        got = explain(model, inputs, method=method, composite=composite)
        assert _rel(got.scores, explain(model, inputs, method=method).scores) > 1e-3
        one = explain(model, {k: v[1:, :4] for k, v in inputs.items()}, method=method, composite=composite)
        assert torch.allclose(got.scores[1, :4], one.scores[0], rtol=0, atol=1e-10)


# ---------------------------------------------------------------- refused where they cannot serve
def test_a_rule_of_the_other_kind_of_pass_is_refused_when_the_rule_set_is_built():
    with pytest.raises(
        RuleSetError,
        match=r"composite 'attnlrp' serves a modified-gradient replay, but "
        r"by_kind\['linear'\] is GammaLinear\(0.25\), a rule of an explicit "
        r"relevance pass; .* accepts a rule of a modified-gradient replay "
        r"\(a GradientRule\) — here GammaGradient",
    ):
        ATTNLRP.with_rules(by_kind={LINEAR: GammaLinear(0.25)})
    with pytest.raises(
        RuleSetError,
        match=r"composite 'lrp_baseline' serves an explicit relevance pass, but "
        r"by_name\['blocks.\*'\] is EpsilonGradient\(0.1\).* — here EpsilonLinear",
    ):
        LRP_BASELINE.with_rules(by_name={"blocks.*": EpsilonGradient(0.1)})
    with pytest.raises(RuleSetError, match=r"first\['linear'\] is GammaGradient\(0.25\)"):
        TRANSFORMER_ATTRIBUTION.with_rules(first={LINEAR: GammaGradient(0.25)})


def test_a_rule_for_an_operation_it_cannot_serve_is_refused_when_built():
    with pytest.raises(
        RuleSetError,
        match=r"GammaGradient\(0.25\) cannot serve operation 'softmax': it serves "
        r"linear; for 'softmax' a modified-gradient replay accepts "
        r"DetachedOperands, Gradient",
    ):
        ATTNLRP.with_rules(by_kind={SOFTMAX: GammaGradient(0.25)})
    with pytest.raises(
        RuleSetError,
        match=r"EpsilonLinear\(0.1\) cannot serve the first 'patch_conv' layer .*: it "
        r"serves linear; for 'patch_conv' an explicit relevance pass accepts "
        r"Identity, ZBox",
    ):
        LRP_BASELINE.with_rules(first={PATCH_CONV: EpsilonLinear(0.1)})
    with pytest.raises(RuleSetError, match="unknown operation kind 'linaer'"):
        Composite("typo", {**ATTNLRP.rules, "linaer": Gradient()})
    for bad in (-0.1, float("nan"), float("inf"), True, "0.25"):
        with pytest.raises(RuleSetError, match="gamma must be a finite number >= 0"):
            GammaGradient(bad)
        with pytest.raises(RuleSetError, match="epsilon must be a finite number >= 0"):
            EpsilonLinear(bad)


def _state(model: torch.nn.Module) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    "pattern, why",
    [
        ("blocks.*.mlpp.*", "a typo"),
        ("blocks.*.mlp.act", "a GELU: not a Linear"),
        ("blocks.0.*", "partial_lrp's pass stops at the last block"),
    ],
)
def test_a_name_pattern_that_changes_nothing_is_refused(pattern, why):
    """A pattern that reaches no operation its rule serves would silently give the default map: refused, naming
    the pattern and the layers the pass did ask a rule for; no hook is left and the model is unchanged."""
    model, x = _vit(), _images()
    before = _state(model)
    method, composite = (
        ("partial_lrp", LRP_BASELINE.with_rules(by_name={pattern: GammaLinear(0.25)}))
        if why.startswith("partial")
        else ("attnlrp", ATTNLRP.with_rules(by_name={pattern: GammaGradient(0.25)}))
    )
    with pytest.raises(
        RuleSetError,
        match=rf"method '{method}': composite .* chose no rule with name pattern "
        rf"'{pattern.replace('.', '[.]').replace('*', '[*]')}' .*matched no layer of "
        r"kind linear the pass asked a rule for; those are named .*blocks\.[02]\.mlp\.fc1",
    ):
        explain(model, x, method=method, composite=composite)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in model.modules())


def test_a_pattern_shadowed_by_an_earlier_one_is_refused():
    """Patterns are tried in order; one whose layers all took an earlier pattern's rule changes nothing."""
    composite = ATTNLRP.with_rules(by_name={"blocks.*": GammaGradient(0.5), "blocks.0.mlp.fc1": EpsilonGradient(0.1)})
    with pytest.raises(
        RuleSetError,
        match=r"name pattern 'blocks.0.mlp.fc1' \(EpsilonGradient\(0.1\)\): it matches "
        r"blocks.0.mlp.fc1, but an earlier pattern chose their rule first",
    ):
        explain(_vit(), _images(), method="attnlrp", composite=composite)


def test_a_first_layer_entry_the_pass_never_meets_is_refused():
    model = make_tiny_bert().double()
    ids = torch.tensor([[2, 11, 12, 3]])
    composite = ATTNLRP.with_rules(first={PATCH_CONV: Gradient()})
    with pytest.raises(RuleSetError, match="first-layer entry 'patch_conv' .*the pass met no 'patch_conv' layer"):
        explain(
            model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, method="attnlrp", composite=composite
        )


@pytest.mark.parametrize("method", ["transformer_attribution", "rollout", "pa_lrp", "integrated_gradients"])
def test_a_method_without_rule_sets_refuses_composite(method):
    with pytest.raises(InputError, match=rf"method '{method}' does not take option\(s\) \['composite'\]"):
        explain(make_tiny_vit(), _images().float(), method=method, composite=ATTNLRP)


@pytest.mark.parametrize(
    "method, composite, takers",
    [("attnlrp", LRP_BASELINE, "'lrp' or 'partial_lrp'"), ("lrp", CP_LRP, "'attnlrp' or 'cp_lrp'")],
)
def test_a_rule_set_for_the_other_kind_of_pass_is_refused_before_anything_runs(method, composite, takers):
    model = make_tiny_vit()
    calls: list = []
    for m in model.modules():
        m.register_forward_pre_hook(lambda mod, inp: calls.append(mod))
    with pytest.raises(
        RuleSetError,
        match=rf"method '{method}' runs .* composite '{composite.name}' is a rule set "
        rf"for .*: pass it to {takers}",
    ):
        explain(model, _images().float(), method=method, composite=composite)
    assert calls == []
    with pytest.raises(InputError, match="composite must be a rule set"):
        explain(model, _images().float(), method=method, composite="gamma")


def test_a_gpt2_conv1d_is_reached_by_its_name():
    """GPT-2's Conv1D layers are seen through Linear views that are not modules of the model: a name pattern on
    the Conv1D's name reaches them (before, the pattern reached nothing)."""
    from decoders import batch, make_decoder, rows

    model, inputs = make_decoder("gpt2"), batch(rows(lengths=(5, 4)))
    composite = ATTNLRP.with_rules(by_name={"transformer.h.*.mlp.c_fc": GammaGradient(0.5)})
    got = explain(model, inputs, method="attnlrp", composite=composite)
    assert _rel(got.scores, explain(model, inputs, method="attnlrp").scores) > 1e-3
