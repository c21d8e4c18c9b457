"""Exercises of notebook 8 (explaining BERT). Each needs the notebook's ``text`` and ``batch``."""
import numpy as np

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
def top5_summed(text, batch):
    tokens, n = _tokens(text, batch, 0)
    scores = explain(text.model, batch, method="transformer_attribution").scores[0, :n]
    words, ws = merge_wordpieces(tokens, scores, reduce="sum")
    top = [words[j] for j in np.argsort(-ws) if words[j] not in ("[CLS]", "[SEP]")][:5]
    print("sum:", top)
    return top


def _ascending(text, batch):
    tokens, n = _tokens(text, batch, 0)
    scores = explain(text.model, batch, method="transformer_attribution").scores[0, :n]
    words, ws = merge_wordpieces(tokens, scores, reduce="sum")
    return [words[j] for j in np.argsort(ws) if words[j] not in ("[CLS]", "[SEP]")][:5]


ex8_1 = Exercise(
    "ex8_1", "Summed word scores", top5_summed, difficulty=1, minutes=5, needs=("text", "batch"),
    answer="the list of the 5 top words of the first sentence with reduce=\"sum\" (without [CLS] and [SEP])",
    hints=["merge_wordpieces(tokens, exp.scores[k, :n], reduce=\"sum\") returns (words, scores).",
           "np.argsort(-scores) orders the words; skip \"[CLS]\" and \"[SEP]\" and keep 5."],
    mistakes=[Mistake(_ascending, "these are the 5 *least* relevant words; sort by decreasing score "
                                  "(np.argsort(-scores))")],
    discussion="The top 5 does not change: in this sentence the relevant words are single word-pieces, so the "
               "largest piece and the sum of pieces agree.",
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
                      "these are transformer-attribution scores; the exercise asks for method=\"cdam\"")],
    discussion="Only \"mess\" speaks against the (wrong) positive prediction; \"unwatchable\" does not. The model "
               "does see one word that should have made it say negative, but \"beautiful\" outweighs it.",
)
