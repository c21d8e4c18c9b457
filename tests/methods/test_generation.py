"""explain_generation: one map per generated token, each equal to explaining its teacher-forced prefix."""

import re
from types import SimpleNamespace

import pytest
import torch
from decoders import FAMILIES, make_decoder
from decoders import batch as decoder_batch
from decoders import rows as decoder_rows

import lrp_core
from lrp_core.errors import InputError
from lrp_core.methods.call import Contrast
from lrp_core.methods.generation import explain_generation, greedy_continuation
from lrp_core.models.tiny_lm import build_model, build_tokenizer

PROMPTS = [
    "Anna lives in Rome. Boris lives in Oslo. Where does Boris live? Answer:",
    "Carla has a cat. Where does Carla live? Answer:",
]


@pytest.fixture(scope="module")
def lm():
    """tiny-lm's tokenizer and shape with random weights (seed 0): the properties hold for any weights."""
    torch.manual_seed(0)
    tok = build_tokenizer()
    return SimpleNamespace(
        model=build_model(len(tok)).double().eval(), tokenizer=tok
    )  # (.double(): HF keeps a float32 mask)


def _alone(lm, prompt_ids, method, target, **options):
    """explain() of one unpadded prefix, read at its last token."""
    ids = torch.tensor([prompt_ids])
    return lrp_core.explain(
        lm.model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, method=method, target=target, **options
    ).scores[0]


def test_greedy_matches_generate(lm):
    """Each prompt of a padded batch continues as generate() continues it alone."""
    enc = lm.tokenizer(PROMPTS, return_tensors="pt", padding=True)  # left padding
    ours = greedy_continuation(lm.model, enc["input_ids"], enc["attention_mask"], 4)
    for b, prompt in enumerate(PROMPTS):
        one = lm.tokenizer(prompt, return_tensors="pt")
        ref = lm.model.generate(
            **one, max_new_tokens=4, do_sample=False, min_new_tokens=4, pad_token_id=lm.tokenizer.pad_token_id
        )[0, one["input_ids"].shape[1] :]
        assert torch.equal(ours[b], ref)


def test_greedy_never_shows_padding_to_the_model():
    """A float64 eager Llama puts NaN into the real rows of a left-padded batch (0 x NaN from the fully masked
    padding rows); the continuation must not inherit it: each row equals the row alone."""
    model = make_decoder("llama")
    prompts = decoder_batch(decoder_rows(seed=3, lengths=(4, 6)), side="left")
    with torch.no_grad():
        assert torch.isnan(model(**prompts).logits[:, -1]).any()  # the trap is real for this model
    got = greedy_continuation(model, prompts["input_ids"], prompts["attention_mask"], 3)
    for b, row in enumerate(decoder_rows(seed=3, lengths=(4, 6))):
        alone = model.generate(
            input_ids=row[None],
            attention_mask=torch.ones_like(row[None]),
            max_new_tokens=3,
            min_new_tokens=3,
            do_sample=False,
            pad_token_id=0,
        )[0, len(row) :]
        assert torch.equal(got[b], alone)


@pytest.mark.parametrize("method", ["attnlrp", "cp_lrp", "transformer_attribution", "generic_attention"])
def test_each_step_equals_its_prefix_alone(lm, method):
    out = explain_generation(lm.model, lm.tokenizer, PROMPTS, method=method, max_new_tokens=3)
    B, K, W = out.scores.shape
    P = out.prompt_length
    assert (B, K, W) == (2, 3, P + 2) and out.input_ids.shape == (2, P + 3)
    for b in range(B):
        real = out.attention_mask[b].bool()
        ids = out.input_ids[b][real].tolist()
        pad = int((~real).sum())
        for k in range(K):
            prefix = ids[: len(ids) - K + k]
            ref = _alone(lm, prefix, method, int(out.targets[b, k]))
            got = out.scores[b, k]
            assert torch.all(got[:pad] == 0) and torch.all(got[P + k :] == 0)
            # Hugging Face's eager attention takes the softmax in float32 whatever the model's dtype (the engine
            # replays it so), and a float32 sum over a padded row may round differently: float32 round-off
            torch.testing.assert_close(got[pad : P + k], ref.double(), rtol=2e-6, atol=2e-6 * ref.abs().max())


def test_contrast_per_step(lm):
    out = explain_generation(
        lm.model, lm.tokenizer, PROMPTS[:1], method="attnlrp", continuation=" Oslo Rome", contrast=["Rome", None]
    )
    assert out.targets[0].tolist() == lm.tokenizer.convert_tokens_to_ids(["Oslo", "Rome"])
    rome = lm.tokenizer.convert_tokens_to_ids("Rome")
    assert out.contrasts[0].tolist() == [rome, -1]
    ids = out.input_ids[0].tolist()
    P = out.prompt_length
    ref = _alone(lm, ids[:P], "attnlrp", Contrast(int(out.targets[0, 0]), rome))
    torch.testing.assert_close(out.scores[0, 0, :P], ref.double(), rtol=1e-9, atol=1e-12)
    with torch.no_grad():
        logits = lm.model(torch.tensor([ids[:P]])).logits[0, -1]
    assert float(out.logits[0, 0]) == pytest.approx(float(logits[out.targets[0, 0]] - logits[rome]), rel=1e-9)
    assert "rather than Rome" in out.html(0)


def test_html_page_is_self_contained(lm, tmp_path):
    out = explain_generation(lm.model, lm.tokenizer, PROMPTS, method="rollout", max_new_tokens=2)
    path = out.save_html(tmp_path / "gen.html")
    doc = path.read_text(encoding="utf-8")
    assert doc.startswith("<!DOCTYPE html>") and doc.count('<table class="trl-gen">') == 2
    assert not re.search(r"<script|<link|@import|https?://", doc)


def test_a_cell_ending_in_show_displays_the_heat_map_once(lm):
    """``gen.show()`` as the last line of a cell: one display of the heat map, and no result for the
    cell's output to display a second time."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    out = explain_generation(lm.model, lm.tokenizer, PROMPTS[:1], method="rollout", max_new_tokens=2)
    shell = InteractiveShell.instance()
    shell.user_ns["gen"] = out
    with capture_output() as captured:
        result = shell.run_cell("gen.show()")
    assert result.success and result.result is None
    html = [o.data["text/html"] for o in captured.outputs]
    assert html == [out.html(0)]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(prompts=[]), "prompts must be"),
        (dict(prompts=[""]), "prompts must be"),
        (dict(prompts=PROMPTS, max_new_tokens=0), "max_new_tokens"),
        (dict(prompts=PROMPTS, continuation=[" Oslo", " Rome Oslo"]), "same, non-zero number"),
        (dict(prompts=PROMPTS[:1], continuation=" Oslo", max_new_tokens=2), "max_new_tokens=2"),
        (
            dict(prompts=PROMPTS, max_new_tokens=2, contrast=[["Rome", None], [None, "Oslo"]]),
            "every prompt or for none",
        ),
        (dict(prompts=PROMPTS, max_new_tokens=1, step_batch=0), "step_batch"),
    ],
)
def test_bad_input(lm, kwargs, match):
    with pytest.raises(InputError, match=match):
        explain_generation(lm.model, lm.tokenizer, method="attnlrp", **kwargs)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("method", ["attnlrp", "transformer_attribution"])
def test_every_decoder_family(family, method):
    """On each family of issue #22 (tiny, random), batched over right-padded id prompts: greedy steps equal
    generate(), and step k's map equals explain() of that row's prefix alone, read at its last token."""
    model = make_decoder(family)
    prompts = decoder_batch(decoder_rows(seed=3, lengths=(4, 6)), side="right")
    out = explain_generation(model, None, prompts, method=method, max_new_tokens=2, progress=False)
    assert out.scores.shape == (2, 2, 6 + 1)
    for b, row in enumerate(decoder_rows(seed=3, lengths=(4, 6))):
        ids = row.tolist() + out.input_ids[b, -2:].tolist()
        for k in range(2):
            prefix = torch.tensor([ids[: len(row) + k]])
            with torch.no_grad():
                assert int(out.targets[b, k]) == int(model(input_ids=prefix).logits[0, -1].argmax())  # greedy
            ref = lrp_core.explain(
                model,
                {"input_ids": prefix, "attention_mask": torch.ones_like(prefix)},
                method=method,
                target=int(out.targets[b, k]),
            ).scores[0]
            got = out.scores[b, k][out.attention_mask[b, :-1].bool()][: len(row) + k]
            torch.testing.assert_close(got, ref, rtol=2e-6, atol=2e-6 * float(ref.abs().max()))  # float32 softmax
