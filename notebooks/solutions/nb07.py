"""Exercises of notebook 7 (CDAM). 7.1 needs ``toy`` and ``scenes``, 7.2 the notebook's ``dino``."""
from lrp_core import concept_target, explain
from lrp_core.data import compose_pair, sample_image
from lrp_core.metrics import pooled_correlation

from .exercise import Exercise, Mistake


def context():
    """The notebook's objects (for the tests)."""
    from lrp_core.data import make_scenes
    from lrp_core.models import load
    return {"toy": load("toy-vit"), "scenes": make_scenes(8, seed=21, n_objects=2), "dino": load("dinov2-s14")}


# ---------------------------------------------------------------- 7.1
def second_class_r(toy, scenes, column=1):
    t = scenes.labels[:, column]                          # the second object's class in every scene
    cd = explain(toy.model, scenes.images, method="cdam", target=t).scores
    tam = explain(toy.model, scenes.images, method="token_ablation", target=t).scores
    r = pooled_correlation(cd, tam)
    print("Pearson r for the second object's class:", round(r, 2))
    return r


ex7_1 = Exercise(
    "ex7_1", "Per-class correlation", second_class_r, difficulty=1, minutes=5, needs=("toy", "scenes"),
    answer="one number: the pooled Pearson r between CDAM and token ablation for the second object's class",
    hints=["Section 2 uses target=scenes.labels[:, 0]; the second object's class is scenes.labels[:, 1].",
           "pooled_correlation(cdam_scores, ablation_scores) returns one number for all 8 scenes."],
    mistakes=[Mistake(lambda toy, scenes: second_class_r(toy, scenes, column=0),
                      "this is r for the first object's class (section 2); use target=scenes.labels[:, 1]")],
    atol=1e-3, rtol=1e-3,
    discussion="r is 0.57 for the second object's class against 0.39 for the first: the agreement between CDAM "
               "and ablation depends on the class, so one number for one class is not a property of the method.",
)


# ---------------------------------------------------------------- 7.2
def fair_concept(dino):
    cat = concept_target(dino.model, dino.preprocess(sample_image("cat")), name="cat")   # "cat" only
    pair = compose_pair("chelsea", "rocket")
    m = explain(dino.model, dino.preprocess(pair), method="cdam", target=cat).upsample()[0]
    half = m.shape[1] // 2
    print("positive relevance on the left (cat) half:",
          round(float(m[:, :half].clamp(min=0).sum() / m.clamp(min=0).sum()), 2))
    return m


def _with_chelsea(dino):
    import torch
    ex = torch.cat([dino.preprocess(sample_image(n)) for n in ["chelsea", "cat"]])
    cat = concept_target(dino.model, ex, name="cat")
    return explain(dino.model, dino.preprocess(compose_pair("chelsea", "rocket")), method="cdam",
                   target=cat).upsample()[0]


ex7_2 = Exercise(
    "ex7_2", "A fair concept test", fair_concept, difficulty=2, minutes=10, needs=("dino",),
    answer="the upsampled CDAM map (224 × 224) of the chelsea–rocket pair for a cat concept built from \"cat\" only",
    hints=["concept_target(dino.model, dino.preprocess(sample_image(\"cat\")), name=\"cat\") builds the concept.",
           "Query: dino.preprocess(compose_pair(\"chelsea\", \"rocket\")); explain with method=\"cdam\", "
           "target=the concept, then .upsample()[0]."],
    mistakes=[Mistake(_with_chelsea, "your concept still contains the \"chelsea\" photo — the query's own cat; "
                                     "build it from \"cat\" only")],
    atol=1e-3, rtol=1e-2,
    discussion="Practically all positive relevance lies on the cat (left) half, although the concept never saw "
               "this photo: the concept generalises to a new cat.",
)
