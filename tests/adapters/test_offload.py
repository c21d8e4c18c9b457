"""Offloaded models (accelerate) are explained exactly, and left as found (issue #43, docs/METHODS.md §4).

accelerate keeps an offloaded module's weights in CPU memory or on disk and puts a meta placeholder in the module
outside its forward. Each kind of offload — ``cpu_offload``, ``disk_offload``, ``dispatch_model`` with layers on
disk, ``from_pretrained(..., device_map=..., offload_folder=...)`` — on a tiny timm ViT, BERT and Llama: every
method family's map equals the same model's, not offloaded (measured 0.0: the same values, the same arithmetic),
and the model keeps its hooks, placeholders, devices and offloaded values; its own forward is unchanged. A model
whose weights were never loaded (built under ``init_empty_weights()``) is refused, naming that.

Before this, on the same models: the ViT raised ``RuntimeError: Tensor on device cpu is not on the expected device
meta`` for every method, BERT's transformer attribution was 1.7e7 off and its LRP 5e27, the Llama's LRP NaN, and
AttnLRP / CP-LRP raised the raw RuntimeError.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import make_tiny_bert, make_tiny_vit
from decoders import batch, make_decoder, model_logits, quick, rows

from lrp_core import explain
from lrp_core.errors import UnsupportedModelError

accelerate = pytest.importorskip("accelerate", reason="accelerate is a test extra (pyproject [test-extras])")

#: one method of each family: explicit passes (read every weight), modified-gradient replays (read norms' weights
#: in their rules, the class token, ...), gradient × attention, the gradient baseline
METHODS = ("transformer_attribution", "lrp", "partial_lrp", "attnlrp", "cp_lrp", "generic_attention", "cdam")
TOL = 1e-5  # float32 round-off (docs/METHODS.md §4): from_pretrained reloads the weights through safetensors


def _vit():
    return make_tiny_vit(), torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))


def _bert():
    ids = torch.tensor([[2, 11, 12, 13, 3, 0], [2, 21, 22, 23, 24, 3]])
    return make_tiny_bert(), {"input_ids": ids, "attention_mask": (ids != 0).long()}


def _llama():
    return make_decoder("llama", dtype=torch.float32), batch(rows(lengths=(5, 7)))


FAMILIES = {"vit": _vit, "bert": _bert, "llama": _llama}


def _disk_map(model: torch.nn.Module, family: str) -> dict:
    """A device map with the first and the last block on disk, everything else in CPU memory: one entry per
    module holding tensors of its own (the root's own parameters by name)."""
    blocks = {"vit": "blocks", "bert": "bert.encoder.layer", "llama": "model.layers"}[family]
    n = len(model.get_submodule(blocks))
    disk = (f"{blocks}.0.", f"{blocks}.{n - 1}.")
    device_map = {}
    for name, m in model.named_modules():
        own = [t for t, _ in (*m.named_parameters(recurse=False), *m.named_buffers(recurse=False))]
        for key in own if not name else ([name] if own else []):
            device_map[key] = "disk" if f"{key}.".startswith(disk) else "cpu"
    return device_map


def _offload(kind: str, family: str, model: torch.nn.Module, tmp_path) -> torch.nn.Module:
    if kind == "cpu_offload":
        return accelerate.cpu_offload(model, execution_device="cpu")
    if kind == "disk_offload":
        return accelerate.disk_offload(model, str(tmp_path / "disk"), execution_device="cpu")
    if kind == "dispatch_disk":
        return accelerate.dispatch_model(model, _disk_map(model, family), offload_dir=str(tmp_path / "dispatch"))
    assert kind == "from_pretrained"
    model.save_pretrained(tmp_path / "saved")
    return (
        type(model)
        .from_pretrained(
            tmp_path / "saved",
            device_map=_disk_map(model, family),
            offload_folder=str(tmp_path / "folder"),
            dtype=torch.float32,
        )
        .eval()
    )


def _state(model: torch.nn.Module) -> list:
    """Everything offloading is made of: each module's hook (and its forward), each tensor's kind, device,
    dtype and shape, the offloaded values (in CPU memory; those on disk are files), and the training flags."""
    out = []
    for name, m in model.named_modules():
        hook = m.__dict__.get("_hf_hook")
        out.append((name, id(hook), id(m.__dict__.get("forward")), m.training))
        for hook_part in getattr(hook, "hooks", [hook]) if hook is not None else []:
            weights = getattr(hook_part, "weights_map", None)
            data = getattr(weights, "dataset", None)
            state = getattr(data, "state_dict", data)
            if isinstance(state, dict):
                out.append((name, sorted((k, v.clone()) for k, v in state.items() if isinstance(v, torch.Tensor))))
        for t_name, t in (*m.named_parameters(recurse=False), *m.named_buffers(recurse=False)):
            out.append((name, t_name, type(t).__name__, str(t.device), t.dtype, tuple(t.shape), t.requires_grad))
    return out


def _same_state(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if len(x) == 2 and isinstance(x[1], list):
            assert [k for k, _ in x[1]] == [k for k, _ in y[1]]
            assert all(torch.equal(u, v) for (_, u), (_, v) in zip(x[1], y[1]))
        else:
            assert x == y


def _own_logits(model: torch.nn.Module, x, family: str) -> torch.Tensor:
    """The model's own forward (through accelerate's hooks): its logits, a decoder's at each row's last token."""
    with torch.no_grad():
        if family == "vit":
            return model(x)
        return model(**x).logits if family == "bert" else model_logits(model, x)


def _dev(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


KINDS = ("cpu_offload", "disk_offload", "dispatch_disk", "from_pretrained")
CASES = [(k, f) for k in KINDS for f in FAMILIES if not (k == "from_pretrained" and f == "vit")]


@pytest.mark.parametrize("kind, family", CASES)
def test_every_method_on_an_offloaded_model_equals_the_model_not_offloaded(kind, family, tmp_path):
    model, x = FAMILIES[family]()
    reference = copy.deepcopy(model)
    model = _offload(kind, family, model, tmp_path)
    assert any(p.is_meta for p in model.parameters()), "the case offloads something"
    own = _own_logits(model, x, family)
    before = _state(model)
    for method in METHODS:
        opts = quick(method) if family == "llama" else {}
        want = explain(reference, x, method, **opts)
        got = explain(model, x, method, **opts)
        assert _dev(got.logits, want.logits) <= TOL, method
        assert _dev(got.scores, want.scores) <= TOL, (method, _dev(got.scores, want.scores))
    _same_state(before, _state(model))  # hooks, placeholders, devices, offloaded values: as found
    assert torch.equal(own, _own_logits(model, x, family))
    assert _dev(got.logits, own) <= TOL  # the explained logits are the offloaded model's own


def test_an_offloaded_model_in_float64_on_request(tmp_path):
    """The float64 mode upcasts what the offload hooks load (the two modes stacked): the map of model.double()."""
    model, x = _vit()
    reference = copy.deepcopy(model).double()
    model = accelerate.cpu_offload(model, execution_device="cpu")
    for method in ("lrp", "attnlrp"):
        got = explain(model, x, method, dtype=torch.float64)
        want = explain(reference, x.double(), method)
        assert got.scores.dtype == torch.float64
        assert _dev(got.scores, want.scores) <= 1e-10, method


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_model_whose_weights_were_never_loaded_is_refused(family):
    build, x = FAMILIES[family], FAMILIES[family]()[1]
    with accelerate.init_empty_weights():
        model = build()[0]
    assert all(p.is_meta for p in model.parameters())
    with pytest.raises(UnsupportedModelError, match=r"weights were never loaded: \d+ of its tensors .* meta"):
        explain(model, x, "attnlrp")
