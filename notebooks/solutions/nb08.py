"""Exercises of notebook 8 (explaining BERT). 8.1 needs the notebook's ``text``, 8.2 ``text`` and ``batch``."""
import numpy as np
import torch

from lrp_core import explain
from lrp_core.viz import merge_wordpieces

from .exercise import Exercise, Mistake

SENTENCES = ["The plot is thin, but the acting is wonderful and the ending made me smile.",
             "An unwatchable mess with a few beautiful shots."]


def context():
    """The notebook's objects (for the tests)."""
    from lrp_core.models import load
    text = load("minilm-sentiment")
    return {"text": text, "batch": text.preprocess(SENTENCES)}


def _tokens(text, batch, k):
    n = int(batch["attention_mask"][k].sum())
    return text.tokenizer.convert_ids_to_tokens(batch["input_ids"][k][:n].tolist()), n


# ---------------------------------------------------------------- 8.1
REVIEW = "The screenplay is overwrought and the cinematography breathtaking."
"""The sentence of exercise 8.1: two of its words are split into pieces (over ##wr ##ough ##t, breath ##taking)."""


def _word_ranking(text, sentence=REVIEW, reduce="sum", descending=True, drop_special=True, target=None):
    """The words of ``sentence`` ranked by their merged transformer-attribution score."""
    one = text.preprocess([sentence])
    n = int(one["attention_mask"][0].sum())
    tokens = text.tokenizer.convert_ids_to_tokens(one["input_ids"][0][:n].tolist())
    scores = explain(text.model, one, method="transformer_attribution", target=target).scores[0, :n]
    words, ws = merge_wordpieces(tokens, scores, reduce=reduce)
    order = np.argsort(-ws if descending else ws)
    return [words[j] for j in order if not (drop_special and words[j] in ("[CLS]", "[SEP]"))]


def ranked_by_sum(text, review=REVIEW):
    one = text.preprocess([review])                       # the exercise's sentence alone
    n = int(one["attention_mask"][0].sum())
    tokens = text.tokenizer.convert_ids_to_tokens(one["input_ids"][0][:n].tolist())
    scores = explain(text.model, one, method="transformer_attribution").scores[0, :n]
    words, ws = merge_wordpieces(tokens, scores, reduce="sum")
    ranking = [words[j] for j in np.argsort(-ws) if words[j] not in ("[CLS]", "[SEP]")]
    print("sum:", ranking)
    return ranking


def _other_class(text):
    one = text.preprocess([REVIEW])
    with torch.no_grad():
        predicted = int(text.model(**one).logits[0].argmax())
    return _word_ranking(text, target=1 - predicted)


ex8_1 = Exercise(
    "ex8_1", "Summed word scores", ranked_by_sum, difficulty=1, minutes=5, needs=("text",),
    answer="the list of the words of `review`, ranked by their summed piece scores (highest first), without "
           "[CLS] and [SEP]",
    hints=["one = text.preprocess([review]); explain(text.model, one, method=\"transformer_attribution\") "
           "explains the predicted class; keep the n = int(one[\"attention_mask\"][0].sum()) real tokens.",
           "merge_wordpieces(tokens, exp.scores[0, :n], reduce=\"sum\") returns (words, scores).",
           "np.argsort(-scores) orders the words, highest first; skip \"[CLS]\" and \"[SEP]\"."],
    mistakes=[Mistake(lambda text: _word_ranking(text, reduce="max"),
                      "this is the ranking by the largest piece (merge_wordpieces' default, section 3); pass "
                      "reduce=\"sum\""),
              Mistake(lambda text: _word_ranking(text, descending=False),
                      "this ranking starts with the *least* relevant word; sort by decreasing score "
                      "(np.argsort(-scores))"),
              Mistake(lambda text: _word_ranking(text, drop_special=False),
                      "your list contains [CLS] and [SEP]: leave the two special tokens out"),
              Mistake(lambda text: _word_ranking(text, sentence=SENTENCES[0]),
                      "these are the words of section 3's sentence; explain `review`, the exercise's sentence"),
              Mistake(_other_class, "this is the map of the other class; explain the predicted class (no target)")],
    discussion="With the largest piece, \"screenplay\" leads and \"overwrought\" (four pieces) is not in the "
               "top 5; summed, \"breathtaking\" (two pieces) moves to the top and \"overwrought\" into the top "
               "5. Summing favours words split into many pieces, the largest piece ignores how many there are: "
               "choose the reduction before comparing words.",
)


# ---------------------------------------------------------------- 8.2
def cdam_second_sentence(text, batch):
    k = 1
    tokens, n = _tokens(text, batch, k)
    one = {key: v[k:k + 1] for key, v in batch.items()}
    e = explain(text.model, one, method="cdam")
    words, ws = merge_wordpieces(tokens, e.scores[0, :n])
    print("words against the prediction:", [w for w, s in zip(words, ws) if s < 0 and w not in ("[CLS]", "[SEP]")])
    return e.scores[0, :n]                                  # the real tokens only


def _padding_mask(text, batch):
    return (batch["attention_mask"][1] == 0).numpy()


ex8_2 = Exercise(
    "ex8_2", "CDAM on text", cdam_second_sentence, difficulty=2, minutes=10, needs=("text", "batch"),
    answer="the CDAM token scores of the second sentence for the predicted class — its n real tokens, or the "
           "whole padded row with zeros on the padding",
    hints=["one = {key: v[1:2] for key, v in batch.items()} keeps the second sentence; explain(text.model, one, "
           "method=\"cdam\").scores[0].",
           "The sentence is shorter than the batch: n = int(batch[\"attention_mask\"][1].sum()) tokens are real, "
           "the rest is padding.",
           "merge_wordpieces(tokens, scores) gives word scores; the negative ones speak against the prediction."],
    padding=_padding_mask,
    mistakes=[Mistake(lambda text, batch: explain(text.model, batch, method="transformer_attribution")
                      .scores[1, :_tokens(text, batch, 1)[1]],
                      "these are transformer-attribution scores; the exercise asks for method=\"cdam\""),
              Mistake(lambda text, batch: explain(text.model, {key: v[:1] for key, v in batch.items()},
                                                  method="cdam").scores[0, :_tokens(text, batch, 0)[1]],
                      "these are the first sentence's scores; the second sentence is row 1 of the batch "
                      "(v[1:2])")],
    discussion="Only \"mess\" speaks against the (wrong) positive prediction; \"unwatchable\" does not. The model "
               "does see one word that should have made it say negative, but \"beautiful\" outweighs it.",
)
