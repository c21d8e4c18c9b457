"""Sources as units (docs/METHODS.md §2s): source scores, the span helpers, leave-one-out and the ContextCite
surrogate against explicit removals and hand computations, on tiny seeded decoders in float64."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from decoders import batch, f64_bound, make_decoder, rows

from lrp_core import InputError, UnsupportedModelError, explain, explain_generation
from lrp_core.errors import MissingExtraError
from lrp_core.methods.ablation import ablation_masks, fit_surrogate
from lrp_core.sources import documents, sentences, token_spans

SPANS = [(0, 2), (2, 5), (5, 6)]  # three sources before the last token of rows of length ≥ 7


@pytest.fixture(scope="module")
def llama():
    return make_decoder("llama")


def _state(model):
    return (
        {k: v.detach().clone() for k, v in model.state_dict().items()},
        [(len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks)) for m in model.modules()],
        [m.training for m in model.modules()],
        [p.grad for p in model.parameters()],
    )


def _same_state(a, b) -> bool:
    return all(torch.equal(a[0][k], b[0][k]) for k in a[0]) and a[1:] == b[1:]


def _logit_at_end(model, ids: torch.Tensor, target: int) -> float:
    """The model's own logit of ``target`` after the unpadded row ``ids`` (positions 0, 1, …)."""
    with torch.no_grad():
        return float(model(input_ids=ids[None]).logits[0, -1, target])


# ------------------------------------------------------------------ source scores of token-map methods
@pytest.mark.parametrize("side", ["left", "right"])
def test_source_scores_are_the_token_scores_summed_over_each_span(llama, side):
    x = batch(rows(lengths=(9, 7, 8)), side=side)
    exp = explain(llama, x, method="attnlrp", sources=SPANS)
    first = (x["attention_mask"] != 0).long().argmax(1)
    by_hand = torch.tensor(
        [[float(exp.scores[b, first[b] + a : first[b] + e].sum()) for a, e in SPANS] for b in range(3)],
        dtype=torch.float64,
    )
    assert exp.sources.shape == (3, 3)
    assert torch.allclose(exp.sources, by_hand, rtol=0, atol=1e-12)
    assert torch.equal(exp.by_source(SPANS), exp.sources)
    # per-row spans: row 1 scored over other spans
    per_row = [SPANS, [(1, 3), (3, 4), (4, 6)], SPANS]
    assert torch.allclose(
        explain(llama, x, method="attnlrp", sources=per_row).sources[1],
        torch.tensor(
            [float(exp.scores[1, first[1] + a : first[1] + e].sum()) for a, e in per_row[1]], dtype=torch.float64
        ),
        atol=1e-12,
    )


def test_padding_side_does_not_move_the_spans(llama):
    r = rows(lengths=(9, 7))
    left = explain(llama, batch(r, side="left"), method="cp_lrp", sources=SPANS).sources
    right = explain(llama, batch(r, side="right"), method="cp_lrp", sources=SPANS).sources
    assert torch.allclose(left, right, rtol=0, atol=f64_bound(llama, 1e-10))


@pytest.mark.parametrize(
    "bad, match",
    [
        ([(0, 2), (5, 12)], "reaches past the row"),  # row 1 has 7 real tokens
        ([(0, 2), (5, 7)], "reaches the explained token"),  # row 1 is read at its token 6
        ([(3, 1)], "0 ≤ start ≤ end"),
        ([(0, 1.5)], "token spans"),
        ([[(0, 1)], [(0, 1), (1, 2)]], r"the rows have \[1, 2\] sources"),
        ([], "token spans"),
    ],
)
def test_bad_spans_are_refused(llama, bad, match):
    with pytest.raises(InputError, match=match):
        explain(llama, batch(rows(lengths=(9, 7)), side="left"), method="attnlrp", sources=bad)


def test_an_encoder_sums_over_spans_too(tiny_bert, text_batch):
    # right-padded BERT rows of 7, 4 and 6 tokens, explained in length groups: the sums over [CLS] w1 | w2
    exp = explain(tiny_bert, text_batch, method="attnlrp", sources=[(0, 2), (2, 3)])
    by_hand = torch.stack([exp.scores[:, 0:2].sum(1), exp.scores[:, 2]], 1)
    assert torch.allclose(exp.sources, by_hand.to(exp.sources.dtype), rtol=0, atol=1e-6)


def test_sources_on_images_are_refused(tiny_vit, images):
    with pytest.raises(InputError, match="sources are token spans of a text"):
        explain(tiny_vit, images[:1], method="rollout", sources=SPANS)


# ------------------------------------------------------------------ leave-one-out
@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_leave_one_out_equals_explicit_removals(family, side):
    model = make_decoder(family)
    r = rows(lengths=(9, 7, 8))
    x = batch(r, side=side)
    before = _state(model)
    exp = explain(model, x, method="leave_one_out", sources=SPANS, batch_size=4)  # 9 removals in 3 passes
    assert _same_state(before, _state(model))
    assert exp.options["forward_passes"] == len(SPANS) + 1
    for b, ids in enumerate(r):
        t = int(exp.target[b])
        full = _logit_at_end(model, ids, t)
        for s, (a, e) in enumerate(SPANS):
            without = _logit_at_end(model, torch.cat([ids[:a], ids[e:]]), t)  # the tokens gone, positions shift
            assert abs(float(exp.sources[b, s]) - (full - without)) < f64_bound(model, 1e-10), (b, s)
    # the token map spreads each source's score over its tokens
    first = (x["attention_mask"] != 0).long().argmax(1)
    for b in range(3):
        for s, (a, e) in enumerate(SPANS):
            got = exp.scores[b, first[b] + a : first[b] + e]
            assert torch.allclose(got, exp.sources[b, s].expand(e - a) / (e - a), atol=1e-14)


def test_leave_one_out_with_a_filler_equals_explicit_replacements(llama):
    r = rows(lengths=(9, 7))
    exp = explain(llama, batch(r, side="left"), method="leave_one_out", sources=SPANS, filler=3)
    for b, ids in enumerate(r):
        t = int(exp.target[b])
        for s, (a, e) in enumerate(SPANS):
            replaced = ids.clone()
            replaced[a:e] = 3
            assert abs(
                float(exp.sources[b, s]) - (_logit_at_end(llama, ids, t) - _logit_at_end(llama, replaced, t))
            ) < f64_bound(llama, 1e-10)


@pytest.mark.parametrize("method", ["leave_one_out", "context_cite"])
def test_a_batch_equals_its_rows_one_by_one(llama, method):
    r = rows(lengths=(9, 7, 8))
    x = batch(r, side="left")
    opts = {"n_ablations": 16} if method == "context_cite" else {}
    whole = explain(llama, x, method=method, sources=SPANS, **opts)
    for b, ids in enumerate(r):
        one = explain(
            llama,
            {"input_ids": ids[None], "attention_mask": torch.ones(1, len(ids), dtype=torch.long)},
            method=method,
            sources=SPANS,
            **opts,
        )
        assert torch.allclose(one.sources[0], whole.sources[b], rtol=0, atol=f64_bound(llama, 1e-9)), b
    # pieces: the same rows explained two at a time
    split = explain(llama, x, method=method, sources=SPANS, chunk_size=2, **opts)
    assert torch.allclose(split.sources, whole.sources, rtol=0, atol=f64_bound(llama, 1e-9))


def test_source_methods_need_sources_and_a_decoder(llama, tiny_bert, text_batch):
    x = batch(rows(lengths=(9,)))
    with pytest.raises(InputError, match="give them with sources="):
        explain(llama, x, method="leave_one_out")
    with pytest.raises(UnsupportedModelError, match="decoder language model"):
        explain(tiny_bert, text_batch, method="leave_one_out", sources=[(1, 2)])
    with pytest.raises(InputError, match="filler=500 is not a token id"):
        explain(llama, x, method="leave_one_out", sources=SPANS, filler=500)
    with pytest.raises(InputError, match="keep_prob must be a number strictly between 0 and 1"):
        explain(llama, x, method="context_cite", sources=SPANS, keep_prob=1.0)


# ------------------------------------------------------------------ the ContextCite surrogate
def test_the_surrogate_recovers_a_planted_linear_source_effect_exactly():
    S, n = 6, 64
    masks = ablation_masks(S, n, 0.5, seed=3).numpy()
    effect, bias = np.array([2.0, -1.5, 0.0, 0.25, 3.0, -0.75]), 0.4
    y = bias + masks @ effect  # an output linear in the kept sources
    beta, b = fit_surrogate(masks, y, alpha=0.0)
    assert np.abs(beta - effect).max() < 1e-12 and abs(b - bias) < 1e-12


def test_the_lasso_shrinks_one_source_by_alpha_over_its_spread():
    # one source: the Lasso on the standardised mask z soft-thresholds cov(z, y) = c·sd by alpha, so
    # β = c − alpha / sd (c > alpha / sd), by hand
    masks = ablation_masks(1, 40, 0.5, seed=0).numpy()
    c, alpha = 1.5, 0.01
    y = 0.3 + c * masks[:, 0]
    sd = masks[:, 0].std()
    beta, b = fit_surrogate(masks, y, alpha=alpha)
    assert abs(beta[0] - (c - alpha / sd)) < 1e-9
    assert abs(b - (y.mean() - beta[0] * masks[:, 0].mean())) < 1e-9


def test_context_cite_is_the_surrogate_of_explicit_removals(llama):
    r = rows(lengths=(9, 7))
    before = _state(llama)
    exp = explain(llama, batch(r, side="left"), method="context_cite", sources=SPANS, n_ablations=12, seed=5, alpha=0.0)
    assert _same_state(before, _state(llama))
    assert exp.options["forward_passes"] == 13
    keep = ablation_masks(len(SPANS), 12, 0.5, seed=5).numpy()
    for b, ids in enumerate(r):
        t = int(exp.target[b])
        y = np.array(
            [
                _logit_at_end(
                    llama, torch.cat([ids[a:e] for s, (a, e) in enumerate(SPANS) if k[s]] + [ids[SPANS[-1][1] :]]), t
                )
                for k in keep
            ]
        )
        beta, _ = fit_surrogate(keep, y, alpha=0.0)
        assert np.abs(exp.sources[b].numpy() - beta).max() < f64_bound(llama, 1e-8), b
    # the default penalty (ContextCite's 0.01) gives scikit-learn's Lasso on the same masks
    lasso = explain(llama, batch(r, side="left"), method="context_cite", sources=SPANS, n_ablations=12, seed=5)
    assert lasso.options["forward_passes"] == 13 and not torch.equal(lasso.sources, exp.sources)


def test_context_cite_without_scikit_learn_names_the_extra(llama, monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.delitem(sys.modules, "sklearn.linear_model", raising=False)
    with pytest.raises(MissingExtraError, match=r"transformer-relevance-lab\[sources\]"):
        explain(llama, batch(rows(lengths=(9,))), method="context_cite", sources=SPANS, n_ablations=4)


# ------------------------------------------------------------------ the span helpers
def test_sentences_and_documents_map_onto_word_level_tokens():
    from lrp_core.models.tiny_lm import build_tokenizer

    tok = build_tokenizer()
    text = sentences("Anna lives in Rome. Boris moved to Oslo.  Where does Anna live? Answer:")
    assert text.labels == ["Anna lives in Rome.", "Boris moved to Oslo.", "Where does Anna live?", "Answer:"]
    # <s> is token 0; "Anna lives in Rome ." tokens 1-5, "Boris moved to Oslo ." 6-10, ...
    assert text.token_spans(tok) == [(1, 6), (6, 11), (11, 16), (16, 18)]
    doc = documents(
        ["Anna lives in Rome.", "Boris moved to Oslo."],
        "{documents} {question}",
        separator=" ",
        question="Where does Anna live? Answer:",
    )
    assert doc.text == "Anna lives in Rome. Boris moved to Oslo. Where does Anna live? Answer:"
    assert doc.token_spans(tok) == [(1, 6), (6, 11)]


def test_spans_follow_byte_level_tokens_with_leading_spaces():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(
        ["Anna lives in Rome. Boris moved to Oslo."] * 4,
        trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=core)
    text = sentences("Anna lives in Rome. Boris moved to Oslo.")
    spans = text.token_spans(tok)
    pieces = tok.convert_ids_to_tokens(tok(text.text)["input_ids"])
    assert spans[0][0] == 0 and spans[0][1] == spans[1][0] and spans[1][1] == len(pieces)
    assert pieces[spans[1][0]].startswith("Ġ")  # " Boris": its leading space falls outside the sentence
    # an edge inside a token is refused
    with pytest.raises(InputError, match="does not align with the tokens"):
        token_spans("Anna lives", [(0, 2)], [(0, 4), (4, 10)])


# ------------------------------------------------------------------ generation
def test_generation_gives_step_sources_and_the_answer_sums_them(llama):
    r = rows(lengths=(9, 7))
    x = batch(r, side="right")
    gen = explain_generation(llama, None, x, method="attnlrp", max_new_tokens=3, sources=SPANS, stop_at_eos=False)
    assert gen.sources.shape == (2, 3, 3)
    # each step's source scores: its token map summed over the spans (the prompts are left-padded inside)
    first = (gen.attention_mask != 0).long().argmax(1)
    for b in range(2):
        for k in range(3):
            by_hand = [float(gen.scores[b, k, first[b] + a : first[b] + e].sum()) for a, e in SPANS]
            assert np.allclose(gen.sources[b, k].numpy(), by_hand, atol=1e-12)
    assert torch.equal(gen.answer_sources(), gen.sources.sum(1))
    loo = explain_generation(llama, None, x, method="leave_one_out", continuation=gen.targets, sources=SPANS)
    # step 1 of row 1 by hand: the prompt without source 1
    t = int(gen.targets[1, 0])
    ids = r[1]
    assert abs(
        float(loo.sources[1, 0, 1])
        - (_logit_at_end(llama, ids, t) - _logit_at_end(llama, torch.cat([ids[:2], ids[5:]]), t))
    ) < f64_bound(llama, 1e-10)


# ------------------------------------------------------------------ the views
@pytest.fixture(scope="module")
def tiny_lm():
    from types import SimpleNamespace

    from decoders import perturb

    from lrp_core.models.tiny_lm import build_model, build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(0)
    return SimpleNamespace(model=perturb(build_model(len(tok)), 0).double().eval(), tokenizer=tok)


PROMPT = "Anna lives in Rome. Boris lives in Oslo. Where does Boris live? Answer:"


def test_the_generation_page_shows_sources_probabilities_and_an_honest_title(tiny_lm, monkeypatch):
    spans = sentences(PROMPT).token_spans(tiny_lm.tokenizer)[:2]
    gen = explain_generation(
        tiny_lm.model, tiny_lm.tokenizer, PROMPT, method="attnlrp", continuation=" Oslo .", sources=spans
    )
    page = gen.html(0)
    assert gen.source_labels(0) == ["Anna lives in Rome .", "Boris lives in Oslo ."]
    assert "Sources, whole answer" in page and "Boris lives in Oslo ." in page
    whole = gen.answer_sources()[0]
    assert f"#2 {float(whole[1]):+.3g}" in page
    # a given continuation: the model's probabilities of its tokens, by hand, and no "why the model wrote"
    ids = tiny_lm.tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        p0 = float(tiny_lm.model(input_ids=ids).logits[0, -1].softmax(-1)[int(gen.targets[0, 0])])
    assert abs(float(gen.probabilities[0, 0]) - p0) < 1e-12
    assert f"p {100 * p0:.1f} %" in page
    assert "why the model wrote" not in page and "given continuation" in page
    greedy = explain_generation(tiny_lm.model, tiny_lm.tokenizer, PROMPT, method="attnlrp", max_new_tokens=1)
    assert "why the model wrote what it wrote" in greedy.html(0)
    # show() displays once and returns nothing (a cell ending in it does not draw it twice)
    shown = []
    import IPython.display

    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    assert gen.show() is None and len(shown) == 1


def test_the_generation_explorer_draws_each_steps_sources(tiny_lm):
    from widgets import GenerationExplorer

    spans = sentences(PROMPT).token_spans(tiny_lm.tokenizer)[:2]
    w = GenerationExplorer(
        tiny_lm.model,
        tiny_lm.tokenizer,
        prompt=PROMPT,
        continuation=" Oslo .",
        sources=spans,
        methods=["attnlrp", "leave_one_out"],
    )
    assert w.source_labels() == ["Anna lives in Rome .", "Boris lives in Oslo ."]
    got = w.explanation.sources[0]
    want = explain(tiny_lm.model, w.prefix(0), method="attnlrp", target=w.target_id(0), sources=spans).sources[0]
    assert torch.equal(got, want)
    assert f"#1 {float(got[0]):+.3g}" in w.html.value and "what speaks for" in w._title()
    w.method_selector.value = "leave_one_out"
    assert "#2" in w.html.value and w.explanation.options["forward_passes"] == 3
    with pytest.raises(InputError, match="reaches the explained token"):
        GenerationExplorer(tiny_lm.model, tiny_lm.tokenizer, prompt=PROMPT, max_new_tokens=1, sources=[(10, 18)])
