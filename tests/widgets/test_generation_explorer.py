"""GenerationExplorer driven programmatically: every view equals the engine's, in float64.

For tiny-lm's shape (3 blocks, D96, word-level tokenizer) and for every decoder family of tests/decoders.py,
for every method that runs on decoders and two steps k, the slider's last stop (the method's map) equals
``explain_generation(...).scores[0, k]``, which explains the whole continuation in one call — the widget
explains each step's prefix alone, so the two routes share no code below ``lrp_core.explain``. The other
stops are compared with the engine's own tensors, combined here by plain torch. The models are random
(every parameter perturbed, so that no map is zero) and float64; HF's eager attention takes its softmax in
float32, so prefix-alone and read-inside-the-sequence differ by float32 round-off of the attention
probabilities: "equal" is within 1e-8 of the map's largest entry.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from decoders import FAMILIES, make_decoder, perturb, rows

import lrp_core
from lrp_core.errors import InputError, UnsupportedModelError
from lrp_core.generation import explain_generation
from lrp_core.methods import registry
from lrp_core.models import LoadedModel
from lrp_core.models.tiny_lm import build_model, build_tokenizer
from widgets import GenerationExplorer, _engine
from widgets import _generation_parts as P
from widgets import generation as G

PROMPT = "Anna lives in Rome. Boris lives in Oslo. Where does Boris live? Answer:"
K = 3
STEPS = (0, 1)  # both differ from the full sequence explain_generation reads (its last step is that sequence)
TOL = 1e-8
METHODS = registry.DECODER_METHODS


@pytest.fixture(scope="module")
def lm():
    """tiny-lm's tokenizer and shape, every parameter random (seed 0), float64."""
    tok = build_tokenizer()
    torch.manual_seed(0)
    return SimpleNamespace(model=perturb(build_model(len(tok)), 0).double().eval(), tokenizer=tok)


@pytest.fixture(scope="module")
def explorer(lm):
    return GenerationExplorer(lm.model, lm.tokenizer, prompt=PROMPT, max_new_tokens=K)


def rel(got: np.ndarray, want: np.ndarray) -> float:
    """max |got − want| / max |want| (an all-zero ``want`` must be met exactly)."""
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-300))


def show(w: GenerationExplorer, method: str, step: int, stop: int = -1) -> np.ndarray:
    """Set the controls as a person would and return the per-piece values shown."""
    w.method_selector.value = method
    w.step_selector.value = step
    w.layer_slider.value = w.layer_slider.options[stop][1]
    assert w.last_error is None, w.last_error
    return w.current_values()


def check_every_method(w: GenerationExplorer, model, tokenizer, prompt, zeros_allowed: int = 0) -> dict[str, float]:
    """The last stop of each method at each step in STEPS against explain_generation; returns the worst error.

    ``zeros_allowed``: how many of the maps may be all zero (Grad-CAM's clamp can zero a random model's map).
    """
    worst, zeros = {}, 0
    generated = w.input_ids[0, w.prompt_length :].tolist()
    for method in METHODS:
        # on the widget's thread count: Hugging Face's float32 RMSNorm inside the float64 model rounds a 50-row
        # batch (Integrated Gradients' steps) differently on 1 and 2 threads (measured 3.8e-8)
        with _engine.torch_threads(model, w.threads):
            ref = explain_generation(model, tokenizer, prompt, method=method, continuation=generated).scores[0]
        for k in STEPS:
            want = ref[k, : w.prompt_length + k].numpy()
            zeros += int(np.abs(want).max() == 0)
            worst[method] = max(worst.get(method, 0.0), rel(show(w, method, k), want))
        assert worst[method] < TOL, (method, worst[method])
    assert zeros <= zeros_allowed, f"{zeros} maps are all zero: nothing was compared there"
    return worst


# ----------------------------------------------------------------------------- the map equals the engine's
def test_tiny_lm_every_method_equals_explain_generation(lm, explorer):
    assert explorer.last_error is None, explorer.last_error
    greedy = explain_generation(lm.model, lm.tokenizer, PROMPT, max_new_tokens=K).targets[0]
    assert explorer.input_ids[0, explorer.prompt_length :].tolist() == greedy.tolist()  # the same continuation
    worst = check_every_method(explorer, lm.model, lm.tokenizer, PROMPT)
    print("max |view - engine| / max |engine|:", {m: f"{v:.1e}" for m, v in worst.items()})


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_decoder_family_every_method_equals_explain_generation(family):
    model = make_decoder(family)
    prompt = rows(seed=3, lengths=(7,))[0].tolist()
    w = GenerationExplorer(model, prompt=prompt, max_new_tokens=K)
    assert w.last_error is None, w.last_error
    assert w.pieces[:3] == [f"#{i}" for i in prompt[:3]]  # no tokenizer: ids as pieces
    worst = check_every_method(w, model, None, {"input_ids": torch.tensor([prompt])}, zeros_allowed=2)
    print(family, "max |view - engine| / max |engine|:", f"{max(worst.values()):.1e}", max(worst, key=worst.get))


# ----------------------------------------------------------------------------- the other stops
def _product_row(layers: torch.Tensor, stop: int, norm: str, position: int) -> np.ndarray:
    """Row ``position`` of (I+Ā_stop)…(I+Ā_0), written out (the decoder reads its last token)."""
    N = layers.shape[-1]
    c = torch.eye(N, dtype=torch.float64)
    for b in range(stop + 1):
        f = layers[b].double() + torch.eye(N, dtype=torch.float64)
        if norm == "row":
            f = f / f.sum(-1, keepdim=True)
        c = f @ c
    return c[position].numpy()


@pytest.mark.parametrize(
    "method,norm", [("transformer_attribution", "row"), ("generic_attention", "none"), ("rollout", "row")]
)
def test_product_stops_are_the_product_up_to_each_block(lm, explorer, method, norm):
    for k in STEPS:
        inputs = explorer.prefix(k)
        exp = lrp_core.explain(lm.model, inputs, method=method, target=explorer.target_id(k))
        n = inputs["input_ids"].shape[1]
        show(explorer, method, k)
        labels = [lab for lab, _ in explorer.layer_slider.options]
        assert len(labels) == 3 and labels[-1] == "blocks 0\u20262"
        for b in range(3):
            want = _product_row(exp.layers[0], b, norm, n - 1)
            assert rel(show(explorer, method, k, stop=b), want) < 1e-10, (method, k, b)


def test_raw_attention_stops_are_each_blocks_attention_at_the_read_token(lm, explorer):
    inputs = explorer.prefix(1)
    exp = lrp_core.explain(lm.model, inputs, method="raw_attention")
    for b in range(3):
        assert rel(show(explorer, "raw_attention", 1, stop=b), exp.layers[0, b, -1].numpy()) < 1e-12


@pytest.mark.parametrize("method", ["attnlrp", "cp_lrp"])
def test_residual_stops_walk_down_from_the_logit_to_the_map(lm, explorer, method):
    k = 1
    exp = lrp_core.explain(lm.model, explorer.prefix(k), method=method, target=explorer.target_id(k))
    show(explorer, method, k)
    labels = [lab for lab, _ in explorer.layer_slider.options]
    assert labels == ["leaving block 2", "leaving block 1", "leaving block 0", G.MAP_LABEL]
    for stop, b in enumerate((2, 1, 0)):
        assert rel(show(explorer, method, k, stop=stop), exp.token_relevance[0, b].numpy()) < 1e-12
    # all of it on the read token, as the explained logit (to float32 round-off: HF's RMSNorm computes in float32)
    top = show(explorer, method, k, stop=0)
    y = float(exp.logits[0, explorer.target_id(k)])
    assert top[-1] == pytest.approx(y, rel=1e-6) and np.all(top[:-1] == 0)
    assert rel(show(explorer, method, k, stop=3), exp.scores[0].numpy()) < 1e-12


def test_methods_without_blocks_have_one_stop(explorer):
    for method in ("attention_gradcam", "cdam", "token_ablation"):
        show(explorer, method, 0)
        assert [lab for lab, _ in explorer.layer_slider.options] == [G.MAP_LABEL]
        assert explorer.layer_slider.disabled


# ----------------------------------------------------------------------------- contrast, cache, words
def test_contrast_box(lm):
    w = GenerationExplorer(lm.model, lm.tokenizer, prompt=PROMPT, max_new_tokens=K, methods=["attnlrp"])
    generated = w.input_ids[0, w.prompt_length :].tolist()
    other = next(t for t in ("Oslo", "Rome", "Anna") if lm.tokenizer.convert_tokens_to_ids(t) != generated[1])
    w.step_selector.value = 1
    w.contrast_box.value = other
    assert w.last_error is None, w.last_error
    ref = explain_generation(lm.model, lm.tokenizer, PROMPT, continuation=generated, contrast=[None, other, None])
    assert rel(w.current_values(), ref.scores[0, 1, : w.prompt_length + 1].numpy()) < TOL
    assert "rather than" in w.html.value and other in w.html.value
    assert "red, for the token" in w.html.value and "for the class" not in w.html.value  # the legend names the token
    w.contrast_box.value = "zzzz"  # not a word of tiny-lm's vocabulary: a message, the map kept
    assert "zzzz" in w.last_error and "not one token" in w.last_error and "trl-error" in w.message.value
    assert w.contrast == lm.tokenizer.convert_tokens_to_ids(other)
    w.contrast_box.value = f"#{generated[1]}"  # the written token itself: the difference would be zero
    assert "is the token written at this step" in w.last_error
    assert w.contrast == lm.tokenizer.convert_tokens_to_ids(other) and w.displayed_map is not None  # map kept
    w.contrast_box.value = ""
    plain = explain_generation(lm.model, lm.tokenizer, PROMPT, continuation=generated).scores[0, 1]
    assert w.last_error is None and w.contrast is None
    assert rel(w.current_values(), plain[: w.prompt_length + 1].numpy()) < TOL


def test_a_step_whose_token_is_the_contrast_shows_the_error_not_a_stale_map(lm):
    w = GenerationExplorer(lm.model, lm.tokenizer, prompt=PROMPT, continuation=" Oslo Rome", methods=["cp_lrp"])
    w.step_selector.value = 1
    w.contrast_box.value = "Oslo"  # "Rome rather than Oslo" at step 2
    assert w.last_error is None and "rather than" in w.html.value
    w.step_selector.value = 0  # step 1 wrote "Oslo" itself
    assert "is the token written at this step" in w.last_error and "trl-error" in w.message.value
    assert w.html.value == "" and w.displayed_map is None
    w.step_selector.value = 1
    assert w.last_error is None and w.displayed_map is not None


def test_explanations_are_cached_per_method_step_and_contrast(lm, monkeypatch):
    calls = []
    real = G._engine.explain
    monkeypatch.setattr(G._engine, "explain", lambda *a, **kw: calls.append(a[2]) or real(*a, **kw))
    w = GenerationExplorer(lm.model, lm.tokenizer, prompt=PROMPT, max_new_tokens=K, methods=["attnlrp", "rollout"])
    assert len(calls) == 1
    for stop in range(len(w.layer_slider.options)):  # the slider re-reads the cached explanation
        w.layer_slider.value = w.layer_slider.options[stop][1]
    w.step_selector.value = 1
    w.step_selector.value = 0
    w.method_selector.value = "rollout"
    w.method_selector.value = "attnlrp"
    assert calls == ["attnlrp", "attnlrp", "rollout"]
    w.contrast_box.value = "Oslo"
    w.contrast_box.value = ""
    assert calls == ["attnlrp", "attnlrp", "rollout", "attnlrp"]


class MarkedTokenizer:
    """A byte-level-BPE-like tokenizer: ``Ġ`` marks a word's start, ``s`` continues one (ids 0 … 5)."""

    VOCAB = ["<pad>", "Ġthe", "Ġcat", "s", "Ġsat", "Ġon"]

    def __call__(self, text: str, add_special_tokens: bool = False, **kw):
        ids = [self.VOCAB.index("Ġ" + w) for w in text.split()]
        return {"input_ids": ids}

    def convert_ids_to_tokens(self, ids):
        return [self.VOCAB[i] for i in ids]

    def get_vocab(self):
        return {t: i for i, t in enumerate(self.VOCAB)}


def test_pieces_are_shown_as_words_with_the_sum_of_their_scores():
    model = make_decoder("llama")
    prompt = [1, 2, 3, 4, 5, 1, 2, 3]  # the cat s sat on the cat s
    w = GenerationExplorer(model, MarkedTokenizer(), prompt=prompt, continuation=[4, 5], methods=["attnlrp"])
    w.step_selector.value = 1
    pieces = w.current_values()
    assert w.word_toggle.layout.display is None and w.word_toggle.value == "words"
    assert w.displayed_tokens == ["the", "cats", "sat", "on", "the", "cats", "sat"]
    want = [pieces[0], pieces[1] + pieces[2], pieces[3], pieces[4], pieces[5], pieces[6] + pieces[7], pieces[8]]
    np.testing.assert_allclose(w.displayed_map, want, rtol=0, atol=0)
    w.word_toggle.value = "pieces"
    assert w.displayed_tokens == ["the", "cat", "s", "sat", "on", "the", "cat", "s", "sat"]
    np.testing.assert_array_equal(w.displayed_map, pieces)


def test_a_word_level_tokenizer_shows_its_pieces_as_they_are(explorer):
    explorer.step_selector.value = 0
    assert P.word_scheme(explorer.tokenizer) is None and explorer.word_toggle.layout.display == "none"
    assert explorer.displayed_tokens == explorer.pieces[: explorer.prompt_length]
    assert "<s>" in explorer.displayed_tokens and "Boris" in explorer.displayed_tokens


def test_loaded_model_is_accepted(lm, explorer):
    loaded = LoadedModel(
        name="tiny-lm",
        model=lm.model,
        preprocess=lambda t: lm.tokenizer(t),
        labels=[],
        kind="text",
        tokenizer=lm.tokenizer,
    )
    w = GenerationExplorer(loaded, prompt=PROMPT, max_new_tokens=K, methods=["cp_lrp"])
    assert w.last_error is None
    assert torch.equal(w.input_ids, explorer.input_ids)
    np.testing.assert_array_equal(w.current_values(), show(explorer, "cp_lrp", 0))


def test_bench_times_the_generation_explorer(capsys):
    from widgets import bench

    results = bench.run_generation("tiny-lm", repeat=2, steps=2)
    assert [
        len(results[k])
        for k in (
            "first computation",
            "layer slider move",
            "step switch (new step)",
            "step switch (cached)",
            "layer slider move (product)",
        )
    ] == [1, 2, 1, 1, 2]
    assert "layer slider move" in capsys.readouterr().out


def test_static_picture_is_the_coloured_context(explorer):
    show(explorer, "attnlrp", 0)
    bundle = explorer._repr_mimebundle_()
    assert "trl-token" in bundle["text/html"] and "Boris" in bundle["text/html"]
    assert bundle["text/html"].count('class="trl-token"') == explorer.prompt_length


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "kwargs,words",
    [
        (dict(prompt=""), ["prompt is empty"]),
        (dict(prompt="   "), ["prompt is empty"]),
        (dict(max_new_tokens=0), ["max_new_tokens", "positive integer", "0"]),
        (dict(max_new_tokens=-2), ["max_new_tokens", "-2"]),
        (dict(max_new_tokens=True), ["max_new_tokens", "True"]),
        (dict(max_new_tokens=2.5), ["max_new_tokens", "2.5"]),
        (dict(methods=["nope"]), ["'nope'", "is not a method", "attnlrp", "token_ablation"]),
        (dict(methods=[]), ["no method", "attnlrp"]),
        (dict(continuation="Oslo Rome", max_new_tokens=3), ["max_new_tokens=3", "2 tokens"]),
    ],
)
def test_bad_arguments_are_input_errors_naming_what_is_accepted(lm, kwargs, words):
    args = {"prompt": PROMPT, **kwargs}
    with pytest.raises(InputError) as err:
        GenerationExplorer(lm.model, lm.tokenizer, **args)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_a_method_that_does_not_run_on_decoders_is_refused_by_name(lm, monkeypatch):
    """Every method runs on decoders today (the Captum baselines too: they are offered); one that did not
    would be refused by name, with the list of those accepted."""
    assert "integrated_gradients" in P.decoder_methods() and "kernel_shap" in P.decoder_methods()
    monkeypatch.setattr(registry, "DECODER_METHODS", tuple(m for m in METHODS if m != "integrated_gradients"))
    with pytest.raises(InputError) as err:
        GenerationExplorer(lm.model, lm.tokenizer, prompt=PROMPT, methods=["integrated_gradients"])
    for word in ("does not run on decoder", "attnlrp"):
        assert word in str(err.value)


def test_text_prompt_without_tokenizer(lm):
    with pytest.raises(InputError, match="tokenizer"):
        GenerationExplorer(lm.model, prompt=PROMPT)


@pytest.mark.parametrize("build", [lambda: make_decoder("llama", head="seq"), lambda: torch.nn.Linear(2, 2)])
def test_models_without_a_language_model_head_are_refused(build):
    with pytest.raises(UnsupportedModelError, match="GenerationExplorer"):
        GenerationExplorer(build(), prompt=[1, 2, 3])
