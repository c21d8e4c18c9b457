"""Decoders the engine cannot explain are refused with their reason, and no decoder reaches the BERT adapter.

Models are built on the ``meta`` device (no weights are allocated): dispatch reads only the class and the
config, so each case takes milliseconds. One refusal also goes through ``explain`` on a real tiny model.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import transformers as T

from lrp_core import explain
from lrp_core.adapters import ADAPTERS, BERT_FAMILY, get_adapter
from lrp_core.errors import UnsupportedModelError

SMALL = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    intermediate_size=64,
)
VISION = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=16
)


def _meta(cls_name: str, config) -> torch.nn.Module:
    with torch.device("meta"):
        return getattr(T, cls_name)(config)


#: mixture-of-experts decoders no adapter replays (Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE have adapters:
#: tests/adapters/test_decoders_moe.py; GPT-OSS's causal LM and sequence classifier: test_decoders_gpt_oss.py)
MOE = {
    "GPT-OSS token classifier": lambda: _meta(
        "GptOssForTokenClassification", T.GptOssConfig(**SMALL, num_local_experts=4, head_dim=16)
    ),
    "DeepSeek-V3": lambda: _meta(
        "DeepseekV3ForCausalLM",
        T.DeepseekV3Config(
            **SMALL, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, first_k_dense_replace=0
        ),
    ),
}
SOFT_CAPPED = {  # Gemma 2 itself is replayed (tests/adapters/test_decoders_gemma2.py)
    "Gemma 3 with soft-capping switched on": lambda: _meta(
        "Gemma3ForCausalLM", T.Gemma3TextConfig(**SMALL, head_dim=16, final_logit_softcapping=30.0)
    ),
}
MULTIMODAL = {  # LLaVA, SmolVLM / Idefics3, Qwen2(.5)-VL, Gemma 3 with images and PaliGemma are explained
    "LLaVA-NeXT": lambda: _meta(
        "LlavaNextForConditionalGeneration",
        T.LlavaNextConfig(vision_config=T.CLIPVisionConfig(**VISION), text_config=T.LlamaConfig(**SMALL)),
    ),
}
REASONS = [
    (MOE, ("mixture-of-experts", "Qwen3-MoE", "dense decoder")),
    (SOFT_CAPPED, ("soft-capping", "tanh", "Gemma 3")),
    (MULTIMODAL, ("multimodal", "vision tower", "language model alone")),
]
CASES = [(name, build, words) for table, words in REASONS for name, build in table.items()]


@pytest.mark.parametrize("name,build,words", CASES, ids=[c[0] for c in CASES])
def test_refused_decoders_say_why_and_what_is_supported(name, build, words):
    with pytest.raises(UnsupportedModelError) as err:
        get_adapter(build())
    message = str(err.value)
    for w in words:
        assert w in message, (name, w, message)
    assert "Supported:" in message and "BERT-family encoder (expected" not in message


def test_a_refusal_reaches_the_caller_of_explain_before_any_work():
    torch.manual_seed(0)
    model = T.DeepseekV3ForCausalLM(
        T.DeepseekV3Config(
            **SMALL, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, first_k_dense_replace=0
        )
    ).eval()
    with pytest.raises(UnsupportedModelError, match="mixture-of-experts"):
        explain(model, {"input_ids": torch.tensor([[1, 2, 3]])}, method="attnlrp")


def test_dense_configs_are_not_taken_for_refused_families():
    """The refusal tests look at what makes a model unexplainable, not at its name: a dense Gemma 3 text model,
    a Llama, CLIP (vision config, but no generation), LLaVA, Qwen2-VL, Gemma 3 with images and PaliGemma 2
    (soft-capped Gemma 2 inside; explained) pass every refusal row."""
    from lrp_core.adapters import REFUSED

    models = [
        _meta("Gemma3ForCausalLM", T.Gemma3TextConfig(**SMALL, head_dim=16)),
        _meta("LlamaForCausalLM", T.LlamaConfig(**SMALL)),
        _meta(
            "CLIPModel",
            T.CLIPConfig(
                text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2),
                vision_config=VISION,
            ),
        ),
        _meta(
            "LlavaForConditionalGeneration",
            T.LlavaConfig(vision_config=T.CLIPVisionConfig(**VISION), text_config=T.LlamaConfig(**SMALL)),
        ),
        _meta(
            "Qwen2VLForConditionalGeneration",
            T.Qwen2VLConfig(
                text_config=dict(SMALL), vision_config=dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2)
            ),
        ),
        _meta(
            "Gemma3ForConditionalGeneration",
            T.Gemma3Config(
                vision_config=T.SiglipVisionConfig(**VISION),
                text_config=T.Gemma3TextConfig(**SMALL, head_dim=16),
                mm_tokens_per_image=4,
            ),
        ),
        _meta(
            "PaliGemmaForConditionalGeneration",
            T.PaliGemmaConfig(
                vision_config=T.SiglipVisionConfig(**VISION),
                text_config=T.Gemma2Config(**SMALL, head_dim=16),
                projection_dim=32,
            ),
        ),
    ]
    for model in models:
        hits = [family for family, recognise, _ in REFUSED if recognise(model)]
        assert hits == [], (type(model).__name__, hits)


# ---------------------------------------------------------------- the BERT row recognises BERT-family encoders only
def _bert_row():
    (row,) = [recognise for family, recognise, _ in ADAPTERS if family.startswith("Hugging Face BertFor")]
    return row


def test_the_bert_row_takes_exactly_the_bert_family_among_all_sequence_classifiers():
    """Every ``*ForSequenceClassification`` transformers registers, as (class name, model type): the BERT row
    takes it iff its model type is a BERT-family encoder (decoders, BigBird, LayoutLM, ... are not)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES as SEQ

    row = _bert_row()
    taken = set()
    for model_type, class_name in SEQ.items():
        fake = type(class_name, (torch.nn.Module,), {})()
        fake.config = SimpleNamespace(model_type=model_type)
        if row(fake):
            taken.add(model_type)
    assert taken == set(BERT_FAMILY)
    assert {"gpt2", "llama", "qwen2", "mistral", "phi3", "gemma3_text", "big_bird", "layoutlm"}.isdisjoint(taken)


DECODER_CLASSIFIERS = [
    (
        "GPT2ForSequenceClassification",
        lambda: T.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, pad_token_id=0),
    ),
    (
        "GPTNeoForSequenceClassification",
        lambda: T.GPTNeoConfig(
            vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, attention_types=[[["global"], 2]]
        ),
    ),
    (
        "OPTForSequenceClassification",
        lambda: T.OPTConfig(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            ffn_dim=64,
            word_embed_proj_dim=32,
        ),
    ),
    ("LlamaForSequenceClassification", lambda: T.LlamaConfig(**SMALL, pad_token_id=0)),
    ("Qwen2ForSequenceClassification", lambda: T.Qwen2Config(**SMALL, pad_token_id=0)),
    ("Phi3ForSequenceClassification", lambda: T.Phi3Config(**SMALL, pad_token_id=0)),
    ("Gemma3TextForSequenceClassification", lambda: T.Gemma3TextConfig(**SMALL, head_dim=16, pad_token_id=0)),
]


@pytest.mark.parametrize("class_name,config", DECODER_CLASSIFIERS, ids=[c[0] for c in DECODER_CLASSIFIERS])
def test_no_decoder_classifier_reaches_the_bert_adapter(class_name, config):
    """Before: GPT2ForSequenceClassification went to the BERT adapter and failed with 'not a BERT-family encoder'.
    Now a decoder either has its own adapter or is refused naming what is supported."""
    from lrp_core.adapters.bert import BertAdapter

    model = _meta(class_name, config())
    try:
        adapter = get_adapter(model)
    except UnsupportedModelError as err:
        assert "BERT-family encoder (expected" not in str(err) and "Supported:" in str(err)
    else:
        assert not isinstance(adapter, BertAdapter)


@pytest.mark.parametrize("family", ["Camembert", "Data2VecText"])
def test_the_bert_family_members_named_only_now_replay_exactly(family):
    """CamemBERT and Data2Vec-text (RoBERTa layouts under their own model types) are in the BERT row by name:
    the replay gives the model's logits, and the longest text accepted is the RoBERTa one (positions start after
    the padding index)."""
    torch.manual_seed(0)
    config = getattr(T, f"{family}Config")(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=42,
        num_labels=3,
        pad_token_id=1,
    )
    model = getattr(T, f"{family}ForSequenceClassification")(config).eval()
    batch = {
        "input_ids": torch.tensor([[0, 5, 6, 7, 2], [0, 8, 2, 1, 1]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
    }
    adapter = get_adapter(model)
    with torch.no_grad():
        assert torch.allclose(adapter.forward(adapter.check_inputs(batch)).logits, model(**batch).logits, atol=1e-6)
    assert adapter.max_length == 42 - 2
