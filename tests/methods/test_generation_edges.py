"""explain_generation at its edges: a model left in train(), the end-of-text token, the model's positions,
bad token ids (refused before any step is computed), and a one-token prompt."""

import numpy as np
import pytest
import torch
from decoders import batch as decoder_batch
from decoders import make_decoder
from decoders import rows as decoder_rows

import lrp_core
from lrp_core.errors import InputError, UnknownMethodError
from lrp_core.methods.generation import explain_generation

PROMPTS = decoder_rows(seed=3, lengths=(4, 6))  # gpt2 (seed 0) writes [71, 2, 71, 36, 23] and [2, 2, 2, 2, 2]


def _prompts() -> dict:
    return decoder_batch(PROMPTS, side="left")


class _Calls:
    """Counts the calls of the LM head: the greedy steps and the explanations all run it."""

    def __init__(self, model):
        self.n = 0
        self.handle = model.lm_head.register_forward_hook(self._count)

    def _count(self, *args) -> None:
        self.n += 1


# ----------------------------------------------------------------------------
# a model left in train(): eval semantics, its modes unchanged
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "family, dropout",
    [("gpt2", dict(resid_pdrop=0.3, embd_pdrop=0.3, attn_pdrop=0.3)), ("llama", dict(attention_dropout=0.3))],
)
def test_a_training_mode_model_is_explained_in_eval_semantics(family, dropout):
    """The greedy steps run without dropout: two random states give the same tokens and maps, those of the
    model in eval mode, and every module is back in train mode afterwards."""
    model = make_decoder(family, **dropout).train()
    runs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        runs.append(explain_generation(model, None, _prompts(), method="attnlrp", max_new_tokens=4, progress=False))
    assert all(m.training for m in model.modules())
    ref = explain_generation(model.eval(), None, _prompts(), method="attnlrp", max_new_tokens=4, progress=False)
    for out in runs:
        assert torch.equal(out.input_ids, ref.input_ids) and torch.equal(out.targets, ref.targets)
        assert torch.equal(out.scores, ref.scores) and torch.equal(out.logits, ref.logits)


def test_the_greedy_step_sees_eval_mode_and_modes_are_restored_when_it_fails():
    model = make_decoder("gpt2", resid_pdrop=0.3).train()
    seen = []

    def fail(module, args, output):
        seen.append([m.training for m in model.modules()])
        raise RuntimeError("hook failed")

    model.lm_head.register_forward_hook(fail)
    with pytest.raises(RuntimeError, match="hook failed"):
        explain_generation(model, None, _prompts(), method="attnlrp", max_new_tokens=2, progress=False)
    assert seen and not any(seen[0])  # the step ran with every module in eval mode
    assert all(m.training for m in model.modules())


def test_explain_on_a_training_mode_clip_is_in_eval_semantics_too():
    """CLIP embeds the other side (prompts or images) with the model's own towers: without dropout, as the replay,
    so explain gives the eval-mode maps whatever the random state, and leaves every module in train mode."""
    from tiny_clip import make_clip

    model = make_clip().double()
    for m in model.modules():  # dropout in both towers' attention (CLIPAttention reads it in train mode)
        if hasattr(m, "dropout") and isinstance(m.dropout, float):
            m.dropout = 0.5
    g = torch.Generator().manual_seed(1)
    inputs = {
        "pixel_values": torch.randn(2, 3, 32, 32, generator=g, dtype=torch.float64),
        "input_ids": torch.tensor([[1, 5, 98], [1, 6, 98]]),
    }
    for side in ("image", "text"):
        ref = lrp_core.explain(model, {**inputs, "explain": side}, method="attnlrp").scores
        model.train()
        for seed in (0, 1):
            torch.manual_seed(seed)
            assert torch.equal(lrp_core.explain(model, {**inputs, "explain": side}, method="attnlrp").scores, ref)
        assert all(m.training for m in model.modules())
        model.eval()


def test_the_guard_does_not_undo_the_switch_back_to_train_mode():
    """A hooked module called last inside eval_semantics leaves a bracket open (until the next module call):
    switching back to train mode there must not be taken for a change of the hook's, to be undone."""
    from lrp_core.runtime.guard import eval_semantics, model_guard

    model = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.Linear(2, 2)).train()
    model[1].register_forward_hook(lambda *args: None)
    with model_guard(model):
        with eval_semantics(model):
            assert not any(m.training for m in model.modules())
            model[1](torch.ones(1, 2))
    assert all(m.training for m in model.modules())


# ----------------------------------------------------------------------------
# the end-of-text token
# ----------------------------------------------------------------------------
def _generate_alone(model, row: torch.Tensor, steps: int) -> list:
    out = model.generate(
        input_ids=row[None], attention_mask=torch.ones_like(row[None]), max_new_tokens=steps, do_sample=False
    )
    return out[0, len(row) :].tolist()


@pytest.mark.parametrize(
    "eos, source, lengths",
    [([36], "generation_config", [4, 5]), (2, "config", [2, 1]), ([2, 71], "generation_config", [1, 1])],
)
def test_greedy_stops_at_the_end_of_text_token_as_generate_does(eos, source, lengths):
    """Each row writes what generate() writes alone, its end-of-text token included; a row that stopped earlier
    is padded with the pad id, its mask 0 there and its later steps unexplained (zero maps, logits 0); the steps
    it took equal those of the run without stopping."""
    model = make_decoder("gpt2")
    if source == "config":  # a generation_config without one falls back to the model's config
        model.generation_config.eos_token_id = None
        model.config.eos_token_id = eos
    else:
        model.generation_config.eos_token_id = eos
    out = explain_generation(model, None, _prompts(), method="attnlrp", max_new_tokens=5, progress=False)
    full = explain_generation(
        model, None, _prompts(), method="attnlrp", max_new_tokens=5, progress=False, stop_at_eos=False
    )
    if source == "config":
        model.generation_config.eos_token_id = eos  # what generate() reads
    P, K = out.prompt_length, out.num_steps
    written = [_generate_alone(model, row, 5) for row in PROMPTS]
    assert [len(w) for w in written] == lengths and K == max(lengths)
    pad = model.generation_config.pad_token_id
    for b, w in enumerate(written):
        n = len(w)
        assert int(out.steps_per_row[b]) == n
        assert out.input_ids[b, P:].tolist() == w + [pad] * (K - n) == out.targets[b].tolist()
        assert out.attention_mask[b, P:].tolist() == [1] * n + [0] * (K - n)
        torch.testing.assert_close(out.scores[b, :n], full.scores[b, :n, : P + K - 1], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(out.logits[b, :n], full.logits[b, :n], rtol=1e-12, atol=0.0)
        assert (out.scores[b, n:] == 0).all() and (out.logits[b, n:] == 0).all()
        assert len(out.generated(b)) == n
    assert full.num_steps == 5 and (full.attention_mask[:, P:] == 1).all()


def test_the_batch_is_padded_as_generate_pads_it():
    """The continuations of a (right-padded, sdpa) batch equal generate()'s on the left-padded batch."""
    model = make_decoder("gpt2", attn="sdpa")
    model.generation_config.eos_token_id = [36]
    out = explain_generation(
        model, None, decoder_batch(PROMPTS, side="right"), method="rollout", max_new_tokens=5, progress=False
    )
    left = _prompts()
    ref = model.generate(**left, max_new_tokens=5, do_sample=False)[:, left["input_ids"].shape[1] :]
    assert torch.equal(out.input_ids[:, out.prompt_length :], ref)


def test_a_given_continuation_is_explained_past_the_end_of_text_token():
    model = make_decoder("gpt2")  # end of text: id 1
    out = explain_generation(
        model, None, _prompts(), method="rollout", continuation=[[5, 1, 7], [1, 1, 9]], progress=False
    )
    assert out.num_steps == 3 and out.steps_per_row.tolist() == [3, 3] and (out.logits != 0).all()


def test_the_html_of_a_stopped_row_shows_its_steps_only():
    model = make_decoder("gpt2")
    model.generation_config.eos_token_id = [36]
    out = explain_generation(model, None, _prompts(), method="rollout", max_new_tokens=5, progress=False)
    assert out.steps_per_row.tolist() == [4, 5]
    assert out.html(0).count('<td class="g">') == 4 and out.html(1).count('<td class="g">') == 5


# ----------------------------------------------------------------------------
# the model's positions, checked before any step
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_prompt_and_new_tokens_past_the_models_positions_are_refused_up_front(family):
    """64 positions; a prompt of 6 (padded) tokens: 59 new tokens need 64 positions, 60 need 65."""
    model = make_decoder(family)
    calls = _Calls(model)
    with pytest.raises(InputError, match=r"6 tokens\) and 60 new tokens need P \+ K − 1 = 65 positions.* has 64"):
        explain_generation(model, None, _prompts(), method="rollout", max_new_tokens=60, progress=False)
    with pytest.raises(InputError, match="65 positions"):
        explain_generation(model, None, _prompts(), method="rollout", continuation=list(range(3, 63)), progress=False)
    assert calls.n == 0
    calls.handle.remove()
    out = explain_generation(
        model,
        None,
        {"input_ids": PROMPTS[1][None]},
        method="rollout",
        max_new_tokens=59,
        progress=False,
        stop_at_eos=False,
    )
    assert out.input_ids.shape == (1, 65) and out.scores.shape == (1, 59, 64)


# ----------------------------------------------------------------------------
# token ids, checked before any step
# ----------------------------------------------------------------------------
class _Tokenizer:
    """Enough of a tokenizer for the pieces (ids shown as text)."""

    def convert_ids_to_tokens(self, ids):
        return [f"t{int(i)}" for i in ids]


@pytest.mark.parametrize("tokenizer", [None, _Tokenizer()])
@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(max_new_tokens=2, contrast=-3), r"contrast ids must lie in 0 … 95.*\[-3\]"),
        (dict(max_new_tokens=2, contrast=[7, -1]), r"contrast ids .*\[-1\]"),
        (dict(max_new_tokens=2, contrast=96), r"contrast ids .*\[96\]"),
        (dict(max_new_tokens=2, contrast=[[7, 2**70], [7, 7]]), r"contrast ids .*\[1180591620717411303424\]"),
        (dict(max_new_tokens=2, contrast=2.0), "contrast must be"),
        (dict(max_new_tokens=2, contrast=[7, True]), "contrast must be token ids"),
        (dict(continuation=[5, 96]), r"continuation ids .*\[96\]"),
        (dict(continuation=[5, -2]), r"continuation ids .*\[-2\]"),
        (dict(continuation=[5.0, 6.0]), "continuation must be token ids"),
        (dict(max_new_tokens=1, stop_at_eos="yes"), "stop_at_eos"),
        (dict(max_new_tokens=1, method="rollout", contrast=7), "'rollout' does not depend on the target token"),
        (dict(max_new_tokens=1, start_layer=9), "start_layer"),
        (dict(max_new_tokens=1, position=0), r"sets \['position'\] itself"),
        (dict(prompts={"input_ids": torch.tensor([[5, 200]])}, max_new_tokens=1), r"input_ids must lie in \[0, 96\)"),
    ],
)
def test_bad_ids_are_refused_before_any_step(tokenizer, kwargs, words):
    model = make_decoder("gpt2")
    calls = _Calls(model)
    kwargs = {"prompts": _prompts(), "method": "attnlrp", **kwargs}
    with pytest.raises(InputError, match=words):
        explain_generation(model, tokenizer, progress=False, **kwargs)
    assert calls.n == 0


def test_an_unknown_method_is_refused_before_any_step():
    model = make_decoder("gpt2")
    calls = _Calls(model)
    with pytest.raises(UnknownMethodError, match="unknown method 'no_such_method'"):
        explain_generation(model, None, _prompts(), method="no_such_method", max_new_tokens=1)
    assert calls.n == 0


def test_a_piece_without_a_tokenizer_is_refused():
    with pytest.raises(InputError, match="'Rome' is text: a token piece needs the tokenizer"):
        explain_generation(make_decoder("gpt2"), None, _prompts(), max_new_tokens=1, contrast="Rome")


def test_numpy_ids_are_token_ids():
    model = make_decoder("gpt2")
    a = explain_generation(
        model, None, _prompts(), method="attnlrp", max_new_tokens=2, contrast=np.int64(7), progress=False
    )
    b = explain_generation(model, None, _prompts(), method="attnlrp", max_new_tokens=2, contrast=7, progress=False)
    assert torch.equal(a.contrasts, b.contrasts) and torch.equal(a.logits, b.logits)


def test_a_model_without_an_lm_head_is_refused():
    with pytest.raises(lrp_core.errors.UnsupportedModelError, match="causal language model"):
        explain_generation(make_decoder("llama", head="seq"), None, _prompts(), max_new_tokens=1)


# ----------------------------------------------------------------------------
# a one-token prompt: step 1 reads position 0
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["token_ablation", "attnlrp", "rollout"])
def test_a_one_token_prompt(method):
    """Step 1 explains the prediction after the first token: that token alone (token ablation: nothing to
    remove, 0); step 2 equals explain() of the two-token prefix."""
    model = make_decoder("llama")
    out = explain_generation(
        model, None, {"input_ids": torch.tensor([[5]])}, method=method, max_new_tokens=2, progress=False
    )
    assert out.scores.shape == (1, 2, 2)  # no end-of-text token (id 2) written
    ids = out.input_ids[0]
    for k in range(2):
        prefix = {"input_ids": ids[None, : k + 1], "attention_mask": torch.ones(1, k + 1, dtype=torch.long)}
        ref = lrp_core.explain(model, prefix, method=method, target=int(out.targets[0, k])).scores[0]
        torch.testing.assert_close(out.scores[0, k, : k + 1], ref.double(), rtol=1e-9, atol=1e-12)
        assert (out.scores[0, k, k + 1 :] == 0).all()
    if method == "token_ablation":
        assert (out.scores[0, 0] == 0).all()
