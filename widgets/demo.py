"""The projector demo: the course's explorers on the embedded models, one tab each (``make demo``).

:func:`projector` returns an ``ipywidgets.Tab``; ``notebooks/demo/projector.ipynb`` only calls it, and
Voilà renders that notebook as a page without its code cell. The tabs:

* ``scenes: toy-vit`` and ``scenes: DINOv2``: a :class:`~widgets.RelevanceExplorer` on two-object scenes
  (class selector, method, layer slider);
* ``sentence``: a :class:`~widgets.TokenRelevance` on ``minilm-sentiment`` (type a sentence, press Enter);
* ``VLM``: a :class:`~widgets.GenerationExplorer` on ``tiny-vlm`` answering a question about a scene;
* ``generation``: a :class:`~widgets.GenerationExplorer` on ``tiny-lm`` answering a facts prompt;
* ``translation``: a :class:`~widgets.GenerationExplorer` on ``tiny-s2s`` translating a sentence, or a
  "not available yet" notice while ``lrp_core`` refuses its ``MarianMTModel``.

The last four have an example selector (held-out records of the course's tasks) that rebuilds the
explorer. A tab is built when it is first opened (the first at once), so the page shows quickly; every
explanation is the explorers' own, nothing is computed here.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import ipywidgets as W
import numpy as np

from lrp_core.data import make_facts, make_scenes, make_vqa
from lrp_core.data.translation import make_translations
from lrp_core.errors import InputError, UnsupportedModelError
from lrp_core.models import load

from .explorer import RelevanceExplorer
from .generation import GenerationExplorer
from .text import TokenRelevance

#: the methods of notebooks 4-7 (the Captum baselines are not taught in the course)
COURSE_METHODS = [
    "transformer_attribution",
    "generic_attention",
    "rollout",
    "raw_attention",
    "attention_gradcam",
    "lrp",
    "partial_lrp",
    "cdam",
    "token_ablation",
]
#: the examples offered in the VLM, generation and translation tabs (held-out records of the course's tasks)
EXAMPLES = 6
SENTENCES = [
    "The plot is thin, but the acting is wonderful and the ending made me smile.",
    "An unwatchable mess with a few beautiful shots.",
]
NOT_YET = "not available yet"


@dataclass(frozen=True)
class Page:
    """One tab: its title and how to build its content (called when the tab is first opened)."""

    title: str
    build: Callable[[], W.Widget]


# ----------------------------------------------------------------------------- the page
def projector(pages: Optional[Sequence[Page]] = None) -> W.Tab:
    """The demo page: one tab per :class:`Page` (default :func:`course_pages`), each built when first opened.

    Args:
        pages: the tabs (default: the course's six).

    Returns:
        An ``ipywidgets.Tab`` (CSS class ``trl-demo``); its first tab is built already.
    """
    pages = list(course_pages() if pages is None else pages)
    boxes = [W.VBox([W.HTML(f"<i>loading {html.escape(p.title)} …</i>")]) for p in pages]
    tab = W.Tab(children=boxes)
    tab.titles = tuple(p.title for p in pages)
    tab.add_class("trl-demo")
    built: set[int] = set()

    def show(index: Optional[int]) -> None:
        if index is None or index in built:
            return
        built.add(index)
        boxes[index].children = (built_page(pages[index]),)

    tab.observe(lambda change: show(change["new"]), names="selected_index")
    show(0)
    return tab


def built_page(page: Page) -> W.Widget:
    """The page's content, or a notice naming what went wrong (a demo keeps its other tabs working)."""
    try:
        return page.build()
    except Exception as err:  # noqa: BLE001 - shown on the page, where a teacher reads it
        return notice(f"{page.title}: {type(err).__name__}: {err}", error=True)


def notice(text: str, error: bool = False) -> W.HTML:
    """A line of text in a tab (CSS class ``trl-demo-notice``, and ``trl-demo-error`` for an error)."""
    box = W.HTML(f"<p style='font-size:1.1em'>{html.escape(text)}</p>")
    box.add_class("trl-demo-notice")
    if error:
        box.add_class("trl-demo-error")
    return box


def examples(labels: Sequence[str], build: Callable[[int], W.Widget], description: str = "example") -> W.VBox:
    """A dropdown of examples over the widget ``build(i)`` of the chosen one, rebuilt on each choice."""
    choice = W.Dropdown(options=[(label, i) for i, label in enumerate(labels)], value=0, description=description)
    choice.layout = W.Layout(width="640px")
    choice.add_class("trl-demo-examples")
    box = W.VBox([choice, build(0)])

    def rebuild(change: dict) -> None:
        box.children = (choice, build(change["new"]))

    choice.observe(rebuild, names="value")
    return box


# ----------------------------------------------------------------------------- the course's tabs
def course_pages() -> list[Page]:
    """The six tabs of the demo, on the embedded models and the course's inputs."""
    return [
        Page("scenes: toy-vit", lambda: scenes_page("toy-vit")),
        Page("scenes: DINOv2", lambda: scenes_page("dinov2-scenes")),
        Page("sentence", sentence_page),
        Page("VLM", vlm_page),
        Page("generation", generation_page),
        Page("translation", translation_page),
    ]


def scenes_page(name: str) -> W.Widget:
    """A RelevanceExplorer of ``name`` (toy-vit, 64 px, or dinov2-scenes, 112 px) on four two-object scenes."""
    loaded = load(name)
    size = 112 if name.startswith("dinov2") else 64
    scenes = make_scenes(4, seed=11, n_objects=2, size=size)
    x = scenes.images
    if size == 112:
        from lrp_core.models.dinov2_scenes import scene_inputs

        x = scene_inputs(scenes.rgb)
    return RelevanceExplorer(loaded, x, image=scenes.rgb, methods=COURSE_METHODS, display_size=320)


def sentence_page() -> W.Widget:
    """A TokenRelevance of minilm-sentiment on the course's sentences; its text box takes a new one."""
    text = load("minilm-sentiment")
    return TokenRelevance(text, text.preprocess(SENTENCES[:1]))


def vlm_page() -> W.Widget:
    """tiny-vlm answering held-out questions about scenes (notebook 14's records), the deciding object outlined."""
    from lrp_core.models.tiny_vlm import HELD_OUT_SEED

    vlm = load("tiny-vlm")
    records = make_vqa(EXAMPLES, seed=HELD_OUT_SEED + 14)
    preprocess: Any = vlm.preprocess  # (image, question) -> the processor's batch (typed for one argument)

    def build(i: int) -> W.Widget:
        r = records[i]
        mask = r.mask if r.has_evidence else None
        return GenerationExplorer(
            vlm,
            prompt=preprocess(r.image, r.question),
            max_new_tokens=1,
            image=np.asarray(r.image),
            mask=mask,
        )

    return examples([f"{r.question} (answer: {r.answer})" for r in records], build, "question")


def generation_page() -> W.Widget:
    """tiny-lm answering held-out facts prompts (notebook 13's records), the answer given as continuation."""
    from lrp_core.models.tiny_lm import HELD_OUT_SEED

    lm = load("tiny-lm")
    records = make_facts(EXAMPLES, seed=HELD_OUT_SEED + 13)

    def build(i: int) -> W.Widget:
        r = records[i]
        return GenerationExplorer(lm, prompt=r.prompt, continuation=f" {r.answer} .")

    return examples([_short(r.prompt) for r in records], build, "prompt")


def translation_page() -> W.Widget:
    """tiny-s2s translating held-out sentences, or a notice while the engine refuses its MarianMTModel."""
    from lrp_core.models.tiny_s2s import HELD_OUT_SEED

    s2s = load("tiny-s2s")
    records = make_translations(EXAMPLES, seed=HELD_OUT_SEED, split="held_out")
    try:
        return examples([r.source for r in records], lambda i: _translation(s2s, records[i].source), "sentence")
    except UnsupportedModelError as err:
        first = str(err).split(". Supported:")[0]
        return notice(
            f"Translation (tiny-s2s): {NOT_YET}. This version of lrp_core cannot explain the model yet ({first}). "
            "The other tabs work."
        )
    except InputError:  # the engine explains the model, the explorer reads decoder generations only
        return notice(
            f"Translation (tiny-s2s): {NOT_YET} on this page. lrp_core explains the model "
            "(MarianMTModel: explain_generation(...).source, notebook 15), but the generation explorer shows "
            "a decoder's generation only. The other tabs work."
        )


def _translation(s2s: Any, source: str) -> W.Widget:
    return GenerationExplorer(s2s, prompt=source)


def _short(text: str, n: int = 90) -> str:
    return text if len(text) <= n else "… " + text[-n:]
