"""Exercises of notebook 2 (signed activations)."""
import numpy as np
import torch
import torch.nn.functional as F

from lrp_core.rules import functional as rules

from .exercise import Exercise, Mistake


# ---------------------------------------------------------------- 2.1
def empty_kept_set():
    x = torch.tensor([[1.0, -0.5]])
    W = torch.tensor([[-1.0, 2.0]])           # contributions: -1.0 and -1.0, none >= 0
    R = torch.tensor([[1.0]])
    Rx = rules.linear_signed(x, W, R)
    print("contributions:", (x * W)[0].tolist())
    print("relevance of the inputs:", Rx[0].tolist(), "-> the unit of relevance is lost")
    return x, W


def _lost(answer):
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return "hand in a pair (x, W): an input row and one weight row"
    try:
        x, W = (torch.as_tensor(t, dtype=torch.float32).reshape(1, -1) for t in answer)
    except (TypeError, ValueError) as err:
        return f"x and W should be tensors or lists of numbers ({err})"
    if x.shape != W.shape:
        return f"x has {x.shape[1]} entries and W has {W.shape[1]}: one weight per input"
    c = (x * W)[0]
    Rx = rules.linear_signed(x, W, torch.ones(1, 1))
    kept = [j for j in range(c.numel()) if c[j] >= 0]
    if kept:
        j = kept[0]
        return (f"the contribution x_{j} w_{j} = {c[j].item():.4g} is ≥ 0, so the kept set is not empty and "
                f"the relevance is conserved (ΣR_x = {Rx.sum().item():.4g}); every x_j w_j must be < 0")
    return None


ex2_1 = Exercise(
    "ex2_1", "When the kept set is empty", empty_kept_set, difficulty=1, minutes=5,
    answer="a pair (x, W): an input row and one weight row whose contributions x_j w_j are all negative",
    hints=["A contribution x_j w_j is negative when x_j and w_j have opposite signs.",
           "Two inputs are enough: x = [1, -0.5] and choose the signs of W against them."],
    property_check=lambda answer: _lost(answer),
    discussion="With every x_j w_j < 0 the kept set is empty: numerator and denominator are 0, safe_div returns "
               "0 and the unit of relevance is lost — conservation fails. In a layer with hundreds of inputs "
               "at least one contribution is almost always ≥ 0, so this is rare in practice.",
)


# ---------------------------------------------------------------- 2.2
def _layers(n=2000, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = F.gelu(torch.randn(n, 16, generator=g))
    Ws = torch.randn(n, 8, 16, generator=g)
    Rs = F.one_hot(torch.randint(0, 8, (n,), generator=g), 8).float()
    return xs, Ws, Rs


def baseline_totals():
    xs, Ws, Rs = _layers()                     # the 2,000 layers of section 4
    totals = np.array([rules.linear_baseline(x[None], W, R[None]).sum().item() for x, W, R in zip(xs, Ws, Rs)])
    print("min", round(totals.min(), 3), " max", round(totals.max(), 3),
          " share equal to 2:", round(float(np.mean(np.isclose(totals, 2.0, atol=1e-4))), 3))
    # import matplotlib.pyplot as plt; plt.hist(totals, bins=40); plt.show()
    return totals


def _signed_totals():
    xs, Ws, Rs = _layers()
    return np.array([rules.linear_signed(x[None], W, R[None]).sum().item() for x, W, R in zip(xs, Ws, Rs)])


ex2_2 = Exercise(
    "ex2_2", "How much does the baseline inflate?", baseline_totals, difficulty=2, minutes=10,
    answer="an array of 2,000 numbers: ΣR_x of rules.linear_baseline for each layer (xs, Ws, Rs) of section 4",
    hints=["Loop over zip(xs, Ws, Rs) as in section 4, with xi[None] and Ri[None] to add the batch dimension.",
           "Collect rules.linear_baseline(xi, Wi, Ri).sum().item() in a list; plt.hist shows where they lie.",
           "Why at most 2: each of the two parts x⁺w⁺ and x⁻w⁻ hands down the whole relevance or nothing."],
    mistakes=[Mistake(_signed_totals, "these are the totals of the signed rule (all 1); the exercise asks "
                                      "for rules.linear_baseline")],
    atol=1e-4,
    discussion="Almost every layer (98 %) hands down exactly 2: each of the two parts, x⁺w⁺ and x⁻w⁻, "
               "distributes the whole incoming relevance if it has any non-zero term and nothing otherwise, "
               "so an output sends 0, 1 or 2 times its relevance down — never more than 2.",
)


# ---------------------------------------------------------------- 2.3
def zplus(x, W, R):
    """The classic z+ rule: keep the positive weights, share R_i in proportion to x_j w_ij^+."""
    Wp = W.clamp(min=0)
    z = x @ Wp.T                                    # (n, out), > 0 for x >= 0
    return x * (rules.safe_div(R, z) @ Wp)          # (n, in)


def _nonneg_cases():
    cases = []
    for seed in (0, 1):
        g = torch.Generator().manual_seed(seed)
        x = torch.relu(torch.randn(4, 16, generator=g))
        W = torch.randn(8, 16, generator=g)
        R = torch.rand(4, 8, generator=g)
        cases.append((x, W, R))
    return cases


ex2_3 = Exercise(
    "ex2_3", "Back to ReLU", zplus, difficulty=2, minutes=10,
    answer="a function zplus(x, W, R) returning the input relevance (n, in) of the classic z+ rule",
    hints=["Keep only the positive weights: Wp = W.clamp(min=0); then z = x @ Wp.T.",
           "The rule is x ⊙ ((R / z) @ Wp); use rules.safe_div(R, z) for the division.",
           "Compare with rules.linear_signed(x, W, R) on ReLU outputs: the two agree."],
    cases=lambda: _nonneg_cases(),
    mistakes=[Mistake(lambda x, W, R: rules.linear_generic(x, W, R),
                      "you kept the negative weights too — that is the generic z-rule; use W.clamp(min=0)"),
              Mistake(lambda x, W, R: rules.safe_div(R, x @ W.clamp(min=0).T) @ W.clamp(min=0),
                      "the factor x is missing: multiply (R / z) @ Wp element-wise by x"),
              Mistake(lambda x, W, R: x * (R @ W.clamp(min=0)),
                      "the division by z is missing: share R_i in proportion, x ⊙ (rules.safe_div(R, z) @ Wp)")],
    total=lambda ref, args: float(args[2].sum()),
    discussion="On x ≥ 0 the kept set x_j w_ij ≥ 0 is exactly the set of positive weights, so the signed rule "
               "and z+ coincide: the signed rule generalises z+ to inputs of either sign.",
)
