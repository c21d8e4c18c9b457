"""The memory model of the modified-gradient passes (lrp_core.runtime.pass_memory) against measured peaks.

The peak is the CPU allocator's own accounting (the profiler's memory events: live tensor bytes, in time order),
deterministic and independent of the process: the prediction is within 25 % of it for the full and the blockwise
pass; the blockwise pass grows linearly in T, the full pass (eager attention) quadratically.
"""

from __future__ import annotations

import pytest
import torch

from lrp_core import explain
from lrp_core.adapters import get_adapter
from lrp_core.runtime import pass_memory


def _allocator_peak(fn) -> float:
    """Peak live tensor bytes above the start while ``fn()`` runs."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    total = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        total += e.nbytes()
        peak = max(peak, total)
    return float(peak)


@pytest.fixture(scope="module")
def small_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=100,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=176,
        max_position_embeddings=512,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def _measured(model, T: int) -> dict:
    ids = torch.randint(1, 100, (1, T), generator=torch.Generator().manual_seed(T))
    x = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    explain(model, {k: v[:, :8] for k, v in x.items()}, method="attnlrp")  # kernels loaded
    adapter = get_adapter(model)
    predicted = pass_memory.predict(adapter, adapter.check_inputs(x))
    got = {}
    for name, low in (("full", False), ("blockwise", True)):
        call = lambda low=low: explain(model, x, method="attnlrp", low_memory=low, unverified=True)  # noqa: E731
        got[name] = _allocator_peak(call)
    return {"measured": got, "predicted": {"full": predicted.full, "blockwise": predicted.blockwise}}


def test_prediction_within_25_percent_and_growth(small_llama):
    at = {T: _measured(small_llama, T) for T in (256, 512)}
    for T, row in at.items():
        for name in ("full", "blockwise"):
            ratio = row["predicted"][name] / row["measured"][name]
            assert 0.75 <= ratio <= 1.25, (T, name, ratio)
    full = at[512]["measured"]["full"] / at[256]["measured"]["full"]
    low = at[512]["measured"]["blockwise"] / at[256]["measured"]["blockwise"]
    assert low < 2.5 < 3.0 < full, (low, full)  # blockwise ~linear in T, the full eager pass ~quadratic
    assert at[512]["measured"]["blockwise"] < 0.3 * at[512]["measured"]["full"]
