"""Exercises of notebook 1 (relevance and conservation)."""
import torch
import torch.nn.functional as F

from lrp_core.rules import functional as rules

from .exercise import Exercise, Mistake

X = torch.tensor([[1.0, 2.0, 0.5, 1.5]])
W1 = torch.tensor([[1.0, -1.0, 0.5, 0.0], [0.5, 0.5, -1.0, 1.0], [-1.0, 0.0, 1.0, 0.5]])
W2 = torch.tensor([[2.0, 1.0, -1.0]])
B1 = torch.tensor([0.0, -1.0, 0.5])


# ---------------------------------------------------------------- 1.1
def one_hot_start():
    h = F.linear(X, W1).clamp(min=0)
    R_y = torch.ones(1, 1)                           # one-hot start instead of y
    R_h = rules.generic(lambda t: F.linear(t, W2), h, R_y)
    R_x = rules.generic(lambda t: F.linear(t, W1), X, R_h)
    print("input relevance:", [round(v, 4) for v in R_x[0].tolist()], " sum:", round(R_x.sum().item(), 4))
    return R_x


def _from_score():
    h = F.linear(X, W1).clamp(min=0)
    y = F.linear(h, W2)
    return rules.generic(lambda t: F.linear(t, W1), X, rules.generic(lambda t: F.linear(t, W2), h, y))


ex1_1 = Exercise(
    "ex1_1", "Fractions instead of scores", one_hot_start, difficulty=1, minutes=5,
    answer="the input relevance R_x, a (1, 4) tensor, when the backward pass starts from R_y = 1",
    hints=["Copy the two rules.generic calls of section 4 and change only the starting relevance.",
           "R_y = torch.ones(1, 1) — the shape of y, value 1."],
    mistakes=[Mistake(lambda: _from_score(),
                      "this is the relevance of section 4, which starts from R_y = y = 2.25; start from R_y = 1"),
              Mistake(lambda: rules.generic(lambda t: F.linear(t, W2), F.linear(X, W1).clamp(min=0), torch.ones(1, 1)),
                      "this is the relevance of the hidden layer h (3 entries); continue through W1 to the 4 inputs")],
    total=lambda ref: 1.0,
    discussion="Every rule here is linear in the incoming relevance R. Starting from 1 instead of y divides "
               "everything by y = 2.25: the input relevances become fractions of the score and add up to 1.",
)


# ---------------------------------------------------------------- 1.2
def bias_relevance():
    z = F.linear(X, W1, B1)
    h = z.clamp(min=0)
    y = F.linear(h, W2)
    R_h = rules.generic(lambda t: F.linear(t, W2), h, y)
    s = rules.safe_div(R_h, z)                       # relevance per unit of z
    R_x = X * (s @ W1)                               # what the inputs receive
    R_b = B1 * s                                     # what each bias receives
    print("inputs:", round(R_x.sum().item(), 4), " biases:", round(R_b.sum().item(), 4),
          " together:", round((R_x.sum() + R_b.sum()).item(), 4), " score:", round(y.item(), 4))
    return R_b


def _bias_times_R():
    z = F.linear(X, W1, B1)
    h = z.clamp(min=0)
    return B1 * rules.generic(lambda t: F.linear(t, W2), h, F.linear(h, W2))


def _bias_free_z():
    z = F.linear(X, W1, B1)
    h = z.clamp(min=0)
    R_h = rules.generic(lambda t: F.linear(t, W2), h, F.linear(h, W2))
    return B1 * rules.safe_div(R_h, F.linear(X, W1))


def _inputs_share():
    z = F.linear(X, W1, B1)
    h = z.clamp(min=0)
    R_h = rules.generic(lambda t: F.linear(t, W2), h, F.linear(h, W2))
    return X * (rules.safe_div(R_h, z) @ W1)


def _bias_total(ref):
    z = F.linear(X, W1, B1)
    y = F.linear(z.clamp(min=0), W2)
    R_h = rules.generic(lambda t: F.linear(t, W2), z.clamp(min=0), y)
    return float(y.sum() - (X * (rules.safe_div(R_h, z) @ W1)).sum())   # score − what the inputs took


ex1_2 = Exercise(
    "ex1_2", "Where does the bias relevance go?", bias_relevance, difficulty=2, minutes=10,
    answer="R_b, the relevance of the three biases b1 (a (1, 3) tensor)",
    hints=["The generic rule hands each part of z_i = Σ_j x_j w_ij + b_i the share (part) · R_i / z_i.",
           "s = rules.safe_div(R_h, z) is the relevance per unit of z; the biases receive b1 * s.",
           "Check yourself: R_x.sum() + R_b.sum() must equal the score 0.75."],
    mistakes=[Mistake(_bias_times_R, "you multiplied b_i by R_i; multiply by R_i / z_i, the relevance per "
                                     "unit of z_i (rules.safe_div(R_h, z))"),
              Mistake(_bias_free_z, "your z lacks the bias: the biases are part of z = F.linear(X, W1, B1), and "
                                    "R_i / z_i must divide by that z"),
              Mistake(_inputs_share, "this is what the inputs receive, R_x; the exercise asks for the biases' "
                                     "share, b1 * s")],
    total=lambda ref: _bias_total(ref),
    discussion="The inputs receive 2.25 and the biases -1.5: together 0.75, the score. Nothing is lost once "
               "the biases are counted as inputs of the layer.",
)


# ---------------------------------------------------------------- 1.3
def explain_output0(Ws, x):
    """Input relevance for output 0 of the bias-free ReLU network with weights Ws (first layer first)."""
    acts = [x]
    for W in Ws[:-1]:
        acts.append(F.linear(acts[-1], W).clamp(min=0))
    out = F.linear(acts[-1], Ws[-1])
    R = torch.zeros_like(out)
    R[:, 0] = out[:, 0]                               # explain output 0
    for W, a in zip(reversed(Ws), reversed(acts)):
        R = rules.generic(lambda t, W=W: F.linear(t, W), a, R)
        print("layer total per input:", [round(v, 4) for v in R.sum(1).tolist()])   # = out[:, 0] each time
    return R


def _all_outputs(Ws, x):
    acts = [x]
    for W in Ws[:-1]:
        acts.append(F.linear(acts[-1], W).clamp(min=0))
    R = F.linear(acts[-1], Ws[-1])
    for W, a in zip(reversed(Ws), reversed(acts)):
        R = rules.generic(lambda t, W=W: F.linear(t, W), a, R)
    return R


def _from_one(Ws, x):
    acts = [x]
    for W in Ws[:-1]:
        acts.append(F.linear(acts[-1], W).clamp(min=0))
    R = torch.zeros(x.shape[0], Ws[-1].shape[0])
    R[:, 0] = 1.0
    for W, a in zip(reversed(Ws), reversed(acts)):
        R = rules.generic(lambda t, W=W: F.linear(t, W), a, R)
    return R


def _output_k(k: int):
    """explain_output0 for output ``k`` instead (a learner who explained another output)."""

    def explain_output(Ws, x):
        acts = [x]
        for W in Ws[:-1]:
            acts.append(F.linear(acts[-1], W).clamp(min=0))
        out = F.linear(acts[-1], Ws[-1])
        R = torch.zeros_like(out)
        R[:, k] = out[:, k]
        for W, a in zip(reversed(Ws), reversed(acts)):
            R = rules.generic(lambda t, W=W: F.linear(t, W), a, R)
        return R

    return explain_output


def _networks():
    cases = []
    for seed in (0, 1):
        g = torch.Generator().manual_seed(seed)
        Ws = [torch.randn(16, 10, generator=g), torch.randn(16, 16, generator=g), torch.randn(8, 16, generator=g)]
        cases.append((Ws, torch.rand(5, 10, generator=g)))
    return cases


def _score0(args):
    Ws, x = args
    a = x
    for W in Ws[:-1]:
        a = F.linear(a, W).clamp(min=0)
    return float(F.linear(a, Ws[-1])[:, 0].sum())


ex1_3 = Exercise(
    "ex1_3", "A deeper check", explain_output0, difficulty=2, minutes=15,
    answer="a function explain_output0(Ws, x) that returns the input relevance (n, 10) for output 0",
    hints=["Keep every layer's input (x, then each ReLU output) in a list on the way forward.",
           "Start from R = zeros like the output, with R[:, 0] = out[:, 0]; then apply rules.generic layer by "
           "layer, last layer first. Bind W in the lambda: lambda t, W=W: F.linear(t, W).",
           "Conservation check: R.sum(1) equals out[:, 0] after every layer."],
    cases=lambda: _networks(),
    mistakes=[Mistake(_all_outputs, "you explained all 8 outputs at once; keep only output 0's relevance "
                                    "(R[:, 0] = out[:, 0], zero elsewhere)"),
              Mistake(_from_one, "you started from R[:, 0] = 1; start from the score itself, R[:, 0] = out[:, 0]"),
              Mistake(_output_k(1), "that explains output 1, the second output; output 0 is column 0 of the "
                                    "output (R[:, 0] = out[:, 0], every other column 0)"),
              Mistake(_output_k(-1), "that explains the last output (column -1); output 0 is column 0 "
                                     "(R[:, 0] = out[:, 0], every other column 0)")],
    total=lambda ref, args: _score0(args),
    discussion="Every layer's total equals output 0 for every input, up to float32 round-off (about 1e-5): "
               "bias-free linear layers and ReLUs conserve relevance exactly.",
)
