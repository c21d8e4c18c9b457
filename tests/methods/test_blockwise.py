"""The blockwise relevance pass (``low_memory``, lrp_core.adapters.blockwise) equals the full pass.

AttnLRP and CP-LRP on tiny decoders (eager and sdpa, padded on either side, one row alone), the same scores,
per-block relevance, conservation and logits as the full pass: float64 to 1e-12 relative, float32 to round-off;
the eager attention runs in query chunks (rows longer than a chunk). Which pass ran is in ``options``; asking a
method or a model that has no blockwise pass is refused.
"""

from __future__ import annotations

import pytest
import torch
from decoders import batch, make_decoder, rows

import lrp_core.adapters.chunked as chunked
from lrp_core import explain
from lrp_core.errors import InputError, UnsupportedModelError

#: rows longer than one chunk (the tiny decoders' head width 8: chunks of MIN_ROWS = 32 query rows)
LENGTHS = (60, 41, 50)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max |a|."""
    return float((a - b).abs().max() / a.abs().max().clamp_min(1e-300))


def _compare(model, inputs: dict, method: str, bound: float) -> dict:
    full = explain(model, inputs, method=method, low_memory=False)
    low = explain(model, inputs, method=method, low_memory=True)
    assert low.options.get("relevance_pass") == "blockwise" and "relevance_pass" not in full.options
    assert torch.equal(full.target, low.target)
    assert _rel(full.logits, low.logits) <= bound
    assert _rel(full.scores, low.scores) <= bound
    assert _rel(full.token_relevance, low.token_relevance) <= bound
    for name in ("output", "blocks", "input"):
        assert _rel(getattr(full.conservation, name), getattr(low.conservation, name)) <= bound
    return {"full": full, "low": low}


@pytest.fixture
def chunk_calls(monkeypatch):
    """How many chunked attention cores ran (the eager pass must chunk its rows)."""
    calls = [0]
    core = chunked.chunked_core

    def counted(*args, **kwargs):
        calls[0] += 1
        return core(*args, **kwargs)

    monkeypatch.setattr("lrp_core.adapters.attention.chunked_core", counted)
    return calls


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3", "gpt2"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_blockwise_equals_full_float64(family, attn, side, chunk_calls):
    model = make_decoder(family, attn)
    inputs = batch(rows(1, LENGTHS), side)
    for method in ("attnlrp", "cp_lrp"):
        _compare(model, inputs, method, 1e-12)
    assert (chunk_calls[0] > 0) == (attn == "eager")  # sdpa runs fused: no map to chunk


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_blockwise_float32_to_round_off(family):
    model = make_decoder(family, "eager", dtype=torch.float32)
    _compare(model, batch(rows(2, LENGTHS), "left"), "attnlrp", 1e-5)


def test_blockwise_batch_equals_single():
    """Each row of a left-padded batch, explained blockwise, equals the row explained alone (blockwise)."""
    model = make_decoder("llama", "eager")
    seqs = rows(3, LENGTHS)
    together = explain(model, batch(seqs, "left"), method="attnlrp", low_memory=True)
    T = together.scores.shape[1]
    for i, s in enumerate(seqs):
        alone = explain(model, batch([s]), method="attnlrp", low_memory=True)
        assert _rel(alone.scores[0], together.scores[i, T - len(s) :]) <= 1e-10


def test_auto_takes_blockwise_where_the_full_pass_does_not_fit():
    model = make_decoder("llama", "eager")
    x = batch(rows(1, (60,)))
    assert "relevance_pass" not in explain(model, x, method="attnlrp").options  # fits: the full pass
    assert "relevance_pass" not in explain(model, x, method="attnlrp", max_memory="none").options
    small = explain(model, x, method="attnlrp", max_memory=10_000)  # 10 kB: below the full pass's peak
    assert small.options["relevance_pass"] == "blockwise"
    assert "relevance_pass" not in explain(model, x, method="attnlrp", max_memory=10_000, low_memory=False).options


def test_refusals():
    model = make_decoder("llama", "eager")
    x = batch(rows(1, (9,)))
    with pytest.raises(InputError, match="no blockwise relevance pass.*attnlrp, cp_lrp"):
        explain(model, x, method="transformer_attribution", low_memory=True)
    with pytest.raises(InputError, match="low_memory must be None"):
        explain(model, x, method="attnlrp", low_memory="yes")


def test_refused_on_an_adapter_with_its_own_block_driver():
    from transformers import SwinConfig, SwinForImageClassification

    torch.manual_seed(0)
    cfg = SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=2)
    model = SwinForImageClassification(cfg).eval()
    with pytest.raises(UnsupportedModelError, match="own block driver"):
        explain(model, torch.randn(1, 3, 32, 32), method="attnlrp", low_memory=True)


def test_blockwise_on_an_encoder_equals_full():
    """The pass is not decoder-only: a ViT (registers none, pixels) gets the same fields."""
    from by_path import root_fixtures  # the root conftest by path: tests/widgets has one too

    model = root_fixtures().make_tiny_vit().double()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    got = _compare(model, x, "attnlrp", 1e-12)
    assert _rel(got["full"].pixels, got["low"].pixels) <= 1e-12


def test_not_in_the_fast_half_mode():
    """The blockwise pass is not run in the fast half mode: asked for, refused by name; by default the full pass."""
    model = make_decoder("llama", "eager").to(torch.bfloat16)
    x = batch(rows(1, (20,)))
    with pytest.raises(InputError, match="low_memory=True: the blockwise pass is not run in the fast half mode"):
        explain(model, x, method="attnlrp", dtype=torch.bfloat16, low_memory=True)
    small = explain(model, x, method="attnlrp", dtype=torch.bfloat16, max_memory=10_000)
    full = explain(model, x, method="attnlrp", dtype=torch.bfloat16)
    assert "relevance_pass" not in small.options
    assert torch.equal(small.scores, full.scores)
