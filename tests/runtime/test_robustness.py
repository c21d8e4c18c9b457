"""No silent wrong answer (issue #25): a probe suite walked over every family in :data:`FAMILIES`.

Each case asserts either equality with the plain call (gradient contexts, wrappers, an input of another
dtype: equal to explaining the cast input) or the exact error class with a message naming what is
accepted — and that an error leaves the model as it was, with no hook behind. A new family is one row
in :data:`FAMILIES` and inherits every probe.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "adapters"))

import text_families  # noqa: E402
import vision_models  # noqa: E402
from conftest import make_tiny_vit  # noqa: E402
from tiny_clip import make_clip  # noqa: E402
from torch.nn.modules import module as torch_module  # noqa: E402
from untouched import assert_untouched, snapshot  # noqa: E402
from vlms import (  # noqa: E402
    gemma3_prompt,
    image_types,
    make_gemma3,
    make_llava,
    make_paligemma,
    make_qwen_vl,
    make_smolvlm,
    paligemma_prompt,
    prompt,
    qwen_inputs,
    qwen_prompt,
    smol_inputs,
    smol_prompt,
    with_types,
)
from vlms import inputs as llava_inputs  # noqa: E402

from lrp_core import METHODS, InputError, UnsupportedModelError, explain  # noqa: E402
from lrp_core.errors import LRPWarning, UnreflectedHookWarning  # noqa: E402


# ---------------------------------------------------------------- the families and their inputs
def _images(n: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def _text() -> dict:
    ids = torch.tensor([[2, 11, 12, 13, 3], [2, 21, 22, 3, 0]])
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


def _clip_inputs(side: str = "image") -> dict:
    ids = torch.tensor([[1, 5, 6, 98], [1, 8, 98, 0], [1, 10, 11, 98]])  # 98: end of text
    x = {"pixel_values": _images(), "input_ids": ids, "attention_mask": (ids != 0).long()}
    return dict(x, explain="text") if side == "text" else x


#: family -> (tiny model builder, inputs builder, number of classes the target indexes, batch size)
FAMILIES = {
    "timm_cls": (make_tiny_vit, _images, 5, 2),
    **{
        name: (vision_models.FAMILIES[name], _images, 5, 2)
        for name in (
            "timm_avg",
            "timm_avg_no_class_token",
            "timm_distilled",
            "hf_deit",
            "hf_deit_teacher",
            "hf_dinov2",
            "hf_siglip",
            "hf_siglip2",
        )
    },
    "hf_vit": (lambda: vision_models.hf_classifier("ViTForImageClassification", "ViTConfig"), _images, 5, 2),
    **{
        name: (lambda name=name: text_families.make(name), _text, 3, 2)
        for name in ("bert", "roberta", "electra", "distilbert", "albert", "mpnet", "modernbert_mean")
    },
    "clip_image": (make_clip, _clip_inputs, 3, 2),  # classes: the 3 prompts; batch: the 2 images
    "clip_text": (make_clip, lambda: _clip_inputs("text"), 2, 3),  # classes: the 2 images; batch: the 3 prompts
    "siglip_image": (lambda: vision_models.siglip_model(), lambda: vision_models.siglip_pair(_images()), 3, 2),
    # classes: the vocabulary; batch: 2 rows, one image each, left-padded
    "llava": (
        lambda: make_llava(dtype=torch.float32),
        lambda: llava_inputs([prompt([5, 6], [7]), prompt([8], [9, 10, 11])], dtype=torch.float32),
        96,
        2,
    ),
    "smolvlm": (
        lambda: make_smolvlm(dtype=torch.float32),
        lambda: smol_inputs([smol_prompt([5, 6], [7]), smol_prompt([8], [9, 10, 11])], dtype=torch.float32),
        96,
        2,
    ),
    "qwen2_5_vl": (
        lambda: make_qwen_vl(dtype=torch.float32),
        lambda: qwen_inputs([qwen_prompt([5, 6], [7]), qwen_prompt([8], [9, 10, 11])], dtype=torch.float32),
        96,
        2,
    ),
    "gemma3_vl": (
        lambda: make_gemma3(dtype=torch.float32),
        lambda: image_types(
            llava_inputs([gemma3_prompt([5, 6], [7]), gemma3_prompt([8], [9, 10, 11])], dtype=torch.float32)
        ),
        96,
        2,
    ),
    "paligemma": (
        lambda: make_paligemma(2, dtype=torch.float32),
        lambda: with_types(
            llava_inputs([paligemma_prompt([5, 6])[0], paligemma_prompt([8], [9, 10])[0]], dtype=torch.float32),
            [paligemma_prompt([5, 6])[1], paligemma_prompt([8], [9, 10])[1]],
        ),
        96,
        2,
    ),
}
IMAGE_FAMILIES = [f for f in FAMILIES if FAMILIES[f][1] is not _text]
TEXT_FAMILIES = [f for f in FAMILIES if FAMILIES[f][1] is _text]


def _family(name: str):
    build, inputs, classes, _ = FAMILIES[name]
    return build(), inputs(), classes


def _global_hooks() -> tuple:
    return (len(torch_module._global_forward_hooks), len(torch_module._global_forward_pre_hooks))


def _same(a, b) -> None:
    """Two explanations of the same thing: every tensor field equal, bit for bit."""
    for name in ("scores", "target", "logits", "pixels", "layers", "token_relevance"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert torch.equal(x, y), name


def _refused(model, inputs, error, match, **kw):
    """``explain`` raises ``error`` matching ``match`` and leaves the model (and torch's global hooks) as found."""
    before, hooks = snapshot(model), _global_hooks()
    with pytest.raises(error, match=match):
        explain(model, inputs, **kw)
    assert_untouched(before, snapshot(model))
    assert _global_hooks() == hooks


# ---------------------------------------------------------------- 2. any gradient context
CONTEXTS = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode, "enable_grad": torch.enable_grad}


@pytest.mark.parametrize("family", ["timm_cls", "bert"])
def test_every_method_works_the_same_in_every_gradient_context(family):
    model, x, _ = _family(family)
    for method in METHODS:
        plain = explain(model, x, method=method)
        for name, context in CONTEXTS.items():
            with context():
                inside = explain(model, x, method=method)
            _same(inside, plain)
            assert not inside.scores.requires_grad and not inside.scores.is_inference(), (method, name)


@pytest.mark.parametrize("family", ["timm_cls", "bert", "clip_text"])
def test_inputs_made_under_inference_mode_are_explained_like_ordinary_ones(family):
    model, x, _ = _family(family)
    with torch.inference_mode():
        made = (
            {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in x.items()}
            if isinstance(x, dict)
            else x.clone()
        )
        inside = explain(model, made, method="attnlrp")
    _same(inside, explain(model, x, method="attnlrp"))


def test_a_model_made_under_inference_mode_is_named_for_gradient_methods():
    with torch.inference_mode():
        model = make_tiny_vit()
    x = _images()
    _same(explain(model, x, method="rollout"), explain(make_tiny_vit(), x, method="rollout"))  # no gradient needed
    with pytest.raises(InputError, match="inference tensors.*outside inference_mode.*rollout"):
        explain(model, x, method="transformer_attribution")


# ---------------------------------------------------------------- 3. dtypes and wrappers
def _cast(x, dtype):
    if isinstance(x, dict):
        return {k: _cast(v, dtype) for k, v in x.items()}
    return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x


@pytest.mark.parametrize("family", IMAGE_FAMILIES)
def test_an_input_of_another_float_dtype_is_explained_as_the_cast_input(family):
    model, x, _ = _family(family)
    for method in ("transformer_attribution", "attnlrp"):
        _same(
            explain(model, _cast(x, torch.float64), method=method),
            explain(model, _cast(_cast(x, torch.float64), torch.float32), method=method),
        )
    double = model.double()  # and the reverse: float32 images on a float64 model
    _same(explain(double, x), explain(double, _cast(x, torch.float64)))


@pytest.mark.parametrize("family", FAMILIES)
def test_compiled_and_data_parallel_models_are_explained_as_the_model_inside(family):
    model, x, _ = _family(family)
    plain = explain(model, x)
    for wrapped in (torch.compile(model), torch.nn.DataParallel(model), torch.compile(torch.nn.DataParallel(model))):
        before = snapshot(model)
        _same(explain(wrapped, x), plain)
        assert_untouched(before, snapshot(model))


@pytest.fixture
def process_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("family", ["timm_cls", "hf_dinov2", "bert", "clip_image"])
def test_distributed_data_parallel_is_explained_as_the_model_inside(family, process_group):
    model, x, _ = _family(family)
    plain = explain(model, x)
    _same(explain(torch.nn.parallel.DistributedDataParallel(model), x), plain)


def test_torchscript_is_refused_naming_what_to_pass_instead():
    model, x = make_tiny_vit(), _images()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit's deprecation and tracer warnings
        traced = torch.jit.trace(model, x)
    with pytest.raises(UnsupportedModelError, match="TorchScript.*original nn.Module.*torch.compile"):
        explain(traced, x)


# ---------------------------------------------------------------- 4. targets and texts
ACCEPTED = "integer class id.*Python int or a NumPy integer"


@pytest.mark.parametrize("family", FAMILIES)
def test_integer_targets_in_every_form_agree(family):
    model, x, classes = _family(family)
    ids = [(classes - 1 - i) % classes for i in range(FAMILIES[family][3])]
    run = lambda target: explain(model, x, method="attention_gradcam", target=target)  # noqa: E731
    as_list = run(ids)
    assert as_list.target.tolist() == ids
    for form in (
        tuple(ids),
        np.array(ids),
        np.array(ids, dtype=np.uint8),
        torch.tensor(ids, dtype=torch.int32),
        [np.int64(i) for i in ids],
        [torch.tensor(i) for i in ids],
    ):
        _same(run(form), as_list)
    for one in (np.int64(1), torch.tensor(1), np.array(1), torch.tensor([1])):
        _same(run(one), run(1))


@pytest.mark.parametrize("family", FAMILIES)
def test_targets_that_are_not_integer_class_ids_are_refused(family):
    model, x, classes = _family(family)
    for bad in (
        [0.7, 1.2],
        np.array([0.7, 1.2]),
        np.array([1.0, 0.0], dtype=np.float32),
        [True, False],
        np.array([True, False]),
        torch.tensor([True, False]),
        True,
        1.0,
        "1",
        [1, "0"],
        {0: 1},
    ):
        _refused(model, x, InputError, ACCEPTED, target=bad)
    rest = [0] * (FAMILIES[family][3] - 1)
    for huge in (10**20, -(10**20), [10**20] + rest, np.array([2**63 - 1] + rest), np.uint64(2**64 - 1), classes):
        _refused(
            model, x, InputError, rf"out of range: the model has {classes} classes \(0 … {classes - 1}\)", target=huge
        )


@pytest.mark.parametrize("family", TEXT_FAMILIES)
def test_bad_text_is_an_input_error_naming_what_is_accepted(family):
    model, x, _ = _family(family)
    _refused(
        model,
        dict(x, attention_mask=x["attention_mask"] * 0.5),
        InputError,
        r"attention_mask must hold 1 \(a token\) and 0 \(padding\) only.*\[0.5\]",
    )
    _refused(
        model,
        dict(x, attention_mask=torch.tensor([[1, 1, 2, 1, 1], [1, 1, 1, 1, 0]])),
        InputError,
        r"0 \(padding\) only.*\[2\]",
    )
    _refused(
        model,
        {"input_ids": [[2, 11, 12, 3], [2, 21, 3]]},
        InputError,
        r"rectangular batch.*different lengths \[3, 4\].*padding=True",
    )
    _refused(model, dict(x, token_type_ids=torch.zeros(2, 3, dtype=torch.long)), InputError, "token_type_ids has shape")
    # a binary mask of any dtype is the tokenizer's mask
    for mask in (x["attention_mask"].bool(), x["attention_mask"].float(), x["attention_mask"].tolist()):
        _same(explain(model, dict(x, attention_mask=mask)), explain(model, x))
    _same(explain(model, {k: v.tolist() for k, v in x.items()}), explain(model, x))  # lists of one length


@pytest.mark.parametrize("side", ["image", "text"])
def test_bad_clip_inputs_are_input_errors_naming_what_is_accepted(side):
    model, x = make_clip(), _clip_inputs(side)
    _refused(
        model,
        dict(x, input_ids=torch.zeros(0, 4, dtype=torch.long), attention_mask=None),
        InputError,
        "at least one text prompt.*processor",
    )
    _refused(model, dict(x, input_ids=[], attention_mask=None), InputError, "input_ids must be batched")
    _refused(
        model,
        dict(x, pixel_values=list(x["pixel_values"])),
        InputError,
        r"pixel_values must be a float tensor \(B, 3, H, W\).*list of 2 Tensor.*return_tensors='pt'",
    )
    _refused(model, dict(x, input_ids=[[1, 5, 98], [1, 98]], attention_mask=None), InputError, "rectangular")
    _refused(model, dict(x, attention_mask=x["attention_mask"] * 0.5), InputError, "0 \\(padding\\) only")
    _same(explain(model, dict(x, pixel_values=x["pixel_values"].numpy())), explain(model, x))
    if side == "text":
        _refused(model, dict(x, pixel_values=torch.zeros(0, 3, 32, 32)), InputError, "at least one image")


def test_progress_is_validated():
    model, x = make_tiny_vit(), _images()
    for bad in ("yes", 1, "False"):
        _refused(model, x, InputError, r"progress must be True.*False.*None", progress=bad)
    for ok in (True, False, None):
        _same(explain(model, x, progress=ok), explain(model, x))


# ---------------------------------------------------------------- 5. threads and hooks
def _pause_first_module_call(model, reached: threading.Event, resume: threading.Event):
    """A process-wide hook (not on the model): a thread other than this one waits at its first call of a
    module of ``model`` until ``resume`` is set."""
    mine, main = {id(m) for m in model.modules()}, threading.current_thread()

    def hook(module, args):
        if id(module) in mine and threading.current_thread() is not main and not reached.is_set():
            reached.set()
            assert resume.wait(30)

    return torch_module.register_module_forward_pre_hook(hook)


def _concurrent(model, x, other, **kw):
    """Explain in a worker thread, paused at its first module call while ``other()`` runs in this one."""
    reached, resume, out = threading.Event(), threading.Event(), {}
    pause = _pause_first_module_call(model, reached, resume)
    worker = threading.Thread(target=lambda: out.update(exp=explain(model, x, **kw)))
    try:
        worker.start()
        assert reached.wait(30)
        other()
    finally:
        resume.set()
        worker.join(60)
        pause.remove()
    return out["exp"]


@pytest.mark.parametrize("family", ["timm_cls", "bert"])
def test_another_threads_hooks_flags_and_modes_survive_a_call(family):
    model, x, _ = _family(family)
    plain = explain(model, x)
    seen = []
    leaf = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    param = next(model.parameters())

    def other():  # what another thread does to the model while the call runs
        model.train()
        param.requires_grad_(False)
        leaf.register_forward_hook(lambda m, i, o: seen.append(1))
        if family == "timm_cls":
            model.blocks[0].attn.fused_attn = not model.blocks[0].attn.fused_attn

    during = _concurrent(model, x, other)
    _same(during, plain)  # training mode and requires_grad do not change an explanation
    assert model.training and all(m.training for m in model.modules())
    assert not param.requires_grad and len(leaf._forward_hooks) == 1
    if family == "timm_cls":
        assert model.blocks[0].attn.fused_attn != make_tiny_vit().blocks[0].attn.fused_attn


def test_the_guard_lists_the_model_only_when_a_hook_can_change_it(monkeypatch):
    """Without hooks nothing foreign runs on the model, so the guard builds no watch (a walk of every module and
    parameter per call); with a hook it does, and undoes what the hook changes."""
    from lrp_core.runtime import guard

    built = []

    class Counted(guard._Watch):
        def __init__(self, model):
            built.append(model)
            super().__init__(model)

    monkeypatch.setattr(guard, "_Watch", Counted)
    model, x = make_tiny_vit(), _images(1)
    plain = explain(model, x)
    assert built == []
    leaf = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))

    def flip(module, args, output) -> None:  # a hook that changes the model (and not its output)
        model.train()

    handle = leaf.register_forward_hook(flip)
    _same(explain(model, x), plain)
    handle.remove()
    assert built == [model] and not model.training


def test_the_calls_own_changes_are_undone_and_another_threads_survive():
    model, x = make_tiny_vit(), _images()
    plain = explain(model, x)

    def flip(module, args, output):  # a user hook the replay runs: it changes the model mid-call
        module.train()
        module.register_forward_hook(lambda *a: None)

    model.head.register_forward_hook(flip)
    before = snapshot(model)
    during = _concurrent(model, x, lambda: model.blocks[2].requires_grad_(False))  # before the head runs
    _same(during, plain)
    assert not any(p.requires_grad for p in model.blocks[2].parameters())  # the other thread's change stays
    model.blocks[2].requires_grad_(True)
    assert_untouched(before, snapshot(model))  # the call's own: the head's mode and the hook it added, undone


@pytest.mark.parametrize("family", ["timm_cls", "bert", "clip_image"])
def test_concurrent_calls_give_the_sequential_answers(family):
    from concurrent.futures import ThreadPoolExecutor

    model, x, _ = _family(family)
    leaf = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    leaf.register_forward_hook(lambda m, i, o: None)  # a hooked model: the guard's brackets are on
    methods = ["transformer_attribution", "attnlrp", "rollout", "lrp"]
    alone = [explain(model, x, method=m) for m in methods]
    before, hooks = snapshot(model), _global_hooks()
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda m: explain(model, x, method=m), methods * 2))
    for a, b in zip(alone * 2, together):
        _same(a, b)
    assert_untouched(before, snapshot(model))
    assert _global_hooks() == hooks


@pytest.mark.parametrize("family", FAMILIES)
def test_hooks_on_modules_the_replay_does_not_run_are_named(family):
    model, x, _ = _family(family)
    plain = explain(model, x)
    model.register_forward_hook(lambda m, i, o: o)  # the whole model: never called by the replay
    with pytest.warns(UnreflectedHookWarning, match=f"forward hooks on {type(model).__name__} were not run"):
        _same(explain(model, x), plain)
    assert issubclass(UnreflectedHookWarning, LRPWarning) and issubclass(LRPWarning, UserWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreflectedHookWarning)  # the documented way to refuse
        _refused(model, x, UnreflectedHookWarning, "were not run")


def test_a_steering_hook_on_a_block_is_named_and_a_hook_on_a_leaf_is_replayed():
    model, x = make_tiny_vit(), _images()
    plain = explain(model, x)
    model.blocks[1].register_forward_hook(lambda m, i, o: o * 1.5)  # steering: the model's logits change
    with pytest.warns(UnreflectedHookWarning, match=r"hooks on blocks\.1 were not run"):
        steered = explain(model, x)
    _same(steered, plain)
    with torch.no_grad():
        assert not torch.allclose(model(x), plain.logits)  # not the hooked model's function: hence the warning
    model = make_tiny_vit()
    model.head.register_forward_hook(lambda m, i, o: 2 * o)  # a leaf the replay calls: reflected, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreflectedHookWarning)
        exp = explain(model, x, "attnlrp")  # a replay differentiates the hooked leaf itself
    with torch.no_grad():
        assert torch.allclose(exp.logits, model(x), atol=1e-5) and torch.allclose(exp.logits, 2 * plain.logits)
    # the explicit rules would read the head's W, b, which the hooked head no longer computes: refused (issue #43)
    with pytest.raises(UnsupportedModelError, match=r"head \(Linear\).* a forward hook or pre-hook on it changes"):
        explain(model, x)
