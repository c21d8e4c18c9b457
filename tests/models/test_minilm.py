"""minilm-sentiment: offline load, [CLS] -> pooler -> classifier path, accuracy on held-out text."""

from __future__ import annotations

import re

import pytest
import torch

from lrp_core.models import LoadedModel, load, minilm

needs_head = pytest.mark.skipif(
    not minilm.HEAD_FILE.is_file(), reason="trained head not present; run scripts/train_minilm_sentiment.py"
)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: these small models run several times faster with one
    thread than with two when the CI's two cores are shared with other jobs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def loaded(one_thread) -> LoadedModel:
    return load("minilm-sentiment")


def test_loads_offline(loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    assert loaded.name == "minilm-sentiment" and loaded.kind == "text"
    assert list(loaded.labels) == ["negative", "positive"]
    assert loaded.model.config.id2label == {0: "negative", 1: "positive"}
    assert not loaded.model.training
    # a second load with the hub explicitly unreachable still works (local files only)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    again = load("minilm-sentiment")
    for (k, a), b in zip(again.model.state_dict().items(), loaded.model.state_dict().values()):
        assert torch.equal(a, b), k


def test_load_leaves_hub_settings_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading must not switch the whole process offline (the hub loader needs it)."""
    import os

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    load("minilm-sentiment")
    assert "HF_HUB_OFFLINE" not in os.environ


def test_architecture_is_bert_minilm(loaded: LoadedModel) -> None:
    from transformers import BertForSequenceClassification

    m = loaded.model
    assert isinstance(m, BertForSequenceClassification)
    cfg = m.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_labels) == (6, 384, 12, 2)


def test_preprocess_batch_and_errors(loaded: LoadedModel) -> None:
    batch = loaded.preprocess(["Great film.", "A long, dull and pointless film that nobody should see."])
    assert set(batch) == {"input_ids", "attention_mask"}
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert ids.shape == mask.shape and ids.shape[0] == 2 and ids.dtype == torch.long
    assert mask[0].sum() < mask[1].sum()  # padded to the longest
    assert (ids[:, 0] == loaded.tokenizer.cls_token_id).all()
    long = loaded.preprocess(["word " * 500])
    assert long["input_ids"].shape[1] == 128  # truncated
    assert loaded.preprocess("one text")["input_ids"].shape[0] == 1
    with pytest.raises(ValueError, match="list of strings"):
        loaded.preprocess([1, 2])
    with pytest.raises(ValueError, match="list of strings"):
        loaded.preprocess([])


def test_prediction_flows_through_cls_pooler_classifier(loaded: LoadedModel) -> None:
    m = loaded.model
    batch = loaded.preprocess(["What a wonderful, moving film.", "Dreadful from start to finish."])
    with torch.no_grad():
        hidden = m.bert(**batch).last_hidden_state  # (B, T, 384)
        by_hand = m.classifier(torch.tanh(m.bert.pooler.dense(hidden[:, 0])))
        logits = m(**batch).logits
    torch.testing.assert_close(logits, by_hand)


@needs_head
def test_shipped_head_is_small_and_only_changed_tensors() -> None:
    from safetensors.torch import load_file

    assert minilm.HEAD_FILE.stat().st_size <= 20 * 2**20
    keys = set(load_file(str(minilm.HEAD_FILE)))
    assert {"classifier.weight", "classifier.bias", "bert.pooler.dense.weight"} <= keys
    assert not any(k.startswith("bert.embeddings.") for k in keys)


def test_untrained_head_differs(loaded: LoadedModel) -> None:
    raw = load("minilm-sentiment", pretrained=False)
    assert raw.info["trained"] is False
    if minilm.HEAD_FILE.is_file():
        assert not torch.equal(raw.model.classifier.weight, loaded.model.classifier.weight)
    with pytest.raises(ValueError, match="pretrained must be"):
        load("minilm-sentiment", pretrained="sometimes")


def test_tweets_are_clean_binary_and_split_disjoint() -> None:
    train, test = minilm.tweet_split(seed=0)
    assert len(test) >= 500
    assert sum(e.label for e in test) * 2 == len(test)  # balanced
    assert not {e.text for e in train} & {e.text for e in test}
    for e in test[:300]:
        assert e.label in (0, 1) and "http" not in e.text and not re.search(r"@\w", e.text)


def test_movie_sentences_are_disjoint() -> None:
    from lrp_core.data.rationales import load_rationales

    tr = {e.text.lower() for e in minilm.load_movie_sentences(minilm.MOVIE_TRAIN_FILE)}
    ev = minilm.load_movie_sentences(minilm.MOVIE_EVAL_FILE)
    assert len(ev) >= 40 and sum(e.label for e in ev) * 2 == len(ev)
    dev = minilm.load_movie_sentences(minilm.MOVIE_DEV_FILE)
    assert not tr & {e.text.lower() for e in ev + dev}
    assert not {e.text.lower() for e in ev} & {e.text.lower() for e in dev}
    assert not tr & {r.text.lower() for r in load_rationales()}


@needs_head
def test_heldout_tweet_accuracy(loaded: LoadedModel) -> None:
    _, test = minilm.tweet_split(seed=0)
    subset = [e for e in test if e.label == 0][:100] + [e for e in test if e.label == 1][:100]
    acc = minilm.accuracy(loaded.model, loaded.preprocess, subset)
    assert acc >= 0.80, acc


@needs_head
def test_movie_review_accuracy(loaded: LoadedModel) -> None:
    ev = minilm.load_movie_sentences(minilm.MOVIE_EVAL_FILE)
    acc = minilm.accuracy(loaded.model, loaded.preprocess, ev)
    assert acc >= 0.80, acc


@needs_head
def test_rationale_set_accuracy(loaded: LoadedModel) -> None:
    """The explanations course uses the rationale set: the model should mostly get it right."""
    from lrp_core.data.rationales import load_rationales

    recs = load_rationales()
    pred = minilm.predict(loaded.model, loaded.preprocess, [r.text for r in recs])
    acc = float((pred == torch.tensor([r.label for r in recs])).float().mean())
    assert acc >= 0.80, acc
