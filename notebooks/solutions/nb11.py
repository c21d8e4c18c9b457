"""Exercises of notebook 11 (AttnLRP and CP-LRP). 11.1 uses seeded tensors of its own, 11.2 the notebook's
``toy`` and ``x`` (four two-object scenes)."""
import torch
import torch.nn.functional as F

from lrp_core import explain
from lrp_core.rules.composites import ATTNLRP
from lrp_core.rules.ops import ELEMENTWISE, MATMUL_AV

from .exercise import Exercise, Mistake


def gated_unit():
    """The bias-free gated unit of exercise 11.1: ``y = w · (gelu(W1 x) ⊙ (W2 x))``, seeded, float64."""
    g = torch.Generator().manual_seed(1111)
    x = torch.randn(4, dtype=torch.float64, generator=g)
    W1 = torch.randn(3, 4, dtype=torch.float64, generator=g)
    W2 = torch.randn(3, 4, dtype=torch.float64, generator=g)
    w = torch.randn(3, dtype=torch.float64, generator=g)
    return x, W1, W2, w


def context():
    """The notebook's objects (for the tests)."""
    from lrp_core.data import make_scenes
    from lrp_core.models import load
    return {"toy": load("toy-vit"), "x": make_scenes(4, seed=11, n_objects=2).images}


# ---------------------------------------------------------------- 11.1
def attnlrp_gated_unit():
    x, W1, W2, w = gated_unit()
    x = x.clone().requires_grad_(True)
    a, u = W1 @ x, W2 @ x
    g = ATTNLRP.rule(ELEMENTWISE).forward(F.gelu, a)        # identity rule: gradient × gelu(a)/a
    h = ATTNLRP.rule(MATMUL_AV).forward(torch.mul, g, u)    # uniform rule: each factor's gradient ÷ 2
    y = w @ h
    y.backward()
    R_x = (x * x.grad).detach()
    print("y =", round(y.item(), 6), "| sum of R_x =", round(R_x.sum().item(), 6))
    return R_x


def _plain(halve: bool, identity: bool):
    def compute():
        x, W1, W2, w = gated_unit()
        x = x.clone().requires_grad_(True)
        a, u = W1 @ x, W2 @ x
        g = ATTNLRP.rule(ELEMENTWISE).forward(F.gelu, a) if identity else F.gelu(a)
        h = ATTNLRP.rule(MATMUL_AV).forward(torch.mul, g, u) if halve else g * u
        (w @ h).backward()
        return (x * x.grad).detach()
    return compute


def _y():
    x, W1, W2, w = gated_unit()
    return float(w @ (F.gelu(W1 @ x) * (W2 @ x)))


ex11_1 = Exercise(
    "ex11_1", "AttnLRP on a gated unit", attnlrp_gated_unit, difficulty=2, minutes=10,
    answer="the AttnLRP relevance R_x of the 4 inputs x (a tensor of shape (4,)); it must sum to y",
    hints=["Make x a leaf with requires_grad, redo the forward pass with the two rules, call y.backward(); "
           "the relevance is x * x.grad.",
           "ATTNLRP.rule(ELEMENTWISE).forward(F.gelu, a) is GELU with the identity rule; "
           "ATTNLRP.rule(MATMUL_AV).forward(torch.mul, g, u) is the product with both gradients halved.",
           "By hand: the product gives each factor half of w ⊙ g ⊙ u; the GELU passes its half on unchanged; "
           "a bias-free Linear hands relevance down as x ⊙ Wᵀ(R / (W x))."],
    total=lambda ref: _y(),
    mistakes=[Mistake(_plain(halve=False, identity=False),
                      "this is plain gradient × input: the GELU passed its ordinary derivative and the product "
                      "gave each factor the whole gradient — use the identity rule and the ÷2"),
              Mistake(_plain(halve=False, identity=True),
                      "the identity rule is right, but the product gave each factor the whole gradient (a missing "
                      "÷2): use the uniform rule, ATTNLRP.rule(MATMUL_AV), which halves it"),
              Mistake(_plain(halve=True, identity=False),
                      "the ÷2 is right, but the GELU passed its ordinary derivative; AttnLRP replaces it by "
                      "gelu(a)/a (the identity rule), so that the GELU passes relevance on unchanged")],
    discussion="The sum of R_x equals y up to the identity rule's 1e-10: the unit has no bias and no softmax, so "
               "every rule conserves. Without the ÷2 both factors of the product take all of the relevance and "
               "the total doubles; with the GELU's real derivative the total is neither y nor 2y.",
)


# ---------------------------------------------------------------- 11.2
def most_absorbing_block(toy, x):
    c = explain(toy.model, x, method="attnlrp").conservation
    share = (c.absorbed() / c.output[:, None]).mean(0)     # steps: readout, block L-1, ..., block 0 (+ embedding)
    L = c.blocks.shape[1]
    step = int(share[1:].argmax()) + 1                       # leave the readout (step 0) out
    block = L - step
    print(f"block {block} absorbs {share[step].item():.3f} of y_t on average")
    return block, float(share[step])


def _step_index(toy, x):
    block, share = most_absorbing_block(toy, x)
    return toy.model.blocks.__len__() - block, share


def _absolute(toy, x):
    c = explain(toy.model, x, method="attnlrp").conservation
    ab = c.absorbed().mean(0)
    L = c.blocks.shape[1]
    step = int(ab[1:].argmax()) + 1
    return L - step, float(ab[step])


ex11_2 = Exercise(
    "ex11_2", "Where the relevance goes", most_absorbing_block, difficulty=1, minutes=10, needs=("toy", "x"),
    answer="a tuple (block, share): the block (0 = the first) that absorbs the most AttnLRP relevance, and the "
           "share of y_t it absorbs, averaged over the 4 scenes",
    hints=["exp.conservation.absorbed() has one column per step, from the top: the readout, then block 3, 2, 1, 0.",
           "Divide each row by exp.conservation.output (y_t of that scene), then average over the scenes (dim 0).",
           "Leave the readout's column out; column k ≥ 1 is block L − k."],
    mistakes=[Mistake(_step_index, "that is the column of absorbed(), counted from the top; column k is block L − k "
                                   "(column 1 is the last block)"),
              Mistake(lambda toy, x: (most_absorbing_block(toy, x)[0] + 1, most_absorbing_block(toy, x)[1]),
                      "the block is counted from 1: the first block is block 0 (column k ≥ 1 of absorbed() is "
                      "block L − k)"),
              Mistake(_absolute, "that is the relevance absorbed, not its share: divide by y_t "
                                 "(exp.conservation.output) scene by scene")],
    atol=1e-3, rtol=2e-2,
    discussion="The last block absorbs by far the most (close to half of y_t): AttnLRP's softmax rule gives part of "
               "the relevance to the softmax's implicit bias, and in the last block, where the [CLS] token's "
               "attention decides the class, that part is large. Biases and LayerNorm β absorb the rest; the "
               "embedding step (position embedding, [CLS] token) can even give relevance back (negative values).",
)
