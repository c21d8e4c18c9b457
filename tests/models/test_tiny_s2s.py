"""tiny-s2s: an embedded Marian encoder-decoder with real weights that translates the alignment task."""

import json

import pytest
import torch

from lrp_core import models
from lrp_core.data.translation import make_translations
from lrp_core.errors import InputError
from lrp_core.models import tiny_s2s
from lrp_core.models.tiny_s2s import HELD_OUT_SEED, accuracies, translate


@pytest.fixture(scope="module")
def s2s():
    return models.load("tiny-s2s")


def test_architecture_is_a_small_marian_with_a_word_level_tokenizer(s2s):
    from transformers import MarianMTModel, PreTrainedTokenizerFast

    assert isinstance(s2s.model, MarianMTModel) and s2s.kind == "seq2seq" and not s2s.model.training
    assert isinstance(s2s.tokenizer, PreTrainedTokenizerFast)
    cfg = s2s.model.config
    assert (cfg.d_model, cfg.encoder_layers, cfg.decoder_layers, cfg.encoder_attention_heads) == (64, 2, 2, 4)
    assert sum(p.numel() for p in s2s.model.parameters()) < 500_000
    size = sum(f.stat().st_size for f in tiny_s2s.ASSET_DIR.iterdir())
    assert size < 2_000_000, size
    # the shipped tokenizer is the one the loader builds: one token per word, then </s>
    built = tiny_s2s.build_tokenizer()
    assert built.get_vocab() == s2s.tokenizer.get_vocab()
    r = make_translations(1, seed=5)[0]
    ids = s2s.tokenizer(r.source)["input_ids"]
    assert s2s.tokenizer.convert_ids_to_tokens(ids) == r.source_words + ["</s>"]


def test_meta_states_both_accuracies_at_least_95_percent(s2s):
    meta = json.loads(tiny_s2s.META_FILE.read_text())
    assert meta["held_out_exact_match"] >= 0.95 and meta["held_out_token_accuracy"] >= 0.95
    for key in ("seed", "train_steps", "train_minutes", "held_out_seed"):
        assert key in meta and s2s.info[key] == meta[key]


@pytest.mark.parametrize("seed", [HELD_OUT_SEED + 17, HELD_OUT_SEED + 4242])
def test_held_out_accuracy_recomputed_on_a_sample(s2s, seed):
    acc = accuracies(s2s.model, s2s.tokenizer, make_translations(150, seed, split="held_out"))
    assert acc["exact_match"] >= 0.95 and acc["token_accuracy"] >= 0.95, acc


def test_generation_is_deterministic_and_batch_independent(s2s):
    sources = [r.source for r in make_translations(6, HELD_OUT_SEED + 3, split="held_out")]
    first = translate(s2s.model, s2s.tokenizer, sources)
    assert first == translate(s2s.model, s2s.tokenizer, sources)
    alone = [translate(s2s.model, s2s.tokenizer, [s])[0] for s in sources[:3]]
    assert alone == first[:3]  # each sentence alone (no padding) translates as in the batch


def test_random_weights_do_not_translate():
    rand = models.load("tiny-s2s", pretrained=False)
    acc = accuracies(rand.model, rand.tokenizer, make_translations(50, HELD_OUT_SEED + 9, split="held_out"))
    assert acc["exact_match"] == 0.0 and acc["token_accuracy"] < 0.3


def test_preprocess_and_bad_arguments(s2s):
    enc = s2s.preprocess(["the cat sees a dog", "every king likes this small fish and the man helps a horse"])
    assert enc["input_ids"].shape[0] == 2 and (enc["attention_mask"][0] == 0).any()  # right-padded
    with torch.no_grad():
        out = s2s.model(**enc, decoder_input_ids=torch.zeros(2, 1, dtype=torch.long))
    assert out.logits.shape == (2, 1, len(s2s.tokenizer))
    with pytest.raises(InputError, match="source sentence"):
        s2s.preprocess([1, 2])
    with pytest.raises(InputError, match="pretrained"):
        models.load("tiny-s2s", pretrained="yes")


def test_missing_weights_are_reported_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(tiny_s2s, "WEIGHTS_FILE", tmp_path / "missing.safetensors")
    with pytest.raises(tiny_s2s.TinyS2SAssetError, match="train_tiny_s2s"):
        models.load("tiny-s2s")
