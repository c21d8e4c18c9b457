"""Exercises of notebook 3 (skip connections and matrix products)."""
import torch

from lrp_core.rules import functional as rules

from .exercise import Exercise, Mistake


# ---------------------------------------------------------------- 3.1
def _triples(n=1000, seed=0):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(n, 6, generator=g) * 5
    v = torch.randn(n, 6, generator=g) * 5
    R = torch.rand(n, 6, generator=g)
    return u, v, R


def lemma2_totals():
    u, v, R = _triples()                             # the data of the exercise cell
    Ru, Rv = rules.add_normalized(u, v, R)           # sums run per sample (row)
    su, sv, sR = Ru.sum(1), Rv.sum(1), R.sum(1)
    print("conservation holds:", torch.allclose(su + sv, sR, atol=1e-4),
          "| shares in [0, ΣR]:", bool(((su >= -1e-5) & (su <= sR + 1e-5) & (sv >= -1e-5) & (sv <= sR + 1e-5)).all()))
    return su, sv


def _generic_totals():
    u, v, R = _triples()
    Ru, Rv = rules.add_generic(u, v, R)
    return Ru.sum(1), Rv.sum(1)


ex3_1 = Exercise(
    "ex3_1", "Lemma 2 on random data", lemma2_totals, difficulty=1, minutes=10,
    answer="a pair (su, sv): the per-sample totals of R_u and R_v after rules.add_normalized, each of shape (1000,)",
    hints=["Ru, Rv = rules.add_normalized(u, v, R) works on the whole batch; each row is one sample.",
           "su = Ru.sum(1) keeps one total per sample; then test su + sv against R.sum(1) and "
           "0 <= su <= R.sum(1)."],
    mistakes=[Mistake(_generic_totals, "these are the generic rule's totals: they conserve, but they are not "
                                       "bounded — use rules.add_normalized")],
    discussion="Both guarantees hold on every sample: su + sv = ΣR up to round-off, and each total lies in "
               "[0, ΣR]. The generic rule's totals conserve too, but reach far outside [0, ΣR].",
)


# ---------------------------------------------------------------- 3.2
def _product_data(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(1, 4, 3, generator=g), torch.rand(1, 3, 5, generator=g), torch.rand(1, 4, 5, generator=g)


def operand_totals():
    a, b, R = _product_data()                        # the data of the exercise cell
    Ra = rules.generic(lambda t: t @ b, a, R)        # b fixed, a varies
    Rb = rules.generic(lambda t: a @ t, b, R)        # a fixed, b varies
    print("ΣR =", round(R.sum().item(), 4), "| ΣR_a =", round(Ra.sum().item(), 4),
          "| ΣR_b =", round(Rb.sum().item(), 4))
    return Ra.sum().item(), Rb.sum().item()


def _halved():
    a, b, R = _product_data()
    Ra, Rb = rules.matmul(a, b, R)
    return Ra.sum().item(), Rb.sum().item()


ex3_2 = Exercise(
    "ex3_2", "Why each operand gets everything", operand_totals, difficulty=1, minutes=5,
    answer="a pair of numbers (ΣR_a, ΣR_b) from rules.generic, each operand treated alone",
    hints=["rules.generic(fn, variable, R): for a, fn = lambda t: t @ b; for b, fn = lambda t: a @ t.",
           "Sum each result over all entries: Ra.sum().item()."],
    mistakes=[Mistake(_halved, "each total is half of ΣR: that is rules.matmul with its halving; treat each "
                               "operand alone with rules.generic")],
    discussion="Both totals equal ΣR: the product is linear in a for fixed b and in b for fixed a, so each "
               "operand alone receives the whole relevance — twice the budget together, hence the halving.",
)


# ---------------------------------------------------------------- 3.3
def _block():
    g = torch.Generator().manual_seed(0)
    torch.softmax(torch.randn(1, 5, 5, generator=g), dim=-1)   # replay the notebook's random draws
    torch.randn(1, 5, 3, generator=g)
    x = torch.randn(1, 4, 3, generator=g)
    Wv = torch.randn(3, 3, generator=g)
    Aw = torch.softmax(x @ x.transpose(-1, -2), dim=-1)
    V = x @ Wv.T
    AV = Aw @ V
    return x, Wv, Aw, V, AV, (x + AV).clamp(min=0)


def _block_total(add, halve):
    x, Wv, Aw, V, AV, Ry = _block()
    R_skip, R_AV = add(x, AV, Ry)
    R_A, R_V = rules.matmul(Aw, V, R_AV, halve=halve)
    R_x = rules.clone(R_skip, rules.linear_signed(x, Wv, R_V))
    return (R_x.sum() + R_A.sum()).item()


def total_without_fixes():
    x, Wv, Aw, V, AV, Ry = _block()                  # section 4's block
    R_skip, R_AV = rules.add_generic(x, AV, Ry)
    R_A, R_V = rules.matmul(Aw, V, R_AV, halve=False)
    R_x = rules.clone(R_skip, rules.linear_signed(x, Wv, R_V))
    total = (R_x.sum() + R_A.sum()).item()
    print("ΣR_y =", round(Ry.sum().item(), 4), "| total after the block without fixes =", round(total, 4),
          "| ratio:", round(total / Ry.sum().item(), 4))
    return total


ex3_3 = Exercise(
    "ex3_3", "Without the fixes", total_without_fixes, difficulty=2, minutes=10,
    answer="one number: ΣR_x + ΣR_A after the block of section 4 with rules.add_generic and halve=False",
    hints=["Copy the cell of section 4; replace rules.add_normalized by rules.add_generic and pass halve=False "
           "to rules.matmul.",
           "The answer is (R_x.sum() + R_A.sum()).item(); compare it with ΣR_y."],
    mistakes=[Mistake(lambda: _block_total(rules.add_normalized, True),
                      "that total is conserved (≈ ΣR_y, as in section 4): the halving is still in place; use "
                      "rules.add_generic and halve=False")],
    discussion="The total almost doubles (23.65 against ΣR_y = 11.86): the product hands each operand the whole "
               "relevance. (The normalisation of the sum does not change the total — both sum rules conserve — it "
               "only keeps the two shares in bounds.) Relevance that crosses the attention path of every block can pick up a factor 2 per "
               "block — up to 2^12 = 4096 after 12 blocks — while the skip path keeps factor 1, so the map ends "
               "up dominated by whichever path crossed the most products.",
)
