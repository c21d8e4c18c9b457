"""Solutions for notebook 1 (relevance and conservation)."""
import torch
import torch.nn.functional as F

from lrp_core import rules

X = torch.tensor([[1.0, 2.0, 0.5, 1.5]])
W1 = torch.tensor([[1.0, -1.0, 0.5, 0.0], [0.5, 0.5, -1.0, 1.0], [-1.0, 0.0, 1.0, 0.5]])
W2 = torch.tensor([[2.0, 1.0, -1.0]])


def ex1_1():
    h = F.linear(X, W1).clamp(min=0)
    R_y = torch.ones(1, 1)                           # one-hot start instead of y
    R_h = rules.generic(lambda t: F.linear(t, W2), h, R_y)
    R_x = rules.generic(lambda t: F.linear(t, W1), X, R_h)
    print("input relevance:", [round(v, 4) for v in R_x[0].tolist()])
    print("sum:", round(R_x.sum().item(), 4), "(= 1: each share is now a fraction of y)")
    return R_x


def ex1_2():
    b1 = torch.tensor([0.0, -1.0, 0.5])
    z = F.linear(X, W1, b1)
    h = z.clamp(min=0)
    y = F.linear(h, W2)
    R_h = rules.generic(lambda t: F.linear(t, W2), h, y)
    s = rules.safe_div(R_h, z)                       # relevance per unit of z
    R_x = X * (s @ W1)                               # what the inputs receive
    R_b = b1 * s                                     # what each bias receives
    total = R_x.sum() + R_b.sum()
    print("inputs:", round(R_x.sum().item(), 4), " biases:", round(R_b.sum().item(), 4),
          " together:", round(total.item(), 4), " score:", round(y.item(), 4))
    return total


def ex1_3(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    Ws = [torch.randn(16, 10, generator=g), torch.randn(16, 16, generator=g), torch.randn(8, 16, generator=g)]
    x = torch.rand(5, 10, generator=g)
    acts = [x]
    for W in Ws[:-1]:
        acts.append(F.linear(acts[-1], W).clamp(min=0))
    out = F.linear(acts[-1], Ws[-1])
    R = torch.zeros_like(out)
    R[:, 0] = out[:, 0]                               # explain output 0
    sums = [R.sum(1)]
    for W, a in zip(reversed(Ws), reversed(acts)):
        R = rules.generic(lambda t, W=W: F.linear(t, W), a, R)
        sums.append(R.sum(1))
    err = max((s - sums[0]).abs().max().item() for s in sums)
    print("largest deviation of a layer's total from the score:", f"{err:.1e}")
    print("conserved:", err < 1e-4)
    return err
