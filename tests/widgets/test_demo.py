"""widgets.demo: the projector page's tabs, built when opened; the translation tab's two branches (stubs)."""

from __future__ import annotations

from types import SimpleNamespace

import ipywidgets as W

from lrp_core.errors import UnsupportedModelError
from widgets import demo


def test_a_tab_is_built_when_first_opened_and_a_failing_one_shows_its_error():
    calls: list[str] = []

    def page(title: str, fail: bool = False) -> demo.Page:
        def build() -> W.Widget:
            calls.append(title)
            if fail:
                raise RuntimeError("no weights")
            return W.Label(title)

        return demo.Page(title, build)

    tab = demo.projector([page("a"), page("b", fail=True), page("c")])
    assert calls == ["a"] and tab.titles == ("a", "b", "c")
    tab.selected_index = 1
    tab.selected_index = 0
    tab.selected_index = 1
    assert calls == ["a", "b"]  # each built once
    (shown,) = tab.children[1].children
    assert "trl-demo-error" in shown._dom_classes and "RuntimeError: no weights" in shown.value
    assert isinstance(tab.children[2].children[0], W.HTML)  # not built yet: "loading c …"


def test_the_translation_tab_says_not_available_yet_while_the_engine_refuses_the_model(monkeypatch):
    monkeypatch.setattr(demo, "load", lambda name: SimpleNamespace(name=name))

    def refuse(model, prompt, **kw):
        raise UnsupportedModelError(
            "GenerationExplorer got MarianMTModel: MarianMTModel is not supported. Supported: …"
        )

    monkeypatch.setattr(demo, "GenerationExplorer", refuse)
    shown = demo.translation_page()
    assert isinstance(shown, W.HTML) and "trl-demo-notice" in shown._dom_classes
    assert "trl-demo-error" not in shown._dom_classes
    assert demo.NOT_YET in shown.value and "MarianMTModel is not supported" in shown.value
    assert "Supported:" not in shown.value  # the first sentence only, not the engine's list


def test_the_translation_tab_shows_the_explorer_once_the_engine_explains_the_model(monkeypatch):
    made: list[str] = []

    def explorer(model, prompt, **kw):
        made.append(prompt)
        return W.Label(f"explained {model.name}: {prompt}")

    monkeypatch.setattr(demo, "load", lambda name: SimpleNamespace(name=name))
    monkeypatch.setattr(demo, "GenerationExplorer", explorer)
    box = demo.translation_page()
    choice, shown = box.children
    assert isinstance(choice, W.Dropdown) and len(choice.options) == demo.EXAMPLES
    assert shown.value == f"explained tiny-s2s: {choice.options[0][0]}"
    choice.value = 2
    assert box.children[1].value == f"explained tiny-s2s: {choice.options[2][0]}" and len(made) == 2


def test_the_translation_tab_on_tiny_s2s_itself_is_the_notice_or_a_working_explorer(monkeypatch):
    """The real engine on tiny-s2s's shape (random weights, built in ms): either branch, never an error."""
    from lrp_core.models import load

    monkeypatch.setattr(demo, "load", lambda name: load(name, pretrained=False))
    shown = demo.translation_page()
    if isinstance(shown, W.HTML):
        assert demo.NOT_YET in shown.value and "MarianMTModel" in shown.value
    else:
        explorer = shown.children[1]
        assert isinstance(explorer, demo.GenerationExplorer) and explorer.last_error is None


def test_the_first_tab_is_a_relevance_explorer_on_the_scenes():
    shown = demo.scenes_page("toy-vit")
    assert isinstance(shown, demo.RelevanceExplorer) and shown.last_error is None
    assert len(shown.class_selector.options) >= 2
