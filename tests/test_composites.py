"""A rule set is a composite and nothing else: the drivers ask it for every step of the pass."""
from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_vit

from lrp_core import explain
from lrp_core.adapters import get_adapter
from lrp_core.composites import (ADD, LINEAR, MASK_ADD, OP_KINDS, TRANSFORMER_ATTRIBUTION, Composite, GenericAdd,
                                 Identity, Op, Propagation, Rule)
from lrp_core.rules import generic


class GenericRule(Rule):
    """A rule written outside the library: :func:`lrp_core.rules.generic` (gradient × input of the ratio)."""

    name = "generic"

    def relevance(self, op, R, cache=None):
        return (generic(op.module, op.inputs[0], R),)


#: the generic DTD rule everywhere it applies: Linear, the residual Adds; everything else as before
GENERIC = TRANSFORMER_ATTRIBUTION.with_rules("generic", **{LINEAR: GenericRule(), ADD: GenericAdd(),
                                                           MASK_ADD: GenericAdd()})


def _bias_free_vit(seed: int = 0) -> torch.nn.Module:
    model = make_tiny_vit(seed=seed).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    return model


def test_a_new_composite_changes_the_pass_and_nothing_else():
    """Generic rule on a bias-free model: relevance conserved at every block (Euler), unlike the paper's rules."""
    model = _bias_free_vit()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    a = get_adapter(model)
    trace = a.forward(a.check_inputs(x))
    start = torch.zeros_like(trace.logits).scatter_(1, trace.logits.argmax(1, keepdim=True), 1.0)
    generic = a.relprop(trace, start, GENERIC, stop_block=0, to_input=True, prepared={"images": x})
    totals = torch.cat([generic.tokens.sum(-1), generic.inputs.sum(-1, keepdim=True)], dim=1)
    assert torch.allclose(totals, torch.ones_like(totals), atol=1e-6)
    paper = a.relprop(trace, start, TRANSFORMER_ATTRIBUTION, stop_block=0)
    assert not torch.allclose(paper.attn[0], generic.attn[0])


def test_every_step_asks_the_composite():
    """A composite that records what it is asked: every operation kind of a pre-LN pass, none skipped."""
    asked: list = []

    class Recording(Rule):
        def __init__(self, inner: Rule):
            self.inner = inner

        def relevance(self, op: Op, R, cache=None):
            asked.append(op.kind)
            return self.inner.relevance(op, R, cache)

    spy = Composite("spy", {k: Recording(r) for k, r in TRANSFORMER_ATTRIBUTION.rules.items()})
    model = make_tiny_vit()
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    a = get_adapter(model)
    trace = a.forward(a.check_inputs(x))
    ref = a.relprop(trace, torch.eye(5)[:1], TRANSFORMER_ATTRIBUTION, stop_block=0, to_input=True,
                    prepared={"images": x})
    got = a.relprop(trace, torch.eye(5)[:1], spy, stop_block=0, to_input=True, prepared={"images": x})
    assert torch.equal(ref.pixels, got.pixels)
    used = set(asked)
    # [CLS] pooling selects (READOUT, no weighted sum); an image model has no padding mask
    assert used == set(OP_KINDS) - {"pool", "mask_add"}
    assert asked.count(LINEAR) == 3 * 4 + 1  # qkv, proj, fc1, fc2 per block, and the head


def test_a_composite_without_a_rule_names_what_it_covers():
    partial = Composite("partial", {LINEAR: Identity()})
    with pytest.raises(KeyError, match="has no rule for operation 'add'; it covers linear"):
        Propagation(partial)(ADD, (torch.ones(1), torch.ones(1)), torch.ones(1))


def test_explain_is_unchanged_by_building_composites(tiny_vit, images):
    before = explain(tiny_vit, images).scores
    TRANSFORMER_ATTRIBUTION.with_rules("x", **{LINEAR: GenericRule()})  # a copy: the original is untouched
    assert torch.equal(explain(tiny_vit, images).scores, before)
