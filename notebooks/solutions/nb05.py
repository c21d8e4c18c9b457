"""Solutions for notebook 5 (from blocks to a map). Each takes the notebook's ``toy`` model."""
import matplotlib.pyplot as plt
import numpy as np

from lrp_core import explain
from lrp_core.data import make_scenes
from lrp_core.metrics import own_mask_share
from lrp_core.viz import show_methods


def ex5_1(toy, x, image):
    plain = explain(toy.model, x)
    rows = explain(toy.model, x, rollout_norm="row")
    show_methods(image, {"no normalisation": plain.scores[0].reshape(8, 8),
                         'rollout_norm="row"': rows.scores[0].reshape(8, 8)}, ncols=2)
    plt.show()
    # Row normalisation divides each factor I + A_b by its row sums. For the ViT the entries of
    # A_b are small next to the identity, so every row sums to little more than 1 and the map
    # keeps its shape: the two maps are almost perfectly correlated.
    print("largest row sum of I + A_b:", round(float(1 + plain.layers.sum(-1).max()), 3))
    corr = np.corrcoef(plain.scores[0].numpy(), rows.scores[0].numpy())[0, 1]
    print("correlation of the two maps:", round(float(corr), 3))
    return corr


def ex5_2(toy, n: int = 8, seed: int = 5):
    s = make_scenes(n, seed=seed, n_objects=1)
    variants = {"full": {}, "no gradient": {"use_gradient": False},
                "last block only": {"start_layer": -1}, "first block only": {"end_layer": 0}}
    out = {}
    for name, opts in variants.items():
        e = explain(toy.model, s.images, **opts)
        out[name] = float(np.nanmean(own_mask_share(e.upsample(), s.masks[:, 0])))
        print(f"{name:>17}: mean share on the object = {out[name]:.2f}")
    return out
