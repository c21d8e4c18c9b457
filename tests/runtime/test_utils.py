"""Shared helpers (lrp_core.runtime.utils): model device, progress bars, logits."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lrp_core.errors import InputError
from lrp_core.runtime.utils import logits_in_batches, logits_of, minmax_rows, model_device, progress_bar


def test_model_device():
    assert model_device(torch.nn.Linear(2, 3)) == torch.device("cpu")
    assert model_device(lambda x: x) == torch.device("cpu")  # no parameters


def test_progress_bar_passes_through_without_progress():
    items = [1, 2, 3]
    assert progress_bar(items, False, desc="x") is items
    assert list(progress_bar(items, True, disable=True)) == items


def test_logits_of_tensor_output_and_dict_inputs():
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    assert torch.equal(logits_of(lin, x), lin(x))
    hf_like = lambda input_ids, attention_mask: SimpleNamespace(  # noqa: E731
        logits=(input_ids * attention_mask).float()
    )
    ids, mask = torch.ones(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.long)
    assert logits_of(hf_like, {"input_ids": ids, "attention_mask": mask}).shape == (2, 5)
    with pytest.raises(InputError, match=r"\(B, C\)"):
        logits_of(lambda x: x, torch.randn(2, 3, 4))


def test_logits_in_batches_covers_every_sample_once_in_order():
    """Blocks of batch_size, last one short; each block's logits are the model's on that block."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(7, 4)
    seen = []
    calls = []

    def model(inp: torch.Tensor) -> torch.Tensor:
        calls.append(len(inp))
        return lin(inp)

    for block, logits in logits_in_batches(model, x, 3):
        seen.extend(range(7)[block])
        assert torch.equal(logits, lin(x[block]))
    assert seen == list(range(7)) and calls == [3, 3, 1]


def test_logits_in_batches_prepares_each_block():
    """``prepare`` turns a block of raw samples (here texts) into the model's inputs."""
    texts = ["a", "bb", "ccc", "dddd", "eeeee"]

    def prepare(block: list[str]) -> dict[str, torch.Tensor]:
        width = max(map(len, block))  # padding per block, as a tokenizer does
        ids = torch.tensor([[len(t)] * width for t in block])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    hf_like = lambda input_ids, attention_mask: SimpleNamespace(  # noqa: E731
        logits=(input_ids * attention_mask).float()
    )
    out = [(block, lg) for block, lg in logits_in_batches(hf_like, texts, 2, prepare)]
    assert [b.start for b, _ in out] == [0, 2, 4]
    assert [lg.shape for _, lg in out] == [(2, 2), (2, 4), (1, 5)]
    assert torch.cat([lg[:, 0] for _, lg in out]).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    with pytest.raises(InputError, match="batch_size"):
        next(logits_in_batches(hf_like, texts, 0, prepare))


def test_minmax_rows_by_hand_and_with_a_mask():
    x = torch.tensor([[1.0, 3.0, 2.0], [5.0, 5.0, 5.0]])
    assert torch.equal(minmax_rows(x), torch.tensor([[0.0, 1.0, 0.5], [0.0, 0.0, 0.0]]))
    # with a mask the scale is over the masked entries only; the rest become 0
    y = torch.tensor([[9.0, 1.0, 3.0, -4.0]])
    mask = torch.tensor([[False, True, True, False]])
    assert torch.equal(minmax_rows(y, mask), torch.tensor([[0.0, 0.0, 1.0, 0.0]]))
    assert torch.equal(minmax_rows(y, mask)[:, 1:3], minmax_rows(y[:, 1:3]))
