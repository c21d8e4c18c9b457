"""Solutions for notebook 10 (explore)."""


def ex10_1():
    qs = ["Does the method depend on the target class (notebook 6)?",
          "Which block carries the evidence (block slider, notebook 5)?",
          "Do heads disagree in sign (head slider, notebook 4)?"]
    for q in qs:
        print("-", q)
    return qs


def ex10_2(toy, scenes):
    from lrp_core import explain
    from lrp_core.metrics import own_mask_share

    x = scenes.images[:1]
    classes = [int(c) for c in scenes.labels[0]]
    methods = ["transformer_attribution", "rollout", "attention_gradcam", "cdam"]
    share = {}
    for m in methods:
        row = []
        for j, c in enumerate(classes):
            exp = explain(toy.model, x, method=m, target=c)
            row.append(float(own_mask_share(exp.upsample(), scenes.masks[:1, j])[0]))
        share[m] = row
        print(f"{m:>24}: share on its own object = "
              + ", ".join(f"{toy.labels[c]} {v:.2f}" for c, v in zip(classes, row)))
    # A class-agnostic method draws the same map for both classes, so its two shares
    # only differ because the two objects differ in size; a class-specific one can put
    # most of each map on the object of the class it explains.
    return share
