"""Exercises of notebook 13, "Explaining a language model": the reference computations and their checkers."""
from __future__ import annotations

import torch

from lrp_core import explain
from lrp_core.data.facts import evidence_tokens
from lrp_core import Contrast

from .exercise import Exercise, Mistake


def context():
    """The notebook's objects (for the tests), built as the notebook builds them."""
    from lrp_core.data.facts import make_facts
    from lrp_core.models import load
    from lrp_core.models.tiny_lm import HELD_OUT_SEED

    records = make_facts(20, seed=HELD_OUT_SEED + 13)
    return {"lm": load("tiny-lm"), "records": records, "record": records[0]}


def _encoded(lm, record) -> tuple[dict, list[int], int]:
    """One prompt as the model takes it, its evidence token positions and the answer's token id."""
    enc = lm.tokenizer(record.prompt, return_tensors="pt", return_offsets_mapping=True)
    evidence = evidence_tokens(record, enc.pop("offset_mapping")[0].tolist())
    return dict(enc), evidence, lm.tokenizer.convert_tokens_to_ids(record.answer)


# ---------------------------------------------------------------- 13.1
def _ranks(lm, records, method: str, skip_bos: bool = True, base: int = 1, descending: bool = True) -> list[int]:
    ranks = []
    for r in records:
        enc, evidence, answer = _encoded(lm, r)
        scores = explain(lm.model, enc, method=method, target=answer).scores[0].clone()
        if skip_bos:
            scores[0] = -float("inf")                     # the begin-of-text token is not part of the context
        order = torch.argsort(scores if descending else -scores, descending=True).tolist()
        ranks.append(order.index(evidence[0]) + base)
    return ranks


def evidence_rank(lm, records, method: str = "rollout") -> float:
    ranks = _ranks(lm, records, method)
    mean = sum(ranks) / len(ranks)
    print(f"{method}: mean rank of the evidence token {mean:.2f} (1 = top; ranks {ranks})")
    return mean


def _mean_rank(lm, records, **how) -> float:
    return sum(_ranks(lm, records, "rollout", **how)) / len(records)


ex13_1 = Exercise(
    "ex13_1", "Where does rollout put the evidence?", evidence_rank, difficulty=1, minutes=10,
    needs=("lm", "records"),
    answer="a number: the mean, over the 20 prompts in `records`, of the evidence token's rank in the "
           "rollout map (1 = the highest score among the context tokens; the <s> token left out)",
    hints=["For one record r: tokenize r.prompt with return_offsets_mapping=True; evidence_tokens(r, offsets) gives "
           "the evidence position; the target is lm.tokenizer.convert_tokens_to_ids(r.answer).",
           "explain(lm.model, enc, method='rollout', target=answer).scores[0] has one score per "
           "token; set position 0 (the <s> token) to -inf, then torch.argsort(scores, descending=True).",
           "The rank is the place of the evidence position in that order, counted from 1; average over the prompts."],
    mistakes=[Mistake(lambda lm, records: _mean_rank(lm, records, descending=False),
                      "that counts from the lowest score: rank 1 is the highest score"),
              Mistake(lambda lm, records: _mean_rank(lm, records, base=0),
                      "ranks counted from 0: the top token has rank 1"),
              Mistake(lambda lm, records: _mean_rank(lm, records, skip_bos=False),
                      "the <s> token at position 0 was ranked too: it is not part of the context — set its score to "
                      "-inf before sorting (on some prompts rollout puts it above the evidence)"),
              Mistake(lambda lm, records: sum(_ranks(lm, records, "transformer_attribution")) / len(records),
                      "that is the mean rank under transformer_attribution: explain with method='rollout'")],
    atol=1e-9,
    discussion="AttnLRP ranks the evidence first on these prompts; rollout puts it several places down. Its map is "
               "the readout row of a product of (I + A_b) / 2 over the blocks: the identity keeps a large share on "
               "the explained position itself and its neighbours (the question), and the evidence only gets what "
               "the attention of the last position passes to it. Rollout also gives the <s> token, where causal "
               "models park attention they do not need, a share that can rank it above the evidence.",
)


# ---------------------------------------------------------------- 13.2
def _rival(lm, record) -> tuple[dict, list[int], int, int, int]:
    """The prompt, its evidence, the answer's id, the distractor the model scores highest and its position."""
    enc, evidence, answer = _encoded(lm, record)
    with torch.no_grad():
        logits = lm.model(**enc).logits[0, -1]
    ids = lm.tokenizer.convert_tokens_to_ids(record.distractors)
    rival = ids[int(logits[ids].argmax())]
    at = enc["input_ids"][0].tolist().index(rival)        # each value occurs once in a prompt
    return enc, evidence, answer, rival, at


def distractor_share(lm, record) -> float:
    enc, evidence, answer, rival, at = _rival(lm, record)
    scores = explain(lm.model, enc, method="attnlrp", target=Contrast(answer, rival)).scores[0]
    word = lm.tokenizer.convert_ids_to_tokens(rival)
    value = float(scores[at])
    print(f"rather than {word!r}: relevance on {word!r} = {value:+.4f}, on the evidence = "
          f"{float(scores[evidence].sum()):+.4f}")
    return value


def _plain(lm, record):
    enc, _, answer, _, at = _rival(lm, record)
    return float(explain(lm.model, enc, method="attnlrp", target=answer).scores[0, at])


def _first_distractor(lm, record):
    enc, _, answer, _, _ = _rival(lm, record)
    first = lm.tokenizer.convert_tokens_to_ids(record.distractors[0])
    at = enc["input_ids"][0].tolist().index(first)
    return float(explain(lm.model, enc, method="attnlrp", target=Contrast(answer, first)).scores[0, at])


def _reversed(lm, record):
    enc, _, answer, rival, at = _rival(lm, record)
    return float(explain(lm.model, enc, method="attnlrp", target=Contrast(rival, answer)).scores[0, at])


ex13_2 = Exercise(
    "ex13_2", "Rather than the strongest distractor", distractor_share, difficulty=2, minutes=10,
    needs=("lm", "record"),
    answer="a float: the AttnLRP relevance, for the answer rather than the distractor value the model scores "
           "highest, that falls on that distractor's own token in the prompt",
    hints=["lm.model(**enc).logits[0, -1] are the next-token logits; index them with the distractors' token ids "
           "(lm.tokenizer.convert_tokens_to_ids(record.distractors)) to find the strongest one.",
           "The target is Contrast(answer_id, rival_id): y_answer − y_rival.",
           "Find the rival's position with the prompt's pieces (convert_ids_to_tokens) and read scores[0, position]."],
    mistakes=[Mistake(_plain, "that is the plain map of the answer: use target=Contrast(answer, rival)"),
              Mistake(_reversed, "the contrast is the other way round: Contrast(answer, rival) is 'the answer rather "
                                 "than the rival'"),
              Mistake(_first_distractor, "that is record.distractors[0], the first distractor in the list (section "
                                         "4's); the exercise asks for the one the model scores highest at the last "
                                         "position: index the logits with all the distractors' ids and take the "
                                         "argmax")],
    atol=1e-6, rtol=1e-4,
    discussion="In the contrast the rival's own word speaks against the answer (its score is negative): it is the "
               "reason the model could have written the other word. The plain map hides this, because the rival's "
               "word also helps the answer's logit a little (a value of the right kind is nearby).",
)


# ---------------------------------------------------------------- 13.3
def _fact_sources(lm, record, with_question: bool = False) -> list:
    """The prompt's fact sentences as token spans (the question and "Answer:" are not sources)."""
    from lrp_core.sources import sentences

    return sentences(record.prompt).token_spans(lm.tokenizer)[:len(record.distractors) + 1 + with_question]


def _answer_steps(lm, record, spans=None):
    """The per-step source scores (K, S) of AttnLRP for the answer " <value> ." written after the prompt."""
    from lrp_core import explain_generation

    gen = explain_generation(lm.model, lm.tokenizer, record.prompt, method="attnlrp",
                             continuation=f" {record.answer} .", sources=spans or _fact_sources(lm, record),
                             progress=False)
    return gen.sources[0]


def answer_sources(lm, records) -> torch.Tensor:
    record = records[1]
    per_step = _answer_steps(lm, record)
    whole = per_step.sum(0)
    print(f"AttnLRP, whole answer {record.answer!r} + '.': source scores {[round(float(v), 3) for v in whole]}; "
          f"top: fact {int(whole.argmax()) + 1}")
    return whole


ex13_3 = Exercise(
    "ex13_3", "Which fact made it answer?", answer_sources, difficulty=2, minutes=10,
    needs=("lm", "records"),
    answer="a tensor of S numbers: for the second prompt, `records[1]`, each fact sentence's AttnLRP source score "
           "for its whole answer f\" {records[1].answer} .\" (the answer word and the full stop), one per fact in "
           "prompt order",
    hints=["lrp_core.sources.sentences(records[1].prompt).token_spans(lm.tokenizer) gives every sentence's token "
           "span; the facts are the first len(records[1].distractors) + 1 of them (the question and 'Answer:' are "
           "not sources).",
           "explain_generation(lm.model, lm.tokenizer, records[1].prompt, method='attnlrp', continuation=..., "
           "sources=spans) explains each written token; .sources is (1, K, S).",
           "The whole answer's score of a source is the sum of its step scores: gen.answer_sources()[0]."],
    mistakes=[Mistake(lambda lm, records: _answer_steps(lm, records[1])[0],
                      "that is the first step only (the answer word): sum the steps of the whole answer"),
              Mistake(lambda lm, records: _answer_steps(lm, records[1]).mean(0),
                      "that is the mean over the steps: the whole answer's score is their sum"),
              Mistake(lambda lm, records: _answer_steps(lm, records[1], _fact_sources(lm, records[1], True)).sum(0),
                      "the question was counted as a source: the sources are the facts only, the first "
                      "len(records[1].distractors) + 1 sentences"),
              Mistake(lambda lm, records: answer_sources(lm, [records[1], records[0]]),
                      "that is section 7's prompt, record = records[0] (gen.answer_sources() of that section); "
                      "the exercise asks for records[1]")],
    atol=1e-6, rtol=1e-4,
    discussion="The asked person's fact takes nearly all the relevance of the answer word; the full stop adds "
               "little to any fact, since it follows from the answer just written. Leave-one-out and ContextCite "
               "find the same fact by removing sources, at S + 1 and 65 forward passes per step instead of one "
               "forward and one backward pass (docs/RESULTS.md, the sources table).",
)
