"""Every supported Hugging Face text family: the replay is the model, batches equal single texts, the model
stays untouched, every method gives one finite score per token; RoBERTa ≡ BERT; refused families say why."""

from __future__ import annotations

import pytest
import torch
from text_families import CASES, FAMILIES, make, rel_err, text_batch
from untouched import assert_untouched, snapshot

from lrp_core import METHODS, explain
from lrp_core.adapters import get_adapter
from lrp_core.errors import InputError, UnsupportedModelError
from lrp_core.methods import registry
from lrp_core.rules.ops import ELEMENTWISE, LINEAR


# ---------------------------------------------------------------- the replay is the model
@pytest.mark.parametrize("family,impl", CASES)
def test_replay_reproduces_logits(family, impl):
    model = make(family, impl)
    batch = text_batch(model)
    a = get_adapter(model)
    with torch.no_grad():
        expected = model(**batch).logits
        got = a.forward(a.check_inputs(batch)).logits
    assert (got - expected).abs().max() <= 1e-5
    assert torch.allclose(explain(model, batch, method="rollout").logits, expected, atol=1e-5)


# ---------------------------------------------------------------- batch = one by one; one finite score per token
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_batch_equals_single_in_float64(family, method):
    model = make(family).double()
    batch = text_batch(model)
    exp = explain(model, batch, method=method)
    mask = batch["attention_mask"]
    assert exp.scores.shape == mask.shape and torch.isfinite(exp.scores).all()
    for i in range(mask.shape[0]):
        n = int(mask[i].sum())
        one = explain(model, {k: v[i : i + 1, :n] for k, v in batch.items()}, method=method)
        assert rel_err(exp.scores[i, :n], one.scores[0]) <= 1e-8, (family, method)
        assert (exp.scores[i, n:] == 0).all(), "padding scores 0"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_float32_scores_are_finite_and_padding_is_zero(family):
    model = make(family)
    batch = text_batch(model)
    pad = batch["attention_mask"] == 0
    for method in METHODS:
        s = explain(model, batch, method=method).scores
        assert s.shape == pad.shape and torch.isfinite(s).all(), method
        assert (s[pad] == 0).all(), method


# ---------------------------------------------------------------- the model is untouched
@pytest.mark.parametrize("family,impl", CASES)
def test_model_is_untouched(family, impl):
    model = make(family, impl)
    model.train()  # an unusual mode must survive too
    batch = text_batch(model)
    before = snapshot(model)
    for method in METHODS:
        explain(model, batch, method=method)
        assert_untouched(before, snapshot(model))
    with pytest.raises(InputError):
        explain(model, batch, target=99)
    assert_untouched(before, snapshot(model))


# ---------------------------------------------------------------- family specifics
def test_roberta_equals_bert_with_shifted_positions():
    """A BERT holding a RoBERTa's weights (position table shifted by padding_idx + 1, the RoBERTa head on
    BERT's pooler + classifier) explains every text exactly as the RoBERTa does."""
    roberta = make("roberta").double()
    bert = make("bert", seed=1).double()
    bert.config.max_position_embeddings = 40
    _copy_roberta_to_bert(roberta, bert)
    batch = text_batch(roberta)
    with torch.no_grad():
        assert rel_err(bert(**batch).logits, roberta(**batch).logits) <= 1e-12
    for method in METHODS:
        # a reference input must be the same token in both (each model's own padding token differs: 1 vs 0)
        same = {"baseline": roberta.config.pad_token_id} if registry.get(method).takes("baseline") else {}
        a, b = explain(roberta, batch, method=method, **same), explain(bert, batch, method=method, **same)
        assert rel_err(a.scores, b.scores) <= 1e-8, method


def _copy_roberta_to_bert(roberta, bert) -> None:
    offset = roberta.config.pad_token_id + 1  # RoBERTa's first real position
    sd = {k.replace("roberta.", "bert.", 1): v for k, v in roberta.state_dict().items() if k.startswith("roberta.")}
    pos = sd["bert.embeddings.position_embeddings.weight"][offset:]
    bert.bert.embeddings.position_embeddings = torch.nn.Embedding.from_pretrained(pos.clone(), freeze=False)
    sd["bert.embeddings.position_embeddings.weight"] = pos
    types = sd["bert.embeddings.token_type_embeddings.weight"]  # RoBERTa has one token type
    sd["bert.embeddings.token_type_embeddings.weight"] = types.expand(bert.config.type_vocab_size, -1)
    head = roberta.classifier
    sd.update(
        {
            "bert.pooler.dense.weight": head.dense.weight,
            "bert.pooler.dense.bias": head.dense.bias,
            "classifier.weight": head.out_proj.weight,
            "classifier.bias": head.out_proj.bias,
        }
    )
    missing, unexpected = bert.load_state_dict(sd, strict=False)
    assert not unexpected and all(k.endswith("position_ids") or k.endswith("token_type_ids") for k in missing)


def test_roberta_positions_start_after_the_padding_index():
    model = make("roberta")
    a = get_adapter(model)
    assert a.max_length == 42 - 2
    ids = torch.full((1, 41), 7)
    with pytest.raises(InputError, match="at most 40"):
        a.check_inputs({"input_ids": ids})


def test_electra_head_and_embedding_projection():
    model = make("electra")
    a = get_adapter(model)
    kinds = [(layer.kind, layer.module) for layer in a.readout.head_layers]
    assert [k for k, _ in kinds] == [LINEAR, ELEMENTWISE, LINEAR]
    assert kinds[0][1] is model.classifier.dense and kinds[2][1] is model.classifier.out_proj
    assert kinds[1][1] is model.classifier.activation  # GELU, not BERT's tanh
    assert a.embedding_projection() is model.electra.embeddings_project
    emb = a.forward(a.check_inputs(text_batch(model))).embedding
    assert emb.embeds.shape[-1] == 16 and emb.x0.shape[-1] == 32


def test_albert_lists_a_shared_layer_once_per_use():
    model = make("albert")
    a = get_adapter(model)
    layer = model.albert.encoder.albert_layer_groups[0].albert_layers[0]
    assert a.num_blocks == 3 and all(b.attn.q is layer.attention.query for b in a.blocks)
    batch = text_batch(model)
    trace = a.forward(a.check_inputs(batch))
    assert not torch.allclose(trace.attention(0), trace.attention(1))  # each use has its own attention
    exp = explain(model, batch, method="transformer_attribution")
    assert exp.layers.shape[1] == 3 and exp.token_relevance.shape[1] == 3
    grouped = get_adapter(make("albert_groups"))
    assert grouped.num_blocks == 4 * 2  # 4 uses of 2 groups, each of 2 layers


@pytest.mark.parametrize("family", ["distilbert", "albert", "electra"])
def test_modified_gradient_methods_read_the_word_embeddings(family):
    """attnlrp/cp_lrp read relevance at the word-embedding output (ALBERT, ELECTRA: before the projection)."""
    model = make(family)
    a = get_adapter(model)
    batch = text_batch(model)
    emb = a.forward(a.check_inputs(batch), track=True).embedding
    with torch.no_grad():
        words = a.base.embeddings.word_embeddings(batch["input_ids"])
    assert torch.equal(emb.embeds.detach(), words)


def test_distilbert_head_is_pre_classifier_relu_classifier():
    model = make("distilbert")
    head = get_adapter(model).readout.head_layers
    assert [layer.module for layer in head[::2]] == [model.pre_classifier, model.classifier]
    assert isinstance(head[1].module, torch.nn.ReLU)


def test_mpnet_position_bias_is_in_every_block():
    model = make("mpnet")
    a = get_adapter(model)
    trace = a.forward(a.check_inputs(text_batch(model)))
    bias = trace.blocks[0].attn.bias
    assert bias.shape == (3, 2, 7, 7)  # (B, H, N, N): position bias + padding mask
    with torch.no_grad():
        position = model.mpnet.encoder.compute_position_bias(trace.x0)
    assert torch.equal(bias[0], position[0])  # sample 0 has no padding


def _modernbert_headless():
    from transformers import ModernBertConfig, ModernBertModel

    return ModernBertModel(
        ModernBertConfig(
            vocab_size=60,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            cls_token_id=1,
            sep_token_id=2,
        )
    )


@pytest.mark.parametrize(
    "build,why",
    [(_modernbert_headless, "ModernBertModel has no head")],  # DeBERTa's: tests/adapters/test_deberta.py
)
def test_refused_families_say_why_and_what_is_supported(build, why):
    model = build()
    with pytest.raises(UnsupportedModelError, match=why) as err:
        explain(model, {"input_ids": torch.tensor([[5, 6, 7]])})
    assert "Supported:" in str(err.value) and "DistilBert" in str(err.value)


@pytest.mark.parametrize("family,impl", [c for c in CASES if c[0] != "modernbert"])  # its own test: refused
def test_left_padding_is_explained_padded_and_matches_the_model(family, impl):
    """Left padding cannot be trimmed: the replay runs with the mask (and, for RoBERTa/MPNet, the model's
    own position ids); its logits are the model's and padding scores 0."""
    model = make(family, impl)
    batch = text_batch(model)
    T = batch["input_ids"].shape[1]
    shift = (T - batch["attention_mask"].sum(1)).tolist()
    left = {k: torch.stack([torch.roll(v[i], s) for i, s in enumerate(shift)]) for k, v in batch.items()}
    with torch.no_grad():
        expected = model(**left).logits
    exp = explain(model, left, method="transformer_attribution")
    assert (exp.logits - expected).abs().max() <= 1e-5
    assert (exp.scores[left["attention_mask"] == 0] == 0).all()
