"""Edge inputs for every method: one-token rows, a decoder read at position 0, zero-length text.

What is correct in each case:

* A one-token row has one token in its context, the one the head reads. Its map has one entry: the methods
  that propagate through attention give that token everything a one-by-one attention matrix passes (rollout,
  raw attention and transformer attribution: exactly 1), token ablation removes nothing (the read token is
  never removed: 0), Grad-CAM's min-max scaling of a single value gives 0, and the Captum baselines attribute
  the whole output difference to the one feature (occlusion and KernelSHAP: ``y_t(x) − y_t(zero embedding)``;
  input × gradient: ``e · ∂y_t/∂e``), computed here by hand with the model itself.
* A decoder read at ``position=0`` sees only token 0 (causal attention): its map is the one-token row's map at
  column 0 and exactly 0 after it, for every method.
* A one-token row in a padded batch is explained as it is alone (batch = single), and so are the rows beside it.
* Zero-length text (T = 0) is an ``InputError`` for every method and every text family.
"""

import pytest
import torch
from conftest import make_tiny_bert
from decoders import make_decoder, quick
from tiny_clip import make_clip

import lrp_core
from lrp_core.errors import InputError

METHODS = lrp_core.METHODS
BASELINE_DROP = ("occlusion", "kernel_shap")  # one feature: the whole drop to the zero embedding


def _explain(model, inputs, method, **kw):
    return lrp_core.explain(model, inputs, method=method, progress=False, **quick(method), **kw)


def _text(ids: list, mask: list = None) -> dict:
    ids = torch.tensor(ids)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids) if mask is None else torch.tensor(mask)}


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-9) -> bool:
    a, b = a.detach().double(), b.detach().double()
    return bool((a - b).abs().max() <= rtol * b.abs().max().clamp(min=1e-12))


@pytest.fixture(scope="module")
def llama():
    return make_decoder("llama")


@pytest.fixture(scope="module")
def bert():
    return make_tiny_bert().double()


@pytest.fixture(scope="module")
def clip():
    return make_clip().double()


def _clip_text(ids: list, mask: list = None) -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        **_text(ids, mask),
        "pixel_values": torch.randn(2, 3, 32, 32, generator=g, dtype=torch.float64),
        "explain": "text",
    }


# ----------------------------------------------------------------------------
# one-token rows: the trivial maps, by hand
# ----------------------------------------------------------------------------
def _by_hand(model, embed, method: str, target: int) -> float:
    """The one-feature value of a Captum baseline, from the model's own forward on ``inputs_embeds`` (1, 1, E)."""
    e = embed.detach().clone().requires_grad_(True)
    logits = model(inputs_embeds=e).logits
    y = logits[0, -1, target] if logits.dim() == 3 else logits[0, target]
    if method == "input_x_gradient":
        return float((e * torch.autograd.grad(y, e)[0]).sum().detach())
    with torch.no_grad():
        zero = model(inputs_embeds=torch.zeros_like(e)).logits
        return float(y - (zero[0, -1, target] if zero.dim() == 3 else zero[0, target]))


@pytest.mark.parametrize("family", ["llama", "bert"])
@pytest.mark.parametrize(
    "method",
    [
        "rollout",
        "raw_attention",
        "transformer_attribution",
        "token_ablation",
        "attention_gradcam",
        "input_x_gradient",
        *BASELINE_DROP,
    ],
)
def test_a_one_token_row_has_the_trivial_map(family, method, llama, bert):
    model = llama if family == "llama" else bert
    inputs = _text([[5]])
    e = _explain(model, inputs, method)
    assert e.scores.shape == (1, 1) and torch.isfinite(e.scores).all()
    got = float(e.scores[0, 0])
    t = int(e.target[0])
    if method in ("rollout", "raw_attention", "transformer_attribution"):
        assert got == pytest.approx(1.0, abs=1e-12)
    elif method in ("token_ablation", "attention_gradcam"):
        assert got == 0.0
    else:
        ref = _by_hand(model, model.get_input_embeddings()(inputs["input_ids"]), method, t)
        assert got == pytest.approx(ref, rel=1e-9, abs=1e-12)


def test_token_ablation_of_a_one_token_clip_prompt_is_zero(clip):
    """The prompt is only its end-of-text token, the one read: nothing to remove. Its logits are CLIP's own."""
    inputs = _clip_text([[98]])
    e = _explain(clip, inputs, "token_ablation")
    assert e.scores.shape == (1, 1) and e.scores[0, 0] == 0.0
    with torch.no_grad():
        own = clip(input_ids=inputs["input_ids"], pixel_values=inputs["pixel_values"]).logits_per_text
    assert _close(e.logits, own, 1e-12)


# ----------------------------------------------------------------------------
# position 0 on a decoder: the one-token row's map, zero after it
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_position_zero_is_the_first_token_alone(method, llama):
    row = [[5, 17, 42, 8]]
    at0 = _explain(llama, _text(row), method, position=0)
    alone = _explain(llama, _text([row[0][:1]]), method, target=int(at0.target[0]))
    assert torch.equal(at0.target, alone.target)
    assert _close(at0.logits, alone.logits, 1e-12)
    assert _close(at0.scores[0, :1], alone.scores[0], 1e-9)
    assert (at0.scores[0, 1:] == 0).all()


@pytest.mark.parametrize("method", METHODS)
def test_position_zero_in_a_batch(method, llama):
    """Each row read at token 0 (right padding), one of them a one-token row: each equals its first token alone."""
    inputs = _text([[5, 17, 0], [9, 0, 0], [31, 2, 77]], [[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    e = _explain(llama, inputs, method, position=0)
    for b, first in enumerate((5, 9, 31)):
        alone = _explain(llama, _text([[first]]), method, target=int(e.target[b]))
        assert _close(e.scores[b, :1], alone.scores[0], 1e-9)
        assert (e.scores[b, 1:] == 0).all()


# ----------------------------------------------------------------------------
# a one-token row in a padded batch: batch = single, for every family
# ----------------------------------------------------------------------------
CASES = {  # family -> (padded batch with a one-token row, the rows alone, where each row's tokens sit)
    "llama": (_text([[0, 0, 5], [5, 6, 7]], [[0, 0, 1], [1, 1, 1]]), [[[5]], [[5, 6, 7]]], [slice(2, 3), slice(0, 3)]),
    "bert": (_text([[2, 0, 0], [2, 5, 6]], [[1, 0, 0], [1, 1, 1]]), [[[2]], [[2, 5, 6]]], [slice(0, 1), slice(0, 3)]),
    "clip": (
        _text([[98, 0, 0], [1, 5, 98]], [[1, 0, 0], [1, 1, 1]]),
        [[[98]], [[1, 5, 98]]],
        [slice(0, 1), slice(0, 3)],
    ),
}


@pytest.mark.parametrize("family", sorted(CASES))
@pytest.mark.parametrize("method", METHODS)
def test_a_one_token_row_in_a_batch_is_explained_as_alone(family, method, llama, bert, clip):
    model = {"llama": llama, "bert": bert, "clip": clip}[family]
    padded, alone_rows, where = CASES[family]
    wrap = _clip_text if family == "clip" else _text
    e = _explain(model, wrap(padded["input_ids"].tolist(), padded["attention_mask"].tolist()), method, target=1)
    for b, (ids, cols) in enumerate(zip(alone_rows, where)):
        alone = _explain(model, wrap(ids), method, target=1)
        assert _close(e.scores[b, cols], alone.scores[0], 1e-9)
        outside = torch.ones(e.scores.shape[1], dtype=torch.bool)
        outside[cols] = False
        assert (e.scores[b, outside] == 0).all()
    if method == "token_ablation":
        assert (e.scores[0] == 0).all()  # the one-token row: nothing removed


# ----------------------------------------------------------------------------
# zero-length text
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["llama", "bert", "clip"])
@pytest.mark.parametrize("method", METHODS)
def test_zero_length_text_is_an_input_error(family, method, llama, bert, clip):
    empty = torch.zeros(1, 0, dtype=torch.long)
    inputs = {"input_ids": empty, "attention_mask": empty}
    if family == "clip":
        inputs = _clip_text(empty.tolist())
        inputs["input_ids"], inputs["attention_mask"] = empty, empty
    with pytest.raises(InputError, match="empty|at least one"):
        _explain({"llama": llama, "bert": bert, "clip": clip}[family], inputs, method)
