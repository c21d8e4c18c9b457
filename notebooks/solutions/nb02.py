"""Solutions for notebook 2 (signed activations)."""
import numpy as np
import torch
import torch.nn.functional as F

from lrp_core import rules


def ex2_1():
    x = torch.tensor([[1.0, -0.5]])
    W = torch.tensor([[-1.0, 2.0]])           # contributions: -1.0 and -1.0, none >= 0
    R = torch.tensor([[1.0]])
    Rx = rules.linear_signed(x, W, R)
    print("contributions:", (x * W)[0].tolist())
    print("relevance of the inputs:", Rx[0].tolist(), "-> the unit of relevance is lost")
    # In a layer with hundreds of inputs, at least one contribution is almost always >= 0.
    return Rx


def ex2_2(n: int = 2000, seed: int = 0):
    import matplotlib.pyplot as plt
    g = torch.Generator().manual_seed(seed)
    xs = F.gelu(torch.randn(n, 16, generator=g))
    Ws = torch.randn(n, 8, 16, generator=g)
    Rs = F.one_hot(torch.randint(0, 8, (n,), generator=g), 8).float()
    totals = np.array([rules.linear_baseline(x[None], W, R[None]).sum().item() for x, W, R in zip(xs, Ws, Rs)])
    plt.figure(figsize=(4, 2.5))
    plt.hist(totals, bins=40)
    plt.xlabel("sum of input relevance (baseline rule)")
    plt.show()
    print("min", round(totals.min(), 3), " max", round(totals.max(), 3),
          " share equal to 2:", round(float(np.mean(np.isclose(totals, 2.0, atol=1e-4))), 3))
    return totals


def ex2_3(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.relu(torch.randn(4, 16, generator=g))
    W = torch.randn(8, 16, generator=g)
    R = torch.rand(4, 8, generator=g)
    signed = rules.linear_signed(x, W, R)
    zplus = rules.linear_generic(x, W.clamp(min=0), R)
    diff = (signed - zplus).abs().max().item()
    print("largest difference:", f"{diff:.1e}", "-> identical on non-negative inputs")
    return diff
