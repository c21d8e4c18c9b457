"""Exercises of notebook 13, "Explaining a language model": the reference computations and their checkers."""
from __future__ import annotations

import torch

from lrp_core import explain
from lrp_core.data.facts import evidence_tokens
from lrp_core.methods import Contrast

from .exercise import Exercise, Mistake


def _encoded(lm, record) -> tuple[dict, list[int], int]:
    """One prompt as the model takes it, its evidence token positions and the answer's token id."""
    enc = lm.tokenizer(record.prompt, return_tensors="pt", return_offsets_mapping=True)
    evidence = evidence_tokens(record, enc.pop("offset_mapping")[0].tolist())
    return dict(enc), evidence, lm.tokenizer.convert_tokens_to_ids(record.answer)


# ---------------------------------------------------------------- 13.1
def evidence_hit_rate(lm, records, method: str = "attnlrp") -> float:
    hits = 0
    for r in records:
        enc, evidence, answer = _encoded(lm, r)
        scores = explain(lm.model, enc, method=method, target=answer).scores[0]
        scores[0] = -float("inf")                         # the begin-of-text token is not part of the context
        hits += int(int(scores.argmax()) in evidence)
    rate = hits / len(records)
    print(f"{method}: the top context token is the evidence in {hits} of {len(records)} prompts ({rate:.0%})")
    return rate


def _with_bos(lm, records):
    hits = 0
    for r in records:
        enc, evidence, answer = _encoded(lm, r)
        hits += int(int(explain(lm.model, enc, method="attnlrp", target=answer).scores[0].argmax()) in evidence)
    return hits / len(records)


def _by_absolute(lm, records):
    hits = 0
    for r in records:
        enc, evidence, answer = _encoded(lm, r)
        scores = explain(lm.model, enc, method="attnlrp", target=answer).scores[0].abs()
        scores[0] = -1.0
        hits += int(int(scores.argmax()) in evidence)
    return hits / len(records)


ex13_1 = Exercise(
    "ex13_1", "Does AttnLRP point at the evidence?", evidence_hit_rate, difficulty=1, minutes=10,
    needs=("lm", "records"),
    answer="a number in [0, 1]: the share of the prompts in `records` whose highest AttnLRP score over the context "
           "tokens (the begin-of-text token left out) lies on the evidence",
    hints=["For one record r: tokenize r.prompt with return_offsets_mapping=True; evidence_tokens(r, offsets) gives "
           "the evidence positions; the target is lm.tokenizer.convert_tokens_to_ids(r.answer).",
           "explain(lm.model, enc, method='attnlrp', target=answer).scores[0] has one score per token; set position 0 "
           "(the <s> token) to -inf before taking the argmax.",
           "Count the prompts whose argmax is among the evidence positions and divide by len(records)."],
    mistakes=[Mistake(_with_bos, "the <s> token took part: it is not part of the context; leave position 0 out"),
              Mistake(_by_absolute, "that ranks by |score|: a token that speaks strongly *against* the answer is not "
                                    "evidence for it; rank by the signed score")],
    atol=1e-9,
    discussion="The evidence is one word in a prompt of about forty tokens, so a random pick would hit it about one "
               "time in forty. Where AttnLRP's top token misses, look at what it picked: most often the question's "
               "name (which decides *which* fact is asked) or a distractor value with a negative partner nearby.",
)


# ---------------------------------------------------------------- 13.2
def distractor_share(lm, record) -> float:
    enc, evidence, answer = _encoded(lm, record)
    with torch.no_grad():
        logits = lm.model(**enc).logits[0, -1]
    ids = lm.tokenizer.convert_tokens_to_ids(record.distractors)
    rival = ids[int(logits[ids].argmax())]                # the distractor the model likes best
    scores = explain(lm.model, enc, method="attnlrp", target=Contrast(answer, rival)).scores[0]
    pieces = lm.tokenizer.convert_ids_to_tokens(enc["input_ids"][0].tolist())
    at = pieces.index(lm.tokenizer.convert_ids_to_tokens(rival))
    value = float(scores[at])
    print(f"rather than {pieces[at]!r}: relevance on {pieces[at]!r} = {value:+.4f}, on the evidence = "
          f"{float(scores[evidence].sum()):+.4f}")
    return value


def _plain(lm, record):
    enc, _, answer = _encoded(lm, record)
    with torch.no_grad():
        logits = lm.model(**enc).logits[0, -1]
    ids = lm.tokenizer.convert_tokens_to_ids(record.distractors)
    rival = ids[int(logits[ids].argmax())]
    pieces = lm.tokenizer.convert_ids_to_tokens(enc["input_ids"][0].tolist())
    at = pieces.index(lm.tokenizer.convert_ids_to_tokens(rival))
    return float(explain(lm.model, enc, method="attnlrp", target=answer).scores[0, at])


def _reversed(lm, record):
    enc, _, answer = _encoded(lm, record)
    with torch.no_grad():
        logits = lm.model(**enc).logits[0, -1]
    ids = lm.tokenizer.convert_tokens_to_ids(record.distractors)
    rival = ids[int(logits[ids].argmax())]
    pieces = lm.tokenizer.convert_ids_to_tokens(enc["input_ids"][0].tolist())
    at = pieces.index(lm.tokenizer.convert_ids_to_tokens(rival))
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
                                 "than the rival'")],
    atol=1e-6, rtol=1e-4,
    discussion="In the contrast the rival's own word speaks against the answer (its score is negative): it is the "
               "reason the model could have written the other word. The plain map hides this, because the rival's "
               "word also helps the answer's logit a little (a value of the right kind is nearby).",
)
