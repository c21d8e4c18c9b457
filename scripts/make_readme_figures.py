"""Draw the README's pictures from the embedded models.

Two PNGs, both made with the library's own plotting code (``lrp_core.viz``), so a
change there shows up here when the script is run again:

* ``method_grid.png`` — one two-object scene explained by several methods,
  once for each of its two classes (one row per class, one column per method);
* ``token_heatmap.png`` — a sentence's words coloured by relevance for each of
  the sentiment classes of ``minilm-sentiment``;
* ``vlm_answer.png`` — ``tiny-vlm`` (the embedded LLaVA) answering a held-out question about a scene: the
  image with the deciding object's outline, the answer's image map, and the question's words (the 64 image
  tokens summed into one cell).

Usage (from the repository root)::

    python scripts/make_readme_figures.py                      # docs/images/*.png, the README's settings
    python scripts/make_readme_figures.py --model toy-vit --methods rollout,transformer_attribution \\
        --out-dir /tmp/figs                                    # a quick run (seconds)

Everything is offline and seeded: the same code and library give the same maps.
"""

from __future__ import annotations

import argparse
import io
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no window

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from lrp_core import explain  # noqa: E402
from lrp_core.data import make_scenes  # noqa: E402
from lrp_core.models import load  # noqa: E402
from lrp_core.viz import (  # noqa: E402
    colorize,
    merge_wordpieces,
    relevance_cmap,
    show_methods,
    show_relevance,
    signed_norm,
)

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("transformer_attribution", "generic_attention", "attnlrp", "cdam", "rollout")
SHORT = {
    "transformer_attribution": "transformer attr.",
    "generic_attention": "generic attention",
    "attention_gradcam": "attention Grad-CAM",
    "raw_attention": "raw attention",
    "partial_lrp": "partial LRP",
    "token_ablation": "token ablation",
    "attnlrp": "AttnLRP",
    "cp_lrp": "CP-LRP",
    "lrp": "LRP",
    "cdam": "CDAM",
    "rollout": "rollout",
}
SENTENCE = "The plot is thin, but the acting is wonderful."


@dataclass
class Scene:
    """One two-object scene ready to explain: the model input (1, 3, H, W), its picture, its two classes."""

    x: torch.Tensor
    rgb: np.ndarray
    classes: tuple[int, int]
    names: tuple[str, str]


def scene_input(model_name: str, rgb: np.ndarray) -> torch.Tensor:
    """The model's input for scenes drawn at its size: (N, H, W, 3) in [0, 1] -> (N, 3, H, W)."""
    if model_name == "toy-vit":
        from lrp_core.data.scenes import normalize

        return normalize(rgb)
    from lrp_core.models.dinov2_scenes import scene_inputs

    return scene_inputs(rgb)


def pick_scene(loaded, model_name: str, seed: int, size: int, tries: int = 16) -> Scene:
    """Scene 0 of the first seed from ``seed`` on whose two classes are the model's top two.

    The README should show a scene the model gets right, chosen by a rule, not by eye.
    """
    for s in range(seed, seed + tries):
        scenes = make_scenes(1, seed=s, n_objects=2, size=size)
        x = scene_input(model_name, scenes.rgb)
        with torch.no_grad():
            top2 = loaded.model(x).topk(2, dim=-1).indices[0]
        if set(top2.tolist()) == set(scenes.labels[0].tolist()):
            a, b = (int(c) for c in scenes.labels[0])
            return Scene(x, scenes.rgb[0], (a, b), (scenes.class_names[a], scenes.class_names[b]))
    raise RuntimeError(f"no two-object scene of seeds {seed}..{seed + tries - 1} has both classes in the model's top 2")


def method_grid(model_name: str, methods: list[str], seed: int, panel: float, dpi: int) -> plt.Figure:
    """Rows = the scene's two classes, columns = ``methods``; each panel has its own colour scale."""
    loaded = load(model_name)
    size = int(loaded.info.get("image_size", 64)) if model_name != "toy-vit" else 64
    scene = pick_scene(loaded, model_name, seed, size)
    maps = {}
    for cls, name in zip(scene.classes, scene.names):
        for m in methods:
            exp = explain(loaded.model, scene.x, method=m, target=cls)
            maps[f"{name}: {SHORT.get(m, m)}"] = exp.upsample()[0]
    fig = show_methods(scene.rgb, maps, ncols=len(methods), panel_size=panel, colorbar=False)
    for j, ax in enumerate(fig.axes[: len(maps)]):
        row, col = divmod(j, len(methods))
        ax.set_title(SHORT.get(methods[col], methods[col]) if row == 0 else "", fontsize=10)
        if col == 0:  # row label: which class this row explains
            ax.text(
                -0.06,
                0.5,
                f"why '{scene.names[row]}'?",
                transform=ax.transAxes,
                rotation=90,
                ha="right",
                va="center",
                fontsize=10,
            )
    fig.suptitle(f"{model_name}, one scene with two objects — red: for the class, blue: against", fontsize=10, y=1.0)
    fig.tight_layout()
    fig.set_dpi(dpi)
    return fig


def word_scores(text, sentence: str, target: int, method: str) -> tuple[list[str], np.ndarray]:
    """Words (word-pieces merged, [CLS] / [SEP] dropped) and their relevance for ``target``."""
    batch = text.preprocess([sentence])
    exp = explain(text.model, batch, method=method, target=target)
    n = int(batch["attention_mask"][0].sum())
    tokens = text.tokenizer.convert_ids_to_tokens(batch["input_ids"][0][:n].tolist())
    words, scores = merge_wordpieces(tokens, exp.scores[0, :n])
    keep = [i for i, w in enumerate(words) if w not in ("[CLS]", "[SEP]")]
    return [words[i] for i in keep], scores[keep]


def token_heatmap(sentence: str, method: str, dpi: int) -> plt.Figure:
    """One line of coloured words per class of ``minilm-sentiment`` (own colour scale per line)."""
    text = load("minilm-sentiment")
    with torch.no_grad():
        probs = text.model(**text.preprocess([sentence])).logits.softmax(-1)[0]
    rows = [(c, *word_scores(text, sentence, c, method)) for c in range(len(text.labels))]
    fig, axes = plt.subplots(len(rows), 1, figsize=(8.0, 0.75 * len(rows) + 0.5), squeeze=False)
    for ax, (c, words, scores) in zip(axes[:, 0], rows):
        norm = signed_norm(scores)  # the library's zero-centred limits
        colours = colorize(scores, limit=norm.vmax) / 255.0
        ax.set_axis_off()
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.text(
            0.0,
            0.5,
            f"{text.labels[c]} (p = {float(probs[c]):.2f})",
            ha="left",
            va="center",
            fontsize=9,
            color="#333333",
        )
        xpos = 0.22
        for w, col in zip(words, colours):
            t = ax.text(
                xpos,
                0.5,
                w,
                ha="left",
                va="center",
                fontsize=11,
                family="monospace",
                bbox=dict(boxstyle="round,pad=0.25", facecolor=col, edgecolor="#cccccc"),
            )
            fig.canvas.draw()  # measure the word to place the next one
            box = t.get_window_extent().transformed(ax.transData.inverted())
            xpos = box.x1 + 0.012
    sm = plt.cm.ScalarMappable(cmap=relevance_cmap, norm=plt.Normalize(-1, 1))
    bar = fig.colorbar(sm, ax=axes[:, 0].tolist(), orientation="horizontal", fraction=0.08, pad=0.02, aspect=50)
    bar.set_ticks([-1, 0, 1], labels=["against (−max)", "0", "for the class (+max)"])
    bar.ax.tick_params(labelsize=8)
    fig.suptitle(f'minilm-sentiment, {SHORT.get(method, method)}: "{sentence}"', fontsize=10)
    fig.set_dpi(dpi)
    return fig


def pick_question(vlm, seed: int, kind: str = "which", n: int = 24):
    """The first held-out question of ``kind`` (seeds from ``HELD_OUT_SEED + seed``) the model answers correctly.

    The README should show a question the model gets right, chosen by a rule, not by eye.
    """
    from lrp_core.data import make_vqa
    from lrp_core.models.tiny_vlm import HELD_OUT_SEED

    for r in make_vqa(n, seed=HELD_OUT_SEED + seed):
        if r.kind != kind or not r.has_evidence:
            continue
        inputs = vlm.preprocess(r.image, r.question)
        with torch.no_grad():
            best = int(vlm.model(**inputs).logits[0, -1].argmax())
        if best == vlm.tokenizer.convert_tokens_to_ids(r.answer):
            return r, inputs
    raise RuntimeError(f"no {kind!r} question of make_vqa({n}, seed=HELD_OUT_SEED + {seed}) is answered correctly")


def vlm_figure(seed: int, method: str, dpi: int) -> plt.Figure:
    """tiny-vlm: the scene with the deciding object outlined, the answer's image map, the question's word map."""
    vlm = load("tiny-vlm")
    record, inputs = pick_question(vlm, seed)
    tok = vlm.tokenizer
    answer = tok.convert_tokens_to_ids(record.answer)
    exp = explain(vlm.model, inputs, method=method, target=answer)
    with torch.no_grad():
        prob = float(vlm.model(**inputs).logits[0, -1].softmax(-1)[answer])
    scores, image = exp.scores[0], exp.image_tokens[0]
    pieces = tok.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
    first, last = int(image[0]), int(image[-1])
    words = [f"[image ×{len(image)}]"] + pieces[last + 1 :]  # <s> left out: not part of the prompt
    values = torch.cat([scores[image].sum().reshape(1), scores[last + 1 :]]).numpy()
    assert first == 1 and pieces[0] == "<s>"

    fig = plt.figure(figsize=(6.4, 3.9))
    grid = fig.add_gridspec(2, 2, height_ratios=[4.2, 1.0], hspace=0.08, wspace=0.05)
    ax_img, ax_map, ax_words = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, :])
    contour = dict(levels=[0.5], colors="#00c000", linewidths=1.2)
    ax_img.imshow(record.image)
    ax_img.contour(record.mask.astype(float), **contour)
    ax_img.set_title(f'"{record.question}" → {record.answer} (p = {prob:.2f})', fontsize=9)
    ax_img.set_axis_off()
    show_relevance(record.image, exp.upsample()[0], ax=ax_map, colorbar=False)
    ax_map.contour(record.mask.astype(float), **contour)
    ax_map.set_title(f"{SHORT.get(method, method)}: the image tokens", fontsize=9)
    norm = signed_norm(values)
    colours = colorize(values, limit=norm.vmax) / 255.0
    ax_words.set_axis_off()
    ax_words.set_xlim(0, 1)
    ax_words.set_ylim(0, 1)
    ax_words.text(0.0, 0.5, "the prompt:", ha="left", va="center", fontsize=9, color="#333333")
    xpos = 0.16
    for w, col in zip(words, colours):
        t = ax_words.text(
            xpos,
            0.5,
            w,
            ha="left",
            va="center",
            fontsize=11,
            family="monospace",
            bbox=dict(boxstyle="round,pad=0.25", facecolor=col, edgecolor="#cccccc"),
        )
        fig.canvas.draw()  # measure the word to place the next one
        box = t.get_window_extent().transformed(ax_words.transData.inverted())
        xpos = box.x1 + 0.015
    fig.suptitle(
        "tiny-vlm (LLaVA: DINOv2 tower, Llama) — red: for the answer, blue: against; green: the deciding object",
        fontsize=9,
        y=0.99,
    )
    fig.set_dpi(dpi)
    return fig


def save(fig: plt.Figure, path: Path, dpi: int) -> Path:
    """Write ``fig`` as a palette PNG and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", facecolor="white")
    plt.close(fig)
    # an adaptive 256-colour palette: a third of the size, no visible change at this scale
    Image.open(buf).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        default="dinov2-scenes",
        choices=["dinov2-scenes", "toy-vit"],
        help="image model of the method grid (default: dinov2-scenes)",
    )
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated methods, one column each")
    p.add_argument(
        "--seed",
        type=int,
        default=5,
        help="first seed tried for the grid's scene (5: a background that does not look like the blue "
        "of negative relevance)",
    )
    p.add_argument("--text-method", default="transformer_attribution", help="method of the token heat map")
    p.add_argument("--sentence", default=SENTENCE)
    p.add_argument("--vlm-method", default="attnlrp", help="method of the tiny-vlm figure")
    p.add_argument("--vlm-seed", type=int, default=14, help="held-out make_vqa seed offset of the tiny-vlm question")
    p.add_argument("--out-dir", type=Path, default=ROOT / "docs" / "images")
    p.add_argument("--dpi", type=int, default=80)
    p.add_argument("--panel", type=float, default=2.0, help="panel size of the grid in inches")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    grid = save(
        method_grid(args.model, methods, args.seed, args.panel, args.dpi), args.out_dir / "method_grid.png", args.dpi
    )
    tokens = save(
        token_heatmap(args.sentence, args.text_method, args.dpi), args.out_dir / "token_heatmap.png", args.dpi
    )
    vlm = save(vlm_figure(args.vlm_seed, args.vlm_method, args.dpi), args.out_dir / "vlm_answer.png", args.dpi)
    for path in (grid, tokens, vlm):
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
