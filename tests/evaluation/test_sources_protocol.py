"""The sources protocol (docs/METHODS.md §3.7) on tiny-lm: the deciding fact, rankings and ablations by hand."""

import json

import numpy as np
import pytest
import torch

from lrp_core.data.facts import make_facts
from lrp_core.evaluation.__main__ import main
from lrp_core.evaluation.bootstrap import SOURCE_COLUMNS, comparison_table
from lrp_core.evaluation.sources import fact_sources, source_ranking, sources_protocol


@pytest.fixture(scope="module")
def tiny():
    from lrp_core.models import load

    return load("tiny-lm")


def _p(model, ids, answer) -> float:
    with torch.no_grad():
        return float(model(input_ids=ids[None]).logits[0, -1].softmax(-1)[answer])


def test_ranking_by_hand():
    assert source_ranking(np.array([0.1, 0.9, 0.3]), 1) == (1.0, 1.0)
    assert source_ranking(np.array([0.1, 0.9, 0.3]), 2) == (0.0, 0.5)
    assert source_ranking(np.array([0.5, 0.5, 0.0]), 1) == (0.0, 0.5)  # ties in source order


def test_the_deciding_fact_holds_the_evidence(tiny):
    for r in make_facts(12, seed=1_000_000):
        spans, deciding = fact_sources(r, tiny.tokenizer)
        ids = tiny.tokenizer(r.prompt)["input_ids"]
        pieces = tiny.tokenizer.convert_ids_to_tokens(ids)
        assert len(spans) == len(r.distractors) + 1
        a, b = spans[deciding]
        assert r.answer in pieces[a:b] and r.subject in pieces[a:b]
        assert all(pieces[e - 1] == "." for _, e in spans)  # each source is a whole fact sentence
        assert all(r.answer not in pieces[s:e] for j, (s, e) in enumerate(spans) if j != deciding)


def test_protocol_values_by_hand(tiny):
    recs = make_facts(6, seed=1_000_000)
    results, curves, accuracy, answered = sources_protocol(
        tiny.model, tiny.tokenizer, recs, ["leave_one_out", "attnlrp"], progress=False
    )
    assert answered == len(curves["leave_one_out"]["source_hit1_per_prompt"]) > 0
    loo = curves["leave_one_out"]
    assert set(loo["forward_passes_per_prompt"]) <= {4.0, 5.0, 6.0}  # S + 1 for 3 … 5 facts
    assert curves["attnlrp"]["forward_passes_per_prompt"][0] == 1.0
    assert curves["attnlrp"]["backward_passes_per_prompt"][0] == 1.0
    # prompt 0 by hand: leave-one-out's top source removed / kept alone, through the model itself
    from lrp_core import explain

    def answer_of(r):
        return tiny.tokenizer(" " + r.answer, add_special_tokens=False)["input_ids"][0]

    def ids_of(r):
        return torch.tensor(tiny.tokenizer(r.prompt)["input_ids"])

    # the per-prompt lists follow the prompts the model answers, in order: the first of them by hand
    with torch.no_grad():
        r = next(r for r in recs if int(tiny.model(input_ids=ids_of(r)[None]).logits[0, -1].argmax()) == answer_of(r))
    spans, deciding = fact_sources(r, tiny.tokenizer)
    ids, answer = ids_of(r), answer_of(r)
    exp = explain(
        tiny.model,
        {"input_ids": ids[None], "attention_mask": torch.ones(1, len(ids), dtype=torch.long)},
        method="leave_one_out",
        target=answer,
        sources=spans,
    )
    top = int(exp.sources[0].argmax())
    keep = torch.ones(len(ids), dtype=torch.bool)
    keep[spans[top][0] : spans[top][1]] = False
    only = torch.ones(len(ids), dtype=torch.bool)
    for j, (a, b) in enumerate(spans):
        if j != top:
            only[a:b] = False
    assert loo["drop_top_per_prompt"][0] == pytest.approx(_p(tiny.model, ids[keep], answer), abs=1e-6)
    assert loo["keep_top_per_prompt"][0] == pytest.approx(_p(tiny.model, ids[only], answer), abs=1e-6)
    assert loo["source_hit1_per_prompt"][0] == float(top == deciding)
    assert results["random"]["source_hit1"] is not None
    again = sources_protocol(tiny.model, tiny.tokenizer, recs, ["leave_one_out"], progress=False)[1]
    assert again["random"]["source_ap_per_prompt"] == curves["random"]["source_ap_per_prompt"]  # seeded
    table = comparison_table(curves, "attnlrp", columns=SOURCE_COLUMNS)
    assert "| leave_one_out |" in table and "| random |" in table


def test_the_command_line_writes_a_sources_run(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert (
        main(
            [
                "--model",
                "tiny-lm",
                "--protocol",
                "sources",
                "--methods",
                "cp_lrp,context_cite",
                "--n",
                "4",
                "--quiet",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    results = json.loads(out.read_text())
    assert set(results) == {"cp_lrp", "context_cite", "random"}
    assert results["context_cite"]["forward_passes"] == 65.0
    meta = json.loads((tmp_path / "r.meta.json").read_text())
    assert meta["protocol"] == "sources" and "source_ap_per_prompt" in meta["curves"]["cp_lrp"]
    assert main(["--model", "toy-vit", "--protocol", "sources", "--n", "2", "--quiet"]) == 2
    assert "causal language model" in capsys.readouterr().err
