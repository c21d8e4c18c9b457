"""Projection / Similarity targets on headless encoders and SentenceTransformer pipelines (docs/METHODS.md §2h):
the replay is the model's own embedding, batch = each row alone, padding 0, CP-LRP conserves into the projection
on a constant-free variant, input × gradient = autograd through the model, the model untouched."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from embedding_models import (
    IMAGE,
    TEXT,
    images,
    inputs_for,
    make,
    sentence_transformer,
    st_batch,
    text_batch,
    without_additive_constants,
)
from untouched import assert_untouched, snapshot

from lrp_core import Projection, Similarity, explain
from lrp_core.adapters import get_adapter, with_target
from lrp_core.errors import InputError, UnsupportedModelError

FAMILIES = list(TEXT) + list(IMAGE)
METHODS = ("cp_lrp", "attnlrp", "lrp", "input_x_gradient", "transformer_attribution")


def _own(model, x, pooling):
    """The model's own embedding, read from its output here (not through the library)."""
    out = model(pixel_values=x) if isinstance(x, torch.Tensor) else model(**x)
    h = out.last_hidden_state
    pooled = getattr(out, "pooler_output", None)
    if pooling in (None, "pooler") and pooled is not None:
        return pooled
    if pooling == "mean":
        if isinstance(x, torch.Tensor):
            return h[:, 1:].mean(dim=1) if h.shape[1] == 17 else h[:, 2:].mean(dim=1)
        m = x["attention_mask"].to(h.dtype)[..., None]
        return (h * m).sum(1) / m.sum(1)
    return h[:, 0]


#: the tiny models with a pooler (dense + tanh on [CLS])
POOLERS = ("bert", "roberta", "mpnet", "vit", "deit")


def _poolings(family):
    return [None, "cls", "mean"] + (["pooler"] if family in POOLERS else [])


CASES = [(f, p) for f in FAMILIES for p in _poolings(f)]


@pytest.mark.parametrize("family,pooling", CASES)
def test_replay_is_the_models_own_embedding(family, pooling):
    model = make(family)
    x = inputs_for(family, model)
    v = torch.randn(32, dtype=torch.float64)
    with torch.no_grad():
        e = _own(model, x, pooling)
    exp = explain(model, x, method="cp_lrp", target=Projection(v, pooling))
    assert exp.logits.shape == (e.shape[0], 1)
    assert (exp.logits[:, 0] - e @ v).abs().max() <= 1e-10 * (e @ v).abs().max()
    ref = torch.randn(e.shape[0], 32, dtype=torch.float64)
    sim = explain(model, x, method="cp_lrp", target=Similarity(ref, pooling))
    assert sim.logits.shape == (e.shape[0], e.shape[0])
    assert (sim.logits.diagonal() - F.cosine_similarity(e, ref, dim=-1)).abs().max() <= 1e-12
    assert (sim.target == torch.arange(e.shape[0])).all(), "row b explains its own e_ref"


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", ["bert", "distilbert", "mpnet", "vit"])
def test_batch_equals_each_row_alone_and_padding_scores_zero(family, method):
    model = make(family)
    x = inputs_for(family, model)
    ref = torch.randn(32, dtype=torch.float64)
    exp = explain(model, x, method=method, target=Similarity(ref, "mean"))
    for i in range(exp.scores.shape[0]):
        if isinstance(x, torch.Tensor):
            one = explain(model, x[i : i + 1], method=method, target=Similarity(ref, "mean"))
            assert torch.allclose(exp.scores[i], one.scores[0], rtol=1e-8, atol=1e-12), method
            continue
        n = int(x["attention_mask"][i].sum())
        row = {k: v[i : i + 1, :n] for k, v in x.items()}
        one = explain(model, row, method=method, target=Similarity(ref, "mean"))
        assert torch.allclose(exp.scores[i, :n], one.scores[0], rtol=1e-8, atol=1e-12), method
        assert (exp.scores[i, n:] == 0).all(), "padding scores 0"


@pytest.mark.parametrize("family,pooling", CASES)
def test_cp_lrp_conserves_into_the_projection_without_additive_constants(family, pooling):
    """Biases, LayerNorm β, positions, token types and prefix tokens 0: the replay is linear in the input under
    CP-LRP, so the token scores sum to ⟨e, v⟩, and to cos(e, e_ref) (the norm a constant)."""
    model = without_additive_constants(make(family, seed=3))
    x = inputs_for(family, model)
    # the identity rule f(x) / (x + 1e-10) of the pooler's tanh and of the ViTs' GELU: its stabiliser costs up to
    # ~1e-9 relative (as in the other vision families' tests); text without a pooler: 1e-10
    pooler = pooling == "pooler" or (pooling is None and family in POOLERS)
    tol = 1e-8 if pooler or family in IMAGE else 1e-10
    for target in (
        Projection(torch.randn(32, dtype=torch.float64), pooling),
        Similarity(torch.randn(32, dtype=torch.float64), pooling),
    ):
        exp = explain(model, x, method="cp_lrp", target=target)
        y = exp.conservation.output
        assert (exp.scores.sum(dim=1) - y).abs().max() <= tol * y.abs().max() + 1e-13, (family, target)


@pytest.mark.parametrize("family", ["bert", "vit"])
def test_input_x_gradient_is_autograd_through_the_model(family):
    """The plain gradient of the true cosine (not the detached norm), through the model's own forward."""
    model = make(family)
    x = inputs_for(family, model)
    ref = torch.randn(32, dtype=torch.float64)
    exp = explain(model, x, method="input_x_gradient", target=Similarity(ref))
    if isinstance(x, torch.Tensor):
        px = x.clone().requires_grad_(True)
        y = F.cosine_similarity(model(pixel_values=px).pooler_output, ref[None], dim=-1)
        (g,) = torch.autograd.grad(y.sum(), px)
        assert torch.allclose(exp.pixels, (px * g).sum(1), rtol=1e-8, atol=1e-12)
        return
    words = model.embeddings.word_embeddings(x["input_ids"]).detach().requires_grad_(True)
    y = F.cosine_similarity(model(inputs_embeds=words, attention_mask=x["attention_mask"]).pooler_output, ref[None])
    (g,) = torch.autograd.grad(y.sum(), words)
    expected = (words * g).sum(-1) * x["attention_mask"]
    assert torch.allclose(exp.scores, expected, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("family", ["bert", "roberta", "vit"])
def test_model_is_untouched(family):
    model = make(family).train()
    before = snapshot(model)
    explain(model, inputs_for(family, model), method="lrp", target=Projection(torch.randn(32).double(), "mean"))
    explain(model, inputs_for(family, model), method="cp_lrp", target=Similarity(torch.randn(32).double()))
    assert_untouched(before, snapshot(model))


def test_target_vectors_are_checked():
    model = make("bert")
    x = text_batch(model)
    with pytest.raises(InputError, match="width 5"):
        explain(model, x, method="cp_lrp", target=Projection(torch.randn(5).double()))
    with pytest.raises(InputError, match="2 vectors for a batch of 3"):
        explain(model, x, method="cp_lrp", target=Projection(torch.randn(2, 32).double()))
    with pytest.raises(InputError, match="float vector"):
        Projection(torch.arange(3))
    with pytest.raises(InputError, match="zero vector"):
        Similarity(torch.zeros(32))
    with pytest.raises(InputError, match="pooling"):
        Projection(torch.randn(32), pooling="max")
    with pytest.raises(InputError, match="no pooler"):
        explain(make("bert_no_pooler"), x, method="cp_lrp", target=Projection(torch.randn(32).double(), "pooler"))


def test_a_headless_model_asks_for_a_projection():
    model = make("bert")
    with pytest.raises(InputError, match="Projection"):
        explain(model, text_batch(model), method="cp_lrp")


def test_a_classifier_projects_a_named_pooling_and_refuses_its_own():
    """On a classifier the target applies to a named pooling of the final hidden states (its head unused)."""
    from embedding_models import BERT_LIKE
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    clf = BertForSequenceClassification(BertConfig(num_labels=3, **BERT_LIKE)).double().eval()
    x = text_batch(clf)
    v = torch.randn(32, dtype=torch.float64)
    with pytest.raises(InputError, match="classification head"):
        explain(clf, x, method="cp_lrp", target=Projection(v))
    exp = explain(clf, x, method="cp_lrp", target=Projection(v, "cls"))
    with torch.no_grad():
        e = clf.bert(**x).last_hidden_state[:, 0]
    assert torch.allclose(exp.logits[:, 0], e @ v, rtol=1e-10)
    assert get_adapter(clf).num_classes == 3 and with_target(get_adapter(clf), Projection(v, "cls")).num_classes == 1


# ---------------------------------------------------------------- SentenceTransformer pipelines
@pytest.fixture(scope="module")
def st_mean(tmp_path_factory):
    pytest.importorskip("sentence_transformers")
    return sentence_transformer(tmp_path_factory.mktemp("st_mean"))


def test_sentence_transformer_replay_is_its_own_sentence_embedding(st_mean):
    x = st_batch(st_mean)
    with torch.no_grad():
        e = st_mean.encode(["a cat sat on the mat", "dogs run", "the cat and the dog"], convert_to_tensor=True)
    v = torch.randn(32, dtype=torch.float64)
    exp = explain(st_mean, x, method="cp_lrp", target=Projection(v))
    assert torch.allclose(exp.logits[:, 0], e.double() @ v, rtol=1e-10, atol=1e-12), "Pooling mean + Normalize"
    sim = explain(st_mean, x, method="cp_lrp", target=Similarity(e[1]))
    assert torch.allclose(sim.logits[:, 0], e.double() @ e[1].double(), rtol=1e-10, atol=1e-12)
    a = get_adapter(st_mean)
    assert a.sentence is st_mean and a.sentence_pooling == "mean" and a.normalised


def test_sentence_transformer_batch_equals_alone_and_conserves(st_mean, tmp_path):
    x = st_batch(st_mean)
    ref = torch.randn(32, dtype=torch.float64)
    exp = explain(st_mean, x, method="cp_lrp", target=Similarity(ref))
    for i in range(3):
        n = int(x["attention_mask"][i].sum())
        one = explain(st_mean, {k: v[i : i + 1, :n] for k, v in x.items()}, method="cp_lrp", target=Similarity(ref))
        assert torch.allclose(exp.scores[i, :n], one.scores[0], rtol=1e-8, atol=1e-12)
        assert (exp.scores[i, n:] == 0).all()
    free = sentence_transformer(tmp_path, seed=4)
    without_additive_constants(free)
    c = explain(free, x, method="cp_lrp", target=Similarity(ref))
    assert (c.scores.sum(1) - c.conservation.output).abs().max() <= 1e-10


def test_sentence_transformer_cls_pooling_without_normalize(tmp_path):
    pytest.importorskip("sentence_transformers")
    st = sentence_transformer(tmp_path, pooling="cls", normalize=False)
    x = st_batch(st)
    with torch.no_grad():
        e = st(dict(x))["sentence_embedding"]
    v = torch.randn(32, dtype=torch.float64)
    exp = explain(st, x, method="attnlrp", target=Projection(v))
    assert torch.allclose(exp.logits[:, 0], e @ v, rtol=1e-10)
    assert not get_adapter(st).normalised


@pytest.mark.parametrize("pooling", ["max", "weightedmean", "lasttoken"])
def test_sentence_transformer_other_poolings_are_refused_by_name(tmp_path, pooling):
    pytest.importorskip("sentence_transformers")
    with pytest.raises(UnsupportedModelError, match=f"pooling mode '{pooling}'"):
        get_adapter(sentence_transformer(tmp_path, pooling=pooling))


def test_sentence_transformer_with_a_dense_module_is_refused(tmp_path):
    pytest.importorskip("sentence_transformers")
    with pytest.raises(UnsupportedModelError, match="Dense"):
        get_adapter(sentence_transformer(tmp_path, dense=True))


def test_sentence_transformer_is_untouched(st_mean):
    st_mean.train()
    before = snapshot(st_mean)
    explain(st_mean, st_batch(st_mean), method="lrp", target=Similarity(torch.randn(32).double()))
    assert_untouched(before, snapshot(st_mean))
    st_mean.eval()


def test_images_are_explained_on_the_patch_grid():
    model = make("vit")
    exp = explain(model, images(2), method="cp_lrp", target=Projection(torch.randn(32).double()))
    assert exp.scores.shape == (2, 16) and exp.pixels.shape == (2, 32, 32)


# ---------------------------------------------------------------- CLIP towers alone
def _clip_towers(seed: int = 0):
    from transformers import (
        CLIPTextConfig,
        CLIPTextModelWithProjection,
        CLIPVisionConfig,
        CLIPVisionModelWithProjection,
    )

    torch.manual_seed(seed)
    sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, projection_dim=16)
    vision = CLIPVisionModelWithProjection(CLIPVisionConfig(image_size=32, patch_size=8, **sizes))
    text = CLIPTextModelWithProjection(
        CLIPTextConfig(
            vocab_size=60, max_position_embeddings=20, eos_token_id=59, bos_token_id=58, pad_token_id=1, **sizes
        )
    )
    prompts = {
        "input_ids": torch.tensor([[58, 5, 6, 7, 59], [58, 8, 9, 59, 1], [58, 10, 59, 1, 1]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]),
    }
    return vision.double().eval(), text.double().eval(), prompts


def test_clip_towers_replay_their_own_embeds_and_conserve_without_constants():
    vision, text, prompts = _clip_towers()
    v = torch.randn(16, dtype=torch.float64)
    x = images()
    with torch.no_grad():
        img, txt = vision(pixel_values=x).image_embeds, text(**prompts).text_embeds
    assert torch.allclose(explain(vision, x, method="cp_lrp", target=Projection(v)).logits[:, 0], img @ v, rtol=1e-10)
    sim = explain(text, prompts, method="attnlrp", target=Similarity(v))
    assert torch.allclose(sim.logits[:, 0], F.cosine_similarity(txt, v[None]), rtol=1e-10)
    assert (sim.scores[prompts["attention_mask"] == 0] == 0).all(), "padding scores 0"
    n = 3
    one = explain(text, {k: t[2:, :n] for k, t in prompts.items()}, method="attnlrp", target=Similarity(v))
    assert torch.allclose(sim.scores[2, :n], one.scores[0], rtol=1e-8, atol=1e-12), "batch = alone"
    for model, inputs in ((vision, x), (text, prompts)):
        free = without_additive_constants(model)
        with torch.no_grad():
            free.vision_model.embeddings.class_embedding.zero_() if hasattr(free, "vision_model") else None
        exp = explain(free, inputs, method="cp_lrp", target=Similarity(v))
        y = exp.conservation.output
        assert (exp.scores.sum(1) - y).abs().max() <= 1e-8 * y.abs().max(), type(model).__name__


@pytest.mark.parametrize("pool", ["token", "avg"])
def test_a_timm_vit_without_a_head_projects_its_pooled_features(pool):
    """timm with num_classes=0: e(x) is its forward's pooled features ([CLS] or the average), by the same readout."""
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = (
        VisionTransformer(
            img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=0, global_pool=pool
        )
        .double()
        .eval()
    )
    v = torch.randn(32, dtype=torch.float64)
    exp = explain(model, images(2), method="cp_lrp", target=Projection(v))
    with torch.no_grad():
        assert torch.allclose(exp.logits[:, 0], model(images(2)) @ v, rtol=1e-10)
