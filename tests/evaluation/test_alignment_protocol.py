"""The alignment protocol on synthetic maps with known answers, its bootstrap, and the autograd reference maps."""

import json

import numpy as np
import pytest
import torch

from lrp_core.data.translation import make_translations
from lrp_core.errors import InputError, LRPError
from lrp_core.evaluation import alignment as al
from lrp_core.evaluation.bootstrap import comparison_table, paired_interval, paired_statistic_interval
from lrp_core.metrics import aer_from_counts
from lrp_core.models.tiny_s2s import build_model, build_tokenizer
from tests.untouched import assert_untouched, snapshot


@pytest.fixture(scope="module")
def data():
    return al.alignment_data(build_tokenizer(), make_translations(300, seed=11, split="held_out"))


def _noisy_gold(data, seed=0):
    noise = torch.rand(data.gold.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return data.gold.double() * 2 + noise  # gold links score in [2, 3], the rest in [0, 1]


def _half_right(data, seed=1):
    """Gold maps for the words of an even index, an off-by-one source word for the others (a known share wrong)."""
    maps = _noisy_gold(data, seed)
    for n, rec in enumerate(data.records):
        for k in range(1, len(rec.alignment), 2):
            if rec.alignment[k]:
                maps[n, k] %= 1
                maps[n, k, (rec.alignment[k][0] + 1) % len(rec.source_words)] += 2  # the next source word
    return maps


def test_layout_matches_the_records(data):
    r = data.records[0]
    assert data.input_ids.shape[1] >= len(r.source_words) + 1 and data.targets.shape[1] >= len(r.target_words)
    for n, rec in enumerate(data.records):
        assert int(data.candidates[n].sum()) == len(rec.source_words)  # </s> and padding are no candidates
        for k, links in enumerate(rec.alignment):
            assert data.gold[n, k].nonzero().flatten().tolist() == list(links)
        assert int(data.scored[n].sum()) == sum(1 for links in rec.alignment if links)


def test_a_perfect_map_scores_aer_zero_and_top1_one_and_random_is_near_chance(data):
    results, curves, skipped = al.alignment_protocol(lambda m: _noisy_gold(data), data, ["perfect"], baseline=True)
    assert not skipped
    assert results["perfect"]["top1_accuracy"] == 1.0
    assert results["perfect"]["aer_top1"] == 0.0 and results["perfect"]["aer_threshold"] == 0.0
    # random: the expected top-1 accuracy is the mean of 1 / (source words) over the scored words
    chance = float(
        np.mean([np.mean([1 / len(r.source_words)] * sum(1 for a in r.alignment if a)) for r in data.records])
    )
    assert abs(results["random"]["top1_accuracy"] - chance) < 0.04, (results["random"], chance)
    assert results["random"]["aer_top1"] > 0.7
    assert len(curves["random"]["top1_accuracy_per_sentence"]) == len(data.records)


def test_the_random_row_is_seeded(data):
    a = al.alignment_protocol(lambda m: None, data, [], seed=3)[0]
    b = al.alignment_protocol(lambda m: None, data, [], seed=3)[0]
    c = al.alignment_protocol(lambda m: None, data, [], seed=4)[0]
    assert a["random"]["top1_accuracy"] == b["random"]["top1_accuracy"] != c["random"]["top1_accuracy"]


def test_a_known_share_of_wrong_links_is_measured_and_the_intervals_cover_it(data):
    def maps(method):
        return _noisy_gold(data) if method == "perfect" else _half_right(data)

    results, curves, _ = al.alignment_protocol(maps, data, ["perfect", "half"], baseline=False)
    scored_odd = data.scored[:, 1::2]
    hits_even = data.scored[:, 0::2].sum(-1).double()
    per_sentence = (hits_even / data.scored.sum(-1)).numpy()  # the odd words are all wrong (off by one)
    assert curves["half"]["top1_accuracy_per_sentence"] == pytest.approx(per_sentence.tolist())
    truth = 1 - per_sentence.mean()
    mean, lo, hi = paired_interval(
        curves["perfect"]["top1_accuracy_per_sentence"], curves["half"]["top1_accuracy_per_sentence"]
    )
    assert mean == pytest.approx(truth) and lo < truth < hi and hi - lo < 0.1
    wrong = int(scored_odd.sum())
    aer_truth = 1 - 2 * (int(data.scored.sum()) - wrong) / (2 * int(data.scored.sum()))
    assert results["half"]["aer_top1"] == pytest.approx(aer_truth)
    d, lo, hi = paired_statistic_interval(
        curves["half"]["aer_top1_counts_per_sentence"],
        curves["perfect"]["aer_top1_counts_per_sentence"],
        aer_from_counts,
    )
    assert d == pytest.approx(aer_truth) and lo < aer_truth < hi
    table = comparison_table(curves, "perfect", kind="seq2seq")
    assert "| half |" in table and "AER top-1" in table


def test_a_method_that_is_refused_is_skipped_with_its_reason_and_a_wrong_shape_is_an_error(data):
    def maps(method):
        if method == "refused":
            raise LRPError("not defined here")
        return torch.zeros(1, 2, 3)

    with pytest.raises(InputError, match="expected"):
        al.alignment_protocol(maps, data, ["refused", "bad"], baseline=False)
    results, _, skipped = al.alignment_protocol(maps, data, ["refused"], baseline=True)
    assert skipped == ["refused: not defined here"] and list(results) == ["random"]


def test_gradient_maps_are_input_x_gradient_through_the_model_and_leave_it_untouched():
    tok = build_tokenizer()
    torch.manual_seed(0)
    model = build_model(len(tok), dtype=torch.float64).eval()
    data = al.alignment_data(tok, make_translations(3, seed=2, split="held_out"))
    before = snapshot(model)
    maps = al.gradient_source_maps(model, data)
    assert_untouched(before, snapshot(model))
    # the reference: the gradient of the logit of word k w.r.t. the embedding module's output, by a second route
    n, k = 1, 2
    start = torch.full_like(data.targets[:, :1], model.config.decoder_start_token_id)
    dec = torch.cat([start, data.targets[:, :-1]], 1)
    emb = model.get_encoder().embed_tokens(data.input_ids[n : n + 1]).detach().requires_grad_(True)
    scale = model.get_encoder().embed_scale
    out = model(
        inputs_embeds=emb * scale, attention_mask=data.attention_mask[n : n + 1], decoder_input_ids=dec[n : n + 1]
    )
    out.logits[0, k, data.targets[n, k]].backward()
    expected = (emb * emb.grad).sum(-1)[0].detach()  # x · ∂y/∂x with x = the raw embedding: the same product
    assert torch.allclose(maps[n, k, : expected.shape[0]], expected, atol=1e-10)
    # and feeding the scaled embedding is the model's own forward from token ids
    with torch.no_grad():
        own = model(input_ids=data.input_ids, attention_mask=data.attention_mask, decoder_input_ids=dec).logits
        fed = model(
            inputs_embeds=model.get_encoder().embed_tokens(data.input_ids) * scale,
            attention_mask=data.attention_mask,
            decoder_input_ids=dec,
        ).logits
    assert torch.allclose(own, fed, atol=1e-12)
    assert (maps[data.attention_mask[:, None, :].expand_as(maps) == 0] == 0).all()  # padding scores 0


def test_the_command_line_runs_tiny_s2s_and_the_bootstrap_reads_its_meta(tmp_path, capsys):
    from lrp_core.evaluation import bootstrap
    from lrp_core.evaluation.__main__ import main

    out = tmp_path / "s2s.json"
    assert main(["--model", "tiny-s2s", "--methods", "attnlrp", "-n", "12", "--quiet", "--out", str(out)]) == 0
    meta = json.loads(out.with_name("s2s.meta.json").read_text())
    results = json.loads(out.read_text())
    assert meta["kind"] == "seq2seq" and meta["answered"] >= 11
    assert {al.AUTOGRAD_ROW, al.ABLATION_ROW, "random"} <= set(results)
    assert results[al.ABLATION_ROW]["top1_accuracy"] > 0.8  # the trained model's output depends on the gold word
    # attnlrp runs once the engine explains encoder-decoders; until then it is skipped with the reason
    assert "attnlrp" in results or any(s.startswith("attnlrp: ") for s in meta["skipped"])
    assert results[al.AUTOGRAD_ROW]["top1_accuracy"] > results["random"]["top1_accuracy"]
    capsys.readouterr()
    bootstrap.main([str(out.with_name("s2s.meta.json"))])
    table = capsys.readouterr().out
    assert "| random |" in table and "AER top-1" in table


def test_ablation_maps_are_the_logit_drop_of_one_word_replaced_by_unk():
    tok = build_tokenizer()
    torch.manual_seed(1)
    model = build_model(len(tok), dtype=torch.float64).eval()
    data = al.alignment_data(tok, make_translations(3, seed=4, split="held_out"))
    before = snapshot(model)
    maps = al.ablation_source_maps(model, data, tok.unk_token_id)
    assert_untouched(before, snapshot(model))
    n, k, s = 2, 1, 1
    start = torch.full_like(data.targets[:, :1], model.config.decoder_start_token_id)
    dec = torch.cat([start, data.targets[:, :-1]], 1)[n : n + 1]
    ids = data.input_ids[n : n + 1].clone()
    mask = data.attention_mask[n : n + 1]
    with torch.no_grad():
        y = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits[0, k, data.targets[n, k]]
        ids[0, s] = tok.unk_token_id
        y_unk = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits[0, k, data.targets[n, k]]
    assert maps[n, k, s].item() == pytest.approx((y - y_unk).item(), abs=1e-12)
    assert (maps.permute(0, 2, 1)[~data.candidates] == 0).all()  # </s> and padding score 0


def test_explained_maps_call_explain_generation_per_target_length_and_place_gen_source(monkeypatch, data):
    """The wiring to lrp_core.explain_generation: one call per block of equal target length, the gold target as
    continuation, ``gen.source`` (B, K, S) put back in the sentences' rows (a stand-in that returns the gold)."""
    from types import SimpleNamespace

    from lrp_core import generation

    sub = al.alignment_data(build_tokenizer(), data.records[:40])
    calls = []

    def fake(model, tokenizer, prompts, method, continuation, progress):
        rows = [
            next(i for i in range(len(sub.records)) if torch.equal(sub.input_ids[i], x)) for x in prompts["input_ids"]
        ]
        assert all(len(c) == len(continuation[0]) for c in continuation)  # rectangular
        assert [sub.targets[i, : len(c)].tolist() for i, c in zip(rows, continuation)] == continuation
        calls.append((method, len(rows)))
        return SimpleNamespace(source=sub.gold[rows, : len(continuation[0])].double() * 3)

    monkeypatch.setattr(generation, "explain_generation", fake)
    maps = al.explained_source_maps(object(), None, sub, "attnlrp", batch=8)
    assert torch.equal(maps, sub.gold.double() * 3)
    assert all(m == "attnlrp" and b <= 8 for m, b in calls)
    lengths = {len(r.target_words) for r in sub.records}
    assert len(calls) >= len(lengths)
