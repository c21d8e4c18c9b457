"""Task heads (docs/METHODS.md §2h): token classification, question answering, masked LM and multiple choice on
the BERT family, token classification and question answering on decoders, MLP classifier heads.

Each head is checked for what every family is: the replay's logit is the model's own output at that target and
position; a batch is each row alone (float64); padding scores 0 (right and left padding); CP-LRP conserves on a
variant without additive constants; input × gradient is autograd through the model's own forward; the model is
untouched; a missing or invalid position or target is an InputError naming it.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from conftest import _perturb_norms
from text_families import BERT_LIKE, rel_err
from untouched import assert_untouched, snapshot

from lrp_core import METHODS, explain
from lrp_core.errors import InputError, UnsupportedModelError

ENCODERS = ("bert", "roberta", "distilbert", "electra", "albert", "mpnet", "modernbert")
DECODERS = ("llama", "qwen2")
#: family -> (class-name prefix, config class, config keywords)
CONFIGS = {
    "bert": ("Bert", "BertConfig", dict(BERT_LIKE)),
    "roberta": ("Roberta", "RobertaConfig", dict(BERT_LIKE, pad_token_id=1, type_vocab_size=1)),
    "electra": ("Electra", "ElectraConfig", dict(BERT_LIKE, embedding_size=16)),
    "albert": ("Albert", "AlbertConfig", dict(BERT_LIKE, embedding_size=16, num_hidden_layers=3)),
    "mpnet": ("MPNet", "MPNetConfig", dict(BERT_LIKE)),
    "distilbert": (
        "DistilBert",
        "DistilBertConfig",
        dict(vocab_size=60, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=40),
    ),
    "llama": (
        "Llama",
        "LlamaConfig",
        dict(
            vocab_size=60,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            pad_token_id=0,
        ),
    ),
}
CONFIGS["qwen2"] = ("Qwen2", "Qwen2Config", CONFIGS["llama"][2])
CONFIGS["modernbert"] = (
    "ModernBert",
    "ModernBertConfig",
    dict(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=48,
        global_attn_every_n_layers=3,
        local_attention=4,  # two sliding-window layers (±2 tokens: shorter than the texts)
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        max_position_embeddings=40,
    ),
)
HEADS = {
    "token": "ForTokenClassification",
    "qa": "ForQuestionAnswering",
    "mlm": "ForMaskedLM",
    "choice": "ForMultipleChoice",
}
CASES = [(f, h) for f in ENCODERS for h in HEADS] + [(f, h) for f in DECODERS for h in ("token", "qa")]


def make(family: str, head: str, seed: int = 0) -> torch.nn.Module:
    """A tiny random ``<Family><Head>`` in eval mode, float64, norms perturbed."""
    prefix, config, kw = CONFIGS[family]
    kw = dict(kw, num_labels={"token": 3, "qa": 2}.get(head, 2))
    torch.manual_seed(seed)
    model = getattr(transformers, prefix + HEADS[head])(getattr(transformers, config)(**kw)).eval()
    _perturb_norms(model, seed)
    return model.double()


def _pad(model: torch.nn.Module) -> int:
    pad = model.config.pad_token_id
    return 0 if pad is None else int(pad)


ROWS = [[5, 11, 12, 13, 14, 15, 6], [5, 21, 22, 6], [5, 31, 32, 33, 34, 6]]
#: the position each row is read at (a real token of each row)
AT = [4, 2, 3]


def batch(model: torch.nn.Module, head: str, side: str = "right") -> dict:
    """Three texts of lengths 7, 4, 6 padded on ``side``; a multiple-choice model: two samples of three choices."""
    pad = _pad(model)
    rows = [[[5, 11, 12, 6], [5, 21, 22, 23, 24, 6], [5, 7, 6]], [[5, 31, 32, 6], [5, 41, 6], [5, 9, 8, 9, 8, 6]]]
    flat = [r for sample in rows for r in sample] if head == "choice" else ROWS
    T = max(map(len, flat))
    fill = (lambda r: r + [pad] * (T - len(r))) if side == "right" else (lambda r: [pad] * (T - len(r)) + r)
    ids = torch.tensor([fill(r) for r in flat])
    mask = torch.tensor([fill([1] * len(r)) for r in flat]) if side == "right" else None
    if mask is None:
        mask = torch.tensor([[0] * (T - len(r)) + [1] * len(r) for r in flat])
    if head == "choice":
        return {"input_ids": ids.view(2, 3, T), "attention_mask": mask.view(2, 3, T)}
    return {"input_ids": ids, "attention_mask": mask}


def positions(b: dict, side: str = "right") -> list:
    """AT counted from each row's first real token."""
    first = (b["attention_mask"] == 0).long().cumprod(dim=1).sum(dim=1) if side == "left" else torch.zeros(3)
    return [int(f) + p for f, p in zip(first.tolist(), AT)]


def call(head: str, b: dict, side: str = "right") -> dict:
    """The keywords of one explained prediction per row: a class at AT, the end logit at AT, entry 7 at AT."""
    if head == "choice":
        return {}
    at = positions(b, side)
    return {"token": dict(target=2, position=at), "qa": dict(target="end", position=at)}.get(
        head, dict(target=7, position=at)
    )


def own(model: torch.nn.Module, head: str, b: dict, kw: dict) -> torch.Tensor:
    """The model's own output for the explained quantity: (B,) at the read positions, or (B, C) the choices."""
    with torch.no_grad():
        out = model(**b)
    if head == "choice":
        return out.logits
    rows = torch.arange(b["input_ids"].shape[0])
    p = torch.tensor(kw["position"])
    if head == "qa":
        return out.end_logits[rows, p]
    return out.logits[rows, p, kw["target"]]


def explained(exp, head: str) -> torch.Tensor:
    """The explained logit of each row from an Explanation (QA: exp.logits is it; MC: the chosen choice's)."""
    if head == "qa":
        return exp.logits
    return exp.logits.gather(1, exp.target[:, None]).squeeze(1)


# ---------------------------------------------------------------- the replay is the model at the target
@pytest.mark.parametrize("family,head", CASES)
def test_replay_is_the_model_output_at_the_target_and_position(family, head):
    model = make(family, head)
    b = batch(model, head)
    kw = call(head, b)
    exp = explain(model, b, method="cp_lrp", **kw)
    expected = own(model, head, b, kw)
    if head == "choice":
        assert exp.logits.shape == (2, 3) and exp.scores.shape == b["input_ids"].shape
        assert rel_err(exp.logits, expected) < 1e-10
        assert torch.equal(exp.target, expected.argmax(dim=1))  # default: the top choice
    else:
        got = exp.logits if head == "qa" else exp.logits[:, kw["target"]]
        assert exp.logits.shape == ((3,) if head == "qa" else (3, exp.logits.shape[1]))
        assert rel_err(got, expected) < 1e-10


# ---------------------------------------------------------------- batch = each row alone; padding 0 (both sides)
@pytest.mark.parametrize("method", ["cp_lrp", "transformer_attribution"])
@pytest.mark.parametrize("family,head", CASES)
def test_batch_equals_each_row_alone(family, head, method):
    model = make(family, head)
    b = batch(model, head)
    kw = call(head, b)
    exp = explain(model, b, method=method, **kw)
    if head == "choice":  # each sample's chosen row, alone, as a sample of one choice
        for i in range(2):
            k = int(exp.target[i])
            mask = b["attention_mask"][i, k]
            n = int(mask.sum())
            one = explain(model, {key: v[i : i + 1, k : k + 1, :n] for key, v in b.items()}, method=method)
            assert rel_err(exp.scores[i, k, :n], one.scores[0, 0]) < 1e-8
            assert (exp.scores[i, k, n:] == 0).all()
        return
    for i in range(3):
        n = int(b["attention_mask"][i].sum())
        alone = {key: v[i : i + 1, :n] for key, v in b.items()}
        one = explain(model, alone, method=method, **{**kw, "position": kw["position"][i]})
        assert rel_err(exp.scores[i, :n], one.scores[0]) < 1e-8, (family, head, method)
        assert (exp.scores[i, n:] == 0).all(), "padding scores 0"


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("family,head", CASES)
def test_padding_scores_zero_and_the_logit_is_the_models(family, head, side):
    if (family, head, side) == ("modernbert", "choice", "left"):
        pytest.skip("ModernBERT's [CLS] pooling refuses a left-padded row (test_text_families)")
    model = make(family, head)
    b = batch(model, head, side)
    kw = call(head, b, side)
    exp = explain(model, b, method="attnlrp", **kw)
    assert (exp.scores[b["attention_mask"] == 0] == 0).all()
    assert torch.isfinite(exp.scores).all()
    got = exp.logits if head in ("qa", "choice") else exp.logits[:, kw["target"]]
    if family in DECODERS and side == "left":  # each row as the model computes it alone (its RMSNorm rounds in
        expected = torch.cat([_alone(model, head, b, kw, i) for i in range(3)])  # float32: padded rows differ)
    else:
        expected = own(model, head, b, kw)
    assert rel_err(got, expected) < 1e-10


def _alone(model: torch.nn.Module, head: str, b: dict, kw: dict, i: int) -> torch.Tensor:
    """The model's own output for row i without its padding (a decoder: its read position shifted with it)."""
    real = b["attention_mask"][i] == 1
    first = int(torch.nonzero(real)[0])
    row = {k: v[i : i + 1, real] for k, v in b.items()}
    return own(model, head, row, {**kw, "position": [kw["position"][i] - first]})


# ---------------------------------------------------------------- every method on every head
@pytest.mark.parametrize("family,head", [("bert", h) for h in HEADS] + [("llama", "token"), ("qwen2", "qa")])
def test_every_method_runs_on_every_head_and_leaves_the_model_untouched(family, head):
    model = make(family, head).float()
    model.train()  # an unusual mode must survive too
    b = batch(model, head)
    kw = call(head, b)
    before = snapshot(model)
    for method in METHODS:
        if method == "pa_lrp" and family not in DECODERS:
            continue  # position-aware LRP: rotary models only (refused elsewhere, as for the classifiers)
        exp = explain(model, b, method=method, **kw)
        assert exp.scores.shape == b["input_ids"].shape and torch.isfinite(exp.scores).all(), method
        assert (exp.scores[b["attention_mask"] == 0] == 0).all(), method
        assert_untouched(before, snapshot(model))


# ---------------------------------------------------------------- conservation and input × gradient
def _without_additive_constants(model: torch.nn.Module) -> torch.nn.Module:
    """Every bias (LayerNorm β included) and the position and token-type tables set to 0."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "position_embeddings" in name or "token_type_embeddings" in name:
                p.zero_()
    return model


@pytest.mark.parametrize("family,head", CASES)
def test_cp_lrp_conserves_without_additive_constants(family, head):
    """Σ scores = the explained logit (float64): up to the identity rule's 1e-10 stabiliser at each GELU / tanh
    unit (measured ≤ 2e-11 absolute on these models, as for the ViT) and, on decoders, their float32 RMSNorm."""
    model = _without_additive_constants(make(family, head))
    b = batch(model, head)
    exp = explain(model, b, method="cp_lrp", **call(head, b))
    assert_conserves(exp.scores.sum(dim=(-2, -1) if head == "choice" else -1), explained(exp, head), family)


def assert_conserves(total: torch.Tensor, y: torch.Tensor, family: str) -> None:
    """|Σ R − y| ≤ 1e-8 |y| + 1e-9 (the stabiliser's absolute share); decoders: 1e-6 relative (their RMSNorm)."""
    tol = 1e-6 * y.abs() if family in DECODERS else 1e-8 * y.abs() + 1e-9
    assert ((total - y).abs() <= tol).all(), (total - y).abs().max()
    assert (y.abs() > 1e-4).all()  # a logit well above the tolerance


def _own_input_x_gradient(model: torch.nn.Module, head: str, b: dict, kw: dict, target: torch.Tensor):
    """Σ_channels e ⊙ ∂y/∂e through the model's own forward, e its word-embedding output (a hook hands the model a
    leaf in its place)."""
    emb = model.get_input_embeddings()
    with torch.no_grad():
        e = emb(b["input_ids"].flatten(0, -2)).detach().requires_grad_(True)  # (B·C, T, E): the rows the model runs
    handle = emb.register_forward_hook(lambda m, a, out: e)
    try:
        out = model(**b)
    finally:
        handle.remove()
    if head == "choice":
        y = out.logits.gather(1, target[:, None]).sum()
    else:
        rows, p = torch.arange(3), torch.tensor(kw["position"])
        y = (out.end_logits[rows, p] if head == "qa" else out.logits[rows, p, kw["target"]]).sum()
    (g,) = torch.autograd.grad(y, e)
    return (e * g).sum(-1).detach()


@pytest.mark.parametrize("family,head", CASES)
def test_input_x_gradient_is_autograd_through_the_model(family, head):
    model = make(family, head)
    b = batch(model, head)
    kw = call(head, b)
    exp = explain(model, b, method="input_x_gradient", **kw)
    expected = _own_input_x_gradient(model, head, b, kw, exp.target)
    assert rel_err(exp.scores, expected.view(exp.scores.shape)) < 1e-9


# ---------------------------------------------------------------- multiple choice
def test_multiple_choice_scores_the_chosen_choice_only():
    model = make("bert", "choice")
    b = batch(model, "choice")
    exp = explain(model, b, method="cp_lrp", target=[1, 2])
    assert exp.target.tolist() == [1, 2]
    for i, k in enumerate([1, 2]):
        others = [c for c in range(3) if c != k]
        assert (exp.scores[i, others] == 0).all()
        real = b["attention_mask"][i, k] == 1
        assert (exp.scores[i, k][real] != 0).any()


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("family,head", [("bert", "token"), ("distilbert", "mlm"), ("llama", "token")])
def test_a_per_token_head_needs_a_position(family, head):
    model = make(family, head)
    b = batch(model, head)
    with pytest.raises(InputError, match="position"):
        explain(model, b, method="cp_lrp", target=1)
    with pytest.raises(InputError, match="position"):  # row 1 has 4 tokens: 5 is padding
        explain(model, b, method="cp_lrp", target=1, position=5)
    with pytest.raises(InputError, match="position"):
        explain(model, b, method="cp_lrp", target=1, position=[1, 2])  # two positions for three rows


@pytest.mark.parametrize("family", ["roberta", "qwen2"])
def test_question_answering_targets_and_default_position(family):
    model = make(family, "qa")
    b = batch(model, "qa")
    with pytest.raises(InputError, match="target"):
        explain(model, b, method="cp_lrp", target="middle")
    with pytest.raises(InputError, match="target"):
        explain(model, b, method="cp_lrp", target=2)
    exp = explain(model, b, method="cp_lrp", target="start")  # no position: the argmax of the start logit
    with torch.no_grad():
        start = model(**b).start_logits.masked_fill(b["attention_mask"] == 0, float("-inf"))
    assert rel_err(exp.logits, start.max(dim=1).values) < 1e-10
    assert exp.target.tolist() == [0, 0, 0]


def test_choice_and_vocabulary_targets_out_of_range_are_refused():
    model = make("electra", "choice")
    with pytest.raises(InputError, match="target"):
        explain(model, batch(model, "choice"), method="cp_lrp", target=3)
    with pytest.raises(InputError, match="input_ids"):
        explain(model, batch(make("bert", "token"), "token"), method="cp_lrp")  # (B, T): a choice model needs (B, C, T)
    mlm = make("bert", "mlm")
    with pytest.raises(InputError, match="target"):
        explain(mlm, batch(mlm, "mlm"), method="cp_lrp", target=60, position=1)


# ---------------------------------------------------------------- MLP classifier heads
def _mlp(d: int, classes: int, norm: bool = True) -> torch.nn.Sequential:
    layers = [torch.nn.Linear(d, 24), torch.nn.ReLU(), torch.nn.Dropout(0.2)]
    layers += [torch.nn.LayerNorm(24)] if norm else []
    return torch.nn.Sequential(*layers, torch.nn.GELU(), torch.nn.Linear(24, classes))


def _with_mlp_head(kind: str) -> torch.nn.Module:
    """A BERT / Llama sequence classifier, or a BERT token classifier, whose classifier is an MLP."""
    torch.manual_seed(3)
    if kind == "llama":
        model = transformers.LlamaForSequenceClassification(
            transformers.LlamaConfig(**dict(CONFIGS["llama"][2], num_labels=3))
        )
        model.score = _mlp(32, 3)
    else:
        cls = transformers.BertForSequenceClassification if kind == "bert" else transformers.BertForTokenClassification
        model = cls(transformers.BertConfig(**dict(BERT_LIKE)))
        model.classifier = _mlp(32, 3)
    _perturb_norms(model, 3)
    return model.eval().double()


@pytest.mark.parametrize("kind", ["bert", "bert_token", "llama"])
def test_mlp_heads_are_replayed_exactly(kind):
    model = _with_mlp_head(kind)
    b = {"input_ids": torch.tensor([ROWS[0], ROWS[2] + [0]]), "attention_mask": torch.tensor([[1] * 7, [1] * 6 + [0]])}
    kw = dict(position=[3, 2]) if kind == "bert_token" else {}
    with torch.no_grad():
        out = model(**b).logits
    own_logits = out[torch.arange(2), torch.tensor([3, 2])] if kind == "bert_token" else out
    for method in ("cp_lrp", "lrp", "integrated_gradients"):
        exp = explain(model, b, method=method, **kw)
        assert rel_err(exp.logits, own_logits) < 1e-10
        one = explain(model, {k: v[1:, :6] for k, v in b.items()}, method=method, **({"position": 2} if kw else {}))
        assert rel_err(exp.scores[1, :6], one.scores[0]) < 1e-8 and exp.scores[1, 6] == 0
    bare = _without_additive_constants(model)
    exp = explain(bare, b, method="cp_lrp", **kw)
    assert_conserves(exp.scores.sum(-1), exp.logits.gather(1, exp.target[:, None]).squeeze(1), kind)


def test_a_head_layer_the_rules_do_not_read_is_refused_by_name():
    model = _with_mlp_head("bert")
    model.classifier = torch.nn.Sequential(torch.nn.Linear(32, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3))
    with pytest.raises(UnsupportedModelError, match=r"classifier\.1 is a BatchNorm1d"):
        explain(model.eval(), {"input_ids": torch.tensor([ROWS[0]])}, method="cp_lrp")


# ---------------------------------------------------------------- decoders no row names: recognised by structure
@pytest.mark.parametrize("cls", ["GemmaForTokenClassification", "ArceeForQuestionAnswering"])
def test_task_heads_of_unlisted_decoders_are_recognised_and_probed(cls):
    from lrp_core.adapters import get_adapter
    from lrp_core.adapters.recognise import OpenDecoderAdapter

    config = getattr(transformers, cls.split("For")[0] + "Config")(**dict(CONFIGS["llama"][2], num_labels=3))
    torch.manual_seed(4)
    model = getattr(transformers, cls)(config).eval().double()
    assert isinstance(get_adapter(model), OpenDecoderAdapter)
    head = "qa" if cls.endswith("QuestionAnswering") else "token"
    b = batch(model, head, "left")
    kw = call(head, b, "left")
    exp = explain(model, b, method="cp_lrp", **kw)
    expected = torch.cat([_alone(model, head, b, kw, i) for i in range(3)])
    assert rel_err(exp.logits if head == "qa" else exp.logits[:, kw["target"]], expected) < 1e-10
    assert (exp.scores[b["attention_mask"] == 0] == 0).all()


@pytest.mark.parametrize("kind", ["timm", "hf"])
def test_mlp_heads_of_vision_transformers_are_replayed_exactly(kind):
    """timm's ``model.head`` and Hugging Face ViT's ``model.classifier`` replaced by an MLP: the replay is the model,
    batch = each image alone, CP-LRP conserves without additive constants (biases, LayerNorm β, positions, [CLS])."""
    from vision_models import hf_classifier, make_tiny_vit, random_images

    if kind == "timm":
        model = make_tiny_vit(seed=2)
        model.head = _mlp(48, 5)
    else:
        model = hf_classifier("ViTForImageClassification", "ViTConfig", seed=2)
        model.classifier = _mlp(48, 5)
    model = model.eval().double()
    x = random_images(3).double()
    with torch.no_grad():
        own_logits = model(x) if kind == "timm" else model(pixel_values=x).logits
    for method in ("cp_lrp", "lrp", "transformer_attribution"):
        exp = explain(model, x, method=method)
        assert rel_err(exp.logits, own_logits) < 1e-10
        one = explain(model, x[1:2], method=method)
        assert rel_err(exp.scores[1], one.scores[0]) < 1e-8
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name.endswith(("pos_embed", "cls_token", "position_embeddings")):
                p.zero_()
    exp = explain(model, x, method="cp_lrp")
    assert_conserves(exp.scores.sum(-1), exp.logits.gather(1, exp.target[:, None]).squeeze(1), "vit")
