"""Adapter.run_blocks: a logits-only pass (``keep=False``) computes the same logits and keeps no block records."""

import torch

from lrp_core import explain
from lrp_core.adapters import get_adapter


def _logits_both_ways(model, prepared):
    a = get_adapter(model).for_inputs(prepared)
    prepared = a.check_inputs(prepared)
    with torch.no_grad():
        x0 = a.embed(prepared).x0
        full = a.run_blocks(x0, getattr(prepared, "attention_mask", None))
        lean = a.run_blocks(x0, getattr(prepared, "attention_mask", None), keep=False)
    return full, lean


def test_logits_only_pass_equals_the_recorded_one_vit(tiny_vit, images):
    full, lean = _logits_both_ways(tiny_vit, images)
    assert len(full.blocks) == len(tiny_vit.blocks) and lean.blocks == []
    assert torch.equal(full.logits, lean.logits)


def test_logits_only_pass_equals_the_recorded_one_padded_bert(tiny_bert, text_batch):
    full, lean = _logits_both_ways(tiny_bert, text_batch)
    assert lean.blocks == [] and torch.equal(full.logits, lean.logits)


def test_token_ablation_is_the_logit_drop_of_each_removed_token(tiny_vit, images):
    """The lean pass inside token ablation: score of token i = y(all) − y(without i), checked for one token."""
    x = images[:1]
    e = explain(tiny_vit, x, method="token_ablation")
    a = get_adapter(tiny_vit)
    with torch.no_grad():
        x0 = a.embed(a.check_inputs(x)).x0
        t = int(e.target[0])
        start = x0.shape[1] - e.scores.shape[1]  # scored tokens are the last ones ([CLS] first)
        i = start + 3
        without = torch.cat([x0[:, :i], x0[:, i + 1 :]], dim=1)
        drop = tiny_vit(x)[0, t] - a.run_blocks(without).logits[0, t]
    assert torch.allclose(e.scores[0, 3], drop, rtol=1e-5, atol=1e-6)
