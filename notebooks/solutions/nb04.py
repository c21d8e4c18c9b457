"""Exercises of notebook 4 (inside one Transformer block).

Each needs the notebook's model ``toy`` and input ``x``: ``ex4_1.check(my_answer, toy=toy, x=x)``.
"""
import torch

from lrp_core import attention_parts, explain

from .exercise import Exercise, Mistake


def context():
    """The notebook's objects (for the tests): toy-vit and its first one-object scene."""
    from lrp_core.data import make_scenes
    from lrp_core.models import load
    toy = load("toy-vit")
    return {"toy": toy, "x": make_scenes(2, seed=3, n_objects=1).images[:1]}


# ---------------------------------------------------------------- 4.1
def second_class_map(toy, x):
    with torch.no_grad():
        second = int(toy.model(x)[0].argsort(descending=True)[1])     # the second most likely class
    exp = explain(toy.model, x, target=second)
    print("second most likely class:", toy.labels[second])
    return exp.layers[0, -1, 0, 1:]                                     # last block, [CLS] row, patches


ex4_1 = Exercise(
    "ex4_1", "Another class", second_class_map, difficulty=1, minutes=10, needs=("toy", "x"),
    answer="the last block's Ā [CLS] row over the 64 patches (exp.layers[0, -1, 0, 1:]) for the 2nd most "
           "likely class",
    hints=["toy.model(x)[0].argsort(descending=True)[1] is the index of the second most likely class.",
           "explain(toy.model, x, target=second).layers has shape (batch, blocks, tokens, tokens); take "
           "[0, -1, 0, 1:]."],
    mistakes=[Mistake(lambda toy, x: explain(toy.model, x).layers[0, -1, 0, 1:],
                      "this is the map of the predicted class; pass target=<index of the 2nd most likely class>"),
              Mistake(lambda toy, x: explain(toy.model, x, target=int(toy.model(x)[0].argsort(descending=True)[1]))
                      .layers[0, -1, 0, :],
                      "you kept the [CLS] column: drop it with [1:] to keep the 64 patches"),
              Mistake(lambda toy, x: explain(toy.model, x, target=int(toy.model(x)[0].argsort(descending=True)[1]))
                      .layers[0, 0, 0, 1:],
                      "this is the first block's row; take the last block, exp.layers[0, -1, ...]"),
              Mistake(lambda toy, x: explain(toy.model, x, target=int(toy.model(x)[0].argsort()[1]))
                      .layers[0, -1, 0, 1:],
                      "this is the second *least* likely class: argsort() sorts from the lowest logit up — use "
                      "argsort(descending=True)[1]")],
    discussion="The attention A of the forward pass is the same for both classes; the gradient and the "
               "relevance start from another one-hot target, so the map moves with the class.",
)


# ---------------------------------------------------------------- 4.2
def gradient_change(toy, x):
    with_g = explain(toy.model, x, keep_heads=True).layers_per_head[0, -1, :, 0, 1:]
    without = explain(toy.model, x, keep_heads=True, use_gradient=False).layers_per_head[0, -1, :, 0, 1:]
    norm = lambda m: m / m.sum(-1, keepdim=True).clamp(min=1e-12)  # noqa: E731
    change = (norm(with_g) - norm(without)).abs().sum(-1)          # one number per head
    print("L1 change of each head's normalised [CLS] row:", [round(v, 3) for v in change.tolist()])
    return change


def _change(toy, x, block=-1, absolute=True):
    with_g = explain(toy.model, x, keep_heads=True).layers_per_head[0, block, :, 0, 1:]
    without = explain(toy.model, x, keep_heads=True, use_gradient=False).layers_per_head[0, block, :, 0, 1:]
    norm = lambda m: m / m.sum(-1, keepdim=True).clamp(min=1e-12)  # noqa: E731
    d = norm(with_g) - norm(without)
    return (d.abs() if absolute else d).sum(-1)


def _unnormalised(toy, x):
    with_g = explain(toy.model, x, keep_heads=True).layers_per_head[0, -1, :, 0, 1:]
    without = explain(toy.model, x, keep_heads=True, use_gradient=False).layers_per_head[0, -1, :, 0, 1:]
    return (with_g - without).abs().sum(-1)


ex4_2 = Exercise(
    "ex4_2", "Without the gradient", gradient_change, difficulty=2, minutes=15, needs=("toy", "x"),
    answer="a tensor of 4 numbers, one per head: the L1 distance between the head's normalised [CLS] rows "
           "with and without the gradient",
    hints=["explain(..., keep_heads=True).layers_per_head has shape (batch, blocks, heads, tokens, tokens); "
           "the last block's [CLS] rows over the patches are [0, -1, :, 0, 1:].",
           "Normalise each row to sum 1 before comparing (m / m.sum(-1, keepdim=True)): the two variants have "
           "different scales.",
           "Then (norm_with - norm_without).abs().sum(-1)."],
    mistakes=[Mistake(_unnormalised, "you compared the raw rows; normalise each row to sum 1 first — with and "
                                     "without the gradient the maps have very different scales"),
              Mistake(lambda toy, x: _change(toy, x, block=0),
                      "these are the first block's heads; take the last block, layers_per_head[0, -1, ...]"),
              Mistake(lambda toy, x: _change(toy, x, absolute=False),
                      "you summed the signed differences (they cancel); the L1 distance sums their absolute "
                      "values, (.abs().sum(-1))")],
    discussion="Three heads change a lot (L1 distance above 1.3 of a possible 2) and one hardly at all: the "
               "gradient re-weights the heads' patches class-specifically.",
)


# ---------------------------------------------------------------- 4.3
def unclipped_mean(toy, x):
    parts = attention_parts(toy.model, x)                       # the predicted class
    prod = (parts.gradient * parts.relevance)[0, -1, :, 0, 1:]  # last block, (H, 64), signed
    cancel = (prod.clamp(min=0).sum(0) > 0) & (prod.clamp(max=0).sum(0) < 0)
    print("patches where heads disagree in sign:", int(cancel.sum()), "of 64")
    return prod.mean(0)                                         # mean over heads, no clipping


def _clipped(toy, x):
    parts = attention_parts(toy.model, x)
    return (parts.gradient * parts.relevance)[0, -1, :, 0, 1:].clamp(min=0).mean(0)


ex4_3 = Exercise(
    "ex4_3", "Why clip before the mean?", unclipped_mean, difficulty=3, minutes=15, needs=("toy", "x"),
    answer="the head mean of ∇A ⊙ R^A without clipping: the last block's [CLS] row over the 64 patches",
    hints=["lrp_core.attention_parts(toy.model, x) returns .gradient and .relevance, each (batch, blocks, "
           "heads, tokens, tokens).",
           "prod = (parts.gradient * parts.relevance)[0, -1, :, 0, 1:] is (heads, 64); average over heads "
           "without .clamp.",
           "Where do heads cancel? Patches where some head is positive and another negative."],
    mistakes=[Mistake(_clipped, "you clipped before the mean — that is Ā itself; the exercise asks for the mean "
                                "without clipping"),
              Mistake(lambda toy, x: attention_parts(toy.model, x).relevance[0, -1, :, 0, 1:].mean(0),
                      "the gradient factor is missing: average ∇A ⊙ R^A (parts.gradient * parts.relevance), not "
                      "R^A alone"),
              Mistake(lambda toy, x: (lambda p: (p.gradient * p.relevance)[0, -1, :, 0, 1:].sum(0))(
                          attention_parts(toy.model, x)),
                      "you summed over the heads; average them (.mean(0))")],
    discussion="On 20 of the 64 patches some heads are positive and others negative: averaging signed values "
               "cancels evidence, and the unclipped map is dimmer and noisier. Clipping first keeps every "
               "head's positive evidence.",
)
