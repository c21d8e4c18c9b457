"""The course's exercise checkers, run both ways.

For every exercise of ``notebooks/solutions``: the reference answer passes,
a placeholder is "not attempted yet", and typical wrong answers fail with the
message the checker is meant to give. The notebooks' own objects (models,
scenes) come from each module's ``context()``, built once per module.
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from notebook_text import stored_output_text

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "notebooks"))

import solutions  # noqa: E402
from solutions import exercise as exmod  # noqa: E402
from solutions import nb01, nb02, nb03, nb05, nb08, nb10, nb11, nb13  # noqa: E402

EXERCISES = solutions.all_exercises()
NEEDS_MODELS = {name for name, ex in EXERCISES.items() if ex.needs}

_CONTEXTS: dict[str, dict] = {}


def context_for(name: str) -> dict:
    ex = EXERCISES[name]
    if not ex.needs:
        return {}
    mod = sys.modules[ex.reference.__module__]
    key = mod.__name__
    if key not in _CONTEXTS:
        if hasattr(mod, "context"):
            _CONTEXTS[key] = mod.context()
        else:  # notebook 0: the toy model only
            from lrp_core.models import load

            _CONTEXTS[key] = {"toy": load("toy-vit")}
    return {k: _CONTEXTS[key][k] for k in ex.needs}


def verdict(name: str, answer):
    ex = EXERCISES[name]
    ctx = context_for(name)
    with contextlib.redirect_stdout(io.StringIO()):
        return ex.verdict(answer, **ctx)


def reference_answer(name: str):
    ex = EXERCISES[name]
    if ex.cases is not None:
        return ex.reference
    if name == "ex2_1":
        return (torch.tensor([1.0, -0.5]), torch.tensor([-1.0, 2.0]))
    with contextlib.redirect_stdout(io.StringIO()):
        return ex.reference(**context_for(name))


# ---------------------------------------------------------------- metadata
def test_the_course_has_exercises():
    assert len(EXERCISES) >= 20
    assert {n.split("_")[0] for n in EXERCISES} >= {f"ex{i}" for i in range(13)}


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_metadata(name):
    ex = EXERCISES[name]
    assert ex.name == name
    assert ex.difficulty in (1, 2, 3)
    assert 1 <= ex.minutes <= 60
    assert ex.title and ex.answer and ex.hints
    assert ex.discussion, "say what the result means"


# ---------------------------------------------------------------- both ways
@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_placeholder_is_not_attempted(name):
    for placeholder in (..., None):
        ok, msg = EXERCISES[name].verdict(placeholder)  # no context needed for a placeholder
        assert not ok and exmod.NOT_ATTEMPTED in msg
        assert "Error" not in msg and "Traceback" not in msg


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_reference_answer_passes(name):
    ok, msg = verdict(name, reference_answer(name))
    assert ok, msg
    assert msg.startswith("✓")


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_known_mistakes_are_recognised(name):
    ex = EXERCISES[name]
    for mk in ex.mistakes:
        if ex.cases is not None:
            answer = mk.compute
        else:
            with contextlib.redirect_stdout(io.StringIO()):
                answer = mk.compute(**context_for(name))
        ok, msg = verdict(name, answer)
        assert not ok, f"{name}: the mistake '{mk.message}' passes"
        assert mk.message in msg


def _ref(name):
    return reference_answer(name)


#: typical wrong answers beyond the exercises' own mistakes, with the message they must produce
WRONG = {
    "ex0_1": [(lambda: (4, 4), "wrong shape"), (lambda: (4, 4, 65), "includes the [CLS] token")],
    "ex1_1": [
        (lambda: -_ref("ex1_1"), "sign error"),
        (lambda: _ref("ex1_1").T, None),  # (4, 1) holds the same numbers: passes
        (lambda: _ref("ex1_1").reshape(2, 2), "wrong shape"),
        (lambda: _ref("ex1_1").sum(), "single number"),
        (lambda: 2 * _ref("ex1_1"), "twice the expected value — a missing ÷2"),
        (lambda: torch.zeros(1, 4), "all zeros"),
        (lambda: "R_x", "should be a number or a tensor"),
    ],
    "ex1_2": [
        (lambda: _ref("ex1_2") + torch.tensor([0.1, 0.0, 0.0]), "conservation violated"),
        (lambda: _ref("ex1_2") + torch.tensor([0.1, 0.0, 0.0]), "off by 0.1"),
        (lambda: _ref("ex1_2")[:, :2], "wrong shape"),
    ],
    "ex1_3": [
        (lambda: lambda Ws, x: nb01.explain_output0(Ws, x) / 2, "half the expected value"),
        (lambda: lambda Ws, x: None, "not attempted yet"),
        (lambda: lambda Ws, x: x @ Ws[0], "raised"),
        (lambda: _ref("ex1_1"), "expects a function"),
    ],
    "ex2_1": [
        (lambda: ([1.0, 0.5], [1.0, -2.0]), "is ≥ 0, so the kept set is not empty"),
        (lambda: ([1.0, -0.5, 2.0], [-1.0, 2.0]), "one weight per input"),
        (lambda: 3.0, "hand in a pair (x, W)"),
    ],
    "ex2_2": [(lambda: _ref("ex2_2")[:100], "wrong shape"), (lambda: _ref("ex2_2") - 1, "differs from the reference")],
    "ex2_3": [
        (lambda: lambda x, W, R: -nb02.zplus(x, W, R), "sign error"),
        (lambda: lambda x, W, R: nb02.zplus(x, W, R).T, "transposed"),
        (lambda: lambda x, W, R: 2 * nb02.zplus(x, W, R), "a missing ÷2"),
    ],
    "ex3_1": [
        (lambda: torch.stack(_ref("ex3_1")), "should be a tuple of 2 items"),
        (lambda: (_ref("ex3_1")[0].sum(), _ref("ex3_1")[1].sum()), "single number"),
    ],
    "ex3_2": [(lambda: tuple(-v for v in _ref("ex3_2")), "sign error")],
    "ex3_3": [
        (lambda: tuple(v / 2 for v in _ref("ex3_3")), "half the expected value"),
        (lambda: sum(_ref("ex3_3")), "single number"),
        (lambda: (_ref("ex3_3")[0], 5.0), "differs from the reference"),
    ],
    "ex4_1": [(lambda: _ref("ex4_1")[:10], "wrong shape")],
    "ex4_2": [(lambda: _ref("ex4_2") * 2, "a missing ÷2")],
    "ex4_3": [(lambda: -_ref("ex4_3"), "sign error")],
    "ex5_1": [(lambda: _ref("ex5_1").reshape(8, 8), None)],  # the 8 × 8 grid is the same map: passes
    "ex5_2": [
        (lambda: {k: v for k, v in _ref("ex5_2").items() if k != "full"}, "lacks the key(s) ['full']"),
        (lambda: list(_ref("ex5_2").values()), "should be a dict"),
    ],
    "ex6_1": [(lambda: {s: v for s, v in _ref("ex6_1").items() if s != 3}, "lacks the key(s) [3]")],
    "ex6_2": [(lambda: _ref("ex6_2")[:32], "wrong shape")],
    "ex7_1": [(lambda: -_ref("ex7_1"), "sign error")],
    "ex7_2": [(lambda: -_ref("ex7_2"), "sign error")],
    "ex8_1": [
        (lambda: _ref("ex8_1")[:5], "has 5 items, expected 9"),
        (lambda: _ref("ex8_1")[1::-1] + _ref("ex8_1")[2:], "right items in the wrong order"),
    ],
    "ex8_2": [
        (lambda: torch.cat([_ref("ex8_2"), torch.full((6,), 0.1)]), "relevance on padding"),
        (lambda: torch.cat([_ref("ex8_2"), torch.zeros(6)]), None),
    ],  # zeros on the padding: right
    "ex9_1": [(lambda: {"rollout": 1.0}, "lacks the key(s) ['transformer_attribution']")],
    "ex9_2": [(lambda: {**_ref("ex9_2"), "miou": 0.1}, "your answer['miou']")],
    "ex10_1": [
        (lambda: {"rollout"}, "is missing ['raw_attention']"),
        (lambda: {"rollout", "raw_attention", "cdam"}, "should not contain ['cdam']"),
    ],
    "ex10_2": [(lambda: {k: v[::-1] for k, v in _ref("ex10_2").items()}, "differs from the reference")],
    "ex11_1": [
        (lambda: 2 * _ref("ex11_1"), "a missing ÷2"),
        (lambda: _ref("ex11_1") + torch.tensor([0.5, 0.0, 0.0, 0.0], dtype=torch.float64), "conservation violated"),
        (lambda: _ref("ex11_1").sum(), "single number"),
    ],
    "ex11_2": [
        (lambda: (_ref("ex11_2")[0], 0.25), "differs from the reference"),
        (lambda: (2, _ref("ex11_2")[1]), "differs from the reference"),
    ],
    "ex12_1": [
        (lambda: _ref("ex12_1")[:32], "wrong shape"),
        (lambda: _ref("ex12_1").reshape(8, 8), None),
    ],  # the 8 × 8 grid is the same map: passes
    "ex12_2": [(lambda: -_ref("ex12_2"), "sign error"), (lambda: _ref("ex12_2").reshape(4, 4), None)],
    "ex13_1": [(lambda: _ref("ex13_1") - 1, "ranks counted from 0"), (lambda: float(_ref("ex13_1")), None)],
    "ex13_2": [(lambda: -_ref("ex13_2"), "other way round"), (lambda: 2 * _ref("ex13_2"), "twice the expected value")],
    "ex13_3": [(lambda: _ref("ex13_3")[:-1], "wrong shape"), (lambda: _ref("ex13_3").float(), None)],
    "ex14_1": [(lambda: 100 * _ref("ex14_1"), "a percentage"), (lambda: 1 - _ref("ex14_1"), "too small")],
    "ex14_2": [(lambda: _ref("ex14_2") + 0.05, "too large"), (lambda: torch.tensor(_ref("ex14_2")), None)],
    "ex15_1": [(lambda: _ref("ex15_1")[:-1], "wrong shape"), (lambda: torch.tensor(_ref("ex15_1")), None)],
    "ex15_2": [(lambda: 100 * _ref("ex15_2"), "too large"), (lambda: torch.tensor(_ref("ex15_2")), None)],
}


def test_every_exercise_has_typical_wrong_answers():
    assert set(WRONG) == set(EXERCISES)


@pytest.mark.parametrize("name", sorted(WRONG))
def test_typical_wrong_answers(name):
    for make, expected in WRONG[name]:
        ok, msg = verdict(name, make())
        if expected is None:
            assert ok, msg
        else:
            assert not ok and expected in msg, f"{name}: expected {expected!r} in {msg!r}"
            assert f"{name}.hint()" in msg or exmod.NOT_ATTEMPTED in msg


def test_check_prints_and_returns_a_bool():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert EXERCISES["ex1_1"].check(_ref("ex1_1")) is True
        assert EXERCISES["ex1_1"].check(-_ref("ex1_1")) is False
        assert EXERCISES["ex1_1"].check(...) is False
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("✓") and lines[1].startswith("✗") and exmod.NOT_ATTEMPTED in lines[-1]


def test_a_missing_context_is_a_message_not_an_error():
    ex = EXERCISES["ex9_2"]
    saved, ex._ctx = ex._ctx, {}
    try:
        ok, msg = ex.verdict({"miou": 1.0})
    finally:
        ex._ctx = saved
    assert not ok and "pass toy=toy, one=one" in msg


def test_hints_cycle_and_solution_prints_code_and_result():
    ex = EXERCISES["ex1_1"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ex._hint_pos = 0
        for _ in range(len(ex.hints) + 1):
            ex.hint()
        ex.solution()
    text = out.getvalue()
    assert f"Hint 1/{len(ex.hints)}" in text and text.count("Hint 1/") == 2
    assert "def one_hot_start" in text and "0.6667" in text and "add up to 1" in text


def test_reveal_is_the_solution():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        solutions.reveal("ex3_2")
    assert "def operand_relevance" in out.getvalue()


# ---------------------------------------------------------------- nothing leaks into the stored notebooks
def _stored_outputs() -> str:
    import json

    return "\n".join(
        stored_output_text(json.loads(p.read_text(encoding="utf-8")))
        for p in sorted((ROOT / "notebooks").glob("*.ipynb"))
    )


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_no_solution_output_in_stored_notebooks(name):
    """What ``solution()`` prints (code and results) appears in no stored output of any notebook."""
    ex = EXERCISES[name]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ex.solution(**context_for(name))
    printed = out.getvalue()
    assert "--- returns ---" in printed
    lines = {ln.strip() for ln in printed.splitlines()}
    lines = {
        ln
        for ln in lines
        if len(ln) >= 12 and not ln.startswith(("---", "Solution to")) and not set(ln) <= set("()[]{}, ")
    }
    stored = {ln.strip() for ln in _stored_outputs().splitlines()}
    leaked = sorted(lines & stored)
    assert not leaked, f"stored notebook outputs show the solution of {name}: {leaked[:3]}"


# ---------------------------------------------------------------- the texts can be followed literally
#: notebooks whose exercise texts are checked for undefined names (every notebook with exercises)
TEXT_CHECKED = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _names_defined(code: list[str]) -> set[str]:
    """Names that the code cells import, assign or define (IPython magics left out)."""
    import ast

    names: set[str] = set()
    for src in code:
        src = "\n".join(ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):  # a function the learner writes: its signature's names
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names


def _names_called(markdown: str) -> set[str]:
    """Names read by the code spans of an exercise text that call something, minus those the text assigns."""
    import ast
    import re

    read, assigned = set(), set()
    for span in re.findall(r"`([^`]+)`", markdown):
        try:
            tree = ast.parse(span.strip())
        except SyntaxError:
            continue  # prose in backticks, shapes, `...`
        nodes = list(ast.walk(tree))
        if not any(isinstance(n, ast.Call) for n in nodes):
            continue  # a bare name or module path is a reference, not code to run
        read |= {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        assigned |= {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return read - assigned


@pytest.mark.parametrize("path", TEXT_CHECKED, ids=lambda p: p.name)
def test_exercise_texts_use_names_their_notebook_defines(path):
    """Code an exercise text tells the learner to run uses only names defined before its check cell."""
    import builtins
    import json
    import re

    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    checked = 0
    for i, cell in enumerate(cells):
        text = "".join(cell["source"])
        name = re.search(r"\b(ex\d+_\d+)\.hint\(\)", text)
        if cell["cell_type"] != "markdown" or not name or not re.search(r"\*\*\d+\.\d+ ·", text):
            continue
        end = next(k for k in range(i, len(cells)) if f"{name.group(1)}.check(" in "".join(cells[k]["source"]))
        code = ["".join(c["source"]) for c in cells[: end + 1] if c["cell_type"] == "code"]
        undefined = _names_called(text) - _names_defined(code) - set(dir(builtins))
        assert not undefined, f"{path.name} {name.group(1)}: the text uses {sorted(undefined)}, never defined there"
        checked += 1
    assert checked >= 1, f"{path.name}: found {checked} exercise texts"


def test_the_name_check_finds_an_undefined_name():
    """The check above fails on the text of exercise 10.2 as it was (explain, x, exp, lrp_core, mask undefined)."""
    old = (
        "`explain(toy.model, x, method=..., target=...)` ... "
        "`lrp_core.metrics.own_mask_share(exp.upsample(), mask)` (the masks are `scenes.masks[:1, j]`)"
    )
    code = ["import torch\nfrom lrp_core.models import load\ntoy = load('toy-vit')\nscenes = None\n%config X"]
    assert _names_called(old) - _names_defined(code) == {"explain", "x", "exp", "lrp_core", "mask"}


def test_ex10_2_done_as_its_text_says_passes():
    """Exercise 10.2 followed literally: a list of own_mask_share(...) results (one-element arrays) per method."""
    from lrp_core import explain
    from lrp_core.metrics import own_mask_share

    ctx = context_for("ex10_2")
    toy, scenes = ctx["toy"], ctx["scenes"]
    x = scenes.images[:1]
    classes = [int(c) for c in scenes.labels[0]]
    answer = {
        m: [
            own_mask_share(explain(toy.model, x, method=m, target=c).upsample(), scenes.masks[:1, j])
            for j, c in enumerate(classes)
        ]
        for m in ["transformer_attribution", "rollout", "attention_gradcam", "cdam"]
    }
    ok, msg = verdict("ex10_2", answer)
    assert ok, msg
    swapped = {m: v[::-1] for m, v in answer.items()}
    assert not verdict("ex10_2", swapped)[0]


def test_one_element_arrays_count_as_numbers_in_a_list():
    tol = exmod.Tolerance()
    exmod.compare([np.array([0.3]), torch.tensor([0.2])], [0.3, 0.2], tol)  # passes: no exception
    with pytest.raises(exmod.Mismatch):
        exmod.compare([np.array([0.3]), torch.tensor([0.25])], [0.3, 0.2], tol)
    with pytest.raises(exmod.Mismatch, match="should be a number or a tensor"):
        exmod.compare([np.array([0.3, 0.1]), 0.2], [0.3, 0.2], tol)  # two numbers are not one


def test_readme_and_teaching_give_the_number_of_exercises():
    """The exercise count the README and the teacher's guide state is the number of exercises there are."""
    import re

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    teaching = (ROOT / "docs" / "TEACHING.md").read_text(encoding="utf-8")
    stated = [int(n) for n in re.findall(r"Every exercise \((\d+) in all\)", readme)]
    stated += [int(n) for n in re.findall(r"\*\*all\*\*.*?\| (\d+) exercises \|", teaching)]
    assert stated == [len(EXERCISES)] * 2, f"stated {stated}, there are {len(EXERCISES)}"


def test_teaching_places_each_named_function_where_its_notebook_uses_it():
    """A reference "`name` (notebook N, section S)" in the teacher's guide points at a section of notebook N
    whose cells (its Markdown heading to the next) use ``name``."""
    import json
    import re

    teaching = (ROOT / "docs" / "TEACHING.md").read_text(encoding="utf-8")
    refs = re.findall(r"`(\w+)`\s+\(notebook (\d+), section (\d+)\)", teaching)
    assert refs, "expected at least one reference of that form"
    for name, nb, sec in refs:
        (path,) = (ROOT / "notebooks").glob(f"{int(nb):02d}_*.ipynb")
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        section, inside = [], False
        for c in cells:
            text = "".join(c["source"])
            if c["cell_type"] == "markdown" and text.startswith("## "):
                inside = text.startswith(f"## {sec}.")
            if inside:
                section.append(text)
        assert section, f"{path.name} has no section {sec}"
        assert any(name in t for t in section), f"`{name}` does not appear in {path.name} section {sec}"


# ---------------------------------------------------------------- near misses: every step left out in turn
def _nm_ctx(name: str) -> dict:
    return context_for(name)


def _toy_x(name):
    c = _nm_ctx(name)
    return c["toy"], c["x"]


def _nm_ex0_1(step):
    m = _nm_ctx("ex0_1")["toy"].model
    blocks, heads, patches = len(m.blocks), m.blocks[0].attn.num_heads, m.patch_embed.num_patches
    return {
        "blocks": (blocks * heads, heads, patches),
        "heads": (blocks, m.blocks[0].attn.head_dim, patches),
        "patch tokens only": (blocks, heads, patches + 1),
    }[step]


def _nm_ex1_1(step):
    import torch.nn.functional as F

    from lrp_core.rules import functional as rules

    X, W1, W2 = nb01.X, nb01.W1, nb01.W2
    h = F.linear(X, W1).clamp(min=0)
    start = F.linear(h, W2) if step == "start from 1" else torch.ones(1, 1)
    R_h = rules.generic(lambda t: F.linear(t, W2), h, start)
    return R_h if step == "through W1" else rules.generic(lambda t: F.linear(t, W1), X, R_h)


def _nm_ex1_2(step):
    import torch.nn.functional as F

    from lrp_core.rules import functional as rules

    X, W1, W2, B1 = nb01.X, nb01.W1, nb01.W2, nb01.B1
    z = F.linear(X, W1, B1)
    h = z.clamp(min=0)
    R_h = rules.generic(lambda t: F.linear(t, W2), h, F.linear(h, W2))
    if step == "divide by z":
        return B1 * R_h
    if step == "z with the bias":
        return B1 * rules.safe_div(R_h, F.linear(X, W1))
    return X * (rules.safe_div(R_h, z) @ W1)  # "the biases' share": the inputs' instead


def _nm_ex1_3(step):
    import torch.nn.functional as F

    from lrp_core.rules import functional as rules

    def fn(Ws, x):
        acts = [x]
        for W in Ws[:-1]:
            acts.append(F.linear(acts[-1], W).clamp(min=0))
        out = F.linear(acts[-1], Ws[-1])
        if step == "output 0 only":
            R = out.clone()
        else:
            R = torch.zeros_like(out)
            R[:, 0] = 1.0 if step == "start from the score" else out[:, 0]
        for W, a in zip(reversed(Ws), reversed(acts)):
            R = rules.generic(lambda t, W=W: F.linear(t, W), a, R)
        return R

    return fn


def _nm_ex2_1(step):
    return {
        "every contribution negative": ([1.0, -0.5], [1.0, 2.0]),
        "one weight per input": ([1.0, -0.5], [-1.0, 2.0, -3.0]),
    }[step]


def _nm_ex2_2(step):
    from lrp_core.rules import functional as rules

    xs, Ws, Rs = nb02._layers()
    if step == "every layer":
        xs, Ws, Rs = xs[:100], Ws[:100], Rs[:100]
    rule = rules.linear_signed if step == "the baseline rule" else rules.linear_baseline
    return np.array([rule(x[None], W, R[None]).sum().item() for x, W, R in zip(xs, Ws, Rs)])


def _nm_ex2_3(step):
    from lrp_core.rules import functional as rules

    def fn(x, W, R):
        Wp = W if step == "positive weights" else W.clamp(min=0)
        z = x @ Wp.T
        s = R if step == "divide by z" else rules.safe_div(R, z)
        return s @ Wp if step == "times x" else x * (s @ Wp)

    return fn


def _nm_ex3_1(step):
    from lrp_core.rules import functional as rules

    u, v, R = nb03._triples()
    Ru, Rv = (rules.add_generic if step == "normalised rule" else rules.add_normalized)(u, v, R)
    if step == "per-sample totals":
        return Ru.sum(), Rv.sum()
    return Ru.sum(1), Rv.sum(1)


def _nm_ex3_2(step):
    from lrp_core.rules import functional as rules

    a, b, R = nb03._product_data()
    if step == "each operand alone":
        return rules.matmul(a, b, R)
    return R.sum().item(), R.sum().item()  # "the relevance tensors": only their totals


def _nm_ex3_3(step):
    from lrp_core.rules import functional as rules

    g = torch.Generator().manual_seed(0 if step == "the new input" else nb03.BLOCK_SEED)
    if step == "the new input":  # section 4's draws continue after section 3's
        torch.randn(1, 5, 5, generator=g), torch.randn(1, 5, 3, generator=g)
    x = torch.randn(1, 4, 3, generator=g)
    Wv = torch.randn(3, 3, generator=g)
    Aw = torch.softmax(x @ x.transpose(-1, -2), dim=-1)
    V = x @ Wv.T
    AV = Aw @ V
    Ry = (x + AV).clamp(min=0)
    add = rules.add_normalized if step == "rules.add_generic" else rules.add_generic
    R_skip, R_AV = add(x, AV, Ry)
    R_A, R_V = rules.matmul(Aw, V, R_AV, halve=step == "halve=False")
    R_xv = rules.linear_signed(x, Wv, R_V)
    R_x = rules.clone(
        torch.zeros_like(R_skip) if step == "the skip branch" else R_skip,
        torch.zeros_like(R_xv) if step == "the values branch" else R_xv,
    )
    return R_x.sum().item(), R_A.sum().item()


def _nm_ex4_1(step):
    from lrp_core import explain

    toy, x = _toy_x("ex4_1")
    with torch.no_grad():
        order = toy.model(x)[0].argsort(descending=True)
    target = int(order[0] if step == "the second class" else order[1])
    layers = explain(toy.model, x, target=target).layers
    block = 0 if step == "the last block" else -1
    return layers[0, block, 0, :] if step == "the patches only" else layers[0, block, 0, 1:]


def _nm_ex4_2(step):
    from lrp_core import explain

    toy, x = _toy_x("ex4_2")
    block = 0 if step == "the last block" else -1
    w = explain(toy.model, x, keep_heads=True).layers_per_head[0, block, :, 0, 1:]
    wo = explain(toy.model, x, keep_heads=True, use_gradient=False).layers_per_head[0, block, :, 0, 1:]
    if step != "normalise the rows":
        w, wo = w / w.sum(-1, keepdim=True).clamp(min=1e-12), wo / wo.sum(-1, keepdim=True).clamp(min=1e-12)
    d = w - wo
    return (d if step == "absolute values" else d.abs()).sum(-1)


def _nm_ex4_3(step):
    from lrp_core import attention_parts

    toy, x = _toy_x("ex4_3")
    p = attention_parts(toy.model, x)
    prod = (p.relevance if step == "the gradient factor" else p.gradient * p.relevance)[0, -1, :, 0, 1:]
    if step == "no clipping":
        prod = prod.clamp(min=0)
    return prod.sum(0) if step == "mean over heads" else prod.mean(0)


def _nm_ex5_1(step):
    from lrp_core import explain

    toy, x = _toy_x("ex5_1")
    return explain(toy.model, x).scores[0]  # "rollout_norm='row'" left out


def _nm_ex5_2(step):
    from lrp_core import explain
    from lrp_core.data import make_scenes
    from lrp_core.metrics import own_mask_share

    toy = _nm_ctx("ex5_2")["toy"]
    s = make_scenes(8, seed=5, n_objects=1)
    n = 1 if step == "all 8 scenes" else 8
    variants = dict(nb05.VARIANTS)
    if step == "the four variants' options":
        variants["first block only"] = {"start_layer": 0}
    return {
        k: float(np.nanmean(own_mask_share(explain(toy.model, s.images[:n], **o).upsample(), s.masks[:n, 0])))
        for k, o in variants.items()
    }


def _nm_ex6_1(step):
    from lrp_core import explain
    from lrp_core.metrics import own_mask_share

    c = _nm_ctx("ex6_1")
    toy, scenes = c["toy"], c["scenes"]
    x = scenes.images[:1]
    a, b = [int(t) for t in scenes.labels[0]]
    ta, tb = (None, None) if step == "each object's class" else (a, b)
    ma, mb = (1, 0) if step == "each object's mask" else (0, 1)
    return {
        s: (
            float(own_mask_share(explain(toy.model, x, target=ta, start_layer=s).upsample(), scenes.masks[:1, ma])[0]),
            float(own_mask_share(explain(toy.model, x, target=tb, start_layer=s).upsample(), scenes.masks[:1, mb])[0]),
        )
        for s in (0, 1, 3)
    }


def _nm_ex6_2(step):
    from lrp_core import explain

    c = _nm_ctx("ex6_2")
    toy, scenes = c["toy"], c["scenes"]
    target = int(scenes.labels[0, 1 if step == "class a" else 0])
    if step == "method lrp":
        return explain(toy.model, scenes.images[:1], target=target).upsample()[0]
    e = explain(toy.model, scenes.images[:1], method="lrp", target=target)
    return e.upsample()[0] if step == "the pixel map" else e.pixels[0]


def _nm_ex7_1(step):
    from lrp_core import explain
    from lrp_core.metrics import pooled_correlation

    c = _nm_ctx("ex7_1")
    toy, scenes = c["toy"], c["scenes"]
    t = scenes.labels[:, 0 if step == "the second object's class" else 1]
    partner = "transformer_attribution" if step == "token ablation" else "token_ablation"
    return pooled_correlation(
        explain(toy.model, scenes.images, method="cdam", target=t).scores,
        explain(toy.model, scenes.images, method=partner, target=t).scores,
    )


def _nm_ex7_2(step):
    from lrp_core import concept_target, explain
    from lrp_core.data import compose_pair, sample_image

    dino = _nm_ctx("ex7_2")["dino"]
    example = "chelsea" if step == "the coffee concept" else "coffee"
    cup = concept_target(dino.model, dino.preprocess(sample_image(example)), name="cup")
    e = explain(dino.model, dino.preprocess(compose_pair("chelsea", "rocket")), method="cdam", target=cup)
    return e.scores[0] if step == "upsampled" else e.upsample()[0]


def _nm_ex8_1(step):
    from lrp_core import explain
    from lrp_core.viz import merge_wordpieces

    text = _nm_ctx("ex8_1")["text"]
    sentence = nb08.SENTENCES[0] if step == "the review" else nb08.REVIEW
    one = text.preprocess([sentence])
    n = int(one["attention_mask"][0].sum())
    tokens = text.tokenizer.convert_ids_to_tokens(one["input_ids"][0][:n].tolist())
    with torch.no_grad():
        pred = int(text.model(**one).logits[0].argmax())
    scores = explain(text.model, one, target=1 - pred if step == "the predicted class" else pred).scores[0, :n]
    words, ws = merge_wordpieces(tokens, scores, **({} if step == "reduce='sum'" else {"reduce": "sum"}))
    order = np.argsort(ws if step == "highest first" else -ws)
    keep = ("[CLS]", "[SEP]") if step != "without [CLS] and [SEP]" else ()
    return [words[j] for j in order if words[j] not in keep]


def _nm_ex8_2(step):
    from lrp_core import explain

    c = _nm_ctx("ex8_2")
    text, batch = c["text"], c["batch"]
    k = 0 if step == "the second sentence" else 1
    one = {key: v[k : k + 1] for key, v in batch.items()}
    n = int(batch["attention_mask"][k].sum())
    if step == "method cdam":
        return explain(text.model, batch, method="transformer_attribution").scores[1, :n]
    scores = explain(text.model, one, method="cdam").scores[0]
    if step == "zeros on the padding":
        full = torch.cat([scores[:n], torch.full((batch["input_ids"].shape[1] - n,), 0.05)])
        return full
    return scores[:n]


def _nm_ex9_1(step):
    from lrp_core import evaluation, metrics

    c = _nm_ctx("ex9_1")
    toy, one = c["toy"], c["one"]
    methods = ["transformer_attribution"] if step == "both methods" else ["transformer_attribution", "rollout"]
    out = {}
    for m in methods:
        maps = evaluation.image_maps(toy.model, one.images, m)[0]
        curve = metrics.perturbation_curve(
            toy.model, one.images, maps, one.labels[:, 0], negative=step != "negative=True"
        )
        out[m] = metrics.perturbation_auc(curve)
    return out


def _nm_ex9_2(step):
    from lrp_core import evaluation, metrics

    c = _nm_ctx("ex9_2")
    toy, one = c["toy"], c["one"]
    maps = evaluation.image_maps(toy.model, one.images, "rollout")[0]  # "transformer attribution's maps"
    return metrics.segmentation_scores(maps, one.masks[:, 0])


def _nm_ex10_1(step):
    return {"rollout": {"raw_attention"}, "raw_attention": {"rollout"}}[step]


def _nm_ex10_2(step):
    from lrp_core import explain
    from lrp_core.metrics import own_mask_share

    c = _nm_ctx("ex10_2")
    toy, scenes = c["toy"], c["scenes"]
    x = scenes.images[:1]
    classes = [int(t) for t in scenes.labels[0]]
    out = {}
    for m in nb10.GRID:
        row = []
        for j, cl in enumerate(classes):
            target = None if step == "each object's class" else cl
            mask = scenes.masks[:1, 1 - j if step == "each object's mask" else j]
            row.append(float(own_mask_share(explain(toy.model, x, method=m, target=target).upsample(), mask)[0]))
        out[m] = row
    return out


def _nm_ex11_1(step):
    import torch.nn.functional as F

    from lrp_core.rules.composites import ATTNLRP
    from lrp_core.rules.ops import ELEMENTWISE, MATMUL_AV

    x, W1, W2, w = nb11.gated_unit()
    x = x.clone().requires_grad_(True)
    a, u = W1 @ x, W2 @ x
    g = F.gelu(a) if step == "the identity rule" else ATTNLRP.rule(ELEMENTWISE).forward(F.gelu, a)
    h = g * u if step == "the halved product" else ATTNLRP.rule(MATMUL_AV).forward(torch.mul, g, u)
    (w @ h).backward()
    return (x * x.grad).detach()


def _nm_ex11_2(step):
    from lrp_core import explain

    toy, x = _toy_x("ex11_2")
    c = explain(toy.model, x, method="attnlrp").conservation
    ab = c.absorbed()
    share = (ab if step == "shares of y_t" else ab / c.output[:, None]).mean(0)
    L = c.blocks.shape[1]
    k = int(share[1:].argmax()) + 1
    return (k if step == "column to block" else L - k), float(share[k])


def _nm_ex12_1(step):
    from lrp_core import explain
    from lrp_core.methods.products import accumulate

    c = _nm_ctx("ex12_1")
    C = accumulate(explain(c["avg"], c["x"][:1], method="transformer_attribution").layers)[0]
    return {"the patch rows": C[0, 1:], "without the [CLS] row": C[:, 1:].mean(0), "over the rows": C[1:, 1:].mean(1)}[
        step
    ]


def _nm_ex12_2(step):
    from lrp_core import Contrast, explain

    c = _nm_ctx("ex12_2")
    if step == "the contrast":
        return explain(c["clip"], c["inputs"], method="attnlrp", target=0).scores[0]
    return explain(c["clip"], c["inputs"], method="generic_attention", target=Contrast(0, 1)).scores[0]


def _nm_ex13_1(step):
    c = _nm_ctx("ex13_1")
    ranks = nb13._ranks(
        c["lm"],
        c["records"],
        "rollout",
        descending=step != "highest first",
        base=0 if step == "ranks from 1" else 1,
        skip_bos=step != "<s> left out",
    )
    return sum(ranks) / len(ranks)


def _nm_ex13_2(step):
    from lrp_core import Contrast, explain

    c = _nm_ctx("ex13_2")
    enc, _, answer, rival, at = nb13._rival(c["lm"], c["record"])
    if step == "the strongest distractor":
        rival = c["lm"].tokenizer.convert_tokens_to_ids(c["record"].distractors[0])
        at = enc["input_ids"][0].tolist().index(rival)
    target = {"the contrast": answer, "the right way round": Contrast(rival, answer)}.get(step, Contrast(answer, rival))
    return float(explain(c["lm"].model, enc, method="attnlrp", target=target).scores[0, at])


def _nm_ex13_3(step):
    from lrp_core import explain_generation
    from lrp_core.sources import sentences

    c = _nm_ctx("ex13_3")
    lm, record = c["lm"], c["records"][1]
    facts = sentences(record.prompt).token_spans(lm.tokenizer)[
        : len(record.distractors) + 1 + (step == "the facts only")
    ]
    gen = explain_generation(
        lm.model,
        lm.tokenizer,
        record.prompt,
        method="attnlrp",
        continuation=f" {record.answer} .",
        sources=facts,
        progress=False,
    )
    per_step = gen.sources[0]  # (K, S)
    return {"the whole answer": per_step[0], "summed over the steps": per_step.mean(0)}.get(step, per_step.sum(0))


def _nm_ex14_1(step):
    from lrp_core import explain

    c = _nm_ctx("ex14_1")
    vlm, record = c["vlm"], c["record"]
    inputs = vlm.preprocess(record.image, record.question)
    image_map = (
        explain(vlm.model, inputs, method="attnlrp", target=vlm.tokenizer.convert_tokens_to_ids(record.answer))
        .upsample()[0]
        .double()
    )
    mask = torch.as_tensor(record.mask)
    if step == "the deciding object's mask":
        mask = torch.as_tensor(record.masks[1 - [bool((m == record.mask).all()) for m in record.masks].index(True)])
    part = image_map if step == "the positive part" else image_map.clamp(min=0)
    return float(part[mask].sum() / part.sum())


def _nm_ex14_2(step):
    from lrp_core import Contrast, explain

    c = _nm_ctx("ex14_2")
    vlm, record = c["vlm"], c["record"]
    answer, other = vlm.tokenizer.convert_tokens_to_ids(
        [record.answer, *[s for s in record.shapes if s != record.answer]]
    )
    target = answer if step == "the contrast" else Contrast(other, answer)
    inputs = vlm.preprocess(record.image, record.question)
    image_map = explain(vlm.model, inputs, method="attnlrp", target=target).upsample()[0].double().clamp(min=0)
    return float(image_map[torch.as_tensor(record.mask)].sum() / image_map.sum())


def _nm_ex15_maps(s2s, record, method):
    from lrp_core import explain_generation

    gen = explain_generation(s2s.model, s2s.tokenizer, record.source, method=method, max_new_tokens=24, progress=False)
    return gen, int(gen.steps[0])


def _nm_ex15_1(step):
    c = _nm_ctx("ex15_1")
    record = c["record"]
    gen, steps = _nm_ex15_maps(c["s2s"], record, "attnlrp")
    words = len(record.source_words)
    rows = steps if step == "without the </s> step" else steps - 1
    maps = {"the words only": gen.source[0, :rows], "the source only": gen.scores[0, :rows]}.get(
        step, gen.source[0, :rows, :words]
    )
    return maps.argmax(-1).tolist()


def _nm_ex15_2(step):
    c = _nm_ctx("ex15_2")
    hits = total = 0
    for r in c["records"]:
        gen, steps = _nm_ex15_maps(c["s2s"], r, "cp_lrp" if step == "method lrp" else "lrp")
        maps = (
            gen.scores[0, : steps - 1]
            if step == "the source only"
            else gen.source[0, : steps - 1, : len(r.source_words)]
        )
        for top, links in zip(maps.argmax(-1).tolist(), r.alignment):
            if links or step == "scored words only":
                hits, total = hits + (top in links), total + 1
    return hits / total


#: For every exercise, the steps it asks for: (step, a fragment the checker's message must contain when the
#: answer is submitted with that step left out). ``_nm_<name>(step)`` builds that near miss independently.
STEPS = {
    "ex0_1": [("blocks", "count the blocks"), ("heads", "count the heads"), ("patch tokens only", "[CLS] token")],
    "ex1_1": [("start from 1", "start from R_y = 1"), ("through W1", "continue through W1")],
    "ex1_2": [
        ("divide by z", "R_i / z_i"),
        ("z with the bias", "lacks the bias"),
        ("the biases' share", "the biases' share"),
    ],
    "ex1_3": [("output 0 only", "keep only output 0"), ("start from the score", "R[:, 0] = out[:, 0]")],
    "ex2_1": [
        ("every contribution negative", "every x_j w_j must be < 0"),
        ("one weight per input", "one weight per input"),
    ],
    "ex2_2": [("the baseline rule", "rules.linear_baseline"), ("every layer", "(2000,)")],
    "ex2_3": [("positive weights", "W.clamp(min=0)"), ("divide by z", "division by z"), ("times x", "factor x")],
    "ex3_1": [("normalised rule", "rules.add_normalized"), ("per-sample totals", "sum over a dimension")],
    "ex3_2": [("each operand alone", "without the halving"), ("the relevance tensors", "not their totals")],
    "ex3_3": [
        ("rules.add_generic", "use rules.add_generic"),
        ("halve=False", "pass halve=False"),
        ("the new input", "the x and Wv the exercise cell draws"),
        ("the skip branch", "skip connection"),
        ("the values branch", "values' share"),
    ],
    "ex4_1": [
        ("the second class", "target=<index of the 2nd"),
        ("the patches only", "[CLS] column"),
        ("the last block", "the last block"),
    ],
    "ex4_2": [
        ("normalise the rows", "normalise each row"),
        ("the last block", "the last block"),
        ("absolute values", "absolute"),
    ],
    "ex4_3": [
        ("no clipping", "without clipping"),
        ("the gradient factor", "gradient factor"),
        ("mean over heads", "average them"),
    ],
    "ex5_1": [("rollout_norm='row'", 'rollout_norm="row"')],
    "ex5_2": [("all 8 scenes", "average over all 8"), ("the four variants' options", "['first block only']")],
    "ex6_1": [("each object's class", "target=a"), ("each object's mask", "other object's mask")],
    "ex6_2": [("method lrp", 'method="lrp"'), ("the pixel map", ".pixels[0]"), ("class a", "target=a")],
    "ex7_1": [("the second object's class", "scenes.labels[:, 1]"), ("token ablation", "token_ablation")],
    "ex7_2": [("the coffee concept", '"coffee"'), ("upsampled", "(224, 224)")],
    "ex8_1": [
        ("reduce='sum'", 'reduce="sum"'),
        ("highest first", "decreasing score"),
        ("without [CLS] and [SEP]", "[CLS] and [SEP]"),
        ("the review", "explain `review`"),
        ("the predicted class", "the predicted class"),
    ],
    "ex8_2": [
        ("method cdam", 'method="cdam"'),
        ("the second sentence", "the second sentence"),
        ("zeros on the padding", "padding must receive exactly 0"),
    ],
    "ex9_1": [("negative=True", "negative=True"), ("both methods", "['rollout']")],
    "ex9_2": [("transformer attribution's maps", "transformer-attribution maps")],
    "ex10_1": [("rollout", "is missing ['rollout']"), ("raw_attention", "is missing ['raw_attention']")],
    "ex10_2": [("each object's class", "explain class j"), ("each object's mask", "other* object's mask")],
    "ex11_1": [("the identity rule", "identity rule"), ("the halved product", "halves it")],
    "ex11_2": [("column to block", "block L − k"), ("shares of y_t", "divide by y_t")],
    "ex12_1": [
        ("the patch rows", "[CLS] row"),
        ("without the [CLS] row", "w = 0 on [CLS]"),
        ("over the rows", "the wrong axis"),
    ],
    "ex12_2": [("the contrast", "a contrast"), ("method attnlrp", 'method="attnlrp"')],
    "ex13_1": [
        ("highest first", "rank 1 is the highest score"),
        ("ranks from 1", "counted from 0"),
        ("<s> left out", "<s> token at position 0 was ranked"),
    ],
    "ex13_2": [
        ("the contrast", "target=Contrast(answer, rival)"),
        ("the right way round", "other way round"),
        ("the strongest distractor", "record.distractors[0]"),
    ],
    "ex13_3": [
        ("the whole answer", "first step only"),
        ("summed over the steps", "mean over the steps"),
        ("the facts only", "question was counted"),
    ],
    "ex14_1": [("the positive part", "clamp(min=0)"), ("the deciding object's mask", "other object's mask")],
    "ex14_2": [("the contrast", "target=Contrast(answer, other)"), ("the right way round", "other way round")],
    "ex15_1": [
        ("the words only", "the </s> column was a candidate"),
        ("the source only", "runs over gen.scores"),
        ("without the </s> step", "the last step was kept"),
    ],
    "ex15_2": [
        ("the source only", "over the prefix too"),
        ("scored words only", "were counted"),
        ("method lrp", "CP-LRP's accuracy"),
    ],
}


def test_every_exercise_lists_its_steps():
    assert set(STEPS) == set(EXERCISES)
    assert all(STEPS[name] for name in STEPS)


@pytest.mark.parametrize(
    "name, step, fragment",
    [(n, s, f) for n in sorted(STEPS) for s, f in STEPS[n]],
    ids=[f"{n}: {s}" for n in sorted(STEPS) for s, _ in STEPS[n]],
)
def test_an_answer_with_one_step_left_out_fails_naming_the_step(name, step, fragment):
    """The answer done right except for one step is refused (✗), with a message that names that step."""
    with contextlib.redirect_stdout(io.StringIO()):
        answer = globals()[f"_nm_{name}"](step)
    ok, msg = verdict(name, answer)
    assert not ok, f"{name}: leaving out '{step}' passes the checker"
    assert msg.startswith("✗") and fragment in msg, f"{name} without '{step}': {msg!r}"
