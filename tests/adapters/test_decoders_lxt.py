"""AttnLRP and CP-LRP on decoder LMs: agreement with LXT (git HEAD), and the fixtures' own facts.

The reference outputs in ``tests/fixtures/lxt/decoders`` were computed by LXT itself, one unpadded
sequence at a time, by ``scripts/check_decoders_against_lxt.py`` in a separate virtualenv (LXT is
not a dependency of the tests; what its patches do: scripts/lxt_findings.md, "Decoders").

The engine must give every row LXT's scores whether the rows are padded left, right or explained
alone, with eager or sdpa attention (each compared with LXT run the same way: in float64 the two
differ at float32 round-off, because transformers computes the eager softmax in float32).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from decoders import f64_bound  # noqa: E402
from lxt_decoders import ATTN, FAMILIES, load_fixture, methods_of, pad, reference  # noqa: E402

from lrp_core import explain  # noqa: E402

TOL = {"float64": 1e-8, "float32": 1e-4}
BIAS_FREE = ("llama", "qwen3", "gemma3")  # no bias, no LayerNorm beta, no position embedding
PAD_ID = 0

CASES = [(f, m, d) for f in FAMILIES for m in methods_of(f) for d in ("float64", "float32")]
ids = [f"{f}-{m}-{d}" for f, m, d in CASES]


def row_rel(got: torch.Tensor, want: torch.Tensor) -> float:
    """max|got − want| / max|want| for one row."""
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


# ----------------------------------------------------------------------------- the fixtures themselves


@pytest.mark.parametrize("family,method,dtype", CASES, ids=ids)
def test_fixture_model_reproduces_lxt_logits(family, method, dtype):
    """The model rebuilt here from the fixture gives LXT's targets and target logits (forward unpatched)."""
    model, fx = load_fixture(family, method, dtype)
    assert fx["family"] == family and fx["method"] == method and fx["dtype"] == dtype
    lengths = [len(s) for s in fx["sequences"]]
    assert len(lengths) >= 3 and len(set(lengths)) == len(lengths)
    assert all(p.dtype == torch.float64 for p in fx["state_dict"].values() if p.is_floating_point())
    for name, p in model.state_dict().items():  # the model holds the stored weights, not a float32 rounding
        if name in fx["state_dict"]:
            assert torch.equal(p, fx["state_dict"][name].to(p.dtype)), name
    with torch.no_grad():
        last = torch.stack([model(s[None]).logits[0, -1] for s in fx["sequences"]])
    assert torch.equal(last.argmax(-1), fx["targets"])
    y = last.gather(1, fx["targets"][:, None])[:, 0]
    # LXT's forward equals transformers' up to round-off (GPT-2: its own LayerNorm arithmetic)
    # (and the reference's float32 islands, its eager softmax, round with the kernels of the CPU that made it)
    assert ((y - fx["logits"]).abs() / fx["logits"].abs()).max() <= f64_bound(
        model, 1e-13 if dtype == "float64" else 1e-5
    )
    for s, sc in zip(fx["sequences"], fx["scores"]):
        assert sc.shape == s.shape and sc.dtype == model.dtype


@pytest.mark.parametrize("family,method", [(f, m) for f in FAMILIES for m in methods_of(f)])
def test_fixture_lxt_rules_changed_the_gradient(family, method):
    """LXT's patch was active: its scores are not the plain gradient × input of the same model."""
    _, fx = load_fixture(family, method, "float64")
    assert min(row_rel(a, b) for a, b in zip(fx["scores"], fx["gradient_x_input"])) > 1e-2


@pytest.mark.parametrize("family,method,dtype", CASES, ids=ids)
def test_fixture_eager_and_sdpa_agree(family, method, dtype):
    """LXT eager vs LXT sdpa: same targets; scores equal up to float32 round-off (eager softmax is float32)."""
    _, fx = load_fixture(family, method, dtype)
    sd = fx["sdpa"]
    assert torch.equal(sd["targets"], fx["targets"])
    worst = max(row_rel(a, b) for a, b in zip(sd["scores"], fx["scores"]))
    assert worst <= (1e-13 if family == "gpt2" and dtype == "float64" else 1e-5)


@pytest.mark.parametrize("family", BIAS_FREE)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_fixture_cp_lrp_conserves_without_additive_constants(family, dtype):
    """CP-LRP (LXT) on a model with no additive constant: Σ scores = target logit.

    Not to 1e-12 in float64: transformers computes the RMSNorms (and the eager softmax) in float32.
    """
    _, fx = load_fixture(family, "cp_lrp", dtype)
    sums = torch.stack([s.sum() for s in fx["scores"]])
    assert ((sums - fx["logits"]).abs() / fx["logits"].abs()).max() <= (1e-6 if dtype == "float64" else 1e-5)


def test_pad_left_and_right():
    rows = [torch.tensor([5, 6]), torch.tensor([7, 8, 9])]
    left, right = pad(rows, "left", PAD_ID), pad(rows, "right", PAD_ID)
    assert left["input_ids"].tolist() == [[0, 5, 6], [7, 8, 9]]
    assert left["attention_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert right["input_ids"].tolist() == [[5, 6, 0], [7, 8, 9]]
    assert right["attention_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    with pytest.raises(ValueError, match="side"):
        pad(rows, "middle", PAD_ID)


# ----------------------------------------------------------------------------- the engine against LXT


@pytest.mark.parametrize("attn", ATTN)
@pytest.mark.parametrize("batching", ["left", "right", "single"])
@pytest.mark.parametrize("family,method,dtype", CASES, ids=ids)
def test_engine_equals_lxt(family, method, dtype, batching, attn):
    """lrp_core.explain(model, batch, method) (target None) gives each row LXT's scores; padding scores 0."""
    model, fx = load_fixture(family, method, dtype, attn)
    ref = reference(fx, attn)
    rows = fx["sequences"]
    batches = [pad(rows, batching, PAD_ID)] if batching != "single" else [pad([s], "right", PAD_ID) for s in rows]
    got_targets, got_scores = [], []
    for batch in batches:
        exp = explain(model, batch, method=method)
        scores = exp.scores.detach().cpu()
        mask = batch["attention_mask"].bool()
        assert scores.shape == mask.shape
        assert torch.all(scores[~mask] == 0), "padding positions must score 0"
        got_targets += exp.target.cpu().tolist()
        got_scores += [scores[i][mask[i]] for i in range(len(scores))]
    assert got_targets == ref["targets"].tolist()
    for r, (got, want) in enumerate(zip(got_scores, ref["scores"])):
        err = row_rel(got, want)
        assert err <= f64_bound(model, TOL[dtype]), f"row {r} (length {len(want)}): max|d|/max|ref| = {err:.2e}"
    for p_name, p in model.named_parameters():  # the engine never modifies the model
        assert torch.equal(p.detach().double(), fx["state_dict"][p_name].to(p.dtype).double()), p_name
