"""What a decoder's inputs ask for is honoured or refused, never dropped.

* ``position_ids`` given with the inputs are the model's (the explained logit is ``model(**inputs)``'s), checked;
* a cache (``past_key_values`` / ``cache``), ``inputs_embeds``, a ``cache_position`` that continues a cache and any
  key the explanation does not read are an :class:`InputError` naming the key; keys that change no logit pass;
* a sequence classifier is read where Hugging Face pools (its last token that is not ``pad_token_id``), also where
  the padding id is the end-of-text token the rows end in, padded on either side;
* every rotary type of transformers: a row's map and logit in a batch (one long, one short row, padded left or
  right) are those of the row alone, and the rotary module is not written to (``dynamic`` / ``longrope`` choose
  their tables by the longest position of a call: chosen per row);
* BERT-family encoders honour ``position_ids`` and ``token_type_ids`` too.
"""

from __future__ import annotations

import copy

import pytest
import torch
from decoders import ROPES, batch, make_decoder, rows
from text_families import make, text_batch

import lrp_core
from lrp_core.adapters import get_adapter
from lrp_core.errors import InputError


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs().max() / b.abs().max().clamp(min=1e-300)).detach())


def _own_logits(model, inputs: dict) -> torch.Tensor:
    """``model(**inputs)``'s logits at the last column (causal LM), or the classifier's pooled ones."""
    with torch.no_grad():
        out = model(**inputs).logits
    return out if out.dim() == 2 else out[:, -1]


# ----------------------------------------------------------------------------- position_ids
@pytest.mark.parametrize("family,step", [("llama", 2), ("gpt2", 1), ("gemma3", 1)])
def test_given_position_ids_are_the_models(family, step):
    model = make_decoder(family, "sdpa")
    inputs = batch(rows(lengths=(6, 6, 6)))  # unpadded, so model(**inputs) reads the last column of every row
    # a prompt offset per row (rotary attention sees only its round-off), and for Llama a step of 2 as well
    inputs["position_ids"] = step * torch.arange(6)[None] + torch.tensor([[3], [9], [0]])
    exp = lrp_core.explain(model, inputs, method="attnlrp")
    own = _own_logits(model, inputs)
    assert _rel(exp.logits, own) < 1e-12
    # the position ids change the model's logits beyond round-off
    assert _rel(own, _own_logits(model, {k: v for k, v in inputs.items() if k != "position_ids"})) > 1e-9


def test_given_position_ids_one_row_for_all_and_left_padding():
    model = make_decoder("llama", "sdpa")
    seqs = rows(lengths=(4, 7))
    inputs = batch(seqs, "left")
    inputs["position_ids"] = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0) + 2
    exp = lrp_core.explain(model, inputs, method="attnlrp")
    assert _rel(exp.logits, _own_logits(model, inputs)) < 1e-12
    shared = lrp_core.explain(model, {**batch(seqs[1:]), "position_ids": torch.arange(7)[None] + 2}, method="attnlrp")
    assert _rel(shared.scores, exp.scores[1:]) < 1e-10


@pytest.mark.parametrize(
    "bad,match",
    [
        (torch.arange(5)[None].expand(3, -1), "shape"),
        (torch.full((3, 9), -1), "lie in"),
        (torch.full((3, 9), 64), "lie in"),
        (torch.zeros(3, 9), "integer"),
    ],
)
def test_bad_position_ids_are_refused(bad, match):
    model = make_decoder("llama")
    with pytest.raises(InputError, match=match):
        lrp_core.explain(model, {**batch(rows()), "position_ids": bad}, method="attnlrp")


def test_packed_position_ids_without_a_mask_are_refused():
    model = make_decoder("llama")
    ids = rows(lengths=(8,))[0][None]
    packed = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]])  # two sequences in one row: HF attends within each
    with pytest.raises(InputError, match="packed"):
        lrp_core.explain(model, {"input_ids": ids, "position_ids": packed}, method="attnlrp")


def test_position_ids_that_skip_under_a_sliding_window_are_refused():
    model = make_decoder("mistral")  # window 4: HF counts it in tokens
    inputs = batch(rows())
    with pytest.raises(InputError, match="sliding window"):
        lrp_core.explain(model, {**inputs, "position_ids": 2 * torch.arange(9)[None]}, method="attnlrp")


# ----------------------------------------------------------------------------- caches, embeddings, other keys
@pytest.mark.parametrize("key", ["past_key_values", "cache"])
def test_a_cache_is_refused(key):
    from transformers import DynamicCache

    model = make_decoder("llama")
    ids = rows(lengths=(8,))[0][None]
    with torch.no_grad():
        cache = model(input_ids=ids[:, :5], use_cache=True).past_key_values
    assert isinstance(cache, DynamicCache) and cache.get_seq_length() == 5
    with pytest.raises(InputError, match=rf"'{key}'.*past_key_values.*use_cache|whole sequence"):
        lrp_core.explain(model, {"input_ids": ids[:, 5:], key: cache}, method="attnlrp")


def test_inputs_embeds_are_refused():
    model = make_decoder("llama")
    inputs = batch(rows())
    embeds = model.get_input_embeddings()(inputs["input_ids"]) * 2
    with pytest.raises(InputError, match="inputs_embeds.*input_ids"):
        lrp_core.explain(model, {**inputs, "inputs_embeds": embeds}, method="attnlrp")


def test_cache_position_counting_from_zero_is_accepted_else_refused():
    model = make_decoder("llama")
    inputs = batch(rows())
    plain = lrp_core.explain(model, inputs, method="attnlrp")
    same = lrp_core.explain(model, {**inputs, "cache_position": torch.arange(9)}, method="attnlrp")
    assert torch.equal(plain.scores, same.scores)
    with pytest.raises(InputError, match="cache_position"):
        lrp_core.explain(model, {**inputs, "cache_position": torch.arange(9) + 4}, method="attnlrp")


def test_unknown_keys_are_refused_and_keys_without_effect_pass():
    model = make_decoder("llama")
    inputs = batch(rows())
    with pytest.raises(InputError, match="'offset_mapping'.*input_ids, attention_mask, position_ids"):
        lrp_core.explain(model, {**inputs, "offset_mapping": torch.zeros(3, 9, 2, dtype=torch.long)}, method="attnlrp")
    plain = lrp_core.explain(model, inputs, method="attnlrp")
    extra = {
        "labels": inputs["input_ids"],
        "use_cache": False,
        "output_attentions": True,
        "return_dict": True,
        "token_type_ids": torch.zeros_like(inputs["input_ids"]),
        "past_key_values": None,
    }
    assert torch.equal(lrp_core.explain(model, {**inputs, **extra}, method="attnlrp").scores, plain.scores)


# ----------------------------------------------------------------------------- where a classifier reads
EOS = 2


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_classifier_with_pad_equal_to_eos_is_read_where_the_model_pools(family, side):
    over = dict(pad_token_id=EOS, eos_token_id=EOS)
    model = make_decoder(family, "sdpa", head="seq", **over)
    seqs = [torch.cat([r, torch.tensor([EOS])]) for r in rows(lengths=(5, 8, 3))]  # every row ends in eos
    inputs = batch(seqs, side, pad_id=EOS)
    inputs_hf = {**inputs, "position_ids": (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)}
    own = _own_logits(model, inputs_hf)
    exp = lrp_core.explain(model, inputs, method="attnlrp")
    assert _rel(exp.logits, own) < 1e-12
    # the map is that of the row without its final eos, alone: the eos after the read token carries nothing
    for i, s in enumerate(seqs):
        alone = lrp_core.explain(model, batch([s[:-1]]), method="attnlrp")
        assert _rel(alone.logits, own[i : i + 1]) < 1e-12
        got = exp.scores[i][inputs["attention_mask"][i].bool()]
        assert got[-1] == 0
        assert _rel(got[:-1], alone.scores[0]) < 1e-10


def test_classifier_padded_with_another_id_than_its_pad_token_is_refused():
    model = make_decoder("llama", head="seq", pad_token_id=EOS)
    inputs = batch(rows(), "right", pad_id=0)  # HF would pool a padding token of the shorter rows
    with pytest.raises(InputError, match="pad_token_id"):
        lrp_core.explain(model, inputs, method="attnlrp")


# ----------------------------------------------------------------------------- rotary tables per row
def test_every_rotary_type_is_covered():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    assert set(ROPE_INIT_FUNCTIONS) | {"default"} == set(ROPES)


def _rotary_state(model) -> dict:
    rope = model.model.rotary_emb
    return {
        k: (v.clone() if isinstance(v, torch.Tensor) else v)
        for k, v in vars(rope).items()
        if not k.startswith("_") and k != "config"
    } | {k: b.clone() for k, b in rope.named_buffers()}


@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("side", ["left", "right"])
def test_rotary_tables_are_each_rows_own(rope, side):
    family, over = ROPES[rope]
    model = make_decoder(family, "sdpa", **over)
    reference = copy.deepcopy(model)  # transformers' dynamic rotary keeps state between calls: references apart
    short, long = rows(lengths=(5, 14))
    inputs = batch([short, long], side)
    before = _rotary_state(model)
    adapter = get_adapter(model)
    got = adapter.forward(adapter.check_inputs(inputs)).logits  # the whole batch in one replay
    exp = lrp_core.explain(model, inputs, method="attnlrp")
    for i, s in enumerate((short, long)):
        alone = lrp_core.explain(model, batch([s]), method="attnlrp")
        own = _own_logits(reference, batch([s]))
        assert _rel(got[i], own[0]) < 1e-12, (i, _rel(got[i], own[0]))
        assert _rel(exp.logits[i], own[0]) < 1e-12
        assert _rel(exp.scores[i][inputs["attention_mask"][i].bool()], alone.scores[0]) < 1e-10
    after = _rotary_state(model)
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert torch.equal(after[k], v) if isinstance(v, torch.Tensor) else after[k] == v, k


def test_dynamic_rotary_runs_past_max_position_embeddings():
    family, over = ROPES["dynamic"]
    model = make_decoder(family, "sdpa", **over)
    ids = rows(lengths=(14,))[0][None]
    exp = lrp_core.explain(model, {"input_ids": ids}, method="attnlrp")
    assert _rel(exp.logits, _own_logits(copy.deepcopy(model), {"input_ids": ids})) < 1e-12


# ----------------------------------------------------------------------------- BERT family
@pytest.mark.parametrize("family", ["bert", "roberta", "electra", "albert"])
def test_encoder_position_and_token_type_ids_are_the_models(family):
    model = make(family).double()
    inputs = text_batch(model)
    T = inputs["input_ids"].shape[1]
    inputs["position_ids"] = torch.arange(T)[None] + torch.tensor([[2], [5], [9]])
    types = torch.zeros_like(inputs["input_ids"])
    types[:, 3:] = 1 if model.config.type_vocab_size > 1 else 0
    inputs["token_type_ids"] = types
    with torch.no_grad():
        own = model(**inputs).logits
        plain = model(**{k: v for k, v in inputs.items() if k != "position_ids"}).logits
    assert _rel(own, plain) > 1e-6  # the positions matter
    assert _rel(lrp_core.explain(model, inputs, method="attnlrp").logits, own) < 1e-12


@pytest.mark.parametrize(
    "family,key",
    [
        ("bert", "head_mask"),
        ("bert", "inputs_embeds"),
        ("bert", "offset_mapping"),
        ("distilbert", "token_type_ids"),
        ("distilbert", "position_ids"),
        ("mpnet", "position_ids"),
    ],
)
def test_encoder_keys_the_replay_does_not_read_are_refused(family, key):
    model = make(family)
    inputs = text_batch(model)
    value = {
        "head_mask": torch.ones(2, 2),
        "inputs_embeds": torch.zeros(3, 7, 32),
        "token_type_ids": torch.ones_like(inputs["input_ids"]),
    }.get(key, torch.zeros_like(inputs["input_ids"]))
    with pytest.raises(InputError, match=key):
        lrp_core.explain(model, {**inputs, key: value}, method="attnlrp")


@pytest.mark.parametrize("family", ["distilbert", "mpnet"])
def test_one_segment_on_a_model_without_a_segment_table_changes_nothing(family):
    """All-zero token_type_ids (what a BERT tokenizer emits for one text) on a model with no segment table: the
    explanation is the one without them, bit for bit; a second segment is refused (the test above)."""
    model = make(family)
    inputs = text_batch(model)
    with_zeros = lrp_core.explain(
        model, {**inputs, "token_type_ids": torch.zeros_like(inputs["input_ids"])}, method="attnlrp"
    )
    assert torch.equal(with_zeros.scores, lrp_core.explain(model, inputs, method="attnlrp").scores)


def test_encoder_token_type_ids_outside_the_segment_table_are_refused():
    model = make("roberta")  # type_vocab_size 1: only segment 0
    inputs = text_batch(model)
    with pytest.raises(InputError, match=r"token_type_ids must lie in \[0, 1\)"):
        lrp_core.explain(model, {**inputs, "token_type_ids": torch.ones_like(inputs["input_ids"])}, method="attnlrp")
