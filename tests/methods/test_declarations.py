"""An option and a result field are each declared once, and what reads them agrees."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

from lrp_core import InputError, explain
from lrp_core.explanation import OPTIONAL_FIELDS, RESULT_FIELDS, Explanation
from lrp_core.methods import objects, registry
from lrp_core.methods.call import MethodResult
from lrp_core.methods.options import SHARED_OPTIONS, Shared


@pytest.mark.parametrize("cls", objects.ALL, ids=lambda c: c.name)
def test_each_option_is_declared_once_with_its_help_check_and_a_default_that_passes_it(cls):
    for f in dataclasses.fields(cls):
        assert f.metadata["help"] and callable(f.metadata["check"]), f.name
        assert f.metadata["check"](f.default, 4) == f.default, f.name
    assert registry.get(cls.name) is cls and not set(cls.option_names()) & set(SHARED_OPTIONS)
    assert isinstance(cls().bind(4, "text"), cls)  # the defaults construct and bind


def test_an_option_check_is_what_explain_raises(tiny_vit, images):
    # the check declared for keep_heads is the one explain runs
    with pytest.raises(InputError, match="keep_heads must be True or False, got 'yes'"):
        explain(tiny_vit, images[:1], method="rollout", keep_heads="yes")
    with pytest.raises(InputError, match="start_layer=7 is out of range: the model has 3 blocks"):
        explain(tiny_vit, images[:1], method="rollout", start_layer=7)


def test_result_fields_are_the_fields_of_method_result_and_explanation():
    names = [f.name for f in RESULT_FIELDS]
    assert [f.name for f in dataclasses.fields(MethodResult)] == names + ["used"]
    assert set(names) <= {f.name for f in dataclasses.fields(Explanation)}


@pytest.mark.parametrize("method", registry.METHOD_NAMES)
def test_returns_says_which_fields_a_method_fills(tiny_vit, images, method):
    spec = registry.get(method)
    exp = explain(tiny_vit, images[:2], method=method, **({"keep_heads": True} if spec.takes("keep_heads") else {}))
    filled = {name for name in OPTIONAL_FIELDS if getattr(exp, name) is not None}
    # registers: filled where the model has register tokens (tests/adapters/test_vit_variants.py checks which)
    assert filled == set(spec.returns) - {"registers"}, method
    one = exp[1]
    for name in filled - {"conservation"}:
        assert getattr(one, name).shape[0] == 1 and getattr(one, name).equal(getattr(exp, name)[1:2]), name


def test_pixels_are_filled_by_the_methods_down_to_the_pixels():
    assert registry.filled_by("pixels") == (
        "lrp",
        "attnlrp",
        "cp_lrp",
        "pa_lrp",
        "input_x_gradient",
        "integrated_gradients",
        "smoothgrad",
        "occlusion",
        "kernel_shap",
    )


def _parameter_docs(doc: str) -> dict[str, str]:
    """The entries of a numpy-style ``Parameters`` section: name -> its description."""
    section = doc.split("Parameters\n    ----------\n", 1)[1].split("\n    Returns\n", 1)[0]
    entries = re.split(r"\n    (?=\*{0,2}\w+(?: :|\n))", "\n" + section)
    return {e.split(" :")[0].split("\n")[0].strip(): e for e in entries if e.strip()}


def test_explain_takes_the_shared_options_as_typed_keywords_and_the_methods_own_as_the_rest():
    sig = inspect.signature(explain)
    docs = _parameter_docs(explain.__doc__)
    keyword_only = [n for n, p in sig.parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert tuple(keyword_only) == SHARED_OPTIONS == tuple(f.name for f in dataclasses.fields(Shared))
    for name in keyword_only:
        p = sig.parameters[name]
        assert p.default is None and p.annotation != inspect.Parameter.empty, name
        assert name in docs, name
    assert sig.parameters["options"].kind is inspect.Parameter.VAR_KEYWORD and "**options" in docs
    # no method's option is a parameter of explain: each is a field of its method's class
    assert not registry.OPTION_NAMES - set(SHARED_OPTIONS) & set(sig.parameters)
    assert "Returns\n    -------\n    Explanation" in explain.__doc__


def test_none_is_the_method_default_and_a_misspelled_option_is_refused(tiny_vit, images):
    default = explain(tiny_vit, images[:1], method="smoothgrad")
    spelled = explain(
        tiny_vit,
        images[:1],
        method="smoothgrad",
        n_samples=None,
        stdevs=None,
        seed=None,
        batch_size=None,
        keep_heads=None,
    )
    assert default.options == spelled.options and default.scores.equal(spelled.scores)
    with pytest.raises(InputError, match=r"unknown option\(s\) \['stdev'\]; method 'smoothgrad' accepts: n_samples"):
        explain(tiny_vit, images[:1], method="smoothgrad", stdev=0.1)
