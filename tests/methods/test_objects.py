"""The method objects (lrp_core.methods.objects): the string form is shorthand for the class, each class owns
its options and checks them, and each says what it computes with a docs/METHODS.md section that exists."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_bert, make_tiny_vit
from decoders import batch, make_decoder, rows

import lrp_core
from lrp_core import InputError, IntegratedGradients, Rollout, SmoothGrad, explain, explain_generation
from lrp_core.errors import RuleSetError
from lrp_core.explanation import RESULT_FIELDS
from lrp_core.methods import objects, registry
from lrp_core.methods.options import SHARED_OPTIONS, Method
from lrp_core.rules.composites import ATTNLRP, LRP_BASELINE
from lrp_core.rules.ops import MODIFIED_GRADIENT

ROOT = Path(__file__).resolve().parents[2]

#: options that change the arithmetic (and keep the runs short), per method; the others run with their defaults
RUN_WITH = {
    "transformer_attribution": {"start_layer": 1, "use_gradient": False, "keep_heads": True},
    "generic_attention": {"keep_heads": True},
    "rollout": {"start_layer": -2, "end_layer": 1},
    "raw_attention": {"keep_heads": True},
    "token_ablation": {"batch_size": 3},
    "pa_lrp": {"base": "cp_lrp"},
    "integrated_gradients": {"n_steps": 4, "baseline": "zeros", "batch_size": 2},
    "smoothgrad": {"n_samples": 3, "stdevs": 0.1, "seed": 2},
    "occlusion": {"batch_size": 4},
    "kernel_shap": {"n_samples": 12, "seed": 1},
    "leave_one_out": {"batch_size": 2},
    "context_cite": {"n_ablations": 8, "alpha": 0.0, "seed": 3},
}
#: one valid value per option a method may own
VALUE = {
    "start_layer": 0,
    "end_layer": 1,
    "rollout_norm": "row",
    "use_gradient": False,
    "keep_heads": True,
    "batch_size": 3,
    "base": "cp_lrp",
    "n_steps": 4,
    "baseline": "zeros",
    "n_samples": 5,
    "stdevs": 0.1,
    "seed": 1,
    "filler": 0,
    "n_ablations": 4,
    "keep_prob": 0.25,
    "alpha": 0.0,
}


def _models():
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    ids = torch.tensor([[2, 11, 12, 13, 3], [2, 21, 22, 3, 0]])
    yield "vit", make_tiny_vit().double(), images.double(), {}
    yield "bert", make_tiny_bert().double(), {"input_ids": ids, "attention_mask": (ids != 0).long()}, {}
    x = batch(rows(lengths=(9, 7)), "left")
    yield "llama", make_decoder("llama").double(), x, {"sources": [(0, 2), (2, 5)]}


MODELS = list(_models())


def _same(a, b) -> None:
    """Every result field bit-identical (a Conservation: each of its tensors), the same options used."""
    assert a.method == b.method and a.options == b.options
    for f in RESULT_FIELDS:
        x, y = getattr(a, f.name), getattr(b, f.name)
        if dataclasses.is_dataclass(x):
            x, y = dataclasses.asdict(x), dataclasses.asdict(y)
            assert x.keys() == y.keys() and all(_equal(x[k], y[k]) for k in x), f.name
        else:
            assert _equal(x, y), f.name


def _equal(x, y) -> bool:
    return torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y


@pytest.mark.parametrize("name, model, x, shared", MODELS, ids=[m[0] for m in MODELS])
def test_every_method_object_equals_its_string_shorthand(name, model, x, shared):
    methods = registry.METHOD_NAMES + (registry.SOURCE_METHOD_NAMES if name == "llama" else ())
    for method in methods:
        opts = RUN_WITH.get(method, {})
        cls = registry.get(method)
        by_name = explain(model, x, method=method, **opts, **shared)
        by_object = explain(model, x, method=cls(**opts), **shared)
        _same(by_name, by_object)
        assert by_object.method == method
        for k, v in opts.items():  # what the method used is what it was given (blocks counted from 0)
            if k in by_object.options and k != "start_layer":
                assert by_object.options[k] == v, (method, k)


def test_the_class_itself_is_the_method_with_its_defaults(tiny_vit, images):
    _same(explain(tiny_vit, images[:1], method=Rollout), explain(tiny_vit, images[:1], method="rollout"))


def test_a_keyword_the_method_does_not_own_is_refused_naming_its_options(tiny_vit, images):
    with pytest.raises(
        InputError, match=r"'rollout' does not take option\(s\) \['n_steps'\]; method 'rollout' accepts: "
    ):
        explain(tiny_vit, images[:1], method="rollout", n_steps=4)
    with pytest.raises(
        InputError, match=r"unknown option\(s\) \['steps'\]; method 'integrated_gradients' accepts: n_steps"
    ):
        explain(tiny_vit, images[:1], method="integrated_gradients", steps=4)
    # a method object carries its options: keywords next to it are refused, naming the class to give them to
    with pytest.raises(InputError, match=r"carries its own options: give \['n_steps'\] to IntegratedGradients"):
        explain(tiny_vit, images[:1], method=IntegratedGradients(), n_steps=4)
    with pytest.raises(TypeError, match="n_steps"):
        Rollout(n_steps=4)  # type: ignore[call-arg]
    # the shared options go with every method, object or name
    assert explain(tiny_vit, images[:1], method=Rollout(keep_heads=True), chunk_size=1).layers_per_head is not None


@pytest.mark.parametrize("cls", objects.ALL, ids=lambda c: c.name)
def test_each_class_owns_exactly_the_options_its_name_accepts(cls):
    for option in registry.OPTION_NAMES - set(SHARED_OPTIONS):
        owned = option in {f.name for f in dataclasses.fields(cls)}
        assert cls.takes(option) == owned, option
        value = (
            VALUE[option] if option != "composite" else ATTNLRP if cls.rule_pass == MODIFIED_GRADIENT else LRP_BASELINE
        )
        if owned:
            assert getattr(registry.method_of(cls.name, {option: value}), option) == value
        else:
            with pytest.raises(InputError, match=rf"method '{cls.name}' does not take option\(s\) \['{option}'\]"):
                registry.method_of(cls.name, {option: value})
    for option in SHARED_OPTIONS:
        assert cls.takes(option) and option not in {f.name for f in dataclasses.fields(cls)}


def test_options_are_checked_when_the_object_is_made():
    with pytest.raises(InputError, match="n_steps must be a positive int, got 0"):
        IntegratedGradients(n_steps=0)
    with pytest.raises(InputError, match="stdevs must be a positive number"):
        SmoothGrad(stdevs=-1.0)
    with pytest.raises(InputError, match="keep_heads must be True or False, got 'yes'"):
        Rollout(keep_heads="yes")  # type: ignore[arg-type]
    with pytest.raises(RuleSetError, match="pass it to 'attnlrp' or 'cp_lrp'"):
        lrp_core.LRP(composite=ATTNLRP)
    assert lrp_core.LRP(composite=LRP_BASELINE).composite is LRP_BASELINE
    # a block index is checked against the model when it is bound: -1 is the last block, 3 of 3 is out of range
    assert Rollout(start_layer=-1).bind(3, "image").start_layer == 2
    with pytest.raises(InputError, match="start_layer=3 is out of range: the model has 3 blocks"):
        Rollout(start_layer=3).bind(3, "image")
    with pytest.raises(InputError, match="end_layer=0 is before start_layer=1"):
        Rollout(start_layer=1, end_layer=0).bind(3, "image")


def test_none_takes_the_modalitys_default_and_a_given_value_wins():
    ta = lrp_core.TransformerAttribution()
    assert [ta.bind(2, k).rollout_norm for k in ("image", "text", "decoder")] == ["none", "row", "row"]
    assert lrp_core.TransformerAttribution(rollout_norm="row").bind(2, "image").rollout_norm == "row"
    ig = IntegratedGradients()
    assert [ig.bind(2, k).baseline for k in ("image", "text", "decoder")] == ["zeros", "pad", "zeros"]
    assert [SmoothGrad().bind(2, k).stdevs for k in ("image", "text", "decoder")] == [0.6, 0.02, 0.02]
    assert ig.baseline is None  # binding makes a new object: the user's is unchanged


def _sections() -> set[str]:
    text = (ROOT / "docs" / "METHODS.md").read_text(encoding="utf-8")
    return set(re.findall(r"^#{2,3} (\d+[a-z]?(?:\.\d+)?)[. ]", text, re.M))


@pytest.mark.parametrize("cls", objects.ALL, ids=lambda c: c.name)
def test_each_class_says_what_it_computes_and_cites_a_section_that_exists(cls):
    doc = cls.__doc__ or ""
    cited = re.findall(r"docs/METHODS\.md §(\d+[a-z]?(?:\.\d+)?)", doc)
    assert cited and set(cited) <= _sections(), (cls.name, cited)
    assert not doc.startswith(cls.__name__ + "(")  # written, not the dataclass's generated signature


def test_the_classes_are_the_registry_and_the_public_names():
    assert tuple(m.name for m in objects.TOKEN_MAP) == lrp_core.METHODS == registry.METHOD_NAMES
    assert tuple(m.name for m in objects.SOURCE) == registry.SOURCE_METHOD_NAMES
    for cls in objects.ALL:
        assert getattr(lrp_core, cls.__name__) is cls and cls.__name__ in lrp_core.__all__
        assert issubclass(cls, Method) and "run" in vars(cls) and "memory" in vars(cls)


def test_keywords_are_the_string_form_of_an_object(tiny_vit, images):
    obj = lrp_core.TransformerAttribution(start_layer=1, keep_heads=True)
    _same(explain(tiny_vit, images[:1], method=obj), explain(tiny_vit, images[:1], method=obj.name, **obj.keywords()))


def test_explain_generation_takes_a_method_object_as_its_string_form():
    llama, x = MODELS[2][1], MODELS[2][2]
    by_name = explain_generation(llama, None, x, method="cp_lrp", max_new_tokens=2, stop_at_eos=False)
    by_object = explain_generation(llama, None, x, method=lrp_core.CPLRP(), max_new_tokens=2, stop_at_eos=False)
    assert by_object.method == "cp_lrp" and torch.equal(by_name.scores, by_object.scores)
    assert torch.equal(by_name.input_ids, by_object.input_ids)
