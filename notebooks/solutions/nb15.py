"""Exercises of notebook 15, "Explaining a translation": the reference computations and their checkers."""
from __future__ import annotations

import torch

from lrp_core import explain_generation

from .exercise import Exercise, Mistake


def context():
    """The notebook's objects (for the tests), built as the notebook builds them."""
    from lrp_core.data.translation import make_translations
    from lrp_core.models import load
    from lrp_core.models.tiny_s2s import HELD_OUT_SEED

    records = make_translations(8, seed=HELD_OUT_SEED + 15, split="held_out")
    return {"s2s": load("tiny-s2s"), "records": records, "record": records[1]}


def _steps(s2s, record, method: str) -> torch.Tensor:
    """The (K + 1, S + 1 + K + 1) maps of the greedy translation: each step's source scores, then its prefix's."""
    gen = explain_generation(s2s.model, s2s.tokenizer, record.source, method=method, max_new_tokens=24,
                             progress=False)
    return gen.scores[0, : int(gen.steps[0])]


# ---------------------------------------------------------------- 15.1
def _top1(s2s, record, method: str = "attnlrp", eos: bool = False, prefix: bool = False, last: bool = False,
          base: int = 0) -> list[int]:
    S = len(record.source_words)                            # the source words; column S is </s>
    maps = _steps(s2s, record, method)
    if not last:
        maps = maps[:-1]                                    # the last step writes </s>, not a word
    cols = maps if prefix else maps[:, : S + int(eos)]
    return [int(i) + base for i in cols.argmax(-1)]


def top1_source_words(s2s, record) -> list[int]:
    best = _top1(s2s, record)
    words = record.source_words
    print("AttnLRP, top source word of each generated word:")
    print("  " + " · ".join(f"{t} ← {words[i]}" for t, i in zip(record.target_words, best)))
    return best


ex15_1 = Exercise(
    "ex15_1", "The source word of each generated word", top1_source_words, difficulty=1, minutes=10,
    needs=("s2s", "record"),
    answer="a list of K integers: for each word tiny-s2s writes when translating `record.source` (the final "
           "</s> not included), the position (from 0) of the source word with the highest AttnLRP score",
    hints=["explain_generation(s2s.model, s2s.tokenizer, record.source, method='attnlrp', max_new_tokens=24) "
           "explains every step of the greedy translation; gen.source[0] is (steps, S).",
           "The source columns are the words, then </s>: keep the first len(record.source_words) columns.",
           "The last step writes </s>: drop it. Then .argmax(-1) per step."],
    mistakes=[Mistake(lambda s2s, record: _top1(s2s, record, eos=True),
                      "the </s> column was a candidate: the source words are the first len(record.source_words) "
                      "columns of gen.source (the last one is </s>)"),
              Mistake(lambda s2s, record: _top1(s2s, record, prefix=True),
                      "that argmax runs over gen.scores, the source and the prefix: take gen.source, the source "
                      "columns only"),
              Mistake(lambda s2s, record: _top1(s2s, record, last=True),
                      "the last step was kept: it writes </s>, not a word — one position per generated word"),
              Mistake(lambda s2s, record: _top1(s2s, record, base=1),
                      "positions counted from 1: the first source word is position 0")],
    atol=0,
    discussion="Most words point at the word they translate (compare record.alignment). The object marker `wo` "
               "translates no source word: its top word is a verb (here *sees* both times). When the prefix is "
               "allowed too, the top position of `wo`, of the verb after it and of `to` is the word just written: "
               "the decoder reads its own output, and that is evidence about where the sentence stands, not about "
               "what the source says.",
)


# ---------------------------------------------------------------- 15.2
def _accuracy(s2s, records, method: str = "lrp", prefix: bool = False, unscored: bool = False,
              eos: bool = False) -> float:
    hits = total = 0
    for r in records:
        best = _top1(s2s, r, method, eos=eos, prefix=prefix)
        for b, links in zip(best, r.alignment):
            if links or unscored:
                hits, total = hits + (b in links), total + 1
    return hits / total


def lrp_alignment_accuracy(s2s, records) -> float:
    acc = _accuracy(s2s, records)
    print(f"LRP: top-1 alignment accuracy {acc:.3f} on the {len(records)} sentences "
          f"(CP-LRP: {_accuracy(s2s, records, 'cp_lrp'):.3f})")
    return acc


ex15_2 = Exercise(
    "ex15_2", "How often does plain LRP find the source word?", lrp_alignment_accuracy, difficulty=2, minutes=15,
    needs=("s2s", "records"),
    answer="a number: over the 8 sentences in `records`, the share of the generated words with a gold source word "
           "(`r.alignment[k]` not empty) whose top source word under method='lrp' is one of their gold words",
    hints=["For each record r, do exercise 15.1's computation with method='lrp': one top source position per "
           "generated word.",
           "r.alignment[k] is the tuple of gold source positions of target word k; an empty tuple (the object "
           "marker `wo`) is not scored.",
           "Count the hits (top position in r.alignment[k]) and the scored words over all sentences; divide."],
    mistakes=[Mistake(lambda s2s, records: _accuracy(s2s, records, prefix=True),
                      "the argmax ran over the prefix too: a prefix position is never a source word — take the "
                      "source columns only"),
              Mistake(lambda s2s, records: _accuracy(s2s, records, unscored=True),
                      "the words without a gold link (the object marker `wo`) were counted: score only the words "
                      "whose r.alignment[k] is not empty"),
              Mistake(lambda s2s, records: _accuracy(s2s, records, "cp_lrp"),
                      "that is CP-LRP's accuracy (AttnLRP's is the same here): the exercise asks for method='lrp'")],
    atol=1e-9,
    discussion="Plain LRP finds the source word for fewer than half of the words; CP-LRP for every one. The "
               "difference is notebook 11's: the plain rule pushes relevance through the softmax and the products "
               "of attention, where it is not conserved and flips sign; CP-LRP treats the attention weights as "
               "constants, so the relevance follows the value path from the generated word to the source word the "
               "cross-attention reads. The published run (docs/RESULTS.md, tiny-s2s) shows the same on 200 "
               "sentences.",
)
