"""The model is never changed by a call, whatever hooks the user has on it.

Every method is run on tiny models (timm ViT, EVA and Swin, BERT and ModernBERT, every decoder family — the
mixture-of-experts, parallel-block, soft-capped and post-norm ones included — and Llama and GPT-2 with a
sequence-classifier head too) that carry the user's hooks of every kind — forward, pre-, with-kwargs,
always-called, full backward and backward pre-hooks — on every module kind the engine touches (input embeddings,
the head, norms, a block, an attention module and one of its projections), and, on the Hugging Face models, the hook
``enable_input_require_grads()`` puts on the input embeddings. After each call:

* every module's hook dictionaries are as before, entry for entry (same ids, same functions, same order),
  and torch's process-wide hooks too;
* the model's own forward on new inputs of another shape is bit-identical to a clean deep copy's, and its
  forward and backward run the same user hooks in the same order as before the call;
* the explanation equals the clean model's (the hooks are no-ops), and a second call gives the same.

A call that fails midway (a bad option checked late, a user hook that raises, ``KeyboardInterrupt``) leaves the
model the same way.
"""

from __future__ import annotations

import copy
import os
import sys

import pytest
import torch
from torch import nn
from torch.nn.modules import module as torch_module

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # tests/: conftest's builders, decoders

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "adapters"))  # eva, swin, modernbert
from conftest import make_tiny_bert, make_tiny_vit  # noqa: E402
from decoders import batch, make_decoder, quick, rows  # noqa: E402
from vision_models import make_eva, make_swin  # noqa: E402

from lrp_core import METHODS, InputError, explain  # noqa: E402
from lrp_core.adapters.swin import REFUSED_METHODS as SWIN_REFUSED  # noqa: E402
from lrp_core.methods.baselines import CAPTUM_METHODS  # noqa: E402
from lrp_core.runtime.guard import HOOK_DICTS  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore::lrp_core.errors.UnreflectedHookWarning"),  # hooks on blocks
    # torch's note on full backward hooks of modules whose inputs need no gradient (the embeddings)
    pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning"),
]


def _images(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def _bert_text(lengths: tuple, seed: int) -> dict:
    x = batch(rows(seed, lengths))
    return {"input_ids": x["input_ids"] % 60, "attention_mask": x["attention_mask"]}  # BERT's vocabulary: 60


#: model -> (builder, hooked modules: embeddings, head, norms, block, attention, a projection, the inputs
#: explained, new inputs of another shape for the model's own forward)
MODELS = {
    "vit": (
        make_tiny_vit,
        ("patch_embed.proj", "head", "blocks.0.norm1", "norm", "blocks.0", "blocks.0.attn", "blocks.0.attn.qkv"),
        lambda: _images(2, 1),
        lambda: _images(3, 2),
    ),
    "bert": (
        make_tiny_bert,
        (
            "bert.embeddings.word_embeddings",
            "classifier",
            "bert.embeddings.LayerNorm",
            "bert.encoder.layer.0.output.LayerNorm",
            "bert.encoder.layer.0",
            "bert.encoder.layer.0.attention",
            "bert.encoder.layer.0.attention.self.query",
            "bert.pooler.dense",
        ),
        lambda: _bert_text((5, 7), 1),
        lambda: _bert_text((4, 9, 6), 2),
    ),
    **{
        f"llama-{head}": (
            lambda head=head: make_decoder("llama", head=head),
            (
                "model.embed_tokens",
                "lm_head" if head == "causal" else "score",
                "model.layers.0.input_layernorm",
                "model.norm",
                "model.layers.0",
                "model.layers.0.self_attn",
                "model.layers.0.self_attn.q_proj",
            ),
            lambda: batch(rows(1, (5, 7))),
            lambda: batch(rows(2, (4, 9, 6))),
        )
        for head in ("causal", "seq")
    },
    **{
        f"gpt2-{head}": (
            lambda head=head: make_decoder("gpt2", head=head),
            (
                "transformer.wte",
                "lm_head" if head == "causal" else "score",
                "transformer.wpe",
                "transformer.h.0.ln_1",
                "transformer.ln_f",
                "transformer.h.0",
                "transformer.h.0.attn",
                "transformer.h.0.attn.c_attn",
            ),
            lambda: batch(rows(1, (5, 7))),
            lambda: batch(rows(2, (4, 9, 6))),
        )
        for head in ("causal", "seq")
    },
    **{
        f"{family}-causal": (
            lambda family=family: make_decoder(family),
            (
                "model.embed_tokens",
                "lm_head",
                "model.layers.0.input_layernorm",
                "model.norm",
                "model.layers.0",
                "model.layers.0.self_attn",
                "model.layers.0.self_attn." + ("qkv_proj" if family == "phi3" else "q_proj"),
            ),
            lambda: batch(rows(1, (5, 7))),
            lambda: batch(rows(2, (4, 9, 6))),
        )
        for family in ("mistral", "qwen2", "qwen3", "gemma3", "phi3")
    },
    # mixture-of-experts decoders: hooks on the MoE module, its router and its experts too (the replay reads their
    # weights through views and calls none of them)
    **{
        f"{family}-causal": (
            lambda family=family: make_decoder(family),
            (
                "model.embed_tokens",
                "lm_head",
                "model.layers.0.input_layernorm",
                "model.norm",
                "model.layers.0",
                "model.layers.0.self_attn",
                "model.layers.0.self_attn.q_proj",
                "model.layers.0.mlp",
                "model.layers.0.mlp." + ("router" if family == "gpt_oss" else "gate"),
                "model.layers.0.mlp.experts",
            ),
            lambda: batch(rows(1, (5, 7))),
            lambda: batch(rows(2, (4, 9, 6))),
        )
        for family in ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "gpt_oss")
    },
    "gpt_neox-causal": (
        lambda: make_decoder("gpt_neox"),
        (
            "gpt_neox.embed_in",
            "lm_head",
            "gpt_neox.layers.0.input_layernorm",
            "gpt_neox.final_layer_norm",
            "gpt_neox.layers.0",
            "gpt_neox.layers.0.attention",
            "gpt_neox.layers.0.attention.query_key_value",
        ),
        lambda: batch(rows(1, (5, 7))),
        lambda: batch(rows(2, (4, 9, 6))),
    ),
    "phi-causal": (
        lambda: make_decoder("phi"),
        (
            "model.embed_tokens",
            "lm_head",
            "model.layers.0.input_layernorm",
            "model.final_layernorm",
            "model.layers.0",
            "model.layers.0.self_attn",
            "model.layers.0.self_attn.q_proj",
            "model.layers.0.self_attn.q_layernorm",
        ),
        lambda: batch(rows(1, (5, 7))),
        lambda: batch(rows(2, (4, 9, 6))),
    ),
    "falcon-causal": (
        lambda: make_decoder("falcon"),
        (
            "transformer.word_embeddings",
            "lm_head",
            "transformer.h.0.ln_attn",
            "transformer.ln_f",
            "transformer.h.0",
            "transformer.h.0.self_attention",
            "transformer.h.0.self_attention.query_key_value",
        ),
        lambda: batch(rows(1, (5, 7))),
        lambda: batch(rows(2, (4, 9, 6))),
    ),
    **{
        f"{family}-causal": (
            lambda family=family: make_decoder(family),
            (
                "model.embed_tokens",
                "lm_head",
                "model.layers.0.post_attention_layernorm",
                "model.norm",
                "model.layers.0",
                "model.layers.0.self_attn",
                "model.layers.0.self_attn.q_proj",
            ),
            lambda: batch(rows(1, (5, 7))),
            lambda: batch(rows(2, (4, 9, 6))),
        )
        for family in ("gemma2", "olmo2")
    },
    "modernbert": (
        lambda: _modernbert(),
        (
            "model.embeddings.tok_embeddings",
            "classifier",
            "model.embeddings.norm",
            "model.final_norm",
            "model.layers.1",
            "model.layers.1.attn",
            "model.layers.1.attn.Wqkv",
            "head.dense",
        ),
        lambda: _bert_text((5, 7), 1),
        lambda: _bert_text((4, 9, 6), 2),
    ),
    "eva": (
        lambda: make_eva(use_rot_pos_emb=True, swiglu_mlp=True, num_reg_tokens=2, init_values=0.3),
        (
            "patch_embed.proj",
            "head",
            "blocks.0.norm1",
            "norm",
            "blocks.0",
            "blocks.0.attn",
            "blocks.0.attn.qkv",
            "blocks.0.mlp.fc1",
        ),
        lambda: _images(2, 1),
        lambda: _images(3, 2),
    ),
    "swin": (
        lambda: make_swin(),
        (
            "patch_embed.proj",
            "head.fc",
            "layers.0.blocks.0.norm1",
            "norm",
            "layers.0.blocks.1",
            "layers.0.blocks.1.attn",
            "layers.0.blocks.1.attn.qkv",
            "layers.1.downsample",
        ),
        lambda: _images(2, 1),
        lambda: _images(3, 2),
    ),
}


def _modernbert() -> nn.Module:
    """The tiny ModernBERT classifier of the text-family list ([CLS] pooling, sdpa), in float32."""
    from text_families import make

    return make("modernbert", "sdpa")


def _attach(model: nn.Module, names: tuple, log: list) -> None:
    """No-op user hooks of every kind on each named module (each appends its name to ``log`` when it fires)."""

    def note(tag: str):
        return lambda *args, **kwargs: log.append(tag)

    for name in names:
        m = model.get_submodule(name)
        m.register_forward_pre_hook(note(f"{name}:pre"))
        m.register_forward_hook(note(f"{name}:forward"))
        m.register_forward_pre_hook(note(f"{name}:pre-kwargs"), with_kwargs=True)
        m.register_forward_hook(note(f"{name}:forward-kwargs"), with_kwargs=True)
        m.register_forward_hook(note(f"{name}:always"), always_call=True)
        m.register_full_backward_pre_hook(note(f"{name}:backward-pre"))
        m.register_full_backward_hook(note(f"{name}:backward"))
    if hasattr(model, "enable_input_require_grads"):  # what gradient checkpointing / PEFT put on the embeddings
        model.enable_input_require_grads()


def _hook_table(model: nn.Module) -> list:
    """Every hook entry of every module, in order: (module, dictionary, key, the hook object's id)."""
    return [
        (name, d, key, id(fn))
        for name, m in model.named_modules()
        for d in HOOK_DICTS
        for key, fn in getattr(m, d).items()
    ]


def _global_hooks() -> tuple:
    return tuple(
        tuple(getattr(torch_module, d))
        for d in (
            "_global_forward_hooks",
            "_global_forward_pre_hooks",
            "_global_backward_hooks",
            "_global_backward_pre_hooks",
        )
    )


def _own(model: nn.Module, x) -> torch.Tensor:
    """The model's own output (logits) — a dict of ids and a mask for text, pixels for images."""
    out = model(**x) if isinstance(x, dict) else model(x)
    return out.logits if hasattr(out, "logits") else out


def _run_log(model: nn.Module, x, log: list) -> list:
    """The user hooks that fire, in order, on one forward and one backward pass of the model itself."""
    log.clear()
    out = _own(model, x)
    torch.autograd.grad(out.sum(), [p for p in model.parameters() if p.requires_grad][:1])  # fills no .grad
    fired = list(log)
    log.clear()
    return fired


def _same(a, b) -> None:
    for name in ("scores", "target", "logits", "pixels", "layers", "token_relevance"):
        x, y = getattr(a, name, None), getattr(b, name, None)
        assert (x is None) == (y is None), name
        if x is not None:
            assert torch.equal(x, y), name


class _Untouched:
    """What must hold after a call: taken on the hooked model before it (``clean``: its copy without hooks)."""

    def __init__(self, model: nn.Module, clean: nn.Module, new_inputs, log: list):
        self.model, self.clean, self.x, self.log = model, clean, new_inputs, log
        self.table, self.globals = _hook_table(model), _global_hooks()
        self.fired = _run_log(model, new_inputs, log)
        self.flags = [(p.requires_grad, p.grad) for p in model.parameters()] + [m.training for m in model.modules()]

    def check(self) -> None:
        assert _hook_table(self.model) == self.table  # the user's hooks, same ids and order; nothing added
        assert _global_hooks() == self.globals
        assert [(p.requires_grad, p.grad) for p in self.model.parameters()] + [
            m.training for m in self.model.modules()
        ] == self.flags
        with torch.no_grad():
            # another shape: bit-identical (NaN where the model's own eager forward gives a fully masked padding row
            # NaN under a sliding window: at the same places in both)
            mine, clean = _own(self.model, self.x), _own(self.clean, self.x)
            assert torch.equal(mine.isnan(), clean.isnan()) and torch.equal(mine.nan_to_num(), clean.nan_to_num())
        assert _run_log(self.model, self.x, self.log) == self.fired  # the same hooks fire, in the same order
        self.log.clear()


#: every method on one model of each adapter kind (timm ViT, BERT) and on every decoder family; on the
#: sequence-classifier heads the methods that put hooks of the engine's own on the model (the Captum baselines)
#: and one relevance pass
#: the families of the mixture-of-experts, parallel-block, soft-capped and post-norm decoders, ModernBERT, EVA and
#: Swin (Swin: the methods its adapter does not refuse)
NEWER = (
    "qwen3_moe-causal",
    "qwen2_moe-causal",
    "mixtral-causal",
    "olmoe-causal",
    "gpt_oss-causal",
    "gpt_neox-causal",
    "phi-causal",
    "falcon-causal",
    "gemma2-causal",
    "olmo2-causal",
    "modernbert",
    "eva",
    "swin",
)
CASES = [
    (name, method)
    for name in (
        "vit",
        "bert",
        "llama-causal",
        "mistral-causal",
        "qwen2-causal",
        "qwen3-causal",
        "gemma3-causal",
        "phi3-causal",
        "gpt2-causal",
    )
    + NEWER
    for method in METHODS
    if name != "swin" or method not in SWIN_REFUSED
] + [(name, method) for name in ("llama-seq", "gpt2-seq") for method in CAPTUM_METHODS + ("attnlrp",)]


@pytest.mark.parametrize("name, method", CASES)
def test_every_method_leaves_a_hooked_model_untouched(name, method):
    build, points, inputs, new_inputs = MODELS[name]
    model = build()
    clean = copy.deepcopy(model)
    reference = explain(clean, inputs(), method=method, **quick(method))
    log: list = []
    _attach(model, points, log)
    state = _Untouched(model, clean, new_inputs(), log)
    first = explain(model, inputs(), method=method, **quick(method))
    state.check()
    _same(first, reference)  # no-op hooks: the clean model's explanation
    second = explain(model, inputs(), method=method, **quick(method))
    state.check()
    _same(second, first)


@pytest.mark.parametrize("method", CAPTUM_METHODS)
@pytest.mark.parametrize("where", ["embeddings", "head", "enable_input_require_grads"])
def test_one_user_hook_beside_the_baselines_embedding_hook(where, method):
    """The reported cases: one hook of the user's on the module the baseline hooks, or on the head."""
    model = make_decoder("llama")
    clean = copy.deepcopy(model)
    if where == "enable_input_require_grads":
        model.enable_input_require_grads()
    else:
        module = model.model.embed_tokens if where == "embeddings" else model.lm_head
        module.register_forward_hook(lambda m, args, out: None)
    state = _Untouched(model, clean, batch(rows(2, (4, 9, 6))), [])
    x = batch(rows(1, (5, 7)))
    first = explain(model, x, method=method, **quick(method))
    state.check()
    _same(explain(model, x, method=method, **quick(method)), first)
    state.check()


class _Boom(Exception):
    pass


def _raising_hook(after: int, error: type):
    """A forward hook that raises ``error`` at its call number ``after`` (0-based) and is a no-op otherwise."""
    calls = {"n": 0, "armed": True}

    def hook(module, args, out):
        calls["n"] += 1
        if calls["armed"] and calls["n"] == after + 1:
            raise error("raised by the user's hook")

    return hook, calls


#: model -> (the norm the raising hook is on, the projection it is on for AttnLRP)
RAISE_AT = {
    "llama-causal": ("model.layers.0.input_layernorm", "model.layers.0.self_attn.q_proj"),
    "bert": ("bert.embeddings.LayerNorm", "bert.encoder.layer.0.attention.self.query"),
}


@pytest.mark.parametrize(
    "name, method, error",
    [
        (name, method, _Boom)
        for name in ("llama-causal", "bert")
        for method in CAPTUM_METHODS + ("attnlrp", "token_ablation")
    ]
    + [("llama-causal", method, KeyboardInterrupt) for method in ("input_x_gradient", "occlusion")],
)
def test_a_call_that_raises_midway_leaves_the_model_untouched(name, method, error):
    """A user hook on a norm raises at the norm's second call of the explanation — Llama: inside the first
    evaluation of a Captum baseline, with the engine's hook on the embeddings; BERT (its embeddings' LayerNorm):
    while the baselines look for the word-embedding module, with the engine's hooks on every embedding
    (AttnLRP, which computes the norms from their weights: a hook on the first block's query projection, at its
    first call). The error reaches the caller, and the model is as before."""
    build, points, inputs, new_inputs = MODELS[name]
    model = build()
    clean = copy.deepcopy(model)
    log: list = []
    _attach(model, points, log)
    hook, calls = _raising_hook(after=0 if method == "attnlrp" else 1, error=error)
    model.get_submodule(RAISE_AT[name][method == "attnlrp"]).register_forward_hook(hook)
    calls["armed"] = False
    state = _Untouched(model, clean, new_inputs(), log)
    calls.update(n=0, armed=True)
    with pytest.raises(error, match="raised by the user's hook"):
        explain(model, inputs(), method=method, **quick(method))
    calls["armed"] = False
    state.check()


@pytest.mark.parametrize("method", ["integrated_gradients", "occlusion", "kernel_shap"])
@pytest.mark.parametrize(
    "baseline, match", [("blur", "baseline='blur' is for images"), (10**6, "outside the vocabulary")]
)
def test_a_bad_option_checked_late_leaves_the_model_untouched(method, baseline, match):
    """The reference input is checked after the baseline found (and hooked) the word embeddings."""
    build, points, inputs, new_inputs = MODELS["llama-causal"]
    model = build()
    clean = copy.deepcopy(model)
    log: list = []
    _attach(model, points, log)
    state = _Untouched(model, clean, new_inputs(), log)
    with pytest.raises(InputError, match=match):
        explain(model, inputs(), method=method, baseline=baseline, **quick(method))
    state.check()
