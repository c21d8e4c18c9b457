"""Solutions for notebook 4 (inside one Transformer block).

Each takes the notebook's loaded model ``toy``, its input ``x`` and ``image``:
``reveal("ex4_1", toy=toy, x=x, image=image)``.
"""
import matplotlib.pyplot as plt
import torch

from lrp_core import explain
from lrp_core.viz import show_relevance


def ex4_1(toy, x, image):
    with torch.no_grad():
        second = int(toy.model(x)[0].argsort(descending=True)[1])
    maps = {}
    for name, t in [("predicted", None), (f"2nd: {toy.labels[second]}", second)]:
        exp = explain(toy.model, x, target=t)
        maps[name] = exp.layers[0, -1, 0, 1:].reshape(8, 8)
    fig, axes = plt.subplots(1, 2, figsize=(6, 2.8))
    for ax, (name, m) in zip(axes, maps.items()):
        show_relevance(image, m, ax=ax, title=name)
    plt.show()
    # The attention A is the same; gradient and relevance start from another one-hot target.
    return maps


def ex4_2(toy, x, image):
    with_g = explain(toy.model, x, keep_heads=True).layers_per_head[0, -1, :, 0, 1:]
    without = explain(toy.model, x, keep_heads=True, use_gradient=False).layers_per_head[0, -1, :, 0, 1:]
    norm = lambda m: m / m.sum(-1, keepdim=True).clamp(min=1e-12)  # noqa: E731
    change = (norm(with_g) - norm(without)).abs().sum(-1)
    print("L1 change of each head's normalised [CLS] row:", [round(v, 3) for v in change.tolist()])
    return change


def ex4_3(toy, x, image):
    from lrp_core import attention_parts

    parts = attention_parts(toy.model, x)                       # the predicted class
    prod = (parts.gradient * parts.relevance)[0, -1, :, 0, 1:]  # last block, (H, 64), signed
    unclipped = prod.mean(0)
    clipped = prod.clamp(min=0).mean(0)
    cancel = (prod.clamp(min=0).sum(0) > 0) & (prod.clamp(max=0).sum(0) < 0)
    print("patches where heads disagree in sign:", int(cancel.sum()), "of 64")
    fig, axes = plt.subplots(1, 2, figsize=(6, 2.8))
    show_relevance(image, unclipped.reshape(8, 8), ax=axes[0], title="mean, no clipping")
    show_relevance(image, clipped.reshape(8, 8), ax=axes[1], title="clip, then mean")
    plt.show()
    return unclipped, clipped
