"""explain_generation on a vision-language model (docs/METHODS.md §2g, Generation): step k is ``explain`` on the
prefix with the image, in float64; the image maps per step; a batch is its rows; the model is left as it was; the
HTML shows the image tokens as one cell and an image map per step. Tiny random LLaVA (tests/vlms.py) and tiny-vlm."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest
import torch
from decoders import f64_bound
from vlms import GRID, IMAGE, SIZE, inputs, make_llava, per_token_family, prompt

from lrp_core import explain, explain_generation
from lrp_core.errors import InputError, UnsupportedModelError
from lrp_core.viz.text import IMAGE_LABEL, image_cell
from lrp_core.viz.thumbnails import THUMB_PX

K = 3
PIXEL_METHODS = ("attnlrp", "lrp", "cp_lrp")


def _dev(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| relative to the larger map's max |·|."""
    return float((a - b).abs().max() / max(float(a.abs().max()), float(b.abs().max()), 1e-300))


def _prefix(gen, x: dict, k: int, row: int = 0) -> dict:
    """The processor's output for row ``row``'s prompt and its first k generated tokens, unpadded."""
    real = gen.attention_mask[row, : gen.prompt_length + k].bool()
    ids = gen.input_ids[row, : gen.prompt_length + k][real][None]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": x["pixel_values"][row : row + 1]}


@pytest.mark.parametrize(
    "tower,method",
    [("dinov2", "attnlrp"), ("clip", "lrp"), ("dinov2", "cp_lrp"), ("clip", "rollout"), ("dinov2", "token_ablation")],
)
def test_each_step_is_explain_on_its_prefix(tower, method):
    model = make_llava(tower)
    x = inputs([prompt([5, 6], [7, 8])])
    gen = explain_generation(model, x, method=method, max_new_tokens=K, stop_at_eos=False)
    P = gen.prompt_length
    assert gen.scores.shape == (1, K, P + K - 1) and gen.targets.shape == (1, K)
    assert gen.grid == (GRID, GRID) and gen.image_size == (SIZE, SIZE)
    assert gen.patch_map().shape == (1, K, GRID, GRID) and gen.upsample().shape == (1, K, SIZE, SIZE)
    assert (gen.pixels is not None) == (method in PIXEL_METHODS)
    for k in range(K):
        ref = explain(model, _prefix(gen, x, k), method=method, target=int(gen.targets[0, k]))
        assert torch.equal(gen.image_tokens, ref.image_tokens)
        assert _dev(gen.scores[:, k, : P + k], ref.scores) <= 1e-10
        assert not gen.scores[:, k, P + k :].any()  # after the step's prefix
        assert _dev(gen.patch_map()[:, k], ref.patch_map()) <= 1e-10
        assert _dev(gen.upsample()[:, k], ref.upsample()) <= 1e-10
        if method in PIXEL_METHODS:
            assert gen.pixels.shape == (1, K, SIZE, SIZE)
            assert _dev(gen.pixels[:, k], ref.pixels) <= 1e-10
        assert abs(float(gen.logits[0, k]) - float(ref.logits[0, gen.targets[0, k]])) <= 1e-10


def test_the_greedy_tokens_are_generates():
    model = make_llava("clip")
    x = inputs([prompt([5], [7, 8, 9])])
    gen = explain_generation(model, x, method="rollout", max_new_tokens=K, stop_at_eos=False)
    with torch.no_grad():
        out = model.generate(**x, max_new_tokens=K, do_sample=False, min_new_tokens=K)
    assert torch.equal(gen.targets, out[:, x["input_ids"].shape[1] :])


def test_a_batch_is_its_rows():
    """Two prompts of different lengths (left-padded), a given continuation: each row is its own call."""
    model = make_llava("dinov2")
    rows = [prompt([5, 6, 7], [8, 9]), prompt([10], [11])]
    x = inputs(rows, side="right", seed=2)
    cont = [[12, 13], [14, 15]]
    gen = explain_generation(model, x, method="attnlrp", continuation=cont)
    assert gen.scores.shape == (2, 2, gen.prompt_length + 1) and gen.pixels.shape == (2, 2, SIZE, SIZE)
    for b, row in enumerate(rows):
        one = inputs([row], seed=2)
        one["pixel_values"] = x["pixel_values"][b : b + 1]
        alone = explain_generation(model, one, method="attnlrp", continuation=cont[b])
        pad = gen.prompt_length - alone.prompt_length
        assert not gen.scores[b, :, :pad].any()
        assert _dev(gen.scores[b, :, pad:], alone.scores[0]) <= 1e-10
        assert _dev(gen.pixels[b], alone.pixels[0]) <= 1e-10
        assert _dev(gen.upsample()[b], alone.upsample()[0]) <= 1e-10
        assert torch.equal(gen.image_tokens[b] - pad, alone.image_tokens[0])


def _state(model):
    return {
        "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grads": [p.grad for p in model.parameters()],
        "hooks": [(len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks)) for m in model.modules()],
    }


def test_the_model_is_left_bit_identical_and_without_hooks():
    model = make_llava("dinov2").train()  # the greedy steps run in eval semantics; the modes are restored
    x = inputs([prompt([5, 6], [7])])
    before = _state(model)
    explain_generation(model, x, method="attnlrp", max_new_tokens=2, stop_at_eos=False)
    with pytest.raises(UnsupportedModelError):
        explain_generation(model, x, method="pa_lrp", max_new_tokens=2)
    after = _state(model)
    for name in before["params"]:
        assert torch.equal(before["params"][name], after["params"][name]), name
    for key in ("training", "requires_grad", "hooks"):
        assert before[key] == after[key], key
    assert all(a is b for a, b in zip(before["grads"], after["grads"]))


@pytest.mark.parametrize("method", ["pa_lrp"])
def test_the_methods_refused_on_a_vlm_are_refused(method):
    with pytest.raises(UnsupportedModelError, match=f"{method}.*not defined on LlavaForConditionalGeneration"):
        explain_generation(make_llava(), inputs([prompt([5], [6])]), method=method, max_new_tokens=1)


def test_bad_inputs_are_refused_with_what_is_accepted():
    model = make_llava()
    x = inputs([prompt([5], [6])])
    with pytest.raises(InputError, match="pixel_values"):
        explain_generation(model, None, {"input_ids": x["input_ids"]}, max_new_tokens=1)
    with pytest.raises(InputError, match="processor's output"):
        explain_generation(model, None, "a text prompt", max_new_tokens=1)
    with pytest.raises(InputError, match="image token"):  # its image tokens would outnumber the image's features
        explain_generation(model, x, continuation=[IMAGE, 5])
    with pytest.raises(InputError, match="image tokens"):  # the prompt lacks its image tokens
        explain_generation(
            model, dict(x, input_ids=x["input_ids"].masked_fill(x["input_ids"] == IMAGE, 7)), max_new_tokens=1
        )


def test_image_cell_sums_each_run_of_image_tokens():
    pieces = ["<s>", "a", "<im>", "<im>", "<im>", "b", "<im>", "c"]
    scores = np.arange(16, dtype=np.float64).reshape(2, 8)
    shown, summed = image_cell(pieces, scores, [p == "<im>" for p in pieces])
    assert shown == ["<s>", "a", IMAGE_LABEL, "b", IMAGE_LABEL, "c"]
    assert summed.tolist() == [[0, 1, 2 + 3 + 4, 5, 6, 7], [8, 9, 10 + 11 + 12, 13, 14, 15]]


def test_the_html_shows_one_image_cell_and_an_image_map_per_step():
    model = make_llava("clip")
    x = inputs([prompt([5, 6], [7, 8])])
    gen = explain_generation(model, x, method="attnlrp", max_new_tokens=K, stop_at_eos=False)
    page = gen.html()
    assert page.count('<img class="trl-map"') == K and page.count("data:image/png;base64,") == K
    cells = [html.unescape(t) for t in re.findall(r'<span class="c"[^>]*title="([^"]*)"', page)]
    images = [c for c in cells if c.startswith(f"'{IMAGE_LABEL}'")]
    assert len(images) == K and f">{IMAGE}<" not in page  # one [image] cell per step, no placeholder cell
    P = gen.prompt_length
    for k, title in enumerate(images):  # its score: the image tokens' summed score at that step
        want = float(gen.scores[0, k, :P][x["input_ids"][0] == IMAGE].sum())
        assert float(title.split(": ")[1]) == pytest.approx(want, rel=1e-3)


@pytest.fixture(scope="module")
def tiny_vlm():
    from lrp_core import models

    loaded = models.load("tiny-vlm")
    loaded.model.double()  # the float64 property is checked in float64
    return loaded


def test_tiny_vlm_steps_are_explain_on_their_prefixes(tiny_vlm):
    from lrp_core.data import make_vqa
    from lrp_core.models.tiny_vlm import HELD_OUT_SEED

    record = make_vqa(1, HELD_OUT_SEED)[0]
    x = {
        k: (v.double() if v.is_floating_point() else v)
        for k, v in tiny_vlm.preprocess(record.image, record.question).items()
    }
    gen = explain_generation(
        tiny_vlm.model, tiny_vlm.info["processor"], x, method="attnlrp", max_new_tokens=2, stop_at_eos=False
    )
    assert gen.generated(0)[0] == record.answer  # the answer it gives held-out questions
    assert gen.pixels.shape == (1, 2, 112, 112) and gen.patch_map().shape == (1, 2, 8, 8)
    for k in range(2):
        ref = explain(tiny_vlm.model, _prefix(gen, x, k), method="attnlrp", target=int(gen.targets[0, k]))
        assert _dev(gen.scores[:, k, : gen.prompt_length + k], ref.scores) <= 1e-10
        assert _dev(gen.pixels[:, k], ref.pixels) <= 1e-10
    page = gen.html()
    assert page.count('<img class="trl-map"') == 2 and page.count("&lt;image&gt;") == 0
    assert html.unescape(page).count(f"'{IMAGE_LABEL}': ") == 2
    shown = gen.html(image=record.image, mask=record.mask)  # the photo under each step's map, the object outlined
    assert shown.count(f'width="{THUMB_PX}" height="{THUMB_PX}"') == 2 and "outlined: the mask given" in shown


def test_the_generation_explorer_shows_the_image_map_beside_the_text_row():
    """Per step: the image map is the engine's pixel map (float64), the text row shows the image tokens as one
    [image] cell holding their summed score, and the widget's HTML holds the picture."""
    from widgets import GenerationExplorer

    model = make_llava("clip")
    x = inputs([prompt([5, 6], [7, 8])])
    gen = explain_generation(model, x, method="attnlrp", max_new_tokens=2, stop_at_eos=False)
    w = GenerationExplorer(model, None, prompt=x, max_new_tokens=2, methods=["attnlrp", "rollout"])
    assert torch.equal(w.input_ids, gen.input_ids)
    P = gen.prompt_length
    image = (x["input_ids"][0] == IMAGE).numpy()
    for k in range(2):
        w.step_selector.value = k
        assert w.image_map.shape == (SIZE, SIZE)
        assert _dev(torch.from_numpy(w.image_map), gen.pixels[0, k]) <= 1e-10
        assert w.image_view.value.startswith('<img class="trl-step-image"') and "base64," in w.image_view.value
        assert w.displayed_tokens.count(IMAGE_LABEL) == 1 and len(w.displayed_tokens) == P + k - image.sum() + 1
        row = gen.scores[0, k, : P + k].numpy()
        cell = w.displayed_map[w.displayed_tokens.index(IMAGE_LABEL)]
        assert abs(cell - row[:P][image].sum()) <= 1e-10 * np.abs(row).max()
        static = w._static_bundle()["text/html"]  # what a notebook without widgets shows
        assert static.count('<img class="trl-step-image"') == 1 and IMAGE_LABEL in static
    w.method_selector.value = "rollout"  # no pixels: the image tokens' scores upsampled
    ref = explain_generation(model, x, method="rollout", continuation=gen.targets)
    assert _dev(torch.from_numpy(w.image_map), ref.upsample()[0, 1]) <= 1e-10
    assert "pa_lrp" not in w.method_selector.options  # the methods refused on a VLM are not offered
    with pytest.raises(UnsupportedModelError, match="pa_lrp"):
        GenerationExplorer(model, None, prompt=x, max_new_tokens=1, methods=["pa_lrp"])


def test_smolvlm_steps_are_explain_on_their_prefixes():
    """SmolVLM's images (B, k, 3, H, W) and pixel masks stay one per row through the generation loop."""
    from vlms import make_smolvlm, smol_inputs, smol_prompt

    model = make_smolvlm()
    x = smol_inputs([smol_prompt([5, 6], [7, 8])])
    gen = explain_generation(model, x, method="attnlrp", max_new_tokens=K, stop_at_eos=False)
    P = gen.prompt_length
    for k in range(K):
        real = gen.attention_mask[0, : P + k].bool()
        ids = gen.input_ids[0, : P + k][real][None]
        ref = explain(
            model,
            {**x, "input_ids": ids, "attention_mask": torch.ones_like(ids)},
            method="attnlrp",
            target=int(gen.targets[0, k]),
        )
        assert _dev(gen.scores[:, k, : P + k], ref.scores) <= 1e-10
        assert _dev(gen.pixels[:, k], ref.pixels) <= 1e-10


def test_a_family_the_loop_cannot_extend_is_refused_with_the_reason(monkeypatch):
    """An adapter that names why explain_generation does not run on its family is refused with that reason, before
    any step (every family explained today runs: this checks the refusal itself)."""
    from lrp_core.adapters.gemma3_vl import Gemma3VLMAdapter

    monkeypatch.setattr(Gemma3VLMAdapter, "generation_refused", "a per-token entry the loop does not extend")
    model, x, _, _ = per_token_family("gemma3")
    with pytest.raises(UnsupportedModelError, match="Gemma3ForConditionalGeneration: a per-token entry the loop"):
        explain_generation(model, x, method="attnlrp", max_new_tokens=1)


@pytest.mark.parametrize("family", ["gemma3", "paligemma", "qwen", "qwen2"])
def test_per_token_families_generate_as_generate_and_each_step_is_explain_on_its_prefix(family):
    """Gemma 3 (token_type_ids): the greedy tokens are the model's generate(do_sample=False); step k is explain on
    the prompt and its first k tokens, whose per-token entry holds the value generate gives a written token; the
    model is left bit-identical."""
    model, x, name, value = per_token_family(family)
    before = _state(model)
    gen = explain_generation(model, x, method="attnlrp", max_new_tokens=K)  # stops at end-of-text, as generate
    with torch.no_grad():
        out = model.generate(**x, max_new_tokens=K, do_sample=False)
    assert torch.equal(gen.targets, out[:, x["input_ids"].shape[1] :])
    P = gen.prompt_length
    for k in range(gen.targets.shape[1]):
        ids = gen.input_ids[:, : P + k]
        types = torch.cat([x[name], torch.full((1, k), value, dtype=x[name].dtype)], 1)
        ref = explain(
            model,
            {**x, "input_ids": ids, "attention_mask": torch.ones_like(ids), name: types},
            method="attnlrp",
            target=int(gen.targets[0, k]),
        )
        assert _dev(gen.scores[:, k, : P + k], ref.scores) <= 1e-10
        assert _dev(gen.pixels[:, k], ref.pixels) <= 1e-10
        assert abs(float(gen.logits[0, k]) - float(ref.logits[0, gen.targets[0, k]])) <= 1e-10
    after = _state(model)
    assert all(torch.equal(before["params"][n], after["params"][n]) for n in before["params"])
    assert before["hooks"] == after["hooks"] and before["training"] == after["training"]


def _two_rows(family: str) -> tuple:
    """(model, two right-padded prompts of different lengths, each prompt alone) for a per-token family."""
    import vlms

    if family == "gemma3":
        rows = [vlms.gemma3_prompt([5, 6, 7], [8]), vlms.gemma3_prompt([], [9])]
        one = [vlms.image_types(inputs([r], seed=2)) for r in rows]
        both = vlms.image_types(inputs(rows, side="right", seed=2))
        model = vlms.make_gemma3()
    elif family == "paligemma":
        (r0, t0), (r1, t1) = vlms.paligemma_prompt([5, 6, 7]), vlms.paligemma_prompt([8])
        one = [vlms.with_types(inputs([r], seed=2), [t]) for r, t in ((r0, t0), (r1, t1))]
        both = vlms.with_types(inputs([r0, r1], side="right", seed=2), [t0, t1], side="right")
        model = vlms.make_paligemma(2)
    else:
        rows = [vlms.qwen_prompt([5, 6, 7], [8]), vlms.qwen_prompt([], [9])]
        both = vlms.qwen_inputs(rows, side="right", seed=2)
        n = both["pixel_values"].shape[0] // 2
        one = [
            {**vlms.qwen_inputs([r], seed=2), "pixel_values": both["pixel_values"][b * n : (b + 1) * n]}
            for b, r in enumerate(rows)
        ]
        model = vlms.make_qwen_vl()
    for b in range(2):
        one[b]["pixel_values"] = one[b]["pixel_values"] if family == "qwen" else both["pixel_values"][b : b + 1]
    return model, both, one


@pytest.mark.parametrize("family", ["gemma3", "paligemma", "qwen"])
def test_a_padded_batch_of_a_per_token_family_is_its_rows(family):
    """Right-padded prompts of different lengths (re-padded on the left with their per-token entries): each row's
    greedy tokens and maps are those of the row alone."""
    model, both, one = _two_rows(family)
    gen = explain_generation(model, both, method="attnlrp", max_new_tokens=2, stop_at_eos=False)
    for b in range(2):
        alone = explain_generation(model, one[b], method="attnlrp", max_new_tokens=2, stop_at_eos=False)
        pad = gen.prompt_length - alone.prompt_length
        assert torch.equal(gen.targets[b], alone.targets[0])
        assert not gen.scores[b, :, :pad].any()
        assert _dev(gen.scores[b, :, pad:], alone.scores[0]) <= f64_bound(model, 1e-10)
        assert _dev(gen.pixels[b], alone.pixels[0]) <= f64_bound(model, 1e-10)
