"""A rule set is a composite and nothing else: the drivers ask it for every step of the pass."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_vit

from lrp_core import explain
from lrp_core.adapters import get_adapter
from lrp_core.rules.composites import TRANSFORMER_ATTRIBUTION, Composite
from lrp_core.rules.explicit import GenericAdd, Identity
from lrp_core.rules.functional import generic
from lrp_core.rules.ops import ADD, DECODER_KINDS, LINEAR, MASK_ADD, OP_KINDS, ExplicitRule, Op, Rule


class GenericRule(ExplicitRule):
    """A rule written outside the library: :func:`lrp_core.rules.generic` (gradient × input of the ratio)."""

    name = "generic"

    def relevance(self, op, R, cache=None):
        return (generic(op.module, op.inputs[0], R),)


#: the generic DTD rule everywhere it applies: Linear, the residual Adds; everything else as before
GENERIC = TRANSFORMER_ATTRIBUTION.with_rules(
    "generic", by_kind={LINEAR: GenericRule(), ADD: GenericAdd(), MASK_ADD: GenericAdd()}
)


def _bias_free_vit(seed: int = 0) -> torch.nn.Module:
    model = make_tiny_vit(seed=seed).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    return model


def test_a_new_composite_changes_the_pass_and_nothing_else():
    """Generic rule on a bias-free model: relevance conserved at every block (Euler), unlike the paper's rules."""
    model = _bias_free_vit()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    a = get_adapter(model)
    trace = a.forward(a.check_inputs(x), composite=GENERIC)
    start = torch.zeros_like(trace.logits).scatter_(1, trace.logits.argmax(1, keepdim=True), 1.0)
    generic = a.relprop(trace, start, GENERIC, stop_block=0, to_input=True, prepared=a.check_inputs(x))
    totals = torch.cat([generic.tokens.sum(-1), generic.inputs.sum(-1, keepdim=True)], dim=1)
    assert torch.allclose(totals, torch.ones_like(totals), atol=1e-6)
    paper = a.relprop(a.forward(a.check_inputs(x), composite=TRANSFORMER_ATTRIBUTION), start, stop_block=0)
    assert not torch.allclose(paper.attn[0], generic.attn[0])


def test_every_step_asks_the_composite():
    """A composite that records what it is asked: every operation kind of a pre-LN pass, none skipped."""
    asked: list = []

    class Recording(ExplicitRule):
        def __init__(self, inner: Rule):
            self.inner = inner

        def relevance(self, op: Op, R, cache=None):
            asked.append(op.kind)
            return self.inner.relevance(op, R, cache)

    spy = Composite("spy", {k: Recording(r) for k, r in TRANSFORMER_ATTRIBUTION.rules.items()})
    model = make_tiny_vit()
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    a = get_adapter(model)
    prepared = a.check_inputs(x)
    ref = a.relprop(
        a.forward(prepared, composite=TRANSFORMER_ATTRIBUTION),
        torch.eye(5)[:1],
        stop_block=0,
        to_input=True,
        prepared=prepared,
    )
    got = a.relprop(
        a.forward(prepared, composite=spy), torch.eye(5)[:1], stop_block=0, to_input=True, prepared=prepared
    )
    assert torch.equal(ref.pixels, got.pixels)
    used = set(asked)
    # [CLS] pooling selects (READOUT, no weighted sum); an image model has no padding mask and none of the
    # decoders' operations
    # (no LayerScale: the replay skips identities, so no scale operation)
    assert used == set(OP_KINDS) - {"pool", "mask_add", "scale"} - set(DECODER_KINDS)
    assert asked.count(LINEAR) == 3 * 4 + 1  # qkv, proj, fc1, fc2 per block, and the head


def test_a_composite_without_a_rule_names_what_it_covers():
    partial = Composite("partial", {LINEAR: Identity()})
    with pytest.raises(KeyError, match="has no rule for operation 'add'; it covers linear"):
        Replay(partial).rule(ADD)


def test_explain_is_unchanged_by_building_composites(tiny_vit, images):
    before = explain(tiny_vit, images).scores
    TRANSFORMER_ATTRIBUTION.with_rules("x", by_kind={LINEAR: GenericRule()})  # a copy: the original is untouched
    assert torch.equal(explain(tiny_vit, images).scores, before)


# ---------------------------------------------------------------- one contract per kind of pass
from lrp_core.adapters.blocks import Replay  # noqa: E402
from lrp_core.errors import RuleSetError  # noqa: E402
from lrp_core.rules import functional as F  # noqa: E402
from lrp_core.rules.composites import ATTNLRP, CP_LRP, LRP_BASELINE  # noqa: E402
from lrp_core.rules.explicit import BaselineLinear, SignedLinear  # noqa: E402
from lrp_core.rules.gradient import Gradient  # noqa: E402
from lrp_core.rules.ops import ELEMENTWISE, EXPLICIT, MODIFIED_GRADIENT, PATCH_CONV, POS_ADD, GradientRule  # noqa: E402

BUILT_IN = {
    "transformer_attribution": (TRANSFORMER_ATTRIBUTION, EXPLICIT),
    "lrp_baseline": (LRP_BASELINE, EXPLICIT),
    "attnlrp": (ATTNLRP, MODIFIED_GRADIENT),
    "cp_lrp": (CP_LRP, MODIFIED_GRADIENT),
}


def _count_module_calls(model: torch.nn.Module) -> list:
    calls: list = []
    for m in model.modules():
        m.register_forward_pre_hook(lambda mod, inp: calls.append(mod))
    return calls


@pytest.mark.parametrize("name", BUILT_IN)
def test_a_composite_in_the_other_kind_of_pass_is_refused_at_once(name, images):
    """Each built-in rule set knows its pass; the replay runs both kinds (an explicit one as its backward), and
    the explicit relevance pass refuses a modified-gradient rule set before running anything, naming the
    composite, the pass and what to use instead."""
    composite, serves = BUILT_IN[name]
    assert composite.serves == serves
    model = make_tiny_vit()
    a = get_adapter(model)
    prepared = a.check_inputs(images)
    trace = a.forward(prepared, grad=True)
    assert Replay(composite).explicit == (serves == EXPLICIT)
    calls = _count_module_calls(model)
    if serves == EXPLICIT:
        with pytest.raises(RuleSetError, match="replay the batch with adapter.forward"):
            a.relprop(trace, torch.eye(5)[:3], composite)  # a trace of the plain replay has no rules to run
    else:
        with pytest.raises(
            RuleSetError,
            match=rf"Adapter.relprop runs an explicit relevance pass, but composite '{name}' "
            r"is a rule set for a modified-gradient replay: .*Replay.*"
            r"TRANSFORMER_ATTRIBUTION, LRP_BASELINE",
        ):
            a.relprop(trace, torch.eye(5)[:3], composite, stop_block=0, to_input=True, prepared=prepared)
    assert calls == []  # refused before a single module ran
    with pytest.raises(RuleSetError, match="takes a Composite"):
        Replay(SignedLinear())


def test_the_plain_replay_is_the_model():
    model = make_tiny_vit()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    a = get_adapter(model)
    assert Replay(None).composite is None
    with torch.no_grad():
        assert torch.allclose(a.forward(a.check_inputs(x)).logits, model(x), atol=1e-5)


def test_a_composite_that_mixes_kinds_of_pass_is_an_error_when_built():
    with pytest.raises(
        RuleSetError, match="'mixed' mixes explicit-pass rules .*SignedLinear.* with modified-gradient rules .*Gradient"
    ):
        Composite("mixed", {LINEAR: SignedLinear(), ADD: Gradient()})
    with pytest.raises(
        RuleSetError,
        match=r"'transformer_attribution' serves an explicit relevance pass, but "
        r"by_name\['head'\] is Gradient\(\), a rule of a modified-gradient replay",
    ):
        TRANSFORMER_ATTRIBUTION.with_rules("x", by_name={"head": Gradient()})
    with pytest.raises(
        RuleSetError,
        match=r"'attnlrp' serves a modified-gradient replay, but first\['linear'\] is "
        r"BaselineLinear\(\), .* accepts a rule of a modified-gradient replay "
        r"\(a GradientRule\) — here Gradient",
    ):
        ATTNLRP.with_rules("y", first={LINEAR: BaselineLinear()})
    with pytest.raises(
        RuleSetError,
        match=r"'odd names' serves a modified-gradient replay \(its rules by operation "
        r"kind\), but names\['head'\] is SignedLinear\(\)",
    ):
        Composite("odd names", dict(ATTNLRP.rules), names={"head": SignedLinear()})

    class Neither(Rule):
        pass

    with pytest.raises(RuleSetError, match="Neither.* serves no kind of pass; derive a rule from ExplicitRule"):
        Composite("odd", {LINEAR: Neither()})
    with pytest.raises(RuleSetError, match="'first' names the first layer of a kind, but \\['add'\\] have no module"):
        TRANSFORMER_ATTRIBUTION.with_rules("z", first={ADD: GenericAdd()})
    with pytest.raises(RuleSetError, match="has no rules"):
        Composite("empty", {})


# ---------------------------------------------------------------- rules by name and by position
def _attention_relevance_of_the_last_block(model, trace, R_out: torch.Tensor, head_rule, fc1_rule) -> torch.Tensor:
    """R^A of the last pre-LN block of a timm ViT ([CLS] head), by hand with the functions of lrp_core.rules.functional:
    the transformer-attribution rules, with ``head_rule`` / ``fc1_rule`` (x, W, R, out, bias) at the head and fc1."""
    blk, rec, ro = model.blocks[-1], trace.blocks[-1], trace.readout_record
    R_cls = F.select(ro.token, head_rule(ro.inputs[-1], model.head.weight, R_out, None, model.head.bias))
    R = torch.zeros_like(ro.hidden)
    R[:, 0] = R_cls  # the final norm: identity
    R_mid, R_f = F.add_normalized(rec.mid, rec.f, R)
    fc1, fc2 = blk.mlp.fc1, blk.mlp.fc2  # LayerScale, GELU and the norms: identity
    R_g = F.linear_signed(rec.g, fc2.weight, R_f, out=rec.lin["fc2"], bias=fc2.bias)
    R_m = fc1_rule(rec.m, fc1.weight, R_g, rec.lin["fc1"], fc1.bias)
    R_x, R_a = F.add_normalized(rec.x, rec.a, F.clone(R_mid, R_m, x=rec.mid))
    proj, att = blk.attn.proj, rec.attn
    R_o = F.linear_signed(att.o, proj.weight, R_a, out=att.lin["proj"], bias=proj.bias)
    B, N, _ = R_o.shape
    R_o = R_o.reshape(B, N, blk.attn.num_heads, -1).transpose(1, 2)
    return F.matmul(att.A, att.v, R_o, halve=True, z=att.ctx)[0]


def signed(x, W, R, out, bias):
    return F.linear_signed(x, W, R, out=out, bias=bias)


def baseline(x, W, R, out, bias):
    return F.linear_baseline(x, W, R)


def test_a_name_map_swaps_exactly_the_named_layers_rules():
    """ε-like swap by name: the LRP baseline's Linear rule at the head and at every block's fc1 — what the
    hand computation with those rules gives, bit for bit, and not what the default gives."""
    model = make_tiny_vit(seed=1).double()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    a = get_adapter(model)
    trace = a.forward(a.check_inputs(x))
    R_out = torch.eye(5, dtype=torch.float64)[[1, 3]]
    named = TRANSFORMER_ATTRIBUTION.with_rules(
        "baseline head and fc1", by_name={"head": BaselineLinear(), "blocks.*.mlp.fc1": BaselineLinear()}
    )
    last = a.num_blocks - 1
    got = a.relprop(a.forward(a.check_inputs(x), composite=named), R_out, stop_block=last).attn[last]
    default = a.relprop(a.forward(a.check_inputs(x), composite=TRANSFORMER_ATTRIBUTION), R_out, stop_block=last)
    default = default.attn[last]
    assert torch.equal(got, _attention_relevance_of_the_last_block(model, trace, R_out, baseline, baseline))
    assert torch.equal(default, _attention_relevance_of_the_last_block(model, trace, R_out, signed, signed))
    assert (got - default).abs().max() > 1e-3 * default.abs().max()
    # the patterns reach exactly the layers they name, in the explicit pass
    asked = _names_asked(a, trace, named, x)
    assert asked == {"head"} | {f"blocks.{b}.mlp.fc1" for b in range(a.num_blocks)}


def _names_asked(a, trace, composite, x) -> set:
    """The qualified names of the modules whose rule came from ``composite``'s name map, in a pass to the pixels."""
    seen: set = set()

    class Spy(ExplicitRule):
        def __init__(self, inner):
            self.inner = inner

        def relevance(self, op, R, cache=None):
            seen.add(a.module_names[op.module])
            return self.inner.relevance(op, R, cache)

    spied = Composite(
        "spied",
        dict(composite.rules),
        names={p: Spy(r) for p, r in composite.names.items()},
        first={k: Spy(r) for k, r in composite.first.items()},
    )
    prepared = a.check_inputs(x)
    a.relprop(
        a.forward(prepared, composite=spied),
        torch.eye(5, dtype=x.dtype)[: x.shape[0]],
        to_input=True,
        prepared=prepared,
    )
    return seen


def test_the_first_layer_map_is_the_name_map_of_the_first_layer_in_input_order():
    """``first={LINEAR: rule}``: the first Linear in input order (block 0's qkv), the same pass as naming it."""
    model = make_tiny_vit(seed=2).double()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    a = get_adapter(model)
    prepared = a.check_inputs(x)
    trace = a.forward(prepared)
    assert trace.first[LINEAR] is model.blocks[0].attn.qkv and trace.first[PATCH_CONV] is model.patch_embed.proj
    first = TRANSFORMER_ATTRIBUTION.with_rules("first", first={LINEAR: BaselineLinear()})
    named = TRANSFORMER_ATTRIBUTION.with_rules("named", by_name={"blocks.0.attn.qkv": BaselineLinear()})
    R_out = torch.eye(5, dtype=torch.float64)[[0, 2]]
    runs = [
        a.relprop(a.forward(prepared, composite=c), R_out, to_input=True, prepared=prepared)
        for c in (first, named, TRANSFORMER_ATTRIBUTION)
    ]
    assert torch.equal(runs[0].pixels, runs[1].pixels) and torch.equal(runs[0].attn[0], runs[1].attn[0])
    assert not torch.allclose(runs[0].pixels, runs[2].pixels)
    assert _names_asked(a, trace, first, x) == {"blocks.0.attn.qkv"}


def test_name_and_first_maps_in_a_modified_gradient_replay():
    """In a replay: a name map that covers every GELU equals the kind map; a first map reaches one module."""
    model = make_tiny_vit(seed=3).double()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    a = get_adapter(model)
    prepared = a.check_inputs(x)

    def relevance(composite):
        trace = a.forward(prepared, grad=True, composite=composite, track=True)
        y = trace.logits[:, 1].sum()
        (g,) = torch.autograd.grad(y, trace.embedding.images)
        return (g * trace.embedding.images).sum(1)

    by_name = relevance(ATTNLRP.with_rules("plain gelu by name", by_name={"blocks.*.mlp.act": Gradient()}))
    assert torch.equal(by_name, relevance(ATTNLRP.with_rules("plain gelu", by_kind={ELEMENTWISE: Gradient()})))
    assert not torch.allclose(by_name, relevance(ATTNLRP))
    met: list = []

    class Spy(GradientRule):
        def forward(self, fn, *inputs, module=None):
            met.append(a.module_names[module])
            return fn(*inputs)

    relevance(ATTNLRP.with_rules("spy", first={LINEAR: Spy(), PATCH_CONV: Spy()}))
    assert met == ["patch_embed.proj", "blocks.0.attn.qkv"]


def test_maps_need_what_they_read():
    with pytest.raises(RuleSetError, match="chooses rules by module name: Replay needs the model's module names"):
        Replay(TRANSFORMER_ATTRIBUTION.with_rules("n", by_name={"head": BaselineLinear()}))
    with pytest.raises(RuleSetError, match="first layer of a kind: Replay needs the replay's order"):
        Replay(ATTNLRP.with_rules("f", first={LINEAR: Gradient()}), record=False)


# ---------------------------------------------------------------- every operation asks the composite
def _hf_vit() -> torch.nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(5)
    return ViTForImageClassification(
        ViTConfig(
            image_size=32,
            patch_size=8,
            hidden_size=48,
            num_hidden_layers=2,
            num_attention_heads=3,
            intermediate_size=96,
            num_labels=5,
        )
    ).eval()


def _clip_inputs() -> dict:
    ids = torch.tensor([[1, 5, 6, 98], [1, 8, 98, 0]])
    return {
        "pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3)),
        "input_ids": ids,
        "attention_mask": (ids != 0).long(),
    }


def _clip():
    from tiny_clip import make_clip

    return make_clip()


REPLAYED = {
    "timm": (make_tiny_vit, lambda: torch.randn(2, 3, 32, 32)),
    "timm registers, no_embed_class": (
        lambda: make_tiny_vit(reg_tokens=2, no_embed_class=True, init_values=0.5),
        lambda: torch.randn(2, 3, 32, 32),
    ),
    "timm dynamic_img_size": (lambda: make_tiny_vit(dynamic_img_size=True), lambda: torch.randn(2, 3, 40, 24)),
    "hf vit": (_hf_vit, lambda: torch.randn(2, 3, 32, 32)),
    "clip": (_clip, _clip_inputs),
}


@pytest.mark.parametrize("family", REPLAYED)
def test_every_operation_of_the_replay_goes_through_the_composite(family):
    """Each module the replay runs is run by a rule of the composite (a hook on every layer sees a rule
    running), and the composite is asked for the patch conv and the position add too."""
    build, inputs = REPLAYED[family]
    model = build()
    a = get_adapter(model)
    prepared = a.check_inputs(inputs())
    kinds: list = []
    inside = [0]

    class Spy(GradientRule):
        def __init__(self, kind, inner):
            self.kind, self.inner = kind, inner

        def forward(self, fn, *xs, module=None):
            kinds.append(self.kind)
            inside[0] += 1
            try:
                return self.inner.forward(fn, *xs, module=module)
            finally:
                inside[0] -= 1

    bypassed: list = []
    for name, m in model.named_modules():
        # an nn.Embedding is a table lookup of the inputs or positions, no operation on activations
        if not list(m.children()) and not isinstance(m, torch.nn.Embedding):
            m.register_forward_pre_hook(lambda mod, inp, name=name: None if inside[0] else bypassed.append(name))
    spy = Composite("spy", {k: Spy(k, r) for k, r in ATTNLRP.rules.items()})
    trace = a.forward(prepared, grad=True, composite=spy)
    assert bypassed == []
    assert {PATCH_CONV, POS_ADD, LINEAR, "layernorm", "matmul_qk", "matmul_av", "softmax", ADD} <= set(kinds)
    assert kinds.count(PATCH_CONV) == 1 and kinds.count(POS_ADD) == 1
    ref = a.forward(prepared, grad=True, composite=ATTNLRP)
    assert torch.equal(trace.logits, ref.logits)


@pytest.mark.parametrize("family", ["hf vit", "clip", "timm registers, no_embed_class"])
def test_the_explicit_pass_asks_for_the_patch_conv_and_the_position_add(family):
    build, inputs = REPLAYED[family]
    a = get_adapter(build())
    prepared = a.check_inputs(inputs())
    asked: list = []

    class Recording(ExplicitRule):
        def __init__(self, kind, inner):
            self.kind, self.inner = kind, inner

        def relevance(self, op, R, cache=None):
            asked.append(self.kind)
            return self.inner.relevance(op, R, cache)

    spy = Composite("spy", {k: Recording(k, r) for k, r in LRP_BASELINE.rules.items()})
    trace = a.forward(prepared, composite=spy)
    R_out = torch.zeros_like(trace.logits)
    R_out[:, 0] = 1.0
    got = a.relprop(trace, R_out, spy, to_input=True, prepared=prepared)
    ref = a.relprop(a.forward(prepared, composite=LRP_BASELINE), R_out, to_input=True, prepared=prepared)
    assert torch.equal(got.pixels, ref.pixels)
    assert asked.count(PATCH_CONV) == 1 and asked.count(POS_ADD) == 1
