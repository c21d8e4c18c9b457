"""Rule-by-rule properties of lrp_core.rules.functional on random tensors (hypothesis)."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lrp_core.rules import composites as C
from lrp_core.rules import explicit as X
from lrp_core.rules import functional as rules
from lrp_core.rules import ops as O

SEEDS = st.integers(min_value=0, max_value=2**31 - 1)


def _rand(seed: int, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_safe_div_matches_reference_stabiliser():
    a = torch.tensor([1.0, 1.0, 1.0, 2.0])
    b = torch.tensor([0.0, 2.0, -2.0, -1e-9])
    out = rules.safe_div(a, b)
    assert out[0] == 0  # 0 where b == 0
    assert torch.isclose(out[1], torch.tensor(1 / (2 + 1e-9)))
    assert torch.isclose(out[2], torch.tensor(1 / (-2 + 1e-9)))  # constant +eps, not sign-matched
    assert torch.isfinite(out[3])  # b + eps == 0 is bumped once more
    signed = rules.safe_div(a, b, signed=True)
    assert torch.isclose(signed[2], torch.tensor(1 / (-2 - 1e-9)))


@settings(max_examples=40, deadline=None)
@given(seed=SEEDS, n=st.integers(1, 5), d_in=st.integers(1, 12), d_out=st.integers(1, 12))
def test_signed_linear_conserves(seed, n, d_in, d_out):
    x, W, R = _rand(seed, n, d_in), _rand(seed + 1, d_out, d_in), _rand(seed + 2, n, d_out)
    Rx = rules.linear_signed(x, W, R)
    xp, xn = x.clamp(min=0), x.clamp(max=0)
    zp = xp @ W.clamp(min=0).T + xn @ W.clamp(max=0).T
    # each unit passes on R_i·z⁺/(z⁺+1e-9): all of it, but for the stabiliser (and nothing where z⁺ = 0)
    expected = (R * zp / (zp + 1e-9)).sum()
    assert torch.allclose(Rx.sum(), expected, rtol=1e-9, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(seed=SEEDS, n=st.integers(1, 4), d_in=st.integers(1, 12), classes=st.integers(1, 3), forward=st.booleans())
def test_signed_linear_of_a_head_read_at_a_few_classes_is_the_whole_rule(seed, n, d_in, classes, forward):
    """A head's relevance on a few of many outputs (one-hot targets): the rule reads only those rows of W (no
    weight-sized signed parts) and gives the relevance of the rule over every output, to float64 round-off."""
    d_out = 8 * n + 40  # many outputs against the rows: the head case
    x, W, b = _rand(seed, n, d_in), _rand(seed + 1, d_out, d_in), _rand(seed + 3, d_out)
    R = torch.zeros(n, d_out, dtype=torch.float64)
    cols = torch.randperm(d_out, generator=torch.Generator().manual_seed(seed))[:classes]
    R[:, cols] = _rand(seed + 2, n, classes)
    kw = {"out": x @ W.T + b, "bias": b} if forward else {}
    got = rules.linear_signed(x, W, R, **kw)
    xp, xn = x.clamp(min=0), x.clamp(max=0)
    Wp, Wn = W.clamp(min=0), W.clamp(max=0)
    s = R / (xp @ Wp.T + xn @ Wn.T + 1e-9)  # every output's ratio, 0 where R is
    assert torch.allclose(got, xp * (s @ Wp) + xn * (s @ Wn), rtol=1e-10, atol=1e-12)
    assert torch.equal(rules.linear_signed(x, W, torch.zeros_like(R)), torch.zeros_like(x))


@settings(max_examples=40, deadline=None)
@given(seed=SEEDS, n=st.integers(1, 5), d_in=st.integers(1, 12), d_out=st.integers(1, 12))
def test_generic_rule_conserves_for_bias_free_linear(seed, n, d_in, d_out):
    x, W, R = _rand(seed, n, d_in), _rand(seed + 1, d_out, d_in), _rand(seed + 2, n, d_out)
    Rx = rules.generic(lambda t: t @ W.T, x, R)
    z = x @ W.T
    expected = (R * z / (z + 1e-9)).sum()  # conserved up to the stabiliser, unit by unit
    assert torch.allclose(Rx.sum(), expected, rtol=1e-9, atol=1e-9)
    assert torch.allclose(Rx, rules.linear_generic(x, W, R), rtol=1e-9, atol=1e-9)


def test_generic_rule_does_not_conserve_with_bias():
    x, W, R = _rand(0, 4, 6), _rand(1, 3, 6), torch.ones(4, 3, dtype=torch.float64)
    Rx = rules.generic(lambda t: t @ W.T + 5.0, x, R)
    assert not torch.allclose(Rx.sum(), R.sum(), rtol=1e-3)


def test_baseline_linear_does_not_conserve():
    x, W, R = _rand(3, 6, 10), _rand(4, 8, 10), _rand(5, 6, 8).abs()
    assert rules.linear_baseline(x, W, R).sum() > 1.5 * R.sum()  # each signed part takes all of R


@settings(max_examples=60, deadline=None)
@given(seed=SEEDS, b=st.integers(1, 4), n=st.integers(1, 6), d=st.integers(1, 6), scale=st.floats(0.01, 100.0))
def test_normalized_add_conserves_and_bounds_shares_per_sample(seed, b, n, d, scale):
    u, v = _rand(seed, b, n, d, scale=scale), _rand(seed + 1, b, n, d, scale=scale)
    R = _rand(seed + 2, b, n, d)
    Ru, Rv = rules.add_normalized(u, v, R)
    su, sv, sR = (t.reshape(b, -1).sum(1) for t in (Ru, Rv, R))
    assert torch.allclose(su + sv, sR, rtol=1e-6, atol=1e-8)  # conservation, sample by sample
    # Lemma 2: each operand's share of the total is in [0, 1]
    share_u = su / torch.where(sR == 0, torch.ones_like(sR), sR)
    assert ((share_u >= -1e-9) & (share_u <= 1 + 1e-9)).all()


def test_normalized_add_per_sample_equals_single_sample():
    u, v, R = _rand(0, 3, 4, 5), _rand(1, 3, 4, 5), _rand(2, 3, 4, 5)
    Ru, Rv = rules.add_normalized(u, v, R)
    for i in range(3):
        ru, rv = rules.add_normalized(u[i : i + 1], v[i : i + 1], R[i : i + 1], per_sample=False)
        assert torch.allclose(Ru[i : i + 1], ru) and torch.allclose(Rv[i : i + 1], rv)


def test_instability_example_from_the_paper():
    """u = (e^a, e^b), v = (1 − e^a, 1 − e^b), R = (1, 1): the generic rule explodes, the normalised one does not."""
    a, b = 20.0, 25.0
    u = torch.tensor([[math.exp(a), math.exp(b)]], dtype=torch.float64)
    v = 1 - u
    R = torch.ones(1, 2, dtype=torch.float64)
    Ru, Rv = rules.add_generic(u, v, R)
    assert torch.allclose(Ru, u, rtol=1e-6)  # R^u = e^a: relevance blows up ...
    assert torch.allclose(Ru.sum() + Rv.sum(), R.sum(), rtol=1e-6)  # ... although the total is conserved
    Nu, Nv = rules.add_normalized(u, v, R)
    assert torch.allclose(Nu.sum() + Nv.sum(), R.sum(), rtol=1e-9)
    assert 0 <= Nu.sum() <= R.sum() and 0 <= Nv.sum() <= R.sum()
    assert Nu.abs().max() < 2 and Nv.abs().max() < 2


@settings(max_examples=30, deadline=None)
@given(seed=SEEDS, k=st.integers(2, 4))
def test_clone_sums_branches(seed, k):
    Rs = [_rand(seed + i, 3, 5) for i in range(k)]
    assert torch.allclose(rules.clone(*Rs).sum(), sum(r.sum() for r in Rs))


@settings(max_examples=40, deadline=None)
@given(seed=SEEDS, n=st.integers(1, 5), k=st.integers(1, 5), m=st.integers(1, 5))
def test_matmul_needs_the_halving(seed, n, k, m):
    a, b = _rand(seed, 2, n, k), _rand(seed + 1, 2, k, m)
    R = _rand(seed + 2, 2, n, m)
    Ra, Rb = rules.matmul(a, b, R, halve=False)
    # a plain product hands all of R (up to the stabiliser: R z / (z + eps)) to each operand: the sum
    # doubles, not conserved. The stabiliser matters where |z| is small, so it is part of the expectation.
    z = a @ b
    kept = (R * z / (z + rules.EPS)).sum()
    assert torch.allclose(Ra.sum(), kept, rtol=1e-9) and torch.allclose(Rb.sum(), kept, rtol=1e-9)
    Ha, Hb = rules.matmul(a, b, R, halve=True)
    assert torch.allclose(Ha.sum() + Hb.sum(), kept, rtol=1e-9)


@settings(max_examples=20, deadline=None)
@given(seed=SEEDS)
def test_zbox_conserves_on_patch_conv(seed):
    x = _rand(seed, 2, 3, 16, 16)
    W = _rand(seed + 1, 4, 3, 8, 8)
    R = _rand(seed + 2, 2, 4, 2, 2)
    Rx = rules.zbox_conv2d(x, W, R, stride=8)
    assert Rx.shape == x.shape
    # zᴮ is a Taylor expansion exact for the bias-free convolution: conserved up to the +1e-9
    assert torch.allclose(Rx.sum(dim=(1, 2, 3)), R.sum(dim=(1, 2, 3)), rtol=1e-5, atol=1e-5)


def test_composites_pick_rules_by_operation_kind():
    lin = torch.nn.Linear(3, 2)
    assert isinstance(C.TRANSFORMER_ATTRIBUTION.rule(O.LINEAR, lin), X.SignedLinear)
    assert isinstance(C.LRP_BASELINE.rule(O.LINEAR, lin), X.BaselineLinear)
    assert isinstance(C.TRANSFORMER_ATTRIBUTION.rule(O.ELEMENTWISE, torch.nn.GELU()), X.Identity)
    assert isinstance(C.TRANSFORMER_ATTRIBUTION.rule(O.ADD), X.NormalizedAdd)
    assert isinstance(C.LRP_BASELINE.rule(O.ADD), X.GenericAdd)


@settings(max_examples=40, deadline=None)
@given(seed=SEEDS, n=st.integers(1, 6), d_in=st.integers(1, 16), d_out=st.integers(1, 16))
def test_signed_linear_from_the_forward_output_is_the_same_rule(seed, n, d_in, d_out):
    """z⁺ = (xW + |x||W|)/2 from the layer's own output: one product less, the same relevance."""
    x, W, R = _rand(seed, n, d_in), _rand(seed + 1, d_out, d_in), _rand(seed + 2, n, d_out)
    b = _rand(seed + 3, d_out)
    plain = rules.linear_signed(x, W, R)
    fast = rules.linear_signed(x, W, R, out=x @ W.T + b, bias=b, cache={})
    assert torch.allclose(fast, plain, rtol=1e-7, atol=1e-9)
