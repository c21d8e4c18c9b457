"""GenerationExplorer on the vision-language families whose processors give per-token entries: Gemma 3 and
PaliGemma (``token_type_ids``), Qwen2.5-VL and Qwen2-VL (``mm_token_type_ids``, from which the M-RoPE positions
are laid out). Tiny random float64 models of tests/vlms.py.

Each step's text map (the per-piece values of the method's map) and image map equal
``explain_generation``'s for the same prompt and written tokens: the widget explains each step's prefix alone,
with the per-token entries extended for the written tokens by the adapter's ``extend_for_generation``, while
``explain_generation`` explains every step inside the whole sequence in one call, so the two agree up to float64
round-off: ≤ 1e-10 of the map's largest entry. The reference runs on one torch thread, as the widget runs a small
model: PaliGemma's eager attention takes its softmax in float32 (HF), and on torch's two threads here its round-off
moved the maps by up to 4e-8 (on one thread: 5e-17). The model is left bit-identical and without hooks.
"""

from __future__ import annotations

import base64
import io
import re
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from vlms import model_state, per_token_family, relative_deviation

from lrp_core.errors import InputError
from lrp_core.generation import explain_generation
from lrp_core.viz.text import IMAGE_LABEL
from widgets import GenerationExplorer, _engine

FAMILIES = ("gemma3", "paligemma", "qwen", "qwen2")
K = 2


def reference(model: torch.nn.Module, x: dict, **kw) -> Any:
    """``explain_generation`` on one torch thread, the widget's for a small model."""
    with _engine.torch_threads(model, 1):
        return explain_generation(model, x, **kw)


def _unchanged(model: torch.nn.Module, before: dict) -> None:
    after = model_state(model)
    for name in before["params"]:
        assert torch.equal(before["params"][name], after["params"][name]), name
    for key in ("training", "requires_grad", "hooks"):
        assert before[key] == after[key], key
    assert all(a is b for a, b in zip(before["grads"], after["grads"]))


@pytest.mark.parametrize("family", FAMILIES)
def test_each_step_shows_explain_generations_text_map_and_image_map(family):
    model, x, name, value = per_token_family(family)
    before = model_state(model)
    w = GenerationExplorer(model, None, prompt=x, max_new_tokens=K, methods=["attnlrp", "rollout"])
    gen = reference(model, x, method="attnlrp", max_new_tokens=K, stop_at_eos=False)
    assert torch.equal(w.input_ids, gen.input_ids)  # the same greedy tokens, written with the extended entries
    P = gen.prompt_length
    for k in range(K):
        w.step_selector.value = k
        assert w.last_error is None, w.last_error
        want = torch.cat([x[name], torch.full((1, k), value, dtype=x[name].dtype)], 1)
        assert torch.equal(w.prefix(k)[name], want)  # the value generate gives a written token
        relative_deviation(torch.from_numpy(w.current_values()), gen.scores[0, k, : P + k])
        assert w.image_map is not None and w.image_view.value.startswith('<img class="trl-step-image"')
        relative_deviation(torch.from_numpy(w.image_map), gen.pixels[0, k])
        assert w.displayed_tokens.count(IMAGE_LABEL) == 1  # the image tokens as one cell beside the text
    w.method_selector.value = "rollout"  # no pixels: the image tokens' scores upsampled
    ref = reference(model, x, method="rollout", continuation=gen.targets)
    relative_deviation(torch.from_numpy(w.current_values()), ref.scores[0, K - 1, : P + K - 1])
    relative_deviation(torch.from_numpy(w.image_map), ref.upsample()[0, K - 1])
    _unchanged(model, before)


def test_a_given_continuation_on_a_per_token_family():
    """A given continuation (not the greedy one) is explained with the same extended entries."""
    model, x, _, _ = per_token_family("paligemma")
    cont = [7, 9, 11]
    w = GenerationExplorer(model, None, prompt=x, continuation=cont, methods=["attnlrp"])
    gen = reference(model, x, method="attnlrp", continuation=cont)
    P = gen.prompt_length
    for k in range(len(cont)):
        w.step_selector.value = k
        relative_deviation(torch.from_numpy(w.current_values()), gen.scores[0, k, : P + k])
        relative_deviation(torch.from_numpy(w.image_map), gen.pixels[0, k])


def test_smolvlm_whose_processor_gives_no_per_token_entries():
    """SmolVLM (images (1, k, 3, H, W) with their pixel mask, no per-token entry): the same agreement, so every VLM
    family the engine explains is covered here (LLaVA: tests/test_generation_vlm.py)."""
    from vlms import make_smolvlm, smol_inputs, smol_prompt

    model = make_smolvlm()
    x = smol_inputs([smol_prompt([5, 6], [7, 8])])
    w = GenerationExplorer(model, None, prompt=x, max_new_tokens=K, methods=["attnlrp"])
    assert w.per_token == {}
    gen = reference(model, x, method="attnlrp", max_new_tokens=K, stop_at_eos=False)
    assert torch.equal(w.input_ids, gen.input_ids)
    P = gen.prompt_length
    for k in range(K):
        w.step_selector.value = k
        relative_deviation(torch.from_numpy(w.current_values()), gen.scores[0, k, : P + k])
        relative_deviation(torch.from_numpy(w.image_map), gen.pixels[0, k])


def _png(value: str) -> np.ndarray:
    """The picture of an ``<img … src="data:image/png;base64,…">``, (H, W, 3) uint8."""
    data = re.search(r'base64,([^"]+)"', value).group(1)
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"))


def test_the_image_map_is_drawn_over_the_photo_with_the_mask_outlined():
    """image= / mask=: each step's picture is map_png of the step's image map over the photo, the mask's 2 px
    border (80² − 76² px for this square) drawn in OUTLINE_RGB; bad photos and masks are InputErrors."""
    from vlms import SIZE, inputs, make_llava, prompt

    from lrp_core.viz.thumbnails import OUTLINE_RGB, THUMB_PX, map_png

    model = make_llava("clip")
    x = inputs([prompt([5, 6], [7, 8])])
    photo = (np.random.default_rng(0).random((SIZE, SIZE, 3)) * 255).astype(np.uint8)
    mask = np.zeros((SIZE, SIZE), dtype=bool)
    mask[7:21, 7:21] = True  # 14 of 28 px: 80 of THUMB_PX = 160
    w = GenerationExplorer(model, None, prompt=x, max_new_tokens=2, methods=["attnlrp"], image=photo, mask=mask)
    plain = GenerationExplorer(model, None, prompt=x, max_new_tokens=2, methods=["attnlrp"])
    for k in range(2):
        w.step_selector.value = plain.step_selector.value = k
        pic = _png(w.image_view.value)
        want = map_png(w.image_map, image=photo, mask=mask, title="image (pixels)")
        assert np.array_equal(pic, np.asarray(Image.open(io.BytesIO(want)).convert("RGB")))
        assert pic.shape[1] == THUMB_PX and (pic == OUTLINE_RGB).all(-1).sum() >= 80**2 - 76**2
        assert not np.array_equal(pic, _png(plain.image_view.value))  # the photo is under the map
    with pytest.raises(InputError, match="image= too"):
        GenerationExplorer(model, None, prompt=x, max_new_tokens=1, mask=mask)
    with pytest.raises(InputError, match="size of the photo"):
        GenerationExplorer(model, None, prompt=x, max_new_tokens=1, image=photo, mask=mask[:20])
    with pytest.raises(InputError, match="bool"):
        GenerationExplorer(model, None, prompt=x, max_new_tokens=1, image=photo, mask=mask * 0.5)
    from decoders import make_decoder

    with pytest.raises(InputError, match="reads text only"):
        GenerationExplorer(make_decoder("llama"), None, prompt=[1, 5, 6], max_new_tokens=1, image=photo)


def test_a_processor_given_as_the_tokenizer_gives_its_tokenizers_pieces():
    """GenerationExplorer(vlm, processor, prompt=processor_output), as explain_generation takes it: the pieces come
    from the processor's tokenizer (the processor itself has no convert_ids_to_tokens)."""
    from types import SimpleNamespace

    from vlms import inputs, make_llava, prompt

    class Pieces:
        def convert_ids_to_tokens(self, ids: list) -> list:
            return [f"t{i}" for i in ids]

    model = make_llava("clip")
    x = inputs([prompt([5, 6], [7, 8])])
    w = GenerationExplorer(model, SimpleNamespace(tokenizer=Pieces()), prompt=x, max_new_tokens=2, methods=["attnlrp"])
    assert w.last_error is None
    assert w.pieces == [f"t{i}" for i in w.input_ids[0].tolist()]
