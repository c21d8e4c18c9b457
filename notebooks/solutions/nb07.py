"""Solutions for notebook 7 (CDAM)."""
import matplotlib.pyplot as plt
import numpy as np

from lrp_core import concept_target, explain
from lrp_core.data import compose_pair, sample_image
from lrp_core.metrics import pooled_correlation
from lrp_core.viz import show_relevance


def ex7_1(toy, scenes):
    t = scenes.labels[:, 1]
    cd = explain(toy.model, scenes.images, method="cdam", target=t).scores
    tam = explain(toy.model, scenes.images, method="token_ablation", target=t).scores
    r = pooled_correlation(cd, tam)
    print("Pearson r for the second object's class:", round(r, 2))
    return r


def ex7_2(dino):
    cat = concept_target(dino.model, dino.preprocess(sample_image("cat")), name="cat")
    pair = compose_pair("chelsea", "rocket")
    m = explain(dino.model, dino.preprocess(pair), method="cdam", target=cat).upsample()[0]
    fig, ax = plt.subplots(figsize=(3.5, 3.2))
    show_relevance(np.asarray(pair) / 255.0, m, ax=ax, title="concept cat")
    plt.show()
    half = m.shape[1] // 2
    print("positive relevance on the left (cat) half:",
          round(float(m[:, :half].clamp(min=0).sum() / m.clamp(min=0).sum()), 2))
    return m
