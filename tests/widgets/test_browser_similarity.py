"""SimilarityExplorer end to end in JupyterLab + headless Chromium (the harness of test_browser.py): the pair
table shows the engine's R_ij in each cell's tooltip (what hovering shows), and typing a new sentence into the
second box redraws the table with the new pair's map."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
from test_browser import CHANGE_S, KERNEL_RUN_S, _lab_page, _wait

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CODE = [
    """\
import json
import torch
from transformers import BertConfig, BertModel
from lrp_core import bilrp
from lrp_core.models.minilm import load_tokenizer
from widgets import SimilarityExplorer
tok = load_tokenizer()
torch.manual_seed(0)
model = BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=32, max_position_embeddings=64)).eval()
def engine(a, b):
    x, y = (dict(tok([s], return_tensors="pt")) for s in (a, b))
    return bilrp(model, x, y, pooling="mean", normalise=True).pair(0).tolist()
with open("expected.json", "w") as f:
    json.dump({"first": engine("a cat sat", "the dog ran away"), "typed": engine("a cat sat", "birds fly")}, f)
""",
    """\
w = SimilarityExplorer(model, tok, "a cat sat", "the dog ran away", pooling="mean", normalise=True)
assert w.last_error is None, w.last_error
w""",
]


def _cells(page) -> list[str]:
    return page.locator(".trl-similarity .trl-pair").evaluate_all("cs => cs.map(c => c.title)")


def _values(titles: list[str]) -> np.ndarray:
    return np.array([float(re.split(r": ", t)[-1]) for t in titles])


def _matches(titles: list[str], want: list[list[float]]) -> bool:
    w = np.asarray(want)
    got = _values(titles)
    return got.size == w.size and bool(np.all(np.abs(got - w.reshape(-1)) <= 1e-3 * np.abs(w).max()))


def test_similarity_explorer_in_jupyterlab(tmp_path: Path) -> None:
    latency: dict[str, float] = {}
    with _lab_page(tmp_path, CODE) as page:
        first_cell = page.locator(".trl-similarity .trl-pair").first
        first_cell.wait_for(state="visible", timeout=KERNEL_RUN_S * 1000)
        path = tmp_path / "lab" / "expected.json"
        expected = json.loads(_wait(lambda: path.exists() and path.read_text(), CHANGE_S, "expected.json"))
        titles = _wait(
            lambda: (lambda t: t if _matches(t, expected["first"]) else None)(_cells(page)),
            CHANGE_S,
            "the engine's R in the tooltips",
        )
        assert len(titles) == 5 * 6 and titles[0].startswith("[CLS] ↔ [CLS]")
        # hovering a cell: the browser's tooltip is its title, the pair and its R_ij
        cell = page.locator(".trl-similarity .trl-pair").nth(6 + 1)  # row "a", column "the"
        cell.hover()
        assert cell.get_attribute("title").startswith("a ↔ the: ")
        assert float(cell.get_attribute("title").rsplit(": ", 1)[1]) == pytest.approx(expected["first"][1][1], rel=1e-3)
        # typing another second sentence (Enter) redraws the map
        box = page.locator(".trl-similarity input[type=text]").nth(1)
        box.fill("birds fly")
        t0 = time.perf_counter()
        box.press("Enter")
        _wait(
            lambda: (lambda t: t if _matches(t, expected["typed"]) else None)(_cells(page)),
            CHANGE_S,
            "the new pair's map",
            every=0.05,
        )
        latency["typed"] = time.perf_counter() - t0
        assert len(_cells(page)) == 5 * 4
        assert page.locator(".trl-widget .trl-error").count() == 0
    print("browser latency (similarity): " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in latency.items()))
