"""timm ``SwinTransformer``: windowed attention (shifted windows with their region mask, relative position bias)
replayed as full attention over each stage with an additive bias, patch merging between stages, mean readout.
Tiny random models (img 32, patch 4, windows 4 or 2, depths (2, 2), width 16), seconds each."""

from __future__ import annotations

import pytest
import torch
from untouched import assert_untouched, snapshot
from vision_models import make_swin

from lrp_core import METHODS, explain
from lrp_core.adapters import get_adapter
from lrp_core.adapters.swin import REFUSED_METHODS
from lrp_core.errors import InputError, UnsupportedModelError

RUNS = [m for m in METHODS if m not in REFUSED_METHODS]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def _images(n: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


#: window 4: stage 0 (8×8 grid) has shifted windows, stage 1 (4×4) one window; window 2: shifts in both stages
FAMILIES = {"window4": dict(), "window2": dict(window_size=2)}


def _logits(model, x):
    with torch.no_grad():
        return model(x)


@pytest.mark.parametrize("family", FAMILIES)
def test_replay_reproduces_the_logits(family):
    model, x = make_swin(**FAMILIES[family]), _images()
    for method in ("lrp", "attnlrp", "cp_lrp"):  # the plain replay and the modified-gradient ones
        assert (explain(model, x, method=method).logits - _logits(model, x)).abs().max() <= 1e-5, method
    model, x = model.double(), x.double()
    assert rel_err(explain(model, x, method="lrp").logits, _logits(model, x)) <= 1e-12


def test_the_replay_sees_the_shifted_windows():
    """Windows without their shift (the stage's first block's bias for every block) change the logits: the
    logits check above would notice a wrong window layout."""
    model, x = make_swin(window_size=2).double(), _images().double()
    a = get_adapter(model)
    right = a.window_bias
    a.window_bias = lambda b, like: right(0 if b < 2 else 2, like)
    off = a.forward(a.check_inputs(x)).logits
    assert rel_err(off, _logits(model, x)) > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_every_method_that_runs_gives_one_finite_score_per_input_patch(family):
    model, x = make_swin(**FAMILIES[family]), _images()
    for method in RUNS:
        exp = explain(model, x, method=method)
        assert exp.scores.shape == (2, 64), method
        assert torch.isfinite(exp.scores).all(), method
        if exp.pixels is not None:
            assert exp.pixels.shape == (2, 32, 32) and torch.isfinite(exp.pixels).all(), method
        if exp.token_relevance is not None:
            assert exp.token_relevance.shape == (2, 4, 64), method


@pytest.mark.parametrize("method", RUNS)
def test_batch_equals_single_in_float64(method):
    model, x = make_swin(window_size=2).double(), _images(3).double()
    batch = explain(model, x, method=method)
    for i in range(x.shape[0]):
        one = explain(model, x[i : i + 1], method=method)
        assert rel_err(batch.scores[i : i + 1], one.scores) <= 1e-8, method
        if batch.pixels is not None:
            assert rel_err(batch.pixels[i : i + 1], one.pixels) <= 1e-8, method


@pytest.mark.parametrize("method", sorted(REFUSED_METHODS))
def test_methods_without_meaning_are_refused_by_method(method):
    model = make_swin()
    before = snapshot(model)
    with pytest.raises(UnsupportedModelError) as err:
        explain(model, _images(1), method=method)
    assert f"method {method!r} is not defined on SwinTransformer" in str(err.value)
    assert REFUSED_METHODS[method] in str(err.value) and "attnlrp" in str(err.value)
    assert_untouched(before, snapshot(model))


def test_model_is_untouched_by_calls_and_errors():
    model = make_swin(window_size=2)
    model.train()  # an unusual mode must survive too
    before = snapshot(model)
    for method in RUNS:
        explain(model, _images(1), method=method)
    with pytest.raises(InputError):
        explain(model, torch.randn(1, 3, 40, 40), method="lrp")
    assert_untouched(before, snapshot(model))


def test_cp_lrp_conserves_without_additive_constants():
    """Biases and LayerNorm β 0 (the position bias stays: it is inside the softmax, which CP-LRP holds constant):
    the model is linear in the patches, through the windows and the patch merging, so every stage holds the
    logit — the merged stage's relevance too, spread back onto the input patches."""
    model = make_swin(window_size=2).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    exp = explain(model, _images().double(), method="cp_lrp")
    c = exp.conservation
    tol = 1e-8 * c.output.abs() + 1e-9
    assert (c.absorbed().abs().max(dim=1).values < tol).all()
    assert ((c.pixels - c.output).abs() < tol).all()
    assert torch.allclose(exp.token_relevance.sum(-1), c.blocks, rtol=1e-12, atol=0)


def test_lrp_token_relevance_of_the_merged_stage_is_spread_over_its_patches():
    """A merged token covers 2×2 input patches: its relevance is given to each in equal shares."""
    model, x = make_swin().double(), _images(1).double()
    exp = explain(model, x, method="lrp")
    last = exp.token_relevance[0, -1].reshape(8, 8)
    assert torch.equal(last[0::2, 0::2], last[1::2, 1::2]) and torch.equal(last[0::2, 0::2], last[0::2, 1::2])


def test_regrouping_is_timms_patch_merging_grouping():
    from lrp_core.adapters.swin import _regroup

    x = torch.randn(2, 8, 6, 5, dtype=torch.float64)  # (B, H, W, C)
    timm_grouped = x.reshape(2, 4, 2, 3, 2, 5).permute(0, 1, 3, 4, 2, 5).flatten(3)  # PatchMerging.forward
    flat = x.reshape(2, 48, 5)
    assert torch.equal(_regroup(flat, (8, 6)), timm_grouped.reshape(2, 12, 20))


def test_cdam_is_gradient_times_the_last_stage_tokens_shared_by_their_patches():
    """The reference reads the tokens entering the model's last attention (its last block's norm1 output) with a
    hook on timm's own forward: Σ_c h ⊙ ∂y_t/∂h per last-stage token, each 2×2 block of input patches sharing
    its token's score equally."""
    model, x = make_swin().double(), _images().double()
    exp = explain(model, x, method="cdam")
    seen = []
    handle = model.layers[-1].blocks[-1].norm1.register_forward_hook(lambda m, i, o: seen.append(o))
    try:
        y = model(x)
    finally:
        handle.remove()
    (h,) = seen  # (B, 4, 4, C)
    (g,) = torch.autograd.grad(y.gather(1, exp.target[:, None]).sum(), [h])
    per_token = (h * g).sum(-1).detach()  # (B, 4, 4)
    ref = per_token.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2).reshape(2, 64) / 4
    assert rel_err(exp.scores, ref) <= 1e-10
