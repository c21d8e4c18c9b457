"""Solutions for notebook 3 (skip connections and matrix products)."""
import torch

from lrp_core import rules


def ex3_1(n: int = 1000, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(n, 6, generator=g) * 5
    v = torch.randn(n, 6, generator=g) * 5
    R = torch.rand(n, 6, generator=g)
    Ru, Rv = rules.add_normalized(u, v, R)          # sums run per sample (row)
    su, sv, sR = Ru.sum(1), Rv.sum(1), R.sum(1)
    conserved = torch.allclose(su + sv, sR, atol=1e-4)
    bounded = bool(((su >= -1e-5) & (su <= sR + 1e-5) & (sv >= -1e-5) & (sv <= sR + 1e-5)).all())
    print("conservation holds:", conserved, "| shares in [0, ΣR]:", bounded)
    return conserved and bounded


def ex3_2(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(1, 4, 3, generator=g)
    b = torch.rand(1, 3, 5, generator=g)
    R = torch.rand(1, 4, 5, generator=g)
    Ra = rules.generic(lambda t: t @ b, a, R)        # b fixed, a varies
    Rb = rules.generic(lambda t: a @ t, b, R)        # a fixed, b varies
    print("ΣR =", round(R.sum().item(), 4), "| ΣR_a =", round(Ra.sum().item(), 4),
          "| ΣR_b =", round(Rb.sum().item(), 4))
    return Ra.sum().item(), Rb.sum().item()


def ex3_3(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    torch.softmax(torch.randn(1, 5, 5, generator=g), dim=-1)   # replay the notebook's random draws
    torch.randn(1, 5, 3, generator=g)
    x = torch.randn(1, 4, 3, generator=g)
    Wv = torch.randn(3, 3, generator=g)
    Aw = torch.softmax(x @ x.transpose(-1, -2), dim=-1)
    V = x @ Wv.T
    AV = Aw @ V
    Ry = (x + AV).clamp(min=0)
    R_skip, R_AV = rules.add_generic(x, AV, Ry)
    R_A, R_V = rules.matmul(Aw, V, R_AV, halve=False)
    R_x = rules.clone(R_skip, rules.linear_signed(x, Wv, R_V))
    total = (R_x.sum() + R_A.sum()).item()
    print("ΣR_y =", round(Ry.sum().item(), 4), "| total after the block without fixes =", round(total, 4))
    print("ratio:", round(total / Ry.sum().item(), 4))
    return total
