"""Measure how fast the widgets respond: ``python -m widgets.bench [--model toy-vit]``.

Times, on this machine, what a person waits for after touching a control of a
:class:`~widgets.RelevanceExplorer` (or :class:`~widgets.TokenRelevance` for a
text model such as ``minilm-sentiment``, :class:`~widgets.GenerationExplorer` for ``--model tiny-lm``):
server side, i.e. recompute or re-slice, draw, encode the PNG / HTML. The first computation is reported
separately; later moves of the block slider, head switches and sign toggles must not recompute anything.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable, cast

import torch

TEXT = "an unbelievably charming film with a dull and lifeless ending"


def _model(name: str) -> tuple[Any, Any, str]:
    """The named embedded model and one input; a tiny random ViT if it is not available."""
    try:
        from lrp_core.data import make_scenes
        from lrp_core.models import load

        try:
            loaded = load(name)
        except FileNotFoundError:  # weights not built yet: same architecture, same speed
            if name != "toy-vit":
                raise
            from lrp_core.models.toy_vit import load_toy_vit

            loaded, name = load_toy_vit(pretrained=False), "toy-vit architecture (untrained weights)"
        if loaded.kind == "text":
            return loaded, TEXT, name
        try:
            x = make_scenes(1, seed=0).images
        except Exception:  # noqa: BLE001 - any image of the right size will do
            size = cast(Any, loaded.model).patch_embed.img_size  # a timm ViT's image size (h, w)
            x = torch.randn(1, 3, *size)
        return loaded, x, name
    except Exception as err:  # noqa: BLE001
        from timm.models.vision_transformer import VisionTransformer

        torch.manual_seed(0)
        m = VisionTransformer(img_size=64, patch_size=8, embed_dim=96, depth=4, num_heads=4, num_classes=10).eval()
        return m, torch.randn(1, 3, 64, 64), f"random ViT 64px/8, 4 blocks ({name}: {err})"


def _time(action: Callable[[], None], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        action()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def _language_model(name: str) -> tuple[Any, Any, str]:
    """(model or LoadedModel, tokenizer, label): the registered LM, else tiny-lm's shape with random weights."""
    try:
        from lrp_core.models import load

        return load(name), None, name
    except Exception as err:  # noqa: BLE001 - not registered / weights not built yet: same shape, same speed
        if name != "tiny-lm":
            raise
        from lrp_core.models.tiny_lm import build_model, build_tokenizer

        tok = build_tokenizer()
        torch.manual_seed(0)
        return build_model(len(tok)).eval(), tok, f"tiny-lm shape, random weights ({type(err).__name__})"


def _report(results: dict[str, list[float]]) -> None:
    for k, v in results.items():
        print(f"  {k:28s} median {statistics.median(v):7.1f} ms   max {max(v):7.1f} ms   (n={len(v)})")


def run_generation(name: str = "tiny-lm", repeat: int = 10, steps: int = 5) -> dict[str, list[float]]:
    """Time a :class:`~widgets.GenerationExplorer`: layer slider moves (cached), steps and methods (new, cached)."""
    from lrp_core.data.facts import make_facts
    from lrp_core.models.tiny_lm import HELD_OUT_SEED
    from widgets import GenerationExplorer

    model, tok, label = _language_model(name)
    prompt = make_facts(1, seed=HELD_OUT_SEED)[0].prompt  # a held-out facts prompt (about 45 tokens)
    t0 = time.perf_counter()
    w = GenerationExplorer(model, tok, prompt=prompt, max_new_tokens=steps)
    first = (time.perf_counter() - t0) * 1000
    if w.last_error:
        raise SystemExit(f"the widget could not be built: {w.last_error}")
    state = {"s": 0, "k": 0}

    def slider() -> None:  # every stop of the method's slider in turn
        opts = w.layer_slider.options
        state["s"] = (state["s"] + 1) % len(opts)
        w.layer_slider.value = opts[state["s"]][1]

    def step() -> None:
        state["k"] = (state["k"] + 1) % steps
        w.step_selector.value = state["k"]

    results = {
        "first computation": [first],
        "layer slider move": _time(slider, repeat),
        "step switch (new step)": _time(step, steps - 1),
    }
    state["k"] = 0
    results["step switch (cached)"] = _time(step, steps - 1)
    w.method_selector.value = "transformer_attribution"
    results["layer slider move (product)"] = _time(slider, repeat)
    print(
        f"model: {label}; {len(w.layer_slider.options)} product stops, {steps} steps, prompt of "
        f"{w.prompt_length} tokens; torch threads {torch.get_num_threads()}"
    )
    _report(results)
    return results


def run(name: str = "toy-vit", repeat: int = 10) -> dict[str, list[float]]:
    """Time each kind of interaction; returns milliseconds per action."""
    if name == "tiny-lm":
        return run_generation(name, repeat)
    from widgets import RelevanceExplorer, TokenRelevance

    model, x, label = _model(name)
    t0 = time.perf_counter()
    w = TokenRelevance(model, x) if isinstance(x, str) else RelevanceExplorer(model, x)
    first = (time.perf_counter() - t0) * 1000
    if w.last_error:
        raise SystemExit(f"the widget could not be built: {w.last_error}")
    L = w.layer_slider.max + 1
    heads = [v for _, v in w.head_selector.options]
    state = {"b": 0, "h": 0, "c": 0}
    classes = [v for _, v in w.class_selector.options]

    def slider() -> None:
        state["b"] = (state["b"] + 1) % L
        w.layer_slider.value = state["b"]

    def head() -> None:
        state["h"] = (state["h"] + 1) % len(heads)
        w.head_selector.value = heads[state["h"]]

    def sign() -> None:
        w.sign_toggle.value = not w.sign_toggle.value

    def new_class() -> None:  # every call a class not seen before: a real recomputation
        state["c"] += 1
        w.class_selector.value = classes[state["c"] % len(classes)]

    results = {"first computation": [first]}
    results["block slider move"] = _time(slider, repeat)
    results["head switch"] = _time(head, repeat)
    results["sign toggle"] = _time(sign, repeat)
    results["class switch (new class)"] = _time(new_class, min(repeat, len(classes) - 1))
    results["class switch (cached)"] = _time(new_class, min(repeat, len(classes) - 1))
    from widgets._engine import _threads_for

    used = _threads_for(w.facts.module, w.threads) or torch.get_num_threads()
    print(
        f"model: {label}; {L} blocks, {len(heads) - 1} heads; torch threads: "
        f"{torch.get_num_threads()}, widget computes on {used} (threads={w.threads!r})"
    )
    _report(results)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="toy-vit")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument(
        "--threads", default="auto", help='CPU threads for the widget: "auto" (default), a number, or "torch"'
    )
    args = ap.parse_args()
    from widgets._common import RelevanceWidget

    RelevanceWidget.threads = (
        None if args.threads == "torch" else (args.threads if args.threads == "auto" else int(args.threads))
    )
    run(args.model, args.repeat)


if __name__ == "__main__":
    main()
