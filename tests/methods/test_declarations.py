"""Issue #21 item 2: an option and a result field are each declared once, and what reads them agrees."""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing

import pytest

from lrp_core import InputError, explain
from lrp_core.api import OPTION_NAMES
from lrp_core.explanation import OPTIONAL_FIELDS, RESULT_FIELDS, Explanation
from lrp_core.methods import registry
from lrp_core.methods.call import MethodResult, Options
from lrp_core.methods.options import OPTIONS


def test_options_defaults_and_help_come_from_the_declarations():
    assert [(f.name, f.default) for f in dataclasses.fields(Options)] == [(o.name, o.default) for o in OPTIONS]
    assert registry.OPTION_HELP == {o.name: o.help for o in OPTIONS}
    assert {o.name: o.type for o in OPTIONS} == typing.get_type_hints(Options)
    for o in OPTIONS:  # every default passes its own check unchanged (4 blocks)
        assert o.check(o.default, 4) == o.default, o.name


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
    assert filled == set(spec.returns), method
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


def test_every_option_is_a_typed_keyword_of_explain_and_documented():
    sig = inspect.signature(explain)
    docs = _parameter_docs(explain.__doc__)
    for o in OPTIONS:
        p = sig.parameters[o.name]
        assert p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is None, o.name
        assert p.annotation != inspect.Parameter.empty, o.name
        assert o.name in docs, o.name
        # the description names the methods that take the option (generic ones: "Every method")
        takers = {m for m, spec in registry.METHODS.items() if o.name in spec.options}
        description = docs[o.name].split("\n", 1)[1]
        named = {m for m in registry.METHOD_NAMES if f"``{m}``" in description}
        assert named == takers or (o.generic and description.strip().startswith("Every method")), o.name
    # besides model, inputs, method and target, explain's parameters are the options and the refused rest
    assert (
        set(sig.parameters) - {"model", "inputs", "method", "target", "unknown"}
        == set(OPTION_NAMES)
        == {o.name for o in OPTIONS}
    )
    assert sig.parameters["unknown"].kind is inspect.Parameter.VAR_KEYWORD
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
