"""What a call must leave as it was on the user's model, and the check that it did."""

from __future__ import annotations

import torch


def snapshot(model: torch.nn.Module) -> dict:
    """Parameters and buffers (copied), modes, requires_grad, .grad objects, fused-attention flags, hook counts."""
    return {
        "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grads": [p.grad for p in model.parameters()],
        "fused": [getattr(m, "fused_attn", None) for m in model.modules()],
        "hooks": [(len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks)) for m in model.modules()],
        "attn_impl": getattr(getattr(model, "config", None), "_attn_implementation", None),
    }


def assert_untouched(before: dict, after: dict) -> None:
    """``after`` equals ``before`` bit for bit, and every .grad is the very object it was."""
    assert before["params"].keys() == after["params"].keys()
    for k in before["params"]:
        assert torch.equal(before["params"][k], after["params"][k]), k
    for key in ("training", "requires_grad", "fused", "hooks", "attn_impl"):
        assert before[key] == after[key], key
    assert all(a is b for a, b in zip(before["grads"], after["grads"]))
