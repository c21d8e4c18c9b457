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


def operand_relevance():
    a, b, R = _product_data()                        # the data of the exercise cell
    Ra = rules.generic(lambda t: t @ b, a, R)        # b fixed, a varies
    Rb = rules.generic(lambda t: a @ t, b, R)        # a fixed, b varies
    print("ΣR =", round(R.sum().item(), 4), "| ΣR_a =", round(Ra.sum().item(), 4),
          "| ΣR_b =", round(Rb.sum().item(), 4))
    return Ra, Rb


def _halved():
    a, b, R = _product_data()
    return rules.matmul(a, b, R)


def _totals():
    a, b, R = _product_data()
    return R.sum().item(), R.sum().item()


ex3_2 = Exercise(
    "ex3_2", "Why each operand gets everything", operand_relevance, difficulty=1, minutes=5,
    answer="a pair of tensors (R_a, R_b) from rules.generic, each operand treated alone (shapes of a and b)",
    hints=["rules.generic(fn, variable, R): for a, fn = lambda t: t @ b; for b, fn = lambda t: a @ t.",
           "Then compare Ra.sum() and Rb.sum() with R.sum()."],
    mistakes=[Mistake(_halved, "these are halved (rules.matmul's default): treat each operand alone with "
                               "rules.generic, without the halving"),
              Mistake(_totals, "hand in the two relevance tensors themselves, not their totals: "
                               "rules.generic for a (b fixed) and for b (a fixed)")],
    discussion="Both totals equal ΣR: the product is linear in a for fixed b and in b for fixed a, so each "
               "operand alone receives the whole relevance — twice the budget together, hence the halving.",
)


# ---------------------------------------------------------------- 3.3
BLOCK_SEED = 20
"""The exercise cell draws a new input for section 4's block with this seed: on it the generic sum rule hands
the skip a negative share and the values more than the whole budget, so the two sum rules split differently
(on section 4's own input they coincide, and the total could not tell them apart)."""


def _block(seed=BLOCK_SEED):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 4, 3, generator=g)
    Wv = torch.randn(3, 3, generator=g)
    Aw = torch.softmax(x @ x.transpose(-1, -2), dim=-1)
    V = x @ Wv.T
    AV = Aw @ V
    return x, Wv, Aw, V, AV, (x + AV).clamp(min=0)


def _section4_block():
    """Section 4's own input (its generator continues from section 3's draws)."""
    g = torch.Generator().manual_seed(0)
    torch.softmax(torch.randn(1, 5, 5, generator=g), dim=-1)
    torch.randn(1, 5, 3, generator=g)
    x = torch.randn(1, 4, 3, generator=g)
    Wv = torch.randn(3, 3, generator=g)
    Aw = torch.softmax(x @ x.transpose(-1, -2), dim=-1)
    V = x @ Wv.T
    AV = Aw @ V
    return x, Wv, Aw, V, AV, (x + AV).clamp(min=0)


def _block_totals(add=rules.add_generic, halve=False, skip=True, values=True, block=_block):
    """(ΣR_x, ΣR_A) of the block with each step switchable: the sum rule, the halving, the two branches into x."""
    x, Wv, Aw, V, AV, Ry = block()
    R_skip, R_AV = add(x, AV, Ry)
    R_A, R_V = rules.matmul(Aw, V, R_AV, halve=halve)
    R_xv = rules.linear_signed(x, Wv, R_V)
    R_x = rules.clone(R_skip if skip else torch.zeros_like(R_skip), R_xv if values else torch.zeros_like(R_xv))
    return R_x.sum().item(), R_A.sum().item()


def totals_without_fixes():
    x, Wv, Aw, V, AV, Ry = _block()                  # section 4's block on the exercise cell's x and Wv
    R_skip, R_AV = rules.add_generic(x, AV, Ry)
    R_A, R_V = rules.matmul(Aw, V, R_AV, halve=False)
    R_x = rules.clone(R_skip, rules.linear_signed(x, Wv, R_V))
    print("ΣR_y =", round(Ry.sum().item(), 4), "| skip", round(R_skip.sum().item(), 4), "| AV",
          round(R_AV.sum().item(), 4), "| total after the block without fixes =",
          round((R_x.sum() + R_A.sum()).item(), 4))
    return R_x.sum().item(), R_A.sum().item()


ex3_3 = Exercise(
    "ex3_3", "Without the fixes", totals_without_fixes, difficulty=2, minutes=10,
    answer="a pair of numbers (ΣR_x, ΣR_A) after section 4's block on the cell's x and Wv, with rules.add_generic "
           "and halve=False",
    hints=["Copy the cell of section 4 (from Aw = ... on; the exercise cell has drawn x and Wv); replace "
           "rules.add_normalized by rules.add_generic and pass halve=False to rules.matmul.",
           "Look at R_skip.sum() and R_AV.sum() with each sum rule: on this input they differ.",
           "The answer is (R_x.sum().item(), R_A.sum().item()); compare their sum with ΣR_y."],
    mistakes=[Mistake(lambda: _block_totals(halve=True),
                      "the product still halves: pass halve=False to rules.matmul"),
              Mistake(lambda: _block_totals(add=rules.add_normalized),
                      "the sum still uses rules.add_normalized: on this input the two sum rules split R_y "
                      "differently — use rules.add_generic"),
              Mistake(lambda: _block_totals(add=rules.add_normalized, halve=True),
                      "these are the totals with both fixes (section 4's rules): use rules.add_generic and pass "
                      "halve=False"),
              Mistake(lambda: _block_totals(block=_section4_block),
                      "that is section 4's block on its own input; run it on the x and Wv the exercise cell draws "
                      "(recompute Aw, V, AV and R_y from them)"),
              Mistake(lambda: _block_totals()[::-1],
                      "the two numbers are swapped: hand in (ΣR_x, ΣR_A), the input's total first"),
              Mistake(lambda: _block_totals(skip=False),
                      "ΣR_x lacks the skip connection's share: x receives both branches, rules.clone(R_skip, R_xv)"),
              Mistake(lambda: _block_totals(values=False),
                      "ΣR_x lacks the values' share: R_V goes through W_v to x (rules.linear_signed) and joins "
                      "the skip (rules.clone)")],
    discussion="ΣR_x = 2.42 and ΣR_A = 7.19: the total is about four times ΣR_y (9.60 against 2.42). The generic "
               "sum rule gives the skip -4.77 and the values +7.19 — more than the whole budget, although the two "
               "still add up to ΣR_y — and the product without the halving hands that inflated share to both A and"
               " V. Each fix alone leaves an error: with the normalisation only, the total is 3.87; with the "
               "halving only, it is conserved but the shares are out of bounds. Relevance that crosses the "
               "attention path of every block can pick up a factor 2 per block — up to 2^12 = 4096 after 12 blocks"
               " — while the skip path keeps factor 1, so the map ends up dominated by whichever path crossed the "
               "most products.",
)
