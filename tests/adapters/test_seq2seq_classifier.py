"""BartForSequenceClassification / MBartForSequenceClassification (issue #48): the class logit read at the
source's last end-of-text token by the classification head — docs/METHODS.md §2i.

What is checked: the replay's logits are the model's own (each row alone; the decoder reads the source shifted
right, its padding the source's); CP-LRP conserves with every additive constant zeroed; a row's scores do not
depend on its batch or its padding; a source without an end-of-text token is refused.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import transformers as tf

sys.path.insert(0, os.path.dirname(__file__))
from seq2seq_models import COMMON, LAYERS, SOURCES, pad, perturb, zero_constants  # noqa: E402

import lrp_core  # noqa: E402
from lrp_core.adapters import get_adapter  # noqa: E402
from lrp_core.errors import InputError  # noqa: E402

CLASSES = {
    "bart": (tf.BartForSequenceClassification, tf.BartConfig),
    "mbart": (tf.MBartForSequenceClassification, tf.MBartConfig),
}


def _classifier(family: str):
    cls, config_cls = CLASSES[family]
    torch.manual_seed(0)
    cfg = config_cls(**COMMON, **LAYERS, num_labels=3, eos_token_id=3)
    cfg._attn_implementation = "eager"
    return perturb(cls(cfg).eval().double(), 0)


def _alone(model) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.tensor([s])).logits for s in SOURCES])


@pytest.mark.parametrize("family", list(CLASSES))
def test_replay_is_the_model_and_rows_are_alone(family):
    model = _classifier(family)
    alone = _alone(model)
    adapter = get_adapter(model)
    for side in ("left", "right"):
        ids, mask = pad(SOURCES, side)
        got = adapter.forward(adapter.check_inputs({"input_ids": ids, "attention_mask": mask})).logits
        assert float((got - alone).abs().max() / alone.abs().max()) < 1e-10, side
    ids, mask = pad(SOURCES, "right")
    with torch.no_grad():  # right padding: the model's own batch is its rows alone
        assert float((model(input_ids=ids, attention_mask=mask).logits - alone).abs().max()) < 1e-10
    ids, mask = pad(SOURCES, "left")
    dec_mask = torch.cat([torch.ones_like(mask[:, :1]), mask[:, :-1]], dim=1).bool()  # the source's, shifted
    # (left padding: the shifted source's last token lies past the row's end)
    for method in ("cp_lrp", "lrp", "integrated_gradients"):
        left = lrp_core.explain(model, {"input_ids": ids, "attention_mask": mask}, method=method, target=1)
        for i, s in enumerate(SOURCES):
            one = lrp_core.explain(model, {"input_ids": torch.tensor([s])}, method=method, target=1)
            row = torch.cat([left.source[i][mask[i].bool()], left.prefix[i][dec_mask[i]]])
            assert float((row - one.scores[0]).abs().max() / one.scores.abs().max()) < 1e-9, (method, i)


def test_cp_lrp_conserves_without_constants_and_refusals():
    model = zero_constants(_classifier("bart"))
    ids, mask = pad(SOURCES, "right")
    exp = lrp_core.explain(model, {"input_ids": ids, "attention_mask": mask}, method="cp_lrp")
    y = exp.logits.gather(1, exp.target[:, None]).squeeze(1)
    assert torch.allclose(exp.source.sum(-1) + exp.prefix.sum(-1), y, rtol=1e-8, atol=0)
    with pytest.raises(InputError, match="end-of-text"):
        lrp_core.explain(model, {"input_ids": torch.tensor([[5, 6, 7]])}, method="cp_lrp")
    with pytest.raises(InputError, match="position"):
        lrp_core.explain(model, {"input_ids": ids, "attention_mask": mask}, method="cp_lrp", position=1)
