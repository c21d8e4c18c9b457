"""explain_generation on an encoder-decoder (issue #48): each generated token explained with the source fixed.

Step k of ``gen`` is ``explain`` of its teacher-forced prefix (the start token and the k tokens before it), read
at its last token with the token written there as target: ``gen.source[:, k]`` and ``gen.prefix[:, k]`` equal
that explanation's ``source`` and ``prefix``; the greedy tokens are the model's argmax step by step.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "adapters"))
from seq2seq_models import PREFIXES, SOURCES, batch, make_seq2seq  # noqa: E402

import lrp_core  # noqa: E402
from lrp_core.errors import InputError  # noqa: E402


def _greedy(model, source: list, start: int, K: int) -> list:
    dec = [start]
    for _ in range(K):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([dec])).logits
        dec.append(int(logits[0, -1].argmax()))
    return dec[1:]


@pytest.mark.parametrize("family, method", [("marian", "cp_lrp"), ("bart", "attnlrp"), ("t5", "input_x_gradient")])
def test_each_step_is_the_explanation_of_its_prefix(family, method):
    model = make_seq2seq(family)
    src = batch(SOURCES, PREFIXES, "left")
    sources = {"input_ids": src["input_ids"], "attention_mask": src["attention_mask"]}
    K = 3
    gen = lrp_core.explain_generation(model, None, sources, method=method, max_new_tokens=K, stop_at_eos=False)
    start = model.config.decoder_start_token_id
    assert gen.source.shape == (3, K, src["input_ids"].shape[1]) and gen.prefix.shape == (3, K, K)
    for b, s in enumerate(SOURCES):
        assert gen.targets[b].tolist() == _greedy(model, s, start, K)
        for k in range(K):
            prefix = [start] + gen.targets[b, :k].tolist()
            one = lrp_core.explain(
                model,
                {"input_ids": torch.tensor([s]), "decoder_input_ids": torch.tensor([prefix])},
                method=method,
                target=int(gen.targets[b, k]),
            )
            real = src["attention_mask"][b].bool()
            scale = one.scores.abs().max()
            assert (gen.source[b, k][real] - one.source[0]).abs().max() < 1e-10 * scale, (b, k)
            assert (gen.source[b, k][~real] == 0).all()
            assert (gen.prefix[b, k, : k + 1] - one.prefix[0]).abs().max() < 1e-10 * scale, (b, k)
            assert (gen.prefix[b, k, k + 1 :] == 0).all()
            assert abs(float(gen.logits[b, k]) - float(one.logits[0, gen.targets[b, k]])) < 1e-10


def test_given_continuation_and_refusals():
    model = make_seq2seq("bart")
    sources = {"input_ids": torch.tensor([SOURCES[0]])}
    gen = lrp_core.explain_generation(model, None, sources, method="cp_lrp", continuation=[[7, 8, 9]])
    assert gen.targets.tolist() == [[7, 8, 9]] and gen.prefix.shape == (1, 3, 3)
    assert gen.decoder_input_ids.tolist() == [[model.config.decoder_start_token_id, 7, 8]]
    with pytest.raises(InputError, match="contrast"):
        lrp_core.explain_generation(model, None, sources, method="cp_lrp", contrast=5)
    with pytest.raises(lrp_core.errors.UnsupportedModelError, match="rollout"):
        lrp_core.explain_generation(model, None, sources, method="rollout")
