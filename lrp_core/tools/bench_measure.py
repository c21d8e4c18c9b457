"""Measuring one benchmark case: a method's call and forward + backward timed, peak memory in a fresh process.

:func:`measure` times a call (best of the timed runs after a warm-up, fewer runs for long calls) and reads the
process's peak RSS; :func:`run_worker` runs it in a subprocess of its own (``python -m lrp_core.tools.bench
--worker``), so each (case, method) has its own peak. :mod:`lrp_core.tools.bench` builds the cases and the table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from typing import Any, Callable, Optional

import torch
from torch import nn

from ..api import explain
from ..errors import InputError, LRPError
from ..evaluation.sources import passes as explanation_passes
from ..methods import registry
from ..runtime.utils import proc_kib
from .bench_models import (
    Inputs,
    prepare,
)
from .bench_table import (
    BASELINE,
    N_ABLATIONS,
    SOURCE_BATCH_SIZE,
    Case,
    Settings,
)

#: The worker's stdout line that carries its result (JSON after the tag).
RESULT_TAG = "BENCH_RESULT "


def forward_backward(model: nn.Module, inputs: Inputs) -> None:
    """The baseline: a forward pass, the loss = the target (argmax) logits summed, a backward into the parameters.

    A causal LM (``lm_head``) computes its head on the last position only (``logits_to_keep=1``): the
    ``(B, V)`` next-token logits, as the methods explain them (the rows are unpadded). The gradients are
    cleared afterwards.

    Parameters
    ----------
    model : nn.Module
        The case's model.
    inputs : Tensor or dict
        Images ``(B, 3, H, W)``, or the text inputs ``{"input_ids", "attention_mask"}`` ``(B, T)``; the logits
        are ``(B, C)`` (``(B, V)`` for a causal LM).
    """
    if isinstance(inputs, dict) and hasattr(model, "lm_head"):
        logits = model(**inputs, logits_to_keep=1).logits[:, -1]
    else:
        logits = model(**inputs).logits if isinstance(inputs, dict) else model(inputs)
    logits.gather(1, logits.argmax(1, keepdim=True)).sum().backward()
    model.zero_grad(set_to_none=True)


def equal_spans(tokens: int, n: int) -> list[tuple[int, int]]:
    """``n`` contiguous token spans of (nearly) equal length covering the context before the last, read token.

    Span ``i`` is ``[⌊i·(tokens−1)/n⌋, ⌊(i+1)·(tokens−1)/n⌋)``.

    Parameters
    ----------
    tokens : int
        The sequence length T (the last token is the one read).
    n : int
        The number of sources S.

    Returns
    -------
    list of tuple of int
        The S spans ``(start, end)``, covering tokens 0 … T − 2.

    Raises
    ------
    InputError
        If the context (``tokens`` − 1) is shorter than ``n`` tokens (a span would be empty).
    """
    context = tokens - 1
    if n < 1 or context < n:
        raise InputError(f"{n} sources need at least {n} context tokens before the last one; got {tokens} tokens")
    return [(i * context // n, (i + 1) * context // n) for i in range(n)]


def call_for(
    model: nn.Module, inputs: Inputs, method: str, sources: int = 0, unverified: bool = False
) -> Callable[[], object]:
    """The call to time: the baseline or ``explain(model, inputs, method=method)``.

    Parameters
    ----------
    model : nn.Module
        The case's model.
    inputs : Tensor or dict
        The case's inputs (:func:`lrp_core.tools.bench_models.make_inputs`).
    method : str
        A method name, or :data:`BASELINE` for :func:`forward_backward`.
    sources : int
        With ``sources`` > 0: ``sources=`` :func:`equal_spans` of the input's length (and, for the ablation
        methods, ``batch_size`` = :data:`SOURCE_BATCH_SIZE`, ``n_ablations`` = :data:`N_ABLATIONS`).
    unverified : bool
        Leave out the check of the replay against the model's own forward (``explain(..., unverified=True)``).

    Returns
    -------
    callable
        A function of no arguments that makes the call.
    """
    if method == BASELINE:
        return lambda: forward_backward(model, inputs)
    if not sources:
        return lambda: explain(model, inputs, method=method, unverified=unverified)
    assert isinstance(inputs, dict), "sources are token spans of a text"
    opts: dict[str, Any] = {"sources": equal_spans(inputs["input_ids"].shape[1], sources)}
    if method in registry.SOURCE_METHODS:
        opts["batch_size"] = SOURCE_BATCH_SIZE
    if method == "context_cite":
        opts["n_ablations"] = N_ABLATIONS
    return lambda: explain(model, inputs, method=method, unverified=unverified, **opts)


def best_time(
    fn: Callable[[], object], repeat: int, warmup: int = 1, budget: Optional[float] = None
) -> tuple[float, int]:
    """The best wall time of ``fn`` (the run least disturbed by other load), and how many runs it is the best of.

    After ``warmup`` untimed runs, ``repeat`` timed runs — fewer when a budget
    is given: ``min(repeat, budget // t_warmup)`` (at least 1), and none when
    the last warm-up run alone took longer than ``budget`` (that run is then the
    time: for a call that long, warm-up effects are noise).

    Parameters
    ----------
    fn : callable
        The call to time, without arguments.
    repeat : int
        The most timed runs.
    warmup : int
        Untimed runs first.
    budget : float or None
        Seconds the timed runs may take together, estimated from the warm-up; ``None``: no limit.

    Returns
    -------
    tuple
        ``(seconds, runs)``: the best time in seconds and the number of runs it is the best of.
    """
    t_warm = None
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        t_warm = time.perf_counter() - t0
    if budget is not None and t_warm is not None:
        if t_warm > budget:
            return t_warm, 1
        repeat = max(1, min(repeat, int(budget // max(t_warm, 1e-9))))
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), repeat


def rss_kb() -> Optional[int]:
    """This process's resident set size now, in KB (Linux ``/proc``; ``None`` elsewhere)."""
    return proc_kib("/proc/self/status", "VmRSS")


def peak_rss_kb() -> int:
    """This process's peak resident set size so far, in KB (``ru_maxrss``; bytes on macOS)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak


def measure(model: nn.Module, inputs: Inputs, method: str, settings: Settings) -> dict:
    """Time ``method`` on ``(model, inputs)``, with this process's RSS before the first call and its peak after.

    Parameters
    ----------
    model : nn.Module
        The case's model.
    inputs : Tensor or dict
        The case's inputs.
    method : str
        A method name, or :data:`BASELINE`.
    settings : Settings
        The timed runs and the budget.

    Returns
    -------
    dict
        ``seconds`` (the best time), ``runs``, ``rss_before_kb`` (the peak where the RSS cannot be read),
        ``peak_rss_kb`` and, with ``settings.check_cost`` and a method, ``seconds_unchecked``: the best time of
        the same call without the check of the replay, timed after the peak is read.
    """
    last: list[object] = []  # the latest explanation: its passes are recorded with the time
    call = call_for(model, inputs, method, settings.sources)

    def fn() -> None:
        last[:] = [call()]

    before = rss_kb()
    seconds, runs = best_time(fn, settings.repeat, budget=settings.budget)
    peak = peak_rss_kb()
    out = {
        "seconds": seconds,
        "runs": runs,
        "rss_before_kb": before if before is not None else peak,
        "peak_rss_kb": peak,
    }
    if settings.check_cost and method != BASELINE:
        unchecked = call_for(model, inputs, method, settings.sources, unverified=True)
        out["seconds_unchecked"] = best_time(unchecked, settings.repeat, budget=settings.budget)[0]
    if settings.sources:
        tokens = int(inputs["input_ids"].shape[1])  # type: ignore[index]  # a --sources case's inputs: a dict
        forward, backward = (1.0, 1.0) if method == BASELINE else explanation_passes(method, last[0], tokens)
        out["forward_passes"], out["backward_passes"] = forward, backward
    return out


def worker(job: dict) -> dict:
    """The subprocess's work: build the job's case and measure its method.

    Parameters
    ----------
    job : dict
        The :class:`Case` and :class:`Settings` fields, and ``method``.

    Returns
    -------
    dict
        What :func:`measure` returns, with the number of torch ``threads``.
    """
    settings = Settings(**{k: job[k] for k in Settings.__dataclass_fields__ if k in job})
    if settings.threads:
        torch.set_num_threads(settings.threads)
    case = Case(job["model"], job["batch"], job["tokens"], job.get("dtype", "float32"))
    model, inputs = prepare(case, settings.seed)
    out = measure(model, inputs, job["method"], settings)
    out["threads"] = torch.get_num_threads()
    return out


class BenchError(LRPError, RuntimeError):
    """A worker subprocess failed (its stderr's tail is in the message)."""


def run_worker(case: Case, method: str, settings: Settings) -> dict:
    """Measure ``(case, method)`` in a fresh Python process, so that its peak RSS is its own.

    Parameters
    ----------
    case : Case
        The model and input size.
    method : str
        A method name, or :data:`BASELINE`.
    settings : Settings
        How the measuring is done.

    Returns
    -------
    dict
        The worker's result (:func:`worker`).

    Raises
    ------
    BenchError
        When the worker fails or prints no result (the message holds its stderr's tail).
    """
    job = {**asdict(case), **asdict(settings), "method": method}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run(
        [sys.executable, "-m", "lrp_core.tools.bench", "--_worker", json.dumps(job)],
        capture_output=True,
        text=True,
        env=env,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise BenchError(f"{case.model} {case.size} {method}: worker exited {proc.returncode}: " + " | ".join(tail))
    return json.loads(lines[-1][len(RESULT_TAG) :])


class InProcess:
    """``--quick``: measure in this process, keeping the last case's model and inputs (no memory numbers)."""

    def __init__(self) -> None:
        self._case: Optional[Case] = None
        self._built: Optional[tuple[nn.Module, Inputs]] = None

    def __call__(self, case: Case, method: str, settings: Settings) -> dict:
        if case != self._case or self._built is None:  # (both are None before the first case)
            self._case, self._built = case, prepare(case, settings.seed)
        out = measure(*self._built, method, settings)
        return {**out, "rss_before_kb": None, "peak_rss_kb": None}
