"""The Captum baselines on decoder language models (lrp_core/methods/baselines.py, docs/METHODS.md §2d).

Tiny random decoders (tests/decoders.py) in float64. What is explained is the logit at each row's read position;
the features are the row's context tokens (its real tokens up to the one read). The references call Captum
directly on ``forward_function`` of the row alone (unpadded, cut after the read position), with their own
reference input (zero vectors, the decoders' default) and feature mask (one id per token) built by hand.
"""

from __future__ import annotations

import pytest
import torch
from captum.attr import FeatureAblation, InputXGradient, IntegratedGradients, KernelShap, NoiseTunnel
from decoders import batch, f64_bound, make_decoder, model_logits, rows
from untouched import assert_untouched, snapshot

from lrp_core import Contrast, InputError, explain
from lrp_core.adapters import get_adapter
from lrp_core.methods.baselines import CAPTUM_METHODS, forward_function

#: small settings so that the suite stays fast; the batch sizes make Captum split its passes
FAST = {
    "integrated_gradients": {"n_steps": 16, "batch_size": 8},
    "smoothgrad": {"n_samples": 6, "batch_size": 4},
    "occlusion": {"batch_size": 8},
    "kernel_shap": {"n_samples": 40, "batch_size": 16},
    "input_x_gradient": {},
}
#: llama (RMSNorm, RoPE, GQA), gpt2 (learned positions, tied head, no pad token in real configs),
#: gemma3 (a scaled word embedding, sliding + global layers); the mixture-of-experts decoders (GPT-OSS: sinks,
#: clamped experts), the parallel blocks (GPT-NeoX, Phi, Falcon), Gemma 2 (soft-caps) and OLMo-2 (post-norms)
FAMILIES = (
    "llama",
    "gpt2",
    "gemma3",
    "qwen3_moe",
    "qwen2_moe",
    "mixtral",
    "olmoe",
    "gpt_oss",
    "gpt_neox",
    "phi",
    "falcon",
    "gemma2",
    "olmo2",
)
TARGETS = [7, 30, 55]
PER_FEATURE = ("occlusion", "kernel_shap")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def _alone(seq: torch.Tensor) -> dict:
    """One unpadded row as a batch of one."""
    return {"input_ids": seq[None], "attention_mask": torch.ones(1, len(seq), dtype=torch.long)}


def _captum(method: str, a, target: int, opts: dict) -> torch.Tensor:
    """(n,) token scores of ``method`` computed by Captum itself on the forward function ``a`` of one row alone,
    every token a feature, the reference zero vectors (the decoders' default)."""
    x, args, f, t = a.inputs.detach(), a.args, a.forward, torch.tensor([target])
    zeros = torch.zeros_like(x)
    features = torch.arange(x.shape[1])[None, :, None]
    if method == "input_x_gradient":
        attr = InputXGradient(f).attribute(x.requires_grad_(), target=t, additional_forward_args=args)
    elif method == "integrated_gradients":
        attr = IntegratedGradients(f).attribute(
            x,
            baselines=zeros,
            target=t,
            additional_forward_args=args,
            n_steps=opts["n_steps"],
            internal_batch_size=opts["batch_size"],
        )
    elif method == "occlusion":
        attr = FeatureAblation(f).attribute(
            x,
            baselines=zeros,
            target=t,
            additional_forward_args=args,
            feature_mask=features,
            perturbations_per_eval=opts["batch_size"],
        )
    elif method == "smoothgrad":
        torch.manual_seed(0)  # the default seed
        attr = NoiseTunnel(InputXGradient(f)).attribute(
            x.requires_grad_(),
            nt_type="smoothgrad",
            nt_samples=opts["n_samples"],
            nt_samples_batch_size=opts["batch_size"],
            stdevs=0.02,
            target=t,
            additional_forward_args=args,
        )
    else:
        torch.manual_seed(0)
        attr = KernelShap(f).attribute(
            x,
            baselines=zeros,
            target=t,
            additional_forward_args=args,
            feature_mask=features,
            n_samples=opts["n_samples"],
            perturbations_per_eval=opts["batch_size"],
        )
    return attr[0, :, 0] if method in PER_FEATURE else attr[0].sum(-1)


def _real(inputs: dict, i: int) -> torch.Tensor:
    """The columns of row ``i``'s real tokens."""
    return torch.nonzero(inputs["attention_mask"][i]).flatten()


# ----------------------------------------------------------------------------
# the forward function is the model, read at each row's position
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("side", ("left", "right"))
def test_the_forward_function_reproduces_the_models_logits_at_the_read_position(family, side):
    model = make_decoder(family)
    inputs = batch(rows(), side)
    adapter = get_adapter(model)
    a = forward_function(adapter, adapter.check_inputs(inputs))
    # the model's own logits of each row alone (HF eager in float64 gives NaN on fully masked padding rows)
    alone = torch.cat([model_logits(model, _alone(s)) for s in rows()])
    with torch.no_grad():
        assert rel(a.forward(a.inputs, *a.args), alone) < f64_bound(model, 1e-12)
    # the features are the real tokens (read at the last one): padding is no feature
    assert torch.equal(a.mask, inputs["attention_mask"])


# ----------------------------------------------------------------------------
# each method equals Captum called directly on the row alone
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", CAPTUM_METHODS)
def test_each_method_equals_captum_called_directly(method, family):
    model = make_decoder(family)
    seqs = rows()
    inputs = batch(seqs, "left")  # left padding: explain runs the batch as it is (no length groups)
    e = explain(model, inputs, method=method, target=TARGETS, **FAST[method])
    adapter = get_adapter(model)
    for i, (seq, t) in enumerate(zip(seqs, TARGETS)):
        a = forward_function(adapter, adapter.check_inputs(_alone(seq)))
        want = _captum(method, a, t, FAST[method])
        real = _real(inputs, i)
        assert rel(e.scores[i, real], want) < f64_bound(model, 1e-9), (i, e.scores[i, real], want)
        assert (e.scores[i][inputs["attention_mask"][i] == 0] == 0).all()
    assert e.scores.dtype == torch.float64 and torch.isfinite(e.scores).all()


@pytest.mark.parametrize("method", ("input_x_gradient", "integrated_gradients", "occlusion"))
def test_a_padded_batch_equals_captum_on_the_padded_batch(method):
    """The deterministic methods run the padded batch at once: Captum on the same padded batch, with the
    reference zero at real tokens and the input at padding, and one feature per real token, gives the same."""
    model = make_decoder("llama")
    inputs = batch(rows(), "left")
    opts = FAST[method]
    e = explain(model, inputs, method=method, target=TARGETS, **opts)
    adapter = get_adapter(model)
    a = forward_function(adapter, adapter.check_inputs(inputs))
    x, t, real = a.inputs.detach(), torch.tensor(TARGETS), inputs["attention_mask"].bool()[..., None]
    ref = torch.where(real, torch.zeros_like(x), x)
    if method == "input_x_gradient":
        attr = InputXGradient(a.forward).attribute(x.requires_grad_(), target=t, additional_forward_args=a.args)
    elif method == "integrated_gradients":
        attr = IntegratedGradients(a.forward).attribute(
            x, baselines=ref, target=t, additional_forward_args=a.args, n_steps=opts["n_steps"], internal_batch_size=8
        )
    else:
        ids = (inputs["attention_mask"].cumsum(1) - 1).clamp(min=0)[..., None]
        attr = FeatureAblation(a.forward).attribute(
            x, baselines=ref, target=t, additional_forward_args=a.args, feature_mask=ids, perturbations_per_eval=2
        )
    want = (attr[..., 0] if method in PER_FEATURE else attr.sum(-1)) * inputs["attention_mask"]
    assert rel(e.scores, want) < f64_bound(model, 1e-12)


@pytest.mark.parametrize("method", CAPTUM_METHODS)
def test_a_sequence_classifier_equals_captum(method):
    model = make_decoder("llama", head="seq")
    seq = rows()[1]
    e = explain(model, _alone(seq), method=method, target=2, **FAST[method])
    adapter = get_adapter(model)
    want = _captum(method, forward_function(adapter, adapter.check_inputs(_alone(seq))), 2, FAST[method])
    assert rel(e.scores[0], want) < 1e-12


# ----------------------------------------------------------------------------
# padding on either side, batch = single, position = the row cut after it
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("family", ("llama", "gpt2"))
@pytest.mark.parametrize("method", CAPTUM_METHODS)
def test_left_padding_equals_right_padding_equals_alone(method, family):
    model = make_decoder(family)
    seqs = rows()
    left = explain(model, batch(seqs, "left"), method=method, target=TARGETS, **FAST[method])
    right = explain(model, batch(seqs, "right"), method=method, target=TARGETS, **FAST[method])
    T = left.scores.shape[1]
    for i, (seq, t) in enumerate(zip(seqs, TARGETS)):
        alone = explain(model, _alone(seq), method=method, target=t, **FAST[method]).scores[0]
        n = len(seq)
        assert rel(left.scores[i, T - n :], alone) < f64_bound(model, 1e-9)
        assert rel(right.scores[i, :n], alone) < f64_bound(model, 1e-9)
        assert (left.scores[i, : T - n] == 0).all() and (right.scores[i, n:] == 0).all()


@pytest.mark.parametrize("method", CAPTUM_METHODS)
def test_a_position_equals_the_row_cut_after_it(method):
    """Read at p: the map of the row cut after p; the tokens after p are no features and score 0."""
    model = make_decoder("llama")
    seqs = rows()
    inputs = batch(seqs, "left")
    T = inputs["input_ids"].shape[1]
    starts = [T - len(s) for s in seqs]
    cut_at = [3, 5, 2]  # in each row's own token count
    pos = [s + k for s, k in zip(starts, cut_at)]
    e = explain(model, inputs, method=method, target=TARGETS, position=pos, **FAST[method])
    for i, (seq, t) in enumerate(zip(seqs, TARGETS)):
        alone = explain(model, _alone(seq[: cut_at[i] + 1]), method=method, target=t, **FAST[method]).scores[0]
        assert rel(e.scores[i, starts[i] : pos[i] + 1], alone) < f64_bound(model, 1e-9)
        assert (e.scores[i, pos[i] + 1 :] == 0).all() and (e.scores[i, : starts[i]] == 0).all()
        one = explain(model, _alone(seq), method=method, target=t, position=cut_at[i], **FAST[method]).scores[0]
        assert (
            rel(one[: cut_at[i] + 1], alone) < f64_bound(model, 1e-9) and (one[cut_at[i] + 1 :] == 0).all()
        )  # a batch of one too


def test_kernel_shap_with_one_context_token_is_the_logit_drop():
    """Read at the first token: one feature, whose Shapley value is y_t(x) − y_t(reference) (efficiency)."""
    model = make_decoder("gpt2")
    inputs = batch(rows(), "right")
    e = explain(model, inputs, method="kernel_shap", target=TARGETS, position=0, n_samples=10)
    first = {k: v[:, :1] for k, v in inputs.items()}
    with torch.no_grad():
        y = model_logits(model, first)
        zero = model(
            inputs_embeds=torch.zeros(3, 1, 32, dtype=torch.float64), attention_mask=first["attention_mask"]
        ).logits[:, 0]
    drop = (y - zero)[torch.arange(3), TARGETS]
    assert rel(e.scores[:, 0], drop) < 1e-12
    assert (e.scores[:, 1:] == 0).all()


# ----------------------------------------------------------------------------
# what the numbers mean
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("family", ("llama", "gpt2"))
def test_integrated_gradients_is_complete_with_a_convergence_delta(family):
    """Σ scores = y_t(x) − y_t(zero vectors at the context) up to the reported convergence delta (small)."""
    model = make_decoder(family)
    seqs = rows()
    inputs = batch(seqs, "left")
    e = explain(model, inputs, method="integrated_gradients", target=TARGETS, n_steps=64)
    assert e.convergence_delta is not None and e.convergence_delta.shape == (3,)
    assert e.options["baseline"] == "zeros"
    drop = []
    with torch.no_grad():
        for seq, t in zip(seqs, TARGETS):  # each row alone (HF eager gives NaN on fully masked padding rows)
            zero = model(inputs_embeds=torch.zeros(1, len(seq), 32, dtype=torch.float64)).logits[0, -1, t]
            drop.append(model_logits(model, _alone(seq))[0, t] - zero)
    drop = torch.stack(drop)
    assert torch.allclose(e.scores.sum(1) - drop, e.convergence_delta, rtol=1e-6, atol=1e-12)
    if family == "gpt2":
        # GPT-2's path starts at its position embeddings; Llama's starts at x = 0, where RMSNorm(αx) jumps from 0
        # to x / rms(x) within α ≈ sqrt(eps) / rms(x): 64 steps miss that jump, and the delta says by how much
        assert (e.convergence_delta.abs() < 1e-3 * drop.abs().max()).all()
    else:
        assert (e.convergence_delta.abs() > 1e-2 * drop.abs().max()).any()


@pytest.mark.parametrize("method", CAPTUM_METHODS)
def test_a_contrast_is_the_difference_of_the_two_explanations(method):
    """Every baseline is linear in the explained output (the same noise / coalitions for both targets):
    explaining y_a − y_b gives map(a) − map(b). KernelSHAP's regression runs in float32; sdpa, since the
    eager replay takes its softmax in float32 (as the model does), whose round-off the gradients would show;
    GPT-2, whose LayerNorm runs in float64 (Llama's RMSNorm computes in float32)."""
    model = make_decoder("gpt2", attn="sdpa")
    inputs = batch(rows(), "left")
    opts = FAST[method]
    c = explain(model, inputs, method=method, target=Contrast(TARGETS, [3, 3, 3]), **opts)
    d = (
        explain(model, inputs, method=method, target=TARGETS, **opts).scores
        - explain(model, inputs, method=method, target=3, **opts).scores
    )
    assert rel(c.scores, d) < (1e-5 if method == "kernel_shap" else 1e-9)
    assert c.options["contrast_with"] == [3, 3, 3]


def test_occlusion_of_a_token_is_the_logit_drop_computed_by_hand():
    model = make_decoder("gpt2")
    seq = rows()[2]
    e = explain(model, _alone(seq), method="occlusion", target=9)
    emb = model.get_input_embeddings()(seq[None]).detach()
    with torch.no_grad():
        y = model(inputs_embeds=emb).logits[0, -1, 9]
        for j in range(len(seq)):
            cut = emb.clone()
            cut[0, j] = 0
            assert abs(e.scores[0, j] - (y - model(inputs_embeds=cut).logits[0, -1, 9])) < 1e-12 * abs(y)


# ----------------------------------------------------------------------------
# the reference input, options, the model and the generator left alone
# ----------------------------------------------------------------------------
def test_the_decoders_default_reference_is_zeros_and_a_token_can_be_named():
    model = make_decoder("llama")  # its config has pad_token_id = 0
    inputs = batch(rows(), "right")
    default = explain(model, inputs, method="occlusion")
    zeros = explain(model, inputs, method="occlusion", baseline="zeros")
    pad = explain(model, inputs, method="occlusion", baseline="pad")
    by_id = explain(model, inputs, method="occlusion", baseline=0)
    assert default.options["baseline"] == "zeros" and torch.equal(default.scores, zeros.scores)
    assert torch.equal(pad.scores, by_id.scores) and not torch.allclose(pad.scores, zeros.scores)
    assert explain(model, inputs, method="kernel_shap", n_samples=8).options["baseline"] == "zeros"


@pytest.mark.parametrize(
    "options, words",
    [
        ({"baseline": "blur"}, "'blur' is for images"),
        ({"baseline": "mask"}, "tokenizer.mask_token_id"),
        ({"baseline": "pad"}, "tokenizer.pad_token_id"),  # GPT-2's config names no padding token
        ({"baseline": 96}, "outside the vocabulary"),
        ({"n_steps": 0}, "n_steps must be a positive int"),
        ({"stdevs": 0.1}, "does not take option(s) ['stdevs']"),
    ],
)
def test_bad_options_are_refused(options, words):
    model = make_decoder("gpt2", pad_token_id=None)
    with pytest.raises(InputError) as err:
        explain(model, batch(rows(), "left"), method="integrated_gradients", **options)
    assert words in str(err.value)


@pytest.mark.parametrize("method", CAPTUM_METHODS)
def test_the_model_and_the_global_generator_are_left_as_they_were(method):
    model = make_decoder("gpt2")
    before = snapshot(model)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    explain(model, batch(rows(), "left"), method=method, **FAST[method])
    assert torch.equal(torch.rand(3), expected)
    assert_untouched(before, snapshot(model))
