"""The modified-gradient replay of a decoder computes its last block at the read token only (``read_rows``).

The other rows of the last block reach nothing that is read, so the replay must give the full replay's logits,
gradients and per-block relevance (float64: round-off only) while its last attention computes one query row.
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from decoders import batch, make_decoder, rows  # noqa: E402

from lrp_core import explain  # noqa: E402
from lrp_core.adapters import get_adapter  # noqa: E402
from lrp_core.rules.composites import ATTNLRP, CP_LRP  # noqa: E402

#: (family, attention, padding side, rule set): a plain sdpa stack, eager attention, sliding + global layers
#: (Gemma 3), parallel blocks, experts; both paddings, both rule sets
CASES = [
    ("llama", "sdpa", "right", ATTNLRP),
    ("llama", "eager", "left", ATTNLRP),
    ("llama", "sdpa", "left", CP_LRP),
    ("gemma3", "sdpa", "right", ATTNLRP),
    ("gpt_neox", "sdpa", "left", ATTNLRP),
    ("qwen3_moe", "sdpa", "right", CP_LRP),
]


def _relevance(model, inputs: dict, composite, read_rows: bool, position=None):
    """(trace, logits, input relevance (B, T), per-block relevance (B, L, T)) of one modified-gradient replay."""
    a = get_adapter(model)
    prepared = a.check_inputs(inputs)
    if position is not None:
        prepared = a.at_position(prepared, position)
    trace = a.forward(prepared, grad=True, composite=composite, track=True, read_rows=read_rows)
    logits = trace.logits
    y = logits.gather(1, logits.detach().argmax(1, keepdim=True)).sum()
    outs = [rec.out for rec in trace.blocks]
    grads = torch.autograd.grad(y, [trace.embedding.embeds] + outs)
    scores = (trace.embedding.embeds * grads[0]).sum(-1)
    blocks = torch.stack([(h * g).sum(-1) for h, g in zip(outs, grads[1:])], dim=1)
    return trace, logits.detach(), scores.detach(), blocks.detach()


@pytest.mark.parametrize("family, attn, side, composite", CASES, ids=[f"{f}-{a}-{s}-{c.name}" for f, a, s, c in CASES])
def test_last_block_at_the_read_token_equals_the_full_replay(family, attn, side, composite):
    model = make_decoder(family, attn=attn)
    inputs = batch(rows(lengths=(6, 11, 8)), side=side)
    for position in (None, [3, 9, 5] if side == "right" else [-1, -4, -2]):
        full = _relevance(model, inputs, composite, False, position)
        lean = _relevance(model, inputs, composite, True, position)
        assert lean[0].blocks[-1].attn.ctx.shape[2] == 1  # one query row per sample in the last attention
        assert full[0].blocks[-1].attn.ctx.shape[2] == inputs["input_ids"].shape[1]
        for f, g in zip(full[1:], lean[1:]):
            assert f.shape == g.shape
            assert (f - g).abs().max() <= 1e-13 * f.abs().max()


def test_explain_runs_the_last_attention_on_one_query_row(monkeypatch):
    """AttnLRP on a long-enough unpadded row: every block but the last attends with all T queries, the last with
    the read token's alone (the kernel's own causal mask above, no mask for the last row, which sees every key)."""
    model = make_decoder("llama", attn="sdpa", dtype=torch.float32)
    inputs = batch(rows(lengths=(12,)))
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        calls.append((q.shape[2], attn_mask is None, kw.get("is_causal", False)))
        return sdpa(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    e = explain(model, inputs, method="attnlrp", unverified=True)  # the replay's calls only, not the check's forward
    L = model.config.num_hidden_layers
    assert calls == [(12, True, True)] * (L - 1) + [(1, True, False)]
    assert e.token_relevance.shape == (1, L, 12)
    assert torch.all(e.token_relevance[0, -1, :-1] == 0)  # the last block's other rows hold no relevance
