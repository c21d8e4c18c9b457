"""Models split over devices are explained block by block where their weights are, equal to the model on one device
(issue #46 item 3; docs/CONTRACTS.md "Models split over devices").

accelerate's ``dispatch_model`` places the tiny seeded Llama, Qwen2, GPT-2, Gemma 3, BERT and ViT over two
accelerators — simulated on the CPU (tests/fake_devices.py: ``cpu:1`` and ``cpu:2`` behave as two GPUs, an
operation mixing them raises as CUDA does) — and over one accelerator with blocks offloaded to CPU memory and
disk (meta placeholders, computed on the accelerator). Each method's map, logits and target equal the unsplit
model's (measured 0.0: the same kernels in the same order; bound float32 1e-6, float64 1e-12 relative), the
results come back on the inputs' device (which may be another than the embedding's, as for the model's own
forward), a row explained alone equals its row of the batch, and the model (its
hooks, placeholders, devices, offloaded values, its own forward) is left as found. A block whose modules are on
two devices is refused, naming them. On real GPUs (where lent): the same equality for ``cuda:0`` + CPU offload and
``cuda:0`` + ``cuda:1``.

Before this, every method on the two-device split raised ``RuntimeError: Expected all tensors to be on the same
device`` (the replay handed block 1 the stream, mask and rotary tables of block 0's device).
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import make_tiny_bert, make_tiny_vit
from decoders import batch, make_decoder, quick, rows
from fake_devices import CPU, GPU0, GPU1, FakeDevices

from lrp_core import Projection, attention_parts, concept_target, explain
from lrp_core.errors import InputError, UnsupportedModelError

accelerate = pytest.importorskip("accelerate", reason="accelerate is a test extra (pyproject [test-extras])")

METHODS = ("attnlrp", "cp_lrp", "lrp", "transformer_attribution", "input_x_gradient", "integrated_gradients")
TOL = {torch.float32: 1e-6, torch.float64: 1e-12}
DECODERS = ("llama", "qwen2", "gpt2", "gemma3")
#: where each family keeps its blocks
BLOCKS = {"vit": "blocks", "bert": "bert.encoder.layer", "gpt2": "transformer.h"}


def _family(name: str, dtype: torch.dtype = torch.float32):
    """(model, inputs on the CPU) of a family."""
    if name == "vit":
        x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3), dtype=dtype)
        return make_tiny_vit().to(dtype), x
    if name == "bert":
        ids = torch.tensor([[2, 11, 12, 13, 3, 0], [2, 21, 22, 23, 24, 3]])
        return make_tiny_bert().to(dtype), {"input_ids": ids, "attention_mask": (ids != 0).long()}
    return make_decoder(name, dtype=dtype), batch(rows(lengths=(5, 7)))


def device_map(model: torch.nn.Module, family: str, before, blocks: list, after) -> dict:
    """A device map at block granularity, as ``from_pretrained(device_map="auto")`` makes one: the modules before
    the blocks (embeddings; the root's own parameters, a ViT's class token, by name) on ``before``, block i on
    ``blocks[i]`` (the last entry for the blocks beyond), the modules after them (final norm, head) on ``after``."""
    path = BLOCKS.get(family, "model.layers")
    n = len(model.get_submodule(path))
    out: dict = {}
    seen = False
    for name, m in model.named_modules():
        if name.startswith(f"{path}."):
            seen, i = True, int(name[len(path) + 1 :].split(".")[0])
            out.setdefault(f"{path}.{i}", blocks[min(i, len(blocks) - 1)])
            continue
        own = [t for t, _ in (*m.named_parameters(recurse=False), *m.named_buffers(recurse=False))]
        for key in own if not name else ([name] if own else []):
            out[key] = after if seen else before
    assert len({k for k in out if k.startswith(path)}) == n
    for group in accelerate.utils.find_tied_parameters(model):  # a tied head stays with the embedding (as "auto")
        order = list(out)
        keys = sorted((max((k for k in out if f"{p}.".startswith(f"{k}.")), key=len) for p in group), key=order.index)
        for k in keys[1:]:
            out[k] = out[keys[0]]
    return out


#: (before, blocks, after). Two accelerators; and a split with offloading: block 0 on the second accelerator, the
#: later blocks in CPU memory and the head on disk, both computed on the first (accelerate's main device), where
#: the embedding is
PLACINGS = {"two_devices": (GPU0, [GPU0, GPU1], GPU1), "offloaded": (GPU0, [GPU1, "cpu"], "disk")}


def _dispatch(model, family: str, placing: str, tmp_path) -> torch.nn.Module:
    dm = device_map(model, family, *PLACINGS[placing])
    return accelerate.dispatch_model(model, dm, offload_dir=str(tmp_path / "offload"))


def _on(inputs, device):
    if isinstance(inputs, torch.Tensor):
        return inputs.to(device)
    return {k: v.to(device) for k, v in inputs.items()}


def _state(model: torch.nn.Module) -> list:
    """Hooks (and the forwards they wrap), every tensor's kind, device, dtype and shape, the training flags."""
    out = []
    for name, m in model.named_modules():
        out.append((name, id(m.__dict__.get("_hf_hook")), id(m.__dict__.get("forward")), m.training))
        for t_name, t in (*m.named_parameters(recurse=False), *m.named_buffers(recurse=False)):
            out.append((name, t_name, type(t).__name__, str(t.device), t.dtype, tuple(t.shape), t.requires_grad))
    return out


def _dev(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double().cpu() - b.double().cpu()).abs().max() / b.double().abs().max().clamp_min(1e-300))


def _check_equal(got, want, tol: float, what) -> None:
    for field in ("scores", "logits"):
        assert _dev(getattr(got, field), getattr(want, field)) <= tol, (what, field)
    assert torch.equal(got.target.cpu(), want.target.cpu()), what


FAMILIES = ("vit", "bert") + DECODERS


@pytest.mark.parametrize("placing", list(PLACINGS))
@pytest.mark.parametrize("family", FAMILIES)
def test_a_split_model_equals_the_model_on_one_device(family, placing, tmp_path):
    model, x = _family(family)
    reference = copy.deepcopy(model)
    wants = {m: explain(reference, x, m, **quick(m)) for m in METHODS}
    with FakeDevices():
        model = _dispatch(model, family, placing, tmp_path)
        if placing == "offloaded":
            assert any(p.is_meta for p in model.parameters()), "the case offloads something"
        before = _state(model)
        xs = _on(x, GPU0)  # the inputs where the model's first module is, as for model.device
        for method in METHODS:
            got = explain(model, xs, method, **quick(method))
            assert got.scores.device == GPU0 and got.logits.device == GPU0, method  # where the inputs are
            _check_equal(got, wants[method], TOL[torch.float32], method)
        assert _state(model) == before  # hooks, placeholders, devices: as found


@pytest.mark.parametrize("family", ("llama", "vit"))
def test_a_split_model_in_float64(family, tmp_path):
    model, x = _family(family, torch.float64)
    reference = copy.deepcopy(model)
    with FakeDevices():
        model = _dispatch(model, family, "two_devices", tmp_path)
        for method in ("attnlrp", "lrp", "transformer_attribution"):
            got = explain(model, _on(x, GPU0), method)
            _check_equal(got, explain(reference, x, method), TOL[torch.float64], method)


@pytest.mark.parametrize("family", ("gemma3", "bert"))
def test_a_row_alone_equals_its_row_of_the_batch_on_a_split_model(family, tmp_path):
    model, x = _family(family)
    with FakeDevices():
        model = _dispatch(model, family, "two_devices", tmp_path)
        xs = _on(x, GPU0)
        for method in ("attnlrp", "transformer_attribution"):
            whole = explain(model, xs, method)
            for b in range(2):
                one = explain(model, {k: v[b : b + 1] for k, v in xs.items()}, method)
                n = one.scores.shape[1]
                assert _dev(one.scores, whole.scores[b : b + 1, :n]) <= 1e-5, (method, b)


def test_a_block_split_over_two_devices_is_refused():
    model, x = _family("llama")
    with FakeDevices():
        dm = device_map(model, "llama", *PLACINGS["two_devices"])
        del dm["model.layers.1"]
        dm.update({"model.layers.1.self_attn": GPU0, "model.layers.1.input_layernorm": GPU0})
        dm.update({"model.layers.1.mlp": GPU1, "model.layers.1.post_attention_layernorm": GPU1})
        model = accelerate.dispatch_model(model, dm)
        with pytest.raises(
            UnsupportedModelError,
            match=r"block 1 of the model computes on several devices: .*"
            r"model\.layers\.1\.self_attn\.\w+ on cpu:1, .*model\.layers\.1\.mlp\.\w+ on cpu:2",
        ):
            explain(model, _on(x, GPU0), "attnlrp")


def _cuda_case(family: str, dm_of, tmp_path) -> None:
    model, x = _family(family)
    reference = copy.deepcopy(model)
    model = accelerate.dispatch_model(model, dm_of(model), offload_dir=str(tmp_path / "offload"))
    before = _state(model)
    for method in METHODS:
        want = explain(reference, x, method, **quick(method))
        got = explain(model, _on(x, "cuda:0"), method, **quick(method))
        # different kernels on the GPU (and TF32 off by default for matmul): float32 round-off, not bit equality
        _check_equal(got, want, 1e-4, method)
    assert _state(model) == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (cuda:0 + CPU offload)")
@pytest.mark.parametrize("family", ("llama", "bert", "vit"))
def test_cuda_and_cpu_offload_split_equals_one_device(family, tmp_path):
    _cuda_case(family, lambda m: device_map(m, family, 0, [0, "cpu"], "cpu"), tmp_path)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices (cuda:0 + cuda:1)")
@pytest.mark.parametrize("family", ("llama", "bert", "vit"))
def test_two_cuda_devices_split_equals_one_device(family, tmp_path):
    _cuda_case(family, lambda m: device_map(m, family, 0, [0, 1], 1), tmp_path)


def test_a_split_model_takes_the_full_pass_and_refuses_the_blockwise_one(tmp_path):
    """The blockwise pass (low_memory) is not run on a split model: asked for, it is refused by name; by default a
    budget too small for the full pass still runs the full pass, equal to the model on one device."""
    model, x = _family("llama")
    want = explain(copy.deepcopy(model), x, "attnlrp")
    with FakeDevices():
        model = _dispatch(model, "llama", "two_devices", tmp_path)
        xs = _on(x, GPU0)
        with pytest.raises(InputError, match="low_memory=True: the blockwise pass is not run on a model split"):
            explain(model, xs, "attnlrp", low_memory=True)
        got = explain(model, xs, "attnlrp", max_memory=10_000)
        assert "relevance_pass" not in got.options
        _check_equal(got, want, TOL[torch.float32], "attnlrp")


@pytest.mark.parametrize("where", ["cpu", "second_device"])
@pytest.mark.parametrize("family", ("llama", "bert", "vit"))
def test_inputs_on_another_device_than_the_embedding(family, where, tmp_path):
    """As the model's own forward does (accelerate's hooks move its inputs), explain takes a split model's inputs
    on any device: the batch goes where the embedding is, the explanation comes back where the inputs were."""
    model, x = _family(family)
    reference = copy.deepcopy(model)
    with FakeDevices():
        model = _dispatch(model, family, "offloaded", tmp_path)
        device = CPU if where == "cpu" else GPU1  # the embedding computes on GPU0
        xs = _on(x, device)
        for method in ("attnlrp", "transformer_attribution", "integrated_gradients"):
            got = explain(model, xs, method, **quick(method))
            assert got.scores.device == device and got.logits.device == device, method
            if got.attention_mask is not None:
                assert got.attention_mask.device == device, method
            _check_equal(got, explain(reference, x, method, **quick(method)), TOL[torch.float32], method)


@pytest.mark.parametrize("where", ["cpu", "second_device"])
def test_the_other_entry_points_on_a_split_model(where, tmp_path):
    """attention_parts (every block's maps stacked: each computed on its block's device), concept_target and CDAM
    with it, and an embedding target, with the inputs off the embedding's device: equal to the model on one
    device, on the inputs' device."""
    device = CPU if where == "cpu" else GPU1
    vit, images = _family("vit")
    bert, text = _family("bert")
    v = torch.randn(bert.config.hidden_size, generator=torch.Generator().manual_seed(0))
    want_parts, want_concept = attention_parts(copy.deepcopy(vit), images), concept_target(copy.deepcopy(vit), images)
    want_cdam = explain(copy.deepcopy(vit), images, "cdam", target=want_concept)
    want_projection = explain(copy.deepcopy(bert), text, "cp_lrp", target=Projection(v, "mean"))
    with FakeDevices():
        vit, bert = _dispatch(vit, "vit", "two_devices", tmp_path), _dispatch(bert, "bert", "two_devices", tmp_path)
        parts = attention_parts(vit, _on(images, device))
        for field in ("attention", "gradient", "relevance", "logits"):
            assert getattr(parts, field).device == device, field
            assert _dev(getattr(parts, field), getattr(want_parts, field)) <= TOL[torch.float32], field
        concept = concept_target(vit, _on(images, device))
        assert concept.vector.device == device and _dev(concept.vector, want_concept.vector) <= TOL[torch.float32]
        for got, want in (
            (explain(vit, _on(images, device), "cdam", target=concept), want_cdam),
            (explain(bert, _on(text, device), "cp_lrp", target=Projection(v, "mean")), want_projection),
        ):
            assert got.scores.device == device
            _check_equal(got, want, TOL[torch.float32], got.method)


def test_explain_generation_on_a_split_model(tmp_path):
    """Greedy steps and their explanations on tiny-lm split over two devices, its untied head on the second: the
    tokenizer's ids (on the CPU) in, the same tokens, maps and probabilities as on one device."""
    from lrp_core import explain_generation
    from lrp_core.models.tiny_lm import build_model, build_tokenizer

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer)).eval()
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    prompts = ["Anna lives in Rome. Where does Anna live? Answer:", "Boris has a dog."]
    want = explain_generation(copy.deepcopy(model), tokenizer, prompts, max_new_tokens=3)
    with FakeDevices():
        n = len(model.model.layers)
        dm = {"model.embed_tokens": GPU0, "model.norm": GPU1, "model.rotary_emb": GPU1, "lm_head": GPU1}
        dm.update({f"model.layers.{i}": GPU0 if i < n // 2 else GPU1 for i in range(n)})
        got = explain_generation(accelerate.dispatch_model(model, dm), tokenizer, prompts, max_new_tokens=3)
    assert torch.equal(got.targets, want.targets) and torch.equal(got.input_ids, want.input_ids)
    for field in ("scores", "logits", "probabilities"):
        assert getattr(got, field).device == CPU and _dev(getattr(got, field), getattr(want, field)) <= 1e-6, field


@pytest.mark.parametrize("family", ("llama", "vit"))
def test_cpu_offload_to_an_accelerator_takes_inputs_on_the_cpu(family):
    """accelerate's ``cpu_offload(model, execution_device=<accelerator>)``: one device under hooks (the weights in
    CPU memory, loaded for each module's forward), the inputs left on the CPU as the model's own forward takes
    them: moved to the execution device, the explanation back on the CPU, equal to the model explained in place."""
    model, x = _family(family)
    want = explain(copy.deepcopy(model), x, "attnlrp")
    with FakeDevices():
        got = explain(accelerate.cpu_offload(model, execution_device=GPU0), x, "attnlrp")
    assert got.scores.device == CPU and got.logits.device == CPU
    _check_equal(got, want, TOL[torch.float32], "attnlrp")
