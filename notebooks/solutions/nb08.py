"""Solutions for notebook 8 (explaining BERT)."""
import numpy as np
from IPython.display import HTML, display

from lrp_core import explain
from lrp_core.viz import merge_wordpieces, token_html


def ex8_1(tokens, scores):
    tops = {}
    for reduce in ("max", "sum"):
        words, ws = merge_wordpieces(tokens, scores, reduce=reduce)
        tops[reduce] = [words[j] for j in np.argsort(-ws) if words[j] not in ("[CLS]", "[SEP]")][:5]
        print(f"{reduce}: {tops[reduce]}")
    return tops


def ex8_2(text, batch):
    k = 1
    n = int(batch["attention_mask"][k].sum())
    one = {key: v[k:k + 1] for key, v in batch.items()}
    e = explain(text.model, one, method="cdam")
    tokens = text.tokenizer.convert_ids_to_tokens(batch["input_ids"][k][:n].tolist())
    display(HTML(token_html(tokens, e.scores[0, :n])))
    words, ws = merge_wordpieces(tokens, e.scores[0, :n])
    against = [w for w, s in zip(words, ws) if s < 0 and w not in ("[CLS]", "[SEP]")]
    print("words against the prediction:", against)
    return against
