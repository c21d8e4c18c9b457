"""Solutions for notebook 9 (evaluation)."""
from lrp_core import evaluate, metrics


def ex9_1(toy, one):
    out = {}
    for m in ["transformer_attribution", "rollout"]:
        maps = evaluate.image_maps(toy.model, one.images, m)[0]
        c = metrics.perturbation_curve(toy.model, one.images, maps, one.labels[:, 0], negative=True)
        out[m] = metrics.perturbation_auc(c)
        print(f"{m:>24}: negative-test AUC = {out[m]:.1f} (higher is better)")
    return out


def ex9_2(toy, one):
    maps = evaluate.image_maps(toy.model, one.images, "transformer_attribution")[0]
    scores = metrics.segmentation_scores(maps, one.masks[:, 0])
    print({k: round(v, 3) for k, v in scores.items()})
    return scores
