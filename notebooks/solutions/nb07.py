"""Exercises of notebook 7 (CDAM). 7.1 needs ``toy`` and ``scenes``, 7.2 the notebook's ``dino``.

The library's "cat" photo is the "chelsea" photo (scikit-image ships one cat), so a cat concept has
always seen the query's cat; 7.2 is therefore a control with a concept that is absent from the query.
"""
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
def second_class_r(toy, scenes, column=1, partner="token_ablation"):
    t = scenes.labels[:, column]                          # the second object's class in every scene
    cd = explain(toy.model, scenes.images, method="cdam", target=t).scores
    tam = explain(toy.model, scenes.images, method=partner, target=t).scores
    r = pooled_correlation(cd, tam)
    print("Pearson r for the second object's class:", round(r, 2))
    return r


ex7_1 = Exercise(
    "ex7_1", "Per-class correlation", second_class_r, difficulty=1, minutes=5, needs=("toy", "scenes"),
    answer="one number: the pooled Pearson r between CDAM and token ablation for the second object's class",
    hints=["Section 2 uses target=scenes.labels[:, 0]; the second object's class is scenes.labels[:, 1].",
           "pooled_correlation(cdam_scores, ablation_scores) returns one number for all 8 scenes."],
    mistakes=[Mistake(lambda toy, scenes: second_class_r(toy, scenes, column=0),
                      "this is r for the first object's class (section 2); use target=scenes.labels[:, 1]"),
              Mistake(lambda toy, scenes: second_class_r(toy, scenes, partner="transformer_attribution"),
                      "this correlates CDAM with transformer attribution; the reference of section 2 is token "
                      "ablation (method=\"token_ablation\")")],
    atol=1e-3, rtol=1e-3,
    discussion="r is 0.57 for the second object's class against 0.39 for the first: the agreement between CDAM "
               "and ablation depends on the class, so one number for one class is not a property of the method.",
)


# ---------------------------------------------------------------- 7.2
def absent_concept(dino, examples=("coffee",)):
    import torch
    cup = concept_target(dino.model, torch.cat([dino.preprocess(sample_image(n)) for n in examples]), name="cup")
    pair = compose_pair("chelsea", "rocket")                    # no cup anywhere
    m = explain(dino.model, dino.preprocess(pair), method="cdam", target=cup).upsample()[0]
    half = m.shape[1] // 2
    pos = m.clamp(min=0)
    print("positive relevance on the left (cat) half:", round(float(pos[:, :half].sum() / pos.sum()), 2))
    print("total positive:", round(float(pos.sum())), "| total negative:", round(float(m.clamp(max=0).sum())))
    return m


ex7_2 = Exercise(
    "ex7_2", "A concept that is not there", absent_concept, difficulty=2, minutes=10, needs=("dino",),
    answer="the upsampled CDAM map (224 × 224) of the chelsea–rocket composition for a cup concept built from "
           "\"coffee\"",
    hints=["concept_target(dino.model, dino.preprocess(sample_image(\"coffee\")), name=\"cup\") builds the concept.",
           "Query: dino.preprocess(compose_pair(\"chelsea\", \"rocket\")); explain with method=\"cdam\", "
           "target=the concept, then .upsample()[0].",
           "Compare m.clamp(min=0).sum() and m.clamp(max=0).sum() with the same numbers for the cat concept."],
    mistakes=[Mistake(lambda dino: absent_concept(dino, ("chelsea",)),
                      "this is the map of a cat concept; the exercise builds the concept from \"coffee\"")],
    atol=1e-3, rtol=1e-2,
    discussion="CDAM still draws a map for a concept that is absent: about two thirds of the positive relevance "
               "lands on the cat half, and the negative relevance outweighs the positive (about -70,000 against "
               "+58,000; the cat concept on the same query gives about +100,000 against -46,000, all of its "
               "positive relevance on the cat). A map always shows *something*: whether the concept is present "
               "is a question for the score, not for the picture.",
)
