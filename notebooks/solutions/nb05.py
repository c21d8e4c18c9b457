"""Exercises of notebook 5 (from blocks to a map). Each needs the notebook's ``toy`` (and ``x``)."""
import numpy as np

from lrp_core import explain
from lrp_core.data import make_scenes
from lrp_core.metrics import own_mask_share

from .exercise import Exercise, Mistake


def context():
    """The notebook's objects (for the tests)."""
    from lrp_core.models import load
    return {"toy": load("toy-vit"), "x": make_scenes(2, seed=3, n_objects=1).images[:1]}


# ---------------------------------------------------------------- 5.1
def row_normalised(toy, x):
    plain = explain(toy.model, x)
    rows = explain(toy.model, x, rollout_norm="row")
    print("largest row sum of I + A_b:", round(float(1 + plain.layers.sum(-1).max()), 3))
    print("correlation of the two maps:", round(float(np.corrcoef(plain.scores[0], rows.scores[0])[0, 1]), 3))
    return rows.scores[0]


ex5_1 = Exercise(
    "ex5_1", "Row normalisation", row_normalised, difficulty=1, minutes=10, needs=("toy", "x"),
    answer="the 64 patch scores of transformer attribution with rollout_norm=\"row\" (exp.scores[0])",
    hints=["explain(toy.model, x, rollout_norm=\"row\").scores[0] — one score per patch.",
           "Compare with the default map by their correlation (np.corrcoef) and their scale (.max()).",
           "Row sums of each factor: 1 + exp.layers.sum(-1)."],
    mistakes=[Mistake(lambda toy, x: explain(toy.model, x).scores[0],
                      "this is the default map (no normalisation); pass rollout_norm=\"row\"")],
    discussion="Row normalisation divides each factor I + Ā_b by its row sums. For the toy ViT the entries of "
               "Ā_b are small next to the identity (the largest row sum is about 1.07), so the map keeps its "
               "shape: the two maps are almost perfectly correlated and differ mainly in scale.",
)


# ---------------------------------------------------------------- 5.2
VARIANTS = {"full": {}, "no gradient": {"use_gradient": False},
            "last block only": {"start_layer": -1}, "first block only": {"end_layer": 0}}


def shares_on_8_scenes(toy):
    s = make_scenes(8, seed=5, n_objects=1)
    out = {}
    for name, opts in VARIANTS.items():
        e = explain(toy.model, s.images, **opts)
        out[name] = float(np.nanmean(own_mask_share(e.upsample(), s.masks[:, 0])))
        print(f"{name:>17}: mean share on the object = {out[name]:.2f}")
    return out


def _first_scene_only(toy):
    s = make_scenes(8, seed=5, n_objects=1)
    return {name: float(own_mask_share(explain(toy.model, s.images[:1], **o).upsample(), s.masks[:1, 0])[0])
            for name, o in VARIANTS.items()}


ex5_2 = Exercise(
    "ex5_2", "More than one image", shares_on_8_scenes, difficulty=2, minutes=15, needs=("toy",),
    answer="a dict {\"full\": ..., \"no gradient\": ..., \"last block only\": ..., \"first block only\": ...} "
           "of mean shares on the object over make_scenes(8, seed=5, n_objects=1)",
    hints=["explain takes the whole batch: explain(toy.model, s.images, **options) explains all 8 scenes at once.",
           "own_mask_share(exp.upsample(), s.masks[:, 0]) gives one share per scene; average with np.nanmean.",
           "The options of the four variants: {}, use_gradient=False, start_layer=-1, end_layer=0."],
    mistakes=[Mistake(_first_scene_only, "these are the shares of the first scene only; average over all 8")],
    atol=1e-3, rtol=1e-2,
    discussion="On average: full 0.46, no gradient 0.50, last block only 0.51, first block only 0.26. The first "
               "block alone is clearly worst; the other three are close, and the full product is not ahead on "
               "this measure — which rewards covering the object, not faithfulness (notebook 9).",
)
