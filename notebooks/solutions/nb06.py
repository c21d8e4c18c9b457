"""Exercises of notebook 6 (explaining a ViT). Each needs the notebook's ``toy`` and ``scenes`` (scene 0)."""
from lrp_core import explain
from lrp_core.metrics import own_mask_share

from .exercise import Exercise, Mistake


def context():
    """The notebook's objects (for the tests)."""
    from lrp_core.data import make_scenes
    from lrp_core.models import load
    return {"toy": load("toy-vit"), "scenes": make_scenes(4, seed=11, n_objects=2)}


# ---------------------------------------------------------------- 6.1
def later_starts(toy, scenes):
    x = scenes.images[:1]                                   # scene 0
    a, b = [int(c) for c in scenes.labels[0]]
    ma, mb = scenes.masks[:1, 0], scenes.masks[:1, 1]
    out = {}
    for s in (0, 1, 3):
        sa = own_mask_share(explain(toy.model, x, target=a, start_layer=s).upsample(), ma)[0]
        sb = own_mask_share(explain(toy.model, x, target=b, start_layer=s).upsample(), mb)[0]
        out[s] = (float(sa), float(sb))
        print(f"start_layer={s}: share on own object {sa:.2f} / {sb:.2f}")
    return out


def _predicted_only(toy, scenes):
    x = scenes.images[:1]
    out = {}
    for s in (0, 1, 3):
        m = explain(toy.model, x, start_layer=s).upsample()
        out[s] = (float(own_mask_share(m, scenes.masks[:1, 0])[0]), float(own_mask_share(m, scenes.masks[:1, 1])[0]))
    return out


def _swapped_masks(toy, scenes):
    x = scenes.images[:1]
    a, b = [int(c) for c in scenes.labels[0]]
    out = {}
    for s in (0, 1, 3):
        sa = own_mask_share(explain(toy.model, x, target=a, start_layer=s).upsample(), scenes.masks[:1, 1])[0]
        sb = own_mask_share(explain(toy.model, x, target=b, start_layer=s).upsample(), scenes.masks[:1, 0])[0]
        out[s] = (float(sa), float(sb))
    return out


ex6_1 = Exercise(
    "ex6_1", "Start later", later_starts, difficulty=2, minutes=10, needs=("toy", "scenes"),
    answer="a dict {0: (share_a, share_b), 1: (...), 3: (...)}: for each start_layer, the share of class a's map on "
           "object a and of class b's map on object b",
    hints=["explain(toy.model, x, target=a, start_layer=s).upsample() gives the pixel map for class a.",
           "own_mask_share(map, scenes.masks[:1, 0])[0] is the share on object a; masks[:1, 1] is object b."],
    mistakes=[Mistake(_predicted_only, "you explained the predicted class for both objects; pass target=a for "
                                       "object a and target=b for object b"),
              Mistake(_swapped_masks, "you measured each class's map on the other object's mask; class a goes with "
                                      "scenes.masks[:1, 0], class b with scenes.masks[:1, 1]")],
    atol=1e-3, rtol=1e-2,
    discussion="Hardly any change (0.15 / 0.37 from block 0, 0.16 / 0.38 from block 3): on the toy model the "
               "evidence is concentrated in the later blocks, so skipping the first ones neither helps nor hurts.",
)


# ---------------------------------------------------------------- 6.2
def lrp_pixels(toy, scenes):
    a = int(scenes.labels[0, 0])
    pix = explain(toy.model, scenes.images[:1], method="lrp", target=a).pixels[0]   # (64, 64)
    # show it with viz.show_relevance(None, pix) next to scenes.rgb[0]
    return pix


ex6_2 = Exercise(
    "ex6_2", "Pixel LRP up close", lrp_pixels, difficulty=1, minutes=5, needs=("toy", "scenes"),
    answer="the lrp pixel map for class a of scene 0 (exp.pixels[0], 64 × 64)",
    hints=["explain(toy.model, x, method=\"lrp\", target=a) — a is int(scenes.labels[0, 0]).",
           "LRP reaches the pixels: use .pixels[0], not .scores (patches) or .upsample()."],
    mistakes=[Mistake(lambda toy, scenes: explain(toy.model, scenes.images[:1], method="lrp",
                                                  target=int(scenes.labels[0, 0])).upsample()[0],
                      "this is the patch map upsampled to pixels; LRP's own pixel map is .pixels[0]"),
              Mistake(lambda toy, scenes: explain(toy.model, scenes.images[:1], method="lrp",
                                                  target=int(scenes.labels[0, 1])).pixels[0],
                      "this is the map of class b (the second object); pass target=a, int(scenes.labels[0, 0])"),
              Mistake(lambda toy, scenes: explain(toy.model, scenes.images[:1],
                                                  target=int(scenes.labels[0, 0])).upsample()[0],
                      "this is transformer attribution's map (the default method), upsampled; pass "
                      "method=\"lrp\" and take .pixels[0]")],
    discussion="The LRP pixel map follows edges and texture inside the patches (the zB rule at the patch "
               "embedding), not the object's silhouette as a whole.",
)
