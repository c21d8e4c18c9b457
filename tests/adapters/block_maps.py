"""Device maps at block granularity for the split-model tests, as ``from_pretrained(device_map="auto")`` makes them:
each list of blocks split in half over two (simulated) accelerators, everything else with the module before it."""

from __future__ import annotations

import pytest
import torch
from fake_devices import GPU0, GPU1

accelerate = pytest.importorskip("accelerate", reason="accelerate is a test extra (pyproject [test-extras])")


def is_block_list(module: torch.nn.Module) -> bool:
    """A list of blocks: a ModuleList, or a Sequential of modules of one class (timm's blocks and stages)."""
    if isinstance(module, torch.nn.ModuleList):
        return True
    kinds = {type(m) for m in module.children()}
    return isinstance(module, torch.nn.Sequential) and len(module) > 1 and len(kinds) == 1


def block_map(model: torch.nn.Module) -> dict:
    """A device map at block granularity: each list of blocks' first half on GPU0, the rest on GPU1; any other
    module (its own tensors, or no child) where the module before it is; a tied group where its first member is."""
    out: dict = {}
    state = {"device": GPU0}

    def visit(module: torch.nn.Module, name: str) -> None:
        if is_block_list(module):
            for i in range(len(module)):
                state["device"] = GPU0 if i < (len(module) + 1) // 2 else GPU1
                out[f"{name}.{i}"] = state["device"]
            return
        own = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        children = list(module.named_children())
        blocks = any(is_block_list(m) for m in module.modules())
        if name and (not children or (own and not blocks)):  # a leaf, or a unit with tensors of its own
            out[name] = state["device"]
            return
        for t, _ in own:  # a module's own tensors beside its blocks (the root's class token), by name
            out[f"{name}.{t}" if name else t] = state["device"]
        for child_name, child in children:
            visit(child, f"{name}.{child_name}" if name else child_name)

    visit(model, "")
    for group in accelerate.utils.find_tied_parameters(model):
        order = list(out)  # module order: the group goes where its first member (the embedding) is
        keys = sorted((max((k for k in out if f"{p}.".startswith(f"{k}.")), key=len) for p in group), key=order.index)
        for k in keys[1:]:
            out[k] = out[keys[0]]
    return out


__all__ = ["block_map", "is_block_list"]
