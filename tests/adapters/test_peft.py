"""peft models (LoRA, DoRA, IA³, modules_to_save): a ``PeftModel`` is explained as its base model, and every
method's map is the map of the ``merge_and_unload()`` copy (the same function, plain Linear layers) to float64
round-off — the explicit relevance rules read each adapted layer's effective weight
(``lrp_core.rules.linear.effective_linear``), the replay calls the layers themselves. Layers the rules do not
read are refused with the merge hint; the model is left bit-identical, adapters as found."""

from __future__ import annotations

import copy
import subprocess
import sys
import warnings
from pathlib import Path

import peft  # a dev dependency (pyproject's dev extra); the library itself does not need it
import pytest
import torch
from conftest import make_tiny_bert, make_tiny_vit
from decoders import batch, make_decoder, quick, rows
from vision_models import make_eva, make_swin

from lrp_core import explain
from lrp_core.adapters.swin import REFUSED_METHODS as SWIN_REFUSED
from lrp_core.errors import UnsupportedModelError
from lrp_core.methods.registry import METHOD_NAMES

TOL = 1e-10
EXPLICIT = ("transformer_attribution", "lrp", "partial_lrp")
#: the explicit passes (which read weights) and one modified-gradient replay (which calls the layers)
FEW = EXPLICIT + ("attnlrp",)
BERT_TARGETS = ["query", "key", "value", "dense"]
DECODER_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PHI3_TARGETS = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
GPT2_TARGETS = ["c_attn", "c_proj", "c_fc"]
ATTENTION_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
#: the Linear names of the families whose names differ from Llama's
NEWER_TARGETS = {
    "qwen3_moe": ATTENTION_TARGETS,
    "mixtral": ATTENTION_TARGETS,
    "olmoe": ATTENTION_TARGETS,
    "gpt_oss": ATTENTION_TARGETS,
    "qwen2_moe": ATTENTION_TARGETS + ["shared_expert.gate_proj", "shared_expert.up_proj", "shared_expert.down_proj"],
    "gpt_neox": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
    "phi": ["q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2"],
    "falcon": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
}


def _eva_bias_separate() -> torch.nn.Module:
    """A tiny float64 EVA whose attention adds the q/v bias after calling its qkv Linear (``qkv_bias_separate``), so
    a LoRA on qkv acts. (With the bias inside ``F.linear(x, qkv.weight, bias)``, timm's default, the model reads the
    base weight and a LoRA on qkv changes nothing: the peft model is then not its merged copy.)"""
    model = make_eva(use_rot_pos_emb=True, swiglu_mlp=True).double()
    for block in model.blocks:
        block.attn.qkv_bias_separate = True
    return model


def _modernbert() -> torch.nn.Module:
    """The tiny ModernBERT classifier of the text-family list ([CLS] pooling, sdpa), in float64."""
    from text_families import make

    return make("modernbert", "sdpa").double()


def _randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """The adapters' parameters random: LoRA's B (zero at init, which would hide a missing ΔW), DoRA's magnitudes
    and IA³'s vectors around 1, and modules_to_save copies shifted off their originals."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = 0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            if "lora_B" in name:
                p.copy_(noise)
            elif "lora_magnitude_vector" in name or "ia3_l" in name:
                p.copy_(1.0 + noise)
            elif ".modules_to_save." in name:
                p.add_(noise)
    return model


def _adapted(model: torch.nn.Module, config, seed: int = 0) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft's notes on fan_in_fan_out and unsaved embeddings
        return _randomise(peft.get_peft_model(model, config), seed).eval()


def _lora(**kw):
    return peft.LoraConfig(**{"r": 4, "lora_alpha": 8, **kw})


def _merged(pm: torch.nn.Module, **kw) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return copy.deepcopy(pm).merge_and_unload(**kw)


def _bert_inputs() -> dict:
    ids = torch.randint(1, 60, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _images() -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


CASES = {
    "bert": lambda: (_adapted(make_tiny_bert().double(), _lora(target_modules=BERT_TARGETS)), _bert_inputs()),
    "vit": lambda: (
        _adapted(make_tiny_vit().double(), _lora(target_modules=r".*\.(qkv|attn\.proj|fc1|fc2)|head")),
        _images(),
    ),
    "llama": lambda: (
        _adapted(make_decoder("llama"), _lora(target_modules=DECODER_TARGETS)),
        batch(rows(lengths=(4, 6))),
    ),
    # SEQ_CLS: a PeftModelForSequenceClassification, its classifier in a ModulesToSaveWrapper
    "llama_seq": lambda: (
        _adapted(make_decoder("llama", head="seq"), _lora(task_type="SEQ_CLS", target_modules=DECODER_TARGETS)),
        batch(rows(lengths=(4, 6))),
    ),
    "gpt2": lambda: (
        _adapted(make_decoder("gpt2"), _lora(target_modules=GPT2_TARGETS, fan_in_fan_out=True)),
        batch(rows(lengths=(4, 6))),
    ),
    # the other decoder families: sliding windows, q/k norms, Gemma 3's (1+w) norms, Phi-3's fused projections
    **{
        family: (
            lambda family=family: (
                _adapted(
                    make_decoder(family), _lora(target_modules=PHI3_TARGETS if family == "phi3" else DECODER_TARGETS)
                ),
                batch(rows(lengths=(4, 6)), "left"),
            )
        )
        for family in ("mistral", "qwen2", "qwen3", "gemma3", "phi3")
    },
    # the mixture-of-experts, parallel-block, soft-capped and post-norm decoders (the experts' stacked weights are
    # no Linear: LoRA on the attention, and on Qwen2-MoE's shared expert), ModernBERT, EVA and Swin
    **{
        family: (
            lambda family=family: (
                _adapted(make_decoder(family), _lora(target_modules=NEWER_TARGETS.get(family, DECODER_TARGETS))),
                batch(rows(lengths=(4, 6)), "left"),
            )
        )
        for family in (
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
    },
    "modernbert": lambda: (
        _adapted(_modernbert(), _lora(target_modules=["Wqkv", "Wo", "Wi", "dense"])),
        _bert_inputs(),
    ),
    "eva": lambda: (
        _adapted(_eva_bias_separate(), _lora(target_modules=r".*\.(qkv|attn\.proj|fc1_g|fc1_x|fc1|fc2)|head")),
        _images(),
    ),
    "swin": lambda: (
        _adapted(make_swin().double(), _lora(target_modules=r".*\.(qkv|attn\.proj|fc1|fc2|reduction)")),
        _images(),
    ),
}


def _state(model: torch.nn.Module) -> dict:
    """Every parameter and buffer (bit for bit), and each peft layer's merged / active / disabled adapters."""
    state = {f"t:{n}": t.detach().clone() for n, t in list(model.named_parameters()) + list(model.named_buffers())}
    for name, m in model.named_modules():
        if hasattr(m, "merged_adapters"):
            state[f"a:{name}"] = (list(m.merged_adapters), list(m.active_adapters), bool(m.disable_adapters))
        state[f"m:{name}"] = m.training
    return state


def _assert_unchanged(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for k, v in before.items():
        assert torch.equal(v, after[k]) if isinstance(v, torch.Tensor) else v == after[k], k


def _deviation(a, b) -> float:
    """The largest deviation of a's maps from b's, relative to b's largest entry (0 where both are exact)."""
    worst = 0.0
    for field in ("scores", "pixels", "token_relevance"):
        x, y = getattr(a, field), getattr(b, field)
        assert (x is None) == (y is None), field
        if x is not None:
            worst = max(worst, float((x - y).abs().max() / y.abs().max().clamp_min(1e-300)))
    return worst


def _check(model, reference, inputs, method: str, tol: float = TOL) -> float:
    """``explain(model)``'s maps and logits against ``explain(reference)``'s; the model bit-identical after."""
    before = _state(model)
    got = explain(model, inputs, method=method, **quick(method))
    _assert_unchanged(before, _state(model))
    want = explain(reference, inputs, method=method, **quick(method))
    assert torch.allclose(got.logits, want.logits, rtol=TOL, atol=0), method
    deviation = _deviation(got, want)
    assert deviation <= tol, f"{method}: {deviation:.2e}"
    return deviation


#: the tiny Swin's explicit passes amplify the forward's round-off (a LoRA layer computes Wx + B(Ax), its merged copy
#: (W + BA)x, equal weights bit for bit): lrp measured 3.4e-10 — test_swin.py's batch = single bound, 1e-8
SWIN_TOL = 1e-8


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    pm, inputs = CASES[request.param]()
    return request.param, pm, _merged(pm), inputs


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_every_method_explains_the_peft_model_as_its_merged_copy(case, method):
    name, pm, merged, inputs = case
    assert type(pm).__name__.startswith("PeftModel")
    if name == "swin" and method in SWIN_REFUSED:  # refused on Swin by method: on the peft model too, untouched
        before = _state(pm)
        with pytest.raises(UnsupportedModelError, match=method):
            explain(pm, inputs, method=method)
        _assert_unchanged(before, _state(pm))
        return
    tol = SWIN_TOL if name == "swin" else TOL
    _check(pm, merged, inputs, method, tol)  # the bare PeftModel
    if method in FEW:
        _check(pm.get_base_model(), merged, inputs, method, tol)  # its base model, adapter layers inside


# ---------------------------------------------------------------- adapter states and kinds
def _bert_lora(**kw):
    return _adapted(make_tiny_bert().double(), _lora(target_modules=BERT_TARGETS, **kw))


def test_merged_adapters_are_not_added_twice():
    pm = _bert_lora()
    reference = _merged(pm)
    pm.merge_adapter()  # the base weights now hold ΔW; the layers' forward runs them alone
    for method in FEW:
        _check(pm, reference, _bert_inputs(), method)
    assert all(m.merged_adapters == ["default"] for m in pm.modules() if hasattr(m, "lora_A"))


def test_of_two_adapters_the_active_one_is_explained_and_a_disabled_one_reads_as_the_base():
    pm = _bert_lora()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm.add_adapter("other", _lora(target_modules=BERT_TARGETS, r=2))
    _randomise(pm, seed=5)  # "other"'s B too (and "default"'s anew)
    x = _bert_inputs()
    for active in ("default", "other"):
        pm.set_adapter(active)
        reference = _merged(pm, adapter_names=[active])
        for method in FEW:
            _check(pm, reference, x, method)
    with pm.disable_adapter():
        for method in FEW:
            _check(pm, make_tiny_bert().double(), x, method)  # the same seed: the base model's weights
    assert pm.active_adapter == "other" and not any(m.disable_adapters for m in pm.modules() if hasattr(m, "lora_A"))


@pytest.mark.parametrize("kind", ["dora", "lora_bias", "ia3", "ia3_feedforward"])
@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_dora_ia3_and_lora_bias_are_explained_as_their_merged_copies(kind, family):
    if family == "bert":
        model, targets, inputs, extra = make_tiny_bert().double(), BERT_TARGETS, _bert_inputs(), {}
        feedforward = ["dense"]
    else:
        model, targets, inputs, extra = (
            make_decoder("gpt2"),
            GPT2_TARGETS,
            batch(rows(lengths=(4, 6))),
            {"fan_in_fan_out": True},
        )
        feedforward = ["c_proj"]
    config = {
        "dora": lambda: _lora(target_modules=targets, use_dora=True, **extra),
        "lora_bias": lambda: _lora(target_modules=targets, lora_bias=True, **extra),
        "ia3": lambda: peft.IA3Config(target_modules=targets, feedforward_modules=[], **extra),
        "ia3_feedforward": lambda: peft.IA3Config(target_modules=targets, feedforward_modules=feedforward, **extra),
    }[kind]()
    pm = _adapted(model, config)
    reference = _merged(pm)
    for method in FEW:
        _check(pm, reference, inputs, method)


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "what, make, match",
    [
        (
            "lora on the patch convolution",
            lambda: _adapted(make_tiny_vit().double(), _lora(target_modules=["patch_embed.proj"])),
            "Conv2d",
        ),
        (
            "lora on an embedding",
            lambda: _adapted(make_tiny_bert().double(), _lora(target_modules=["word_embeddings"])),
            "Embedding",
        ),
        (
            "lokr",
            lambda: _adapted(make_tiny_bert().double(), peft.LoKrConfig(target_modules=BERT_TARGETS, r=2)),
            "lokr",
        ),
    ],
)
def test_peft_layers_the_rules_do_not_read_are_refused_with_the_merge_hint(what, make, match):
    pm = make()
    inputs = _images() if "patch" in what else _bert_inputs()
    before = _state(pm)
    with pytest.raises(UnsupportedModelError, match=f"(?s){match}.*merge_and_unload"):
        explain(pm, inputs, method="lrp")
    _assert_unchanged(before, _state(pm))


def test_lora_dropout_in_training_mode_is_refused():
    pm = _adapted(make_tiny_bert().double(), _lora(target_modules=BERT_TARGETS, lora_dropout=0.5)).train()
    with pytest.raises(UnsupportedModelError, match="training mode.*eval"):
        explain(pm, _bert_inputs(), method="lrp")
    assert pm.training


def test_prompt_learning_is_refused():
    config = peft.PromptTuningConfig(task_type="SEQ_CLS", num_virtual_tokens=3)
    pm = peft.get_peft_model(make_tiny_bert().double(), config).eval()
    with pytest.raises(UnsupportedModelError, match="prompt learning.*virtual tokens"):
        explain(pm, _bert_inputs(), method="lrp")


def test_the_library_runs_without_peft():
    code = (
        "import sys; sys.modules['peft'] = None\n"  # any import of peft now fails
        "import torch\n"
        "sys.path.insert(0, 'tests')\n"
        "from conftest import make_tiny_bert\n"
        "from lrp_core import explain\n"
        "x = {'input_ids': torch.tensor([[3, 4, 5]]), 'attention_mask': torch.ones(1, 3, dtype=torch.long)}\n"
        "e = explain(make_tiny_bert(), x, method='lrp')\n"
        "assert e.scores.shape == (1, 3)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
