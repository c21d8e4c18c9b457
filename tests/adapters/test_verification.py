"""Verification on every call (docs/CONTRACTS.md, "Verification on every call"; docs/METHODS.md §4).

* Every family's fixture is verified by every ``explain`` call and passes: the logits the method read from the
  replay equal the model's own forward within the dtype's tolerance (float64 1e-10, float32 1e-5, half models
  compared in float32 1e-5).
* A replay that misreads the model (its block description or readout deliberately broken here) is refused with an
  :class:`UnsupportedModelError` naming the figure and the first block that departs; models the replay misread
  silently before (a timm ViT whose ``attn.scale`` was changed, a Llama whose RMSNorms are ``torch.nn.RMSNorm``) are
  either explained exactly or refused, never explained wrongly.
* ``unverified=True`` skips the check; the model is left bit-identical and without hooks, refusal or not.
* Phi-3 ``longrope``: each ``explain_generation`` step equals ``explain()`` of its teacher-forced prefix.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from conftest import make_tiny_bert, make_tiny_vit  # noqa: E402
from decoders import batch, has_float32_islands, make_decoder, rows  # noqa: E402
from text_families import make, text_batch  # noqa: E402
from torch import nn

import lrp_core  # noqa: E402
from lrp_core import explain  # noqa: E402
from lrp_core.adapters import verification  # noqa: E402
from lrp_core.errors import UnsupportedModelError  # noqa: E402
from lrp_core.runtime.guard import HOOK_DICTS  # noqa: E402


@pytest.fixture
def figures(monkeypatch):
    """The deviation every check of the test measured (one per explain call)."""
    seen: list = []
    check = verification.check

    def spy(*args, **kwargs):
        seen.append(check(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(verification, "check", spy)
    return seen


def _images(n: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def _clip():
    from tiny_clip import make_clip

    model = make_clip()
    x = {
        "pixel_values": _images(2),
        "input_ids": torch.tensor([[5, 6, 7, 98], [8, 9, 98, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
    }
    return model, x


def _vlm(family: str):
    import vlms

    if family == "llava":
        return vlms.make_llava(), vlms.inputs([vlms.prompt([5, 6], [7]), vlms.prompt([8], [9, 10, 11])])
    if family == "smolvlm":
        rows_ = [vlms.smol_prompt([5, 6], [7]), vlms.smol_prompt([8], [9, 10, 11])]
        return vlms.make_smolvlm(), vlms.smol_inputs(rows_)
    if family == "qwen2_5_vl":
        rows_ = [vlms.qwen_prompt([5, 6], [7]), vlms.qwen_prompt([8], [9, 10, 11])]
        return vlms.make_qwen_vl(), vlms.qwen_inputs(rows_)
    if family == "gemma3_vl":
        x = vlms.inputs([vlms.gemma3_prompt([5, 6], [7]), vlms.gemma3_prompt([8], [9, 10, 11])])
        return vlms.make_gemma3(), vlms.image_types(x)
    row1, t1 = vlms.paligemma_prompt([5, 6, 7])
    row2, t2 = vlms.paligemma_prompt([8], [9, 10])
    return vlms.make_paligemma(2), vlms.with_types(vlms.inputs([row1, row2]), [t1, t2])


def _vision(family: str):
    import vision_models as V

    return V.FAMILIES[family](), V.random_images()


#: family -> (model, inputs), a cross-section of every kind the engine explains
CASES = {
    "timm_vit": lambda: (make_tiny_vit(), _images()),
    "timm_vit_float64": lambda: (make_tiny_vit().double(), _images().double()),
    **{f: (lambda f=f: _vision(f)) for f in ("timm_avg", "timm_distilled", "hf_deit_teacher", "hf_dinov2")},
    "hf_siglip2": lambda: _vision("hf_siglip2"),
    "timm_eva": lambda: (__import__("vision_models").make_eva(), _images()),
    "timm_swin": lambda: (__import__("vision_models").make_swin(), _images()),
    "bert": lambda: (make_tiny_bert(), text_batch(make_tiny_bert())),
    **{f: (lambda f=f: (make(f).eval(), text_batch(make(f)))) for f in ("roberta", "albert", "mpnet", "modernbert")},
    "clip_image": _clip,
    "clip_text": lambda: (lambda m, x: (m, {**x, "explain": "text"}))(*_clip()),
    **{
        f"{f}_{head}_{side}": (lambda f=f, head=head, side=side: (make_decoder(f, head=head), batch(rows(), side)))
        for f, head, side in [
            ("llama", "causal", "left"),
            ("llama", "seq", "right"),
            ("gpt2", "causal", "right"),
            ("gemma2", "causal", "left"),
            ("phi3", "seq", "left"),
            ("mixtral", "causal", "right"),
            ("falcon", "causal", "left"),
        ]
    },
    **{f: (lambda f=f: _vlm(f)) for f in ("llava", "smolvlm", "qwen2_5_vl", "gemma3_vl", "paligemma")},
}


def _tolerance(model: nn.Module) -> float:
    """float64's where the model computes in float64 throughout; float32's where its own code has float32 steps
    (tests/decoders.py FLOAT32_ISLANDS: padded and unpadded rows then round differently on some CPUs)."""
    f64 = next(model.parameters()).dtype == torch.float64
    return 1e-10 if f64 and not has_float32_islands(model) else 1e-5


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_a_float64_model_with_float32_steps_is_verified_at_float32_tolerance(attn):
    """transformers' eager softmax runs in float32 in a float64 Llama: the verdict allows float32 round-off there,
    float64's with sdpa, and float64's again when dtype=torch.float64 lifts the float32 steps."""
    from lrp_core.adapters import get_adapter
    from lrp_core.runtime.precision import compute_precision

    model = make_decoder("llama", attn)
    adapter = get_adapter(model)
    assert verification.tolerance(adapter) == ((1e-5, torch.float32) if attn == "eager" else (1e-10, torch.float64))
    with compute_precision(make_decoder("llama", attn, dtype=torch.float32), torch.float64):
        f32 = get_adapter(make_decoder("llama", attn, dtype=torch.float32))
        assert verification.tolerance(f32) == (1e-10, torch.float64)


@pytest.mark.parametrize("family", list(CASES))
def test_every_family_is_verified_and_passes(family, figures):
    model, x = CASES[family]()
    for method in ("cdam", "attnlrp"):
        exp = explain(model, x, method=method)
        assert torch.isfinite(exp.scores).all()
    assert len(figures) == 2 and max(figures) <= _tolerance(model), figures


@pytest.mark.parametrize("method", ["transformer_attribution", "lrp", "attnlrp", "cp_lrp", "token_ablation", "cdam"])
def test_every_method_is_verified(method, figures):
    model, x = make_tiny_vit(), _images()
    explain(model, x, method=method)
    assert len(figures) == 1 and figures[0] <= 1e-5


def test_precision_modes_are_verified_at_their_tolerance(figures):
    """dtype=float64 on a float32 model: compared in float64 (1e-10); a bfloat16 model: in float32 (1e-5)."""
    explain(make_tiny_vit(), _images(), method="attnlrp", dtype=torch.float64)
    explain(make_tiny_vit().to(torch.bfloat16), _images(), method="attnlrp")
    explain(make_decoder("llama", dtype=torch.float16), batch(rows(), "left"), method="attnlrp")
    assert figures[0] <= 1e-10 and figures[1] <= 1e-5 and figures[2] <= 1e-5, figures


# ------------------------------------------------------------------------------------------- refusals
def _break_block(monkeypatch, adapter_cls, block: int, scale: float = 1.25):
    """The adapter's description of block ``block`` with a wrong attention scale (the model is not touched)."""
    build = adapter_cls._block

    def wrong(self, i, layer):
        spec = build(self, i, layer)
        return replace(spec, attn=replace(spec.attn, scale=spec.attn.scale * scale)) if i == block else spec

    monkeypatch.setattr(adapter_cls, "_block", wrong)


def _state(model: nn.Module) -> dict:
    return {
        "tensors": {k: v.clone() for k, v in model.state_dict(keep_vars=True).items()},
        "training": [m.training for m in model.modules()],
        "hooks": [len(getattr(m, d)) for m in model.modules() for d in HOOK_DICTS],
        "attrs": [sorted(vars(m)) for m in model.modules()],
    }


def _same_state(a: dict, b: dict) -> None:
    assert a["tensors"].keys() == b["tensors"].keys()
    for k in a["tensors"]:
        assert torch.equal(a["tensors"][k], b["tensors"][k]), k
    assert a["training"] == b["training"] and a["hooks"] == b["hooks"] and a["attrs"] == b["attrs"]


@pytest.mark.parametrize("method", ["rollout", "transformer_attribution", "lrp", "attnlrp", "integrated_gradients"])
def test_a_misread_vit_block_is_refused_naming_the_figure_and_the_block(monkeypatch, method):
    from lrp_core.adapters.vit import TimmViTAdapter

    model, x = make_tiny_vit(), _images()
    model.train()  # the check runs in eval semantics and leaves the modes as found
    before = _state(model)
    _break_block(monkeypatch, TimmViTAdapter, block=1)
    opts = {"n_steps": 4} if method == "integrated_gradients" else {}
    with pytest.raises(UnsupportedModelError, match=r"differ from the model's forward by \d\.\d\de-\d\d relative") as e:
        explain(model, x, method=method, **opts)
    assert "departs at block 1 (blocks.1)" in str(e.value) and "the blocks before it agree" in str(e.value)
    assert "unverified=True" in str(e.value)
    _same_state(before, _state(model))
    # the option skips the check: the (wrong) explanation is given, its logits are not the model's
    exp = explain(model, x, method=method, unverified=True, **opts)
    with torch.no_grad():
        own = model.eval()(x)
    assert float((exp.logits - own).abs().max() / own.abs().max()) > 1e-3


def test_a_misread_decoder_block_and_readout_are_located(monkeypatch):
    from lrp_core.adapters.decoder import DecoderAdapter
    from lrp_core.adapters.llama import LlamaAdapter

    model, x = make_decoder("llama"), batch(rows(), "left")
    before = _state(model)
    with monkeypatch.context() as m:
        _break_block(m, LlamaAdapter, block=1, scale=1.01)
        with pytest.raises(
            UnsupportedModelError, match=r"tolerance 1e-(10|05).*departs at block 1 \(model\.layers\.1\)"
        ):
            explain(model, x, method="attnlrp")
    # a readout that misses the final norm: every block agrees, the departure is after them
    monkeypatch.setattr(
        DecoderAdapter, "_stack", lambda self: (self.model.model, self.model.model.layers, nn.Identity())
    )
    with pytest.raises(UnsupportedModelError, match="Every block's output agrees.*after the last block"):
        explain(model, x, method="rollout")
    _same_state(before, _state(model))


def test_attention_parts_is_verified(monkeypatch):
    from lrp_core.adapters.vit import TimmViTAdapter

    _break_block(monkeypatch, TimmViTAdapter, block=0)
    with pytest.raises(UnsupportedModelError, match="departs at block 0"):
        lrp_core.attention_parts(make_tiny_vit(), _images())


def _exact_or_refused(model: nn.Module, x, own: torch.Tensor, method: str) -> None:
    """The explanation's logits are the model's own, or the call is refused: never a wrong explanation."""
    try:
        exp = explain(model, x, method=method)
    except UnsupportedModelError as err:
        assert "relative" in str(err) or "not" in str(err)
        return
    assert float((exp.logits - own).abs().max() / own.abs().max()) <= 1e-5


@pytest.mark.parametrize("method", ["transformer_attribution", "attnlrp", "lrp"])
def test_models_misread_silently_before_are_exact_or_refused(method):
    vit, x = make_tiny_vit(), _images()
    for blk in vit.blocks:
        blk.attn.scale = blk.attn.scale * 1.2  # every explained logit was 4.7e-2 off, silently
    with torch.no_grad():
        own = vit(x)
    _exact_or_refused(vit, x, own, method)

    llama, inputs = make_decoder("llama"), batch(rows(lengths=(6, 6)))  # unpadded: model_logits is the reference
    for layer in llama.model.layers:  # torch's RMSNorm: the replay read it as Gemma's 1 + w (2.33 off)
        for name in ("input_layernorm", "post_attention_layernorm"):
            old = getattr(layer, name)
            new = nn.RMSNorm(old.weight.shape[0], eps=old.variance_epsilon, dtype=torch.float64)
            with torch.no_grad():
                new.weight.copy_(old.weight)
            setattr(layer, name, new)
    from decoders import model_logits

    _exact_or_refused(llama, inputs, model_logits(llama, inputs), method)


def test_hooks_that_only_the_models_own_forward_runs_are_warned_about_not_refused():
    model, x = make_tiny_vit(), _images()
    plain = explain(model, x, method="rollout")
    model.blocks[0].register_forward_hook(lambda m, i, o: o * 1.5)  # the model's output changes, the replay's not
    with pytest.warns(lrp_core.errors.UnreflectedHookWarning, match=r"blocks\.0"):
        exp = explain(model, x, method="rollout")
    assert torch.equal(exp.scores, plain.scores)


def test_length_dependent_rotary_state_is_left_as_found():
    """The check runs the model's own forward; transformers' longrope / dynamic update rewrites the rotary buffers
    and adds attributes: all put back."""
    from decoders import ROPES

    for rope in ("longrope", "dynamic"):
        family, over = ROPES[rope]
        model = make_decoder(family, "sdpa", **over)
        before = _state(model)
        explain(model, batch(rows(lengths=(5, 14)), "left"), method="attnlrp")
        _same_state(before, _state(model))


# ------------------------------------------------------------------------------ Phi-3 longrope generation
LONGROPE = dict(
    rope_parameters={
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "short_factor": [1.0, 1.1],
        "long_factor": [3.0, 5.0],
        "original_max_position_embeddings": 8,
    },
    original_max_position_embeddings=8,
    sliding_window=None,
)


@pytest.mark.parametrize("method", ["attnlrp", "transformer_attribution"])
def test_longrope_generation_steps_equal_explain_of_their_prefixes(method):
    """Prompts of 6 and 4 tokens, 5 steps: the prefixes cross original_max_position_embeddings = 8 (short to long
    factors) inside the generation; before, steps 0-2 were 0.15-0.61 off explain() of their prefix."""
    from lrp_core.methods.generation import explain_generation

    model = make_decoder("phi3", "sdpa", **LONGROPE)
    prompts = batch(rows(lengths=(6, 4)), "left")
    gen = explain_generation(model, None, prompts, method=method, max_new_tokens=5, stop_at_eos=False)
    P = prompts["input_ids"].shape[1]
    for b in range(2):
        real = gen.attention_mask[b].bool()
        for k in range(5):
            prefix = gen.input_ids[b][real][: real[:P].sum() + k][None]
            alone = explain(model, {"input_ids": prefix}, method=method, target=int(gen.targets[b, k]))
            got = gen.scores[b, k][real[: P + 4]][: prefix.shape[1]]
            dev = float((got - alone.scores[0].double()).abs().max() / alone.scores[0].abs().max())
            assert dev <= 1e-10, (b, k, dev)
            logit = float(alone.logits[0, gen.targets[b, k]])
            assert abs(float(gen.logits[b, k]) - logit) <= 1e-10 * float(alone.logits.abs().max())
    copy.deepcopy(model)  # the model is still a plain module (nothing left attached)
