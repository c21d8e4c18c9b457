"""Exercises that check the learner's answer.

One :class:`Exercise` per exercise of the course. In a notebook::

    from solutions import ex1_1
    my_answer = ...                 # your code
    ex1_1.check(my_answer);         # prints a verdict, returns True / False
    ex1_1.hint()                    # one hint per call, the next one each time
    ex1_1.solution()                # the reference code and its result, only when asked

``check`` never raises on a wrong answer. A placeholder (``...`` or ``None``,
or a function that returns one) prints "not attempted yet". Otherwise the
answer is compared with the *reference computation* (the function given as
``reference``) and a mismatch is explained as specifically as possible:
wrong type or shape, a flipped sign, a factor of 2 (the missing ÷2), another
constant factor, a sum that is not conserved (and by how much), non-zero
relevance on padding, or a known mistake (``mistakes``) that the exercise
recognises.

Exercises that depend on notebook objects (a model, an input) declare them in
``needs``; pass them by keyword: ``ex4_1.check(my_answer, toy=toy, x=x)``.
They are remembered, so ``ex4_1.solution()`` afterwards needs no arguments.

An answer can be a value (number, tensor, array, tuple, list, dict) or, for
exercises with ``cases``, a function: it is called on each case and its
output compared with the reference function's output on the same case.
"""
from __future__ import annotations

import contextlib
import inspect
import io
import math
import pprint
import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

NOT_ATTEMPTED = "not attempted yet"
#: False in the learner's copy (``scripts/learner_copy.py``): there ``solution()`` shows no code, and the
#: discussion only once the exercise is solved.
SOLUTIONS_SHOWN = True
TEACHERS_COPY = "the reference solution is in the teacher's copy — ask your teacher"
DOTS = {1: "●○○", 2: "●●○", 3: "●●●"}


class Mismatch(Exception):
    """Raised inside the comparison with the message the learner will read."""


@dataclass
class Mistake:
    """A typical wrong answer the checker recognises: ``compute(**ctx)`` gives it, ``message`` explains it."""
    compute: Callable[..., Any]
    message: str


def _is_placeholder(a: Any) -> bool:
    return a is None or a is Ellipsis


def _as_array(a: Any) -> np.ndarray | None:
    try:
        import torch
        if isinstance(a, torch.Tensor):
            return a.detach().cpu().double().numpy()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(a, (bool, np.bool_)):
        return None
    if isinstance(a, (int, float, np.number, np.ndarray)):
        return np.asarray(a, dtype=float)
    if isinstance(a, (list, tuple)) and a:
        items = [_one_number(v) for v in a]
        if all(v is not None for v in items):
            return np.asarray(items, dtype=float)
    return None


def _one_number(v: Any) -> float | None:
    """A number, or a one-element array / tensor (what ``own_mask_share(...)`` of one map returns), as a float."""
    if isinstance(v, (bool, np.bool_)):
        return None
    if isinstance(v, (int, float, np.number)):
        return float(v)
    if hasattr(v, "detach"):  # a torch tensor
        v = v.detach().cpu().double().numpy()
    if isinstance(v, np.ndarray) and v.size == 1 and v.dtype.kind in "iuf":
        return float(v.reshape(-1)[0])
    return None


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _ratio(ans: np.ndarray, ref: np.ndarray) -> float | None:
    """The constant c with ans ≈ c · ref, if there is one."""
    den = float((ref * ref).sum())
    if den == 0:
        return None
    c = float((ans * ref).sum()) / den
    scale = max(np.abs(ref).max(), 1e-12)
    if np.abs(ans - c * ref).max() <= 1e-3 * abs(c) * scale + 1e-6:
        return c
    return None


@dataclass
class Tolerance:
    atol: float = 1e-4
    rtol: float = 1e-3


def compare(ans: Any, ref: Any, tol: Tolerance, *, what: str = "your answer", total: float | None = None,
            padding: np.ndarray | None = None, squeeze: bool = True) -> None:
    """Raise :class:`Mismatch` with a specific message unless ``ans`` matches ``ref``."""
    if isinstance(ref, dict):
        if not isinstance(ans, dict):
            raise Mismatch(f"{what} should be a dict with the keys {list(ref)}, got a {type(ans).__name__}")
        missing = [k for k in ref if k not in ans]
        if missing:
            raise Mismatch(f"{what} lacks the key(s) {missing} (expected keys: {list(ref)})")
        extra = [k for k in ans if k not in ref]
        if extra:
            raise Mismatch(f"{what} has unexpected key(s) {extra} (expected keys: {list(ref)})")
        for k in ref:
            compare(ans[k], ref[k], tol, what=f"{what}[{k!r}]")
        return
    if isinstance(ref, str):
        if not isinstance(ans, str) or ans.strip().lower() != ref.strip().lower():
            raise Mismatch(f"{what} is {ans!r}, expected a different value")
        return
    if isinstance(ref, (set, frozenset)):
        if not isinstance(ans, (set, frozenset, list, tuple)):
            raise Mismatch(f"{what} should be a set, got a {type(ans).__name__}")
        a = set(ans)
        if a != set(ref):
            parts = []
            if a - set(ref):
                parts.append(f"should not contain {sorted(a - set(ref))}")
            if set(ref) - a:
                parts.append(f"is missing {sorted(set(ref) - a)}")
            raise Mismatch(f"{what} " + " and ".join(parts))
        return
    ref_arr = _as_array(ref)
    if ref_arr is None and isinstance(ref, (list, tuple)):
        if not isinstance(ans, (list, tuple)):
            raise Mismatch(f"{what} should be a {type(ref).__name__} of {len(ref)} items, got a {type(ans).__name__}")
        if len(ans) != len(ref):
            raise Mismatch(f"{what} has {len(ans)} items, expected {len(ref)}")
        if all(isinstance(r, str) for r in ref):
            if [str(a) for a in ans] == list(ref):
                return
            if sorted(map(str, ans)) == sorted(ref):
                raise Mismatch(f"{what} has the right items in the wrong order: expected {list(ref)}")
            wrong = [a for a in ans if a not in ref]
            raise Mismatch(f"{what} contains {wrong}, which should not be there")
        for j, (a, r) in enumerate(zip(ans, ref)):
            compare(a, r, tol, what=f"{what}[{j}]")
        return
    if isinstance(ref, (bool, np.bool_)):
        if not isinstance(ans, (bool, np.bool_)) or bool(ans) != bool(ref):
            raise Mismatch(f"{what} is {ans!r}, expected {bool(ref)}")
        return
    if ref_arr is None:  # anything else: equality
        if ans != ref:
            raise Mismatch(f"{what} is {ans!r}, which is not the expected value")
        return
    a = _as_array(ans)
    if a is None:
        raise Mismatch(f"{what} should be a number or a tensor, got a {type(ans).__name__}")
    r = ref_arr
    if padding is not None and a.size == padding.size != r.size:
        pad = np.asarray(padding, dtype=bool).reshape(-1)
        flat = a.reshape(-1)
        if np.abs(flat[pad]).max(initial=0) > 0:
            raise Mismatch(f"{what} puts relevance on padding tokens (up to {_fmt(np.abs(flat[pad]).max())}); "
                           "padding must receive exactly 0 — keep only the tokens with attention_mask == 1")
        a = flat[~pad]                        # the real tokens
    if a.shape != r.shape:
        sa, sr = np.squeeze(a).shape, np.squeeze(r).shape
        grid = lambda s1, s2: len(s1) == 1 and len(s2) == 2 and s2[0] == s2[1] >= 4  # a map: (64,) ~ (8, 8)  # noqa: E731,E501
        if squeeze and a.size == r.size and (sa == sr or grid(sa, sr) or grid(sr, sa)):
            a = a.reshape(r.shape)            # (1, 64), (64,) and (8, 8) are the same map
        elif a.ndim == 2 and r.ndim == 2 and a.shape == r.shape[::-1]:
            raise Mismatch(f"wrong shape: {what} is {a.shape}, expected {r.shape} — transposed?")
        elif a.ndim == 0 and r.ndim >= 1:
            raise Mismatch(f"wrong shape: {what} is a single number, expected a tensor of shape {r.shape} "
                           "(did you sum over a dimension you should keep?)")
        else:
            raise Mismatch(f"wrong shape: {what} is {tuple(a.shape)}, expected {tuple(r.shape)}")
    if not np.all(np.isfinite(a)):
        raise Mismatch(f"{what} contains NaN or inf values (a division by zero? use rules.safe_div)")
    # the absolute tolerance is relative to the reference's largest entry: maps come at any scale
    scale = float(np.abs(r).max()) if r.size else 0.0
    atol = tol.atol * scale if scale > 0 else tol.atol
    if np.allclose(a, r, atol=atol, rtol=tol.rtol):
        return
    scale = max(scale, 1e-12)
    if np.abs(a).max() <= atol and scale > atol:
        raise Mismatch(f"{what} is all zeros (expected values up to {_fmt(scale)}) — relevance lost somewhere?")
    if scale > atol:
        if np.allclose(a, -r, atol=atol, rtol=tol.rtol):
            raise Mismatch(f"sign error: {what} is the negative of the expected value")
        if np.allclose(a, 2 * r, atol=atol, rtol=tol.rtol):
            raise Mismatch(f"{what} is exactly twice the expected value — a missing ÷2?")
        if np.allclose(a, r / 2, atol=atol, rtol=tol.rtol):
            raise Mismatch(f"{what} is exactly half the expected value — divided by 2 once too often?")
        c = _ratio(a, r) if r.size > 1 else None
        if c is not None and abs(c - 1) > 1e-3:
            raise Mismatch(f"{what} is the expected value times {_fmt(c)}: right pattern, wrong scale")
    if total is not None:
        s = float(a.sum())
        if not math.isclose(s, total, rel_tol=tol.rtol, abs_tol=max(atol, 1e-6) * max(1, a.size) ** 0.5):
            raise Mismatch(f"conservation violated: {what} sums to {_fmt(s)}, it should sum to {_fmt(total)} "
                           f"(off by {_fmt(s - total)})")
    if r.size == 1:
        av, rv = float(a.reshape(-1)[0]), float(r.reshape(-1)[0])
        rel = abs(av - rv) / max(abs(rv), 1e-12)
        raise Mismatch(f"{what} ({_fmt(av)}) is too {'large' if av > rv else 'small'}: "
                       f"{rel:.0%} away from the reference" if rel >= 0.01 else
                       f"{what} ({_fmt(av)}) is close but outside the tolerance ({rel:.2%} away from the reference)")
    diff = np.abs(a - r)
    idx = np.unravel_index(int(diff.argmax()), diff.shape) if diff.ndim else ()
    where = f" at index {tuple(int(i) for i in idx)}" if diff.ndim else ""
    raise Mismatch(f"{what} differs from the reference by up to {_fmt(float(diff.max()))}{where} "
                   f"(yours {_fmt(float(a[idx]))}, expected {_fmt(float(r[idx]))}; "
                   f"tolerance {_fmt(atol + tol.rtol * abs(float(r[idx])))})")


def _show(v: Any) -> str:
    try:
        import torch
        if isinstance(v, torch.Tensor):
            return repr(v)
    except ImportError:  # pragma: no cover
        pass
    return pprint.pformat(v, width=100, sort_dicts=False)


@dataclass
class Exercise:
    """One exercise: a reference computation and everything needed to check an answer against it."""
    name: str
    title: str
    reference: Callable[..., Any]
    difficulty: int
    minutes: int
    answer: str                                  # what the learner should hand in, in words
    hints: Sequence[str] = ()
    discussion: str = ""                         # printed after the solution
    needs: Sequence[str] = ()                    # notebook objects passed by keyword
    cases: Callable[..., list] | None = None     # the answer is a function, called on each case
    mistakes: Sequence[Mistake] = ()
    validate: Callable[..., str | None] | None = None   # extra test of a matching-type answer
    property_check: Callable[..., str | None] | None = None  # replaces the comparison with a property
    total: Callable[..., float] | None = None    # the sum the answer must have (conservation)
    padding: Callable[..., Any] | None = None    # mask of positions that must hold 0
    atol: float = 1e-4
    rtol: float = 1e-3
    _hint_pos: int = field(default=0, repr=False)
    _ctx: dict = field(default_factory=dict, repr=False)
    _cache: dict = field(default_factory=dict, repr=False)
    _solved: bool = field(default=False, repr=False)

    # ---------------------------------------------------------------- learner API
    @property
    def label(self) -> str:
        return f"{self.name} · {self.title}"

    @property
    def level(self) -> str:
        return f"difficulty {DOTS[self.difficulty]} ({self.difficulty}/3), about {self.minutes} min"

    def check(self, answer: Any = Ellipsis, **ctx: Any) -> bool:
        """Print a verdict on ``answer`` and return whether it is right. Never raises on a wrong answer."""
        ok, message = self.verdict(answer, **ctx)
        print(message)
        return ok

    def hint(self, all: bool = False) -> None:  # noqa: A002 - the learner-facing name
        """Print the next hint (``all=True``: every hint)."""
        if not self.hints:
            print(f"{self.name}: no hints for this one — try {self.name}.solution()")
            return
        if all:
            for j, h in enumerate(self.hints, 1):
                print(f"Hint {j}/{len(self.hints)}: {h}")
            return
        j = self._hint_pos % len(self.hints)
        print(f"Hint {j + 1}/{len(self.hints)} for {self.name}: {self.hints[j]}")
        self._hint_pos += 1

    def solution(self, run: bool = True, **ctx: Any) -> Any:
        """Print the reference code and (by default) its result. Returns None (nothing to display twice).

        In the learner's copy (``SOLUTIONS_SHOWN = False``) no code is printed: the discussion once
        ``check`` has accepted an answer, else a pointer to the teacher's copy.
        """
        if not SOLUTIONS_SHOWN:
            if self._solved:
                print(f"{self.label}: solved.\n\n" + textwrap.fill(self.discussion, 100))
            else:
                print(f"{self.label}: {TEACHERS_COPY}. {self.name}.hint() gives the next hint; once "
                      f"{self.name}.check(...) says ✓, {self.name}.solution() prints the discussion.")
            return None
        ctx = self._context(ctx, need=run)
        print(f"Solution to {self.label}\n")
        print(textwrap.dedent(inspect.getsource(self.reference)))
        if run:
            if self.cases is not None:
                print("--- on an example case ---")
                out = self.reference(*self.cases(**ctx)[0])
            else:
                print("--- output ---")
                out = self.reference(**ctx)
            print("--- returns ---")
            print(_show(out))
        if self.discussion:
            print("\n" + textwrap.fill(self.discussion, 100))
        return None

    def __repr__(self) -> str:
        return f"<Exercise {self.label} — {self.level}; check(answer), hint(), solution()>"

    # ---------------------------------------------------------------- machinery
    def _context(self, ctx: dict, need: bool = True) -> dict:
        self._ctx.update(ctx)
        missing = [k for k in self.needs if k not in self._ctx]
        if missing and need:
            args = ", ".join(f"{k}={k}" for k in self.needs)
            raise TypeError(f"{self.name} needs the notebook's objects: pass {args}")
        return {k: self._ctx[k] for k in self.needs if k in self._ctx}

    def _key(self, ctx: dict) -> tuple:
        return tuple((k, id(v)) for k, v in sorted(ctx.items()))

    def _reference(self, ctx: dict) -> Any:
        if self.cases is not None:
            return None
        key = self._key(ctx)
        if key not in self._cache:
            with contextlib.redirect_stdout(io.StringIO()):
                self._cache[key] = self.reference(**ctx)
        return self._cache[key]

    def _tol(self) -> Tolerance:
        return Tolerance(self.atol, self.rtol)

    def _compare_one(self, ans: Any, ref: Any, ctx: dict, what: str = "your answer") -> None:
        total = self.total(ref=ref, **ctx) if self.total is not None else None
        padding = np.asarray(self.padding(**ctx)) if self.padding is not None else None
        compare(ans, ref, self._tol(), what=what, total=total, padding=padding)

    def _match(self, answer: Any, ctx: dict) -> str | None:
        """None if ``answer`` is right, else the message."""
        if self.property_check is not None:
            return self.property_check(answer, **ctx)
        if self.cases is not None:
            if not callable(answer):
                return (f"{self.name} expects a function (def ...), got a {type(answer).__name__}: "
                        f"{self.answer}")
            for j, args in enumerate(self.cases(**ctx)):
                try:
                    with contextlib.redirect_stdout(io.StringIO()):
                        out = answer(*[a.clone() if hasattr(a, "clone") else a for a in args])
                except Exception as err:  # the learner's code may fail: report, never raise
                    return f"your function raised {type(err).__name__}: {err} (on test case {j + 1})"
                if _is_placeholder(out):
                    return NOT_ATTEMPTED
                with contextlib.redirect_stdout(io.StringIO()):
                    ref = self.reference(*args)
                try:
                    total = self.total(ref=ref, args=args) if self.total is not None else None
                    compare(out, ref, self._tol(), what=f"your function's output (test case {j + 1})", total=total)
                except Mismatch as m:
                    return self._known_mistake(out, ctx, args) or str(m)
            return None
        ref = self._reference(ctx)
        try:
            self._compare_one(answer, ref, ctx)
        except Mismatch as m:
            return self._known_mistake(answer, ctx) or str(m)
        if self.validate is not None:
            return self.validate(answer, **ctx)
        return None

    def _known_mistake(self, answer: Any, ctx: dict, args: tuple | None = None) -> str | None:
        for mk in self.mistakes:
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    wrong = mk.compute(*args) if args is not None else mk.compute(**ctx)
                compare(answer, wrong, self._tol())
            except Mismatch:
                continue
            except Exception:  # a mistake that cannot be formed for this answer
                continue
            return mk.message
        return None

    def verdict(self, answer: Any = Ellipsis, **ctx: Any) -> tuple[bool, str]:
        """``(ok, message)`` without printing; ``check`` prints the message."""
        if _is_placeholder(answer):
            return False, (f"{self.label}: {NOT_ATTEMPTED}. Replace the `...` with {self.answer}, "
                           f"then run the cell again ({self.level}).")
        try:
            ctx = self._context(ctx)
        except TypeError as err:
            return False, f"{self.label}: {err}"
        try:
            msg = self._match(answer, ctx)
        except Exception as err:  # never raise on a wrong answer
            msg = f"could not check this answer ({type(err).__name__}: {err})"
        if msg == NOT_ATTEMPTED:
            return False, (f"{self.label}: {NOT_ATTEMPTED} — your function returns None. "
                           f"Expected: {self.answer}.")
        if msg is None:
            self._solved = True
            return True, f"✓ {self.label}: correct."
        answer = f"{self.name}.solution() the answer" if SOLUTIONS_SHOWN else TEACHERS_COPY
        text = msg if msg[-1:] in ".?!" else msg + "."
        return False, f"✗ {self.label}: {text}\n  Stuck? {self.name}.hint() gives a hint, {answer}."

