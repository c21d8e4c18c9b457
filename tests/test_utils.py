"""Shared helpers (lrp_core.utils): model device, progress bars, logits."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lrp_core.errors import InputError
from lrp_core.utils import logits_of, model_device, progress_bar


def test_model_device():
    assert model_device(torch.nn.Linear(2, 3)) == torch.device("cpu")
    assert model_device(lambda x: x) == torch.device("cpu")        # no parameters


def test_progress_bar_passes_through_without_progress():
    items = [1, 2, 3]
    assert progress_bar(items, False, desc="x") is items
    assert list(progress_bar(items, True, disable=True)) == items


def test_logits_of_tensor_output_and_dict_inputs():
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    assert torch.equal(logits_of(lin, x), lin(x))
    hf_like = lambda input_ids, attention_mask: SimpleNamespace(  # noqa: E731
        logits=(input_ids * attention_mask).float())
    ids, mask = torch.ones(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.long)
    assert logits_of(hf_like, {"input_ids": ids, "attention_mask": mask}).shape == (2, 5)
    with pytest.raises(InputError, match=r"\(B, C\)"):
        logits_of(lambda x: x, torch.randn(2, 3, 4))
