"""tiny-lm: an embedded Llama-family LM with real weights that answers the facts task."""

import pytest
import torch

from lrp_core import models
from lrp_core.data.facts import evidence_tokens, make_facts
from lrp_core.models.tiny_lm import HELD_OUT_SEED


@pytest.fixture(scope="module")
def lm():
    return models.load("tiny-lm")


def _greedy_answers(lm, records):
    enc = lm.preprocess([r.prompt for r in records])
    enc["position_ids"] = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ids = lm.model(**enc).logits[:, -1].argmax(-1)
    return lm.tokenizer.convert_ids_to_tokens(ids.tolist())


def test_architecture_is_the_llama_family(lm):
    cfg = lm.model.config
    assert type(lm.model).__name__ == "LlamaForCausalLM" and lm.kind == "lm"
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # grouped-query attention
    from transformers import PreTrainedTokenizerFast

    assert isinstance(lm.tokenizer, PreTrainedTokenizerFast)  # transformers 5 names the class TokenizersBackend
    assert sum(p.numel() for p in lm.model.parameters()) < 5_000_000


@pytest.mark.parametrize("seed", [HELD_OUT_SEED + 17, HELD_OUT_SEED + 4242])
def test_held_out_accuracy_at_least_95_percent(lm, seed):
    records = make_facts(400, seed)
    answers = _greedy_answers(lm, records)
    acc = sum(a == r.answer for a, r in zip(answers, records)) / len(records)
    assert acc >= 0.95, acc


def test_random_weights_do_not_answer():
    rand = models.load("tiny-lm", pretrained=False)
    records = make_facts(200, HELD_OUT_SEED + 99)
    acc = sum(a == r.answer for a, r in zip(_greedy_answers(rand, records), records)) / len(records)
    assert acc < 0.3


def test_evidence_tokens_are_the_answer_token(lm):
    for r in make_facts(50, HELD_OUT_SEED + 3):
        enc = lm.tokenizer(r.prompt, return_offsets_mapping=True)
        pos = evidence_tokens(r, enc["offset_mapping"])
        assert lm.tokenizer.convert_ids_to_tokens([enc["input_ids"][p] for p in pos]) == [r.answer]
        assert enc["input_ids"][0] == lm.tokenizer.bos_token_id
