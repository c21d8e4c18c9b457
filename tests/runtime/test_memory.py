"""Memory and pieces (lrp_core.runtime.memory, explain's max_memory / chunk_size): a batch explained in pieces is the
batch explained at once, every field; the estimate is an upper bound of the measured peak."""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch
from conftest import make_tiny_bert, make_tiny_vit

from lrp_core import METHODS, ConceptTarget, Contrast, InputError, concept_target, explain
from lrp_core.adapters import get_adapter
from lrp_core.methods import registry
from lrp_core.methods.options import Shared
from lrp_core.runtime import memory
from lrp_core.runtime import pieces as lrp_pieces

TENSOR_FIELDS = (
    "scores",
    "target",
    "logits",
    "pixels",
    "layers",
    "layers_per_head",
    "token_relevance",
    "attention_mask",
)
CONSERVATION_FIELDS = ("output", "blocks", "input", "pixels")


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30)) if b.numel() else 0.0


def _fields(exp) -> dict:
    """Every tensor of an explanation (conservation included), by name."""
    out = {name: getattr(exp, name) for name in TENSOR_FIELDS}
    for name in CONSERVATION_FIELDS:
        out[f"conservation.{name}"] = None if exp.conservation is None else getattr(exp.conservation, name)
    return out


def _assert_equal(a, b, tol: float = 0.0) -> None:
    """Every field of two explanations equal (``tol`` = 0: bit for bit; else relative, targets exactly)."""
    for (name, x), y in zip(_fields(a).items(), _fields(b).values()):
        assert (x is None) == (y is None), name
        if x is None:
            continue
        assert x.shape == y.shape and x.dtype == y.dtype, name
        if tol == 0.0 or not x.is_floating_point():
            assert torch.equal(x, y), (name, rel_err(x, y) if x.is_floating_point() else None)
        else:
            assert rel_err(x, y) <= tol, (name, rel_err(x, y))
    for attr in ("method", "grid", "image_size", "start_layer"):
        assert getattr(a, attr) == getattr(b, attr), attr
    # a budget below one sample's full pass takes AttnLRP's blockwise pass (the same values): only that is named
    assert _without_pass(a.options) == _without_pass(b.options), "options"


def _without_pass(options: dict) -> dict:
    return {k: v for k, v in options.items() if k != "relevance_pass"}


def _options(method: str) -> dict:
    return {"keep_heads": True} if registry.get(method).takes("keep_heads") else {}


def _cat(parts: list):
    """Explanations of consecutive pieces, concatenated (text: all pieces padded to the same length)."""
    cat = lambda ts: None if ts[0] is None else torch.cat(ts)  # noqa: E731
    first = parts[0]
    merged = {name: cat([getattr(p, name) for p in parts]) for name in TENSOR_FIELDS}
    conservation = None
    if first.conservation is not None:
        conservation = type(first.conservation)(
            **{n: cat([getattr(p.conservation, n) for p in parts]) for n in CONSERVATION_FIELDS}
        )
    return type(first)(
        method=first.method,
        grid=first.grid,
        image_size=first.image_size,
        start_layer=first.start_layer,
        conservation=conservation,
        options=first.options,
        **merged,
    )


def _images(dtype):
    return torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(1)).to(dtype)


def _text(lengths=(7, 4, 7, 7, 4), T: int = 7) -> dict:
    g = torch.Generator().manual_seed(2)
    ids = torch.zeros(len(lengths), T, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(5, 60, (n,), generator=g)
        ids[i, 0], ids[i, n - 1] = 2, 3
    return {"input_ids": ids, "attention_mask": (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()}


# ---------------------------------------------------------------- pieces are the batch, every field
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_image_pieces_are_each_piece_explained_alone(method, dtype):
    """Exact: the merge puts every field of every piece back in its rows (pixels, layers, conservation …)."""
    model, x = make_tiny_vit().to(dtype), _images(dtype)
    t = [0, 4, 1, 3, 2] if not registry.get(method).class_agnostic else None
    for k in (1, 2):
        chunked = explain(model, x, method=method, target=t, chunk_size=k, **_options(method))
        alone = [
            explain(model, x[s : s + k], method=method, target=None if t is None else t[s : s + k], **_options(method))
            for s in range(0, 5, k)
        ]
        _assert_equal(chunked, _cat(alone))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-8), (torch.float32, 1e-5)])
def test_image_pieces_equal_the_whole_batch(method, dtype, tol):
    """Against the batch at once: equal up to the round-off of the batch's size (CPU BLAS kernels compute a
    row differently with the number of rows: M < 4 and the M mod 4 tail), as batch vs one by one."""
    model, x = make_tiny_vit().to(dtype), _images(dtype)
    whole = explain(model, x, method=method, max_memory="none", **_options(method))
    for opts in ({"chunk_size": 1}, {"chunk_size": 2}, {"max_memory": 1}):
        _assert_equal(explain(model, x, method=method, **opts, **_options(method)), whole, tol=tol)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_text_of_distinct_lengths_is_identical_in_pieces(method, dtype, text_batch):
    """Every length group is one sample: pieces of any size give bit-identical results, every field."""
    model = make_tiny_bert(weight_scale=5.0).to(dtype)
    whole = explain(model, text_batch, method=method, max_memory="none", **_options(method))
    for opts in ({"chunk_size": 1}, {"chunk_size": 2}, {"max_memory": 1}):
        _assert_equal(explain(model, text_batch, method=method, **opts, **_options(method)), whole)


@pytest.mark.parametrize("method", METHODS)
def test_text_pieces_compose_with_length_groups(method):
    """Lengths 7, 4, 7, 7, 4 in pieces of 2: {1, 4} (length 4), {0, 2} and {3} (length 7), each unpadded."""
    model, text = make_tiny_bert(weight_scale=5.0).double(), _text()
    prepared = get_adapter(model).check_inputs(text)
    bound = registry.get(method)().bind(2, "text")
    pieces = lrp_pieces.plan(get_adapter(model), prepared, bound, Shared(chunk_size=2))
    assert [(r.tolist(), n) for r, n in pieces] == [([1, 4], 4), ([0, 2], 7), ([3], 7)]
    chunked = explain(model, text, method=method, chunk_size=2, **_options(method))
    for rows, n in pieces:
        alone = explain(model, {k: v[rows, :n] for k, v in text.items()}, method=method, **_options(method))
        for name, x in _fields(chunked).items():
            y = _fields(alone)[name]
            if x is None or name == "attention_mask":
                continue
            x = x[rows]
            if name in ("scores", "token_relevance", "layers", "layers_per_head"):
                assert (x[..., n:] == 0).all(), name  # padding scores 0
                x = x[..., :n]
                if name.startswith("layers"):
                    assert (x[..., n:, :] == 0).all(), name
                    x = x[..., :n, :]
            assert torch.equal(x, y), name
    whole = explain(model, text, method=method, max_memory="none", **_options(method))
    _assert_equal(chunked, whole, tol=1e-8)


def test_clip_pieces_keep_the_prompts_and_images_they_compare_with():
    """CLIP: image pieces share the prompts (the classes); prompt pieces share the images."""
    from tiny_clip import make_clip

    clip = make_clip().double()
    ids = torch.tensor([[1, 5, 6, 7, 98], [1, 8, 9, 98, 0], [1, 10, 98, 0, 0], [1, 11, 12, 98, 0]])
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(3)).double()
    inputs = {"pixel_values": images, "input_ids": ids, "attention_mask": (ids != 0).long()}
    for method in ("transformer_attribution", "attnlrp"):
        chunked = explain(clip, inputs, method=method, chunk_size=1)
        _assert_equal(
            chunked,
            _cat([explain(clip, {**inputs, "pixel_values": images[i : i + 1]}, method=method) for i in range(3)]),
        )
        text = {**inputs, "explain": "text"}
        chunked = explain(clip, text, method=method, chunk_size=1)
        whole = explain(clip, text, method=method, max_memory="none")
        _assert_equal(chunked, whole, tol=1e-8)
        for i, n in enumerate(inputs["attention_mask"].sum(1).tolist()):
            one = explain(
                clip,
                {**text, "input_ids": ids[i : i + 1, :n], "attention_mask": torch.ones(1, n).long()},
                method=method,
            )
            assert torch.equal(chunked.scores[i, :n], one.scores[0]) and torch.equal(chunked.logits[i], one.logits[0])


def test_targets_follow_the_rows(tiny_vit):
    """Explicit targets, contrasts and concepts: each piece explains its own rows' classes, bit for bit."""
    x = _images(torch.float32)
    t, neg = [4, 0, 3, 1, 2], [0, 1, 0, 0, 0]
    forms = [
        (lambda s: t[s : s + 2]),
        (lambda s: torch.tensor(t)[s : s + 2]),
        (lambda s: 2),
        (lambda s: Contrast(positive=t[s : s + 2], negative=neg[s : s + 2])),
        (lambda s: Contrast(None, 3)),
    ]
    whole_forms = [t, torch.tensor(t), 2, Contrast(positive=t, negative=neg), Contrast(None, 3)]
    for method in ("transformer_attribution", "attnlrp"):
        for whole_target, piece_target in zip(whole_forms, forms):
            chunked = explain(tiny_vit, x, method=method, target=whole_target, chunk_size=2)
            alone = [explain(tiny_vit, x[s : s + 2], method=method, target=piece_target(s)) for s in (0, 2, 4)]
            merged = _cat(alone)
            merged.options = dict(chunked.options)  # contrast_with lists the whole batch's classes
            _assert_equal(chunked, merged)
            whole = explain(tiny_vit, x, method=method, target=whole_target)
            assert torch.equal(whole.target, chunked.target) and whole.options == chunked.options
    concept = concept_target(tiny_vit, x[:2])
    assert isinstance(concept, ConceptTarget)
    chunked = explain(tiny_vit, x, method="cdam", target=concept, chunk_size=2)
    _assert_equal(chunked, _cat([explain(tiny_vit, x[s : s + 2], method="cdam", target=concept) for s in (0, 2, 4)]))
    assert chunked.target.tolist() == [-1] * 5 and chunked.options == {"concept": "concept"}


def test_a_tiny_budget_splits_and_a_fitting_one_does_not(tiny_vit, monkeypatch):
    x = _images(torch.float32)
    seen = []
    plan = lrp_pieces.plan
    monkeypatch.setattr(lrp_pieces, "plan", lambda *a: seen.append(plan(*a)) or seen[-1])
    adapter = get_adapter(tiny_vit)
    facts = memory.facts_of(adapter, adapter.check_inputs(x))
    two = memory.estimate(_p("transformer_attribution"), facts, 2)
    for max_memory, sizes in ((1, [1] * 5), (two, [2, 2, 1]), ("2 GB", [5]), (None, [5]), ("none", [5])):
        explain(tiny_vit, x, max_memory=max_memory)
        assert [len(r) for r, _ in seen[-1]] == sizes, max_memory
    monkeypatch.setattr(memory, "available", lambda device: 2 * two)  # "auto": half of what is free
    explain(tiny_vit, x)
    assert [len(r) for r, _ in seen[-1]] == [2, 2, 1]
    monkeypatch.setattr(memory, "available", lambda device: None)  # unknown: never split
    explain(tiny_vit, x)
    assert [len(r) for r, _ in seen[-1]] == [5]


def test_one_sample_is_never_split_and_reads_no_free_memory(tiny_vit, text_batch, monkeypatch):
    """A piece has at least one sample, so a one-sample group is one piece whatever the budget: the free
    memory is not read for it (a file read per call, a device query on CUDA). A batch of several still reads
    it, and a malformed max_memory is refused at batch 1 too."""
    reads = []
    monkeypatch.setattr(memory, "available", lambda device: reads.append(device) or 1)
    x = _images(torch.float32)
    explain(tiny_vit, x[:1])
    bert = make_tiny_bert()
    explain(bert, text_batch)  # distinct lengths: every length group is one sample
    assert reads == []
    explain(tiny_vit, x[:2])
    assert len(reads) == 1
    with pytest.raises(InputError, match="max_memory"):
        explain(tiny_vit, x[:1], max_memory="lots")


def test_model_is_untouched_by_a_call_in_pieces(images, text_batch):
    from untouched import assert_untouched, snapshot

    vit = make_tiny_vit()
    vit.train()
    vit.blocks[0].attn.fused_attn = False
    before = snapshot(vit)
    for method in ("transformer_attribution", "attnlrp", "token_ablation"):
        explain(vit, images, method=method, chunk_size=1)
        explain(vit, images, method=method, max_memory=1)
    assert_untouched(before, snapshot(vit))
    bert = make_tiny_bert(attn_implementation="sdpa")
    before = snapshot(bert)
    explain(bert, text_batch, method="generic_attention", chunk_size=2)
    assert_untouched(before, snapshot(bert))


def test_progress_bar_over_pieces(tiny_vit, capsys):
    explain(tiny_vit, _images(torch.float32), chunk_size=1, progress=True)
    assert "piece" in capsys.readouterr().err
    explain(tiny_vit, _images(torch.float32), chunk_size=1, progress=False)
    assert "piece" not in capsys.readouterr().err


# ---------------------------------------------------------------- options
def test_every_method_takes_the_generic_options(tiny_vit, images):
    for name in METHODS:
        for option, value in (("progress", False), ("max_memory", "1GB"), ("chunk_size", 2)):
            assert explain(tiny_vit, images, method=name, **{option: value}).scores.shape == (3, 16)


@pytest.mark.parametrize("bad", [0, -5, "lots", "5 parsecs", True, [1], float("nan"), -math.inf])
def test_bad_max_memory_names_what_is_accepted(tiny_vit, images, bad):
    with pytest.raises(InputError, match=r"max_memory must be None or 'auto'.*'512MB'.*float\('inf'\)"):
        explain(tiny_vit, images, max_memory=bad)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_chunk_size_is_refused(tiny_vit, images, bad):
    with pytest.raises(InputError, match="chunk_size must be a positive int"):
        explain(tiny_vit, images, chunk_size=bad)


def test_chunk_size_and_max_memory_together_are_refused(tiny_vit, images):
    with pytest.raises(InputError, match="chunk_size .* or max_memory .*not both"):
        explain(tiny_vit, images, chunk_size=2, max_memory="1GB")
    assert explain(tiny_vit, images, chunk_size=2, max_memory="auto").scores.shape == (3, 16)


def test_max_memory_values():
    assert memory.parse_max_memory(None) is None and memory.parse_max_memory("auto") is None
    assert memory.parse_max_memory("none") == memory.parse_max_memory(float("inf")) == math.inf
    assert memory.parse_max_memory("2GB") == 2e9 and memory.parse_max_memory("512 MiB") == 512 * 2**20
    assert memory.parse_max_memory(1000) == 1000 and memory.parse_max_memory("1.5kb") == 1500
    assert memory.budget(1000, torch.device("cpu")) == 1000
    free = memory.available(torch.device("cpu"))
    assert free is None or memory.budget(None, torch.device("cpu")) == memory.SAFETY_FRACTION * free


def _p(method: str) -> memory.Profile:
    return registry.get(method).memory


# ---------------------------------------------------------------- the estimate
def test_every_method_declares_its_own_profile():
    # on its own class (the base Method has none to inherit), source methods included
    for m in (*METHODS, *registry.SOURCE_METHOD_NAMES):
        assert isinstance(vars(registry.get(m)).get("memory"), memory.Profile), m


def test_estimate_grows_with_batch_tokens_and_kept_heads():
    f = memory.SizeFacts(blocks=12, tokens=197, width=768, heads=12, mlp=3072, itemsize=4)
    for method in METHODS:
        by_batch = [memory.estimate(_p(method), f, b) for b in (1, 2, 8, 64)]
        assert by_batch == sorted(by_batch) and by_batch[0] < by_batch[-1], method
        by_tokens = [memory.per_sample(_p(method), memory.SizeFacts(12, n, 768, 12, 3072, 4)) for n in (16, 64, 197)]
        assert by_tokens == sorted(by_tokens) and by_tokens[0] < by_tokens[-1], method
        assert memory.per_sample(_p(method), f, keep_heads=True) >= memory.per_sample(_p(method), f)
    ta = memory.per_sample(_p("transformer_attribution"), f)
    assert memory.per_sample(_p("transformer_attribution"), f, keep_heads=True) > ta
    assert (
        memory.piece_size(2 * ta + memory.fixed(_p("transformer_attribution"), f), _p("transformer_attribution"), f, 10)
        == 2
    )
    assert memory.piece_size(1, _p("transformer_attribution"), f, 10) == 1  # at least one sample per piece
    assert memory.piece_size(math.inf, _p("transformer_attribution"), f, 10) == 10


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_estimate_bounds_the_measured_peak():
    """A fresh process: BERT of width 256, 4 blocks, 128 tokens, batch 2 (a few seconds)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "scripts"))
    from measure_memory import measure

    r = measure("bert", "transformer_attribution", tokens=128, batch=2)
    assert r["reliable"], r
    assert r["measured_mb"] <= r["estimated_mb"] <= 3 * r["measured_mb"], r


def test_decoder_facts_know_the_lm_head_sdpa_and_the_gated_mlp():
    """A Llama's facts: the head's outputs are the vocabulary, sdpa is read, a gated MLP counts twice its width."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=500,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        attn_implementation="sdpa",
    )
    adapter = get_adapter(LlamaForCausalLM(cfg).eval())
    ids = torch.randint(0, 500, (2, 9), generator=torch.Generator().manual_seed(0))
    f = memory.facts_of(adapter, adapter.check_inputs({"input_ids": ids, "attention_mask": torch.ones_like(ids)}))
    assert (f.blocks, f.tokens, f.width, f.heads, f.mlp, f.outputs, f.sdpa) == (2, 9, 32, 4, 96, 500, True)


def test_fused_methods_keep_no_attention_maps_on_sdpa():
    """AttnLRP / CP-LRP on an sdpa model: the estimate has no H·N² term (only N² masks); elsewhere it does."""

    def facts(n: int, sdpa: bool) -> memory.SizeFacts:
        return memory.SizeFacts(blocks=8, tokens=n, width=512, heads=8, mlp=2752, itemsize=4, outputs=32000, sdpa=sdpa)

    for method in ("attnlrp", "cp_lrp"):
        eager = memory.per_sample(_p(method), facts(4096, False))
        fused = memory.per_sample(_p(method), facts(4096, True))
        hnn = 8 * 4096**2 * 4
        assert eager - fused >= 8 * 5 * hnn, method  # the replay's maps of every block are gone
        # what stays: linear in N, plus two N² masks and the logits
        lin = memory.per_sample(_p(method), facts(2, True)) / 2
        assert fused <= 4096 * lin + (2 * 4096**2 + 2 * 32000) * 4, method
    ta = memory.per_sample(_p("transformer_attribution"), facts(4096, True))
    assert ta == memory.per_sample(_p("transformer_attribution"), facts(4096, False))  # keeps its maps either way
    # the LM head: 2·V per sample, and its V·D weight is the largest weight of the fixed part
    f = facts(16, True)
    assert memory.fixed(_p("attnlrp"), f) == 3 * 512 * 32000 * 4
    no_head = memory.SizeFacts(8, 16, 512, 8, 2752, 4, outputs=0, sdpa=True)
    assert memory.per_sample(_p("attnlrp"), f) - memory.per_sample(_p("attnlrp"), no_head) == 2 * 32000 * 4


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
@pytest.mark.parametrize("method, tokens", [("attnlrp", 512), ("transformer_attribution", 256)])
def test_decoder_estimate_bounds_the_measured_peak(method, tokens):
    """A fresh process: an sdpa Llama of width 256, 4 blocks, 8 heads / 2 key-value heads, vocabulary 8000."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "scripts"))
    from measure_memory import measure

    r = measure("llama", method, tokens=tokens, batch=1, heads=8)
    assert r["reliable"], r
    assert r["measured_mb"] <= r["estimated_mb"] <= 3 * r["measured_mb"], r


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
@pytest.mark.parametrize("method, batch_size", [("leave_one_out", 1), ("leave_one_out", 4), ("context_cite", 4)])
def test_source_ablation_estimate_bounds_the_measured_peak(method, batch_size):
    """The ablation methods replay logits only (two blocks held, not L): the estimate of 8 sources at 512 tokens
    bounds the measured peak and stays within 3x of it (priced as full traces: 4.4x at batch_size 1)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "scripts"))
    from measure_memory import measure

    r = measure("llama", method, tokens=512, batch=1, heads=8, sources=8, batch_size=batch_size)
    assert r["reliable"], r
    assert r["measured_mb"] <= r["estimated_mb"] <= 3 * r["measured_mb"], r
