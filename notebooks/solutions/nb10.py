"""Exercises of notebook 10 (explore). Each needs the notebook's ``toy`` and ``scenes`` (scene 0)."""
import torch

from lrp_core import explain
from lrp_core.metrics import own_mask_share

from .exercise import Exercise, Mistake

GRID = ["transformer_attribution", "rollout", "attention_gradcam", "cdam"]
CANDIDATES = ["transformer_attribution", "rollout", "raw_attention", "attention_gradcam", "cdam"]


def context():
    """The notebook's objects (for the tests)."""
    from lrp_core.data import make_scenes
    from lrp_core.models import load
    return {"toy": load("toy-vit"), "scenes": make_scenes(4, seed=11, n_objects=2)}


# ---------------------------------------------------------------- 10.1
def class_agnostic(toy, scenes):
    x = scenes.images[:1]
    a, b = [int(c) for c in scenes.labels[0]]
    same = set()
    for m in CANDIDATES:
        ma = explain(toy.model, x, method=m, target=a).scores
        mb = explain(toy.model, x, method=m, target=b).scores
        if torch.allclose(ma, mb, atol=1e-6):
            same.add(m)                        # the same map whatever the class
    print("class-agnostic:", sorted(same))
    return same


ex10_1 = Exercise(
    "ex10_1", "Discuss: which maps ignore the class?", class_agnostic, difficulty=1, minutes=15,
    needs=("toy", "scenes"),
    answer="the set of methods, among " + ", ".join(CANDIDATES) + ", that draw the same map whatever class you ask for",
    hints=["In the explorer, switch the class between the two objects and watch which maps stay put.",
           "Check with numbers: explain scene 0 for both classes and compare the maps with torch.allclose.",
           "A method can only depend on the class if the class enters its computation — a gradient or a "
           "relevance pass."],
    discussion="Rollout and raw attention average attention weights, which the forward pass computes before any "
               "class is chosen; transformer attribution, attention Grad-CAM and CDAM weight by gradients of the "
               "class score. Questions for the discussion: does a class-specific map always put its relevance on "
               "the right object (notebook 6)? Which block carries the evidence (block slider, notebook 5)? Do "
               "heads disagree in sign (head slider, notebook 4)?",
)


# ---------------------------------------------------------------- 10.2
def own_object_shares(toy, scenes, swap=False, predicted=False):
    x = scenes.images[:1]
    classes = [int(c) for c in scenes.labels[0]]
    share = {}
    for m in GRID:
        row = []
        for j, c in enumerate(classes):
            exp = explain(toy.model, x, method=m, target=None if predicted else c)
            mask = scenes.masks[:1, 1 - j if swap else j]
            row.append(float(own_mask_share(exp.upsample(), mask)[0]))
        share[m] = row
        print(f"{m:>24}: share on its own object = "
              + ", ".join(f"{toy.labels[c]} {v:.2f}" for c, v in zip(classes, row)))
    return share


ex10_2 = Exercise(
    "ex10_2", "From picture to number", own_object_shares, difficulty=2, minutes=15, needs=("toy", "scenes"),
    answer="a dict {method: [share for class 0, share for class 1]} for the four methods of section 2",
    hints=["The two classes of scene 0 are [int(c) for c in scenes.labels[0]]; object j's mask is "
           "scenes.masks[:1, j].",
           "own_mask_share(explain(toy.model, x, method=m, target=c).upsample(), mask)[0] is one share."],
    mistakes=[Mistake(lambda toy, scenes: own_object_shares(toy, scenes, swap=True),
                      "you measured each class's map on the *other* object's mask; class j goes with "
                      "scenes.masks[:1, j]"),
              Mistake(lambda toy, scenes: own_object_shares(toy, scenes, predicted=True),
                      "you explained the predicted class for both objects; explain class j (target=c) for "
                      "object j")],
    atol=1e-3, rtol=1e-2,
    discussion="Transformer attribution and CDAM put more relevance on the square when asked about the square "
               "(0.37 / 0.35) than rollout does (0.11): they are class-specific. A class-agnostic method draws the "
               "same map for both classes, so its two shares differ only because the objects differ in size.",
)
