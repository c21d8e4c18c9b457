"""Timing and memory of one GPU-table cell, shared by the lrp_core and the LXT worker of
``scripts/bench_gpu_llama8b.py`` (imports torch only: the LXT worker must not import lrp_core).

A *cell* is one (model variant, method, tokens). :func:`run_cell` calls its function once (the warm-up, also the
estimate of its time), then, if ``repeat`` more calls fit in ``budget`` seconds, ``repeat`` timed calls, and
reports the median of the timed calls (the first call's time where none fit: ``runs`` says 0 then) and the peak
``torch.cuda.max_memory_allocated`` over all its calls (reset before the cell; the bytes allocated before it,
the model and the inputs, reported beside). CUDA events time a call on a GPU, ``perf_counter`` on the CPU (the dry
run; no memory figure there). An out-of-memory error or any other exception ends the cell with a note, the caches
are freed, and the worker goes on. :class:`Rows` appends each row as one JSON line, flushed, so that a killed
worker leaves the rows it finished.
"""

from __future__ import annotations

import gc
import json
import math
import os
import statistics
import time
from typing import Any, Callable, Optional

import torch


class Clock:
    """Times a call on ``device`` (CUDA events on a GPU, ``perf_counter`` elsewhere) and reads its peak memory."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def reset(self) -> Optional[int]:
        """Free the caches and the peak; the bytes allocated now (``None`` on the CPU)."""
        gc.collect()
        if not self.cuda:
            return None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()

    def peak(self) -> Optional[int]:
        return torch.cuda.max_memory_allocated() if self.cuda else None

    def time(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        """Seconds of one call of ``fn`` and what it returned."""
        if not self.cuda:
            t = time.perf_counter()
            out = fn()
            return time.perf_counter() - t, out
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3, out


def is_oom(e: BaseException) -> bool:
    """Whether ``e`` is the device running out of memory (CUDA's error, or the allocator's message)."""
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def run_cell(clock: Clock, fn: Callable[[], Any], repeat: int, budget: float, deadline: float = math.inf) -> dict:
    """Time ``fn`` as the module docstring says.

    Parameters
    ----------
    clock : Clock
        The device's clock.
    fn : callable
        The cell's call; what it returns (a map, a tensor) is kept from the last call.
    repeat : int
        Timed calls after the first, where they fit.
    budget : float
        Seconds the timed calls may take, about.
    deadline : float, optional
        ``time.time()`` the timed calls must end by (none are made where they would not).

    Returns
    -------
    dict
        ``ms`` (median), ``ms_first``, ``runs``, ``peak_mb``, ``before_mb``, ``above_mb`` and ``out`` (the last
        call's result); or ``note`` (``"out of memory: ..."``, ``"error: ..."``) and ``oom`` on failure.
    """
    before = clock.reset()
    try:
        first, out = clock.time(fn)
        runs = repeat if first * repeat <= min(budget, deadline - time.time()) else 0
        times = []
        for _ in range(runs):
            t, out = clock.time(fn)
            times.append(t)
        peak = clock.peak()
    except Exception as e:  # one failing cell is recorded, the others run
        oom = is_oom(e)
        text = str(e).splitlines()[0][:200] if str(e) else ""
        note = f"out of memory: {text}" if oom else f"error: {type(e).__name__}: {text}"
        del e
        clock.reset()
        return {"note": note, "oom": oom}
    row: dict = {
        "ms": 1e3 * (statistics.median(times) if times else first),
        "ms_first": 1e3 * first,
        "runs": runs,
        "out": out,
    }
    if peak is not None and before is not None:
        row.update(peak_mb=peak / 2**20, before_mb=before / 2**20, above_mb=(peak - before) / 2**20)
    return row


def predicted_seconds(done: list, tokens: int) -> Optional[float]:
    """The time one call at ``tokens`` should take, from the cells ``done`` [(tokens, seconds of one call)] of the
    same method: the last one scaled by (tokens ratio)^1.6 (linear layers grow like T, causal attention like T²);
    ``None`` before any."""
    if not done:
        return None
    t0, s0 = done[-1]
    return s0 * (tokens / t0) ** 1.6


class Rows:
    """Rows appended to a JSON-lines file, one per line, flushed and synced as they come."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def emit(self, row: dict) -> None:
        row = {k: v for k, v in row.items() if k not in ("out", "oom")}
        line = json.dumps(row, default=lambda v: None if isinstance(v, float) and math.isnan(v) else str(v))
        with open(self.path, "a") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        print(" ".join(f"{k}={_short(v)}" for k, v in row.items()), flush=True)


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def save_map(folder: str, name: str, scores: torch.Tensor, target: int) -> str:
    """Save a (T,) relevance map (float32, on the CPU) and its target id as ``folder/name.pt``; its path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name + ".pt")
    torch.save({"scores": scores.detach().float().reshape(-1).cpu(), "target": int(target)}, path)
    return path


#: a cell's call at a length and in a mode: (tokens, mode) -> the function timed
Factory = Callable[[int, str], Callable[[], Any]]


def sweep(
    clock: Clock,
    rows: Rows,
    base: dict,
    lengths: list,
    cells: list,
    deadline: float,
    repeat: int,
    budget: float,
    keep: Callable[[str, int, dict], None],
) -> None:
    """Every cell at every length, shortest first, all cells of a length before the next length.

    Parameters
    ----------
    clock, rows : Clock, Rows
        Where to time and where the rows go.
    base : dict
        The fields every row carries (variant, dtype, ...).
    lengths : list of int
        Token counts, ascending.
    cells : list of (str, Factory, list of str)
        ``(method, factory, modes)``: a method runs in its first mode; where that runs out of memory it is run
        again at the same length in the next mode (e.g. ``"plain"`` then ``"checkpointed"``), and the longer
        lengths start in that mode. A method out of memory in its last mode is skipped at the longer lengths.
    deadline : float
        ``time.time()`` after which nothing starts; a cell whose predicted time (:func:`predicted_seconds`)
        would pass it is skipped, recorded as such.
    repeat, budget : int, float
        :func:`run_cell`'s.
    keep : callable
        ``keep(method, tokens, result)`` with each successful result (its ``out``), e.g. to save the map.
    """
    done: dict = {name: [] for name, _, _ in cells}
    mode_of = {name: 0 for name, _, _ in cells}
    failed: dict = {}
    for tokens in lengths:
        for name, factory, modes in cells:
            row = {**base, "method": name, "tokens": tokens}
            if name in failed:
                rows.emit({**row, "note": f"skipped: {failed[name]}"})
                continue
            while True:
                row["mode"] = modes[mode_of[name]]
                left = deadline - time.time()
                guess = predicted_seconds(done[name], tokens)
                if left <= 0 or (guess is not None and guess > left):
                    why = f"predicted {guess:.0f} s" if guess is not None else "no time"
                    rows.emit({**row, "note": f"skipped: {why}, {max(left, 0):.0f} s left"})
                    break
                try:
                    fn = factory(tokens, row["mode"])
                    r = run_cell(clock, fn, repeat, budget, deadline)
                except Exception as e:  # building the call failed (inputs, a refusal): recorded, the others run
                    r = {"note": f"error: {type(e).__name__}: {str(e)[:300]}", "oom": is_oom(e)}
                    clock.reset()
                if "ms" in r:
                    done[name].append((tokens, r["ms"] / 1e3))
                    keep(name, tokens, r)
                    rows.emit({**row, **r})
                    break
                rows.emit({**row, **r})
                if r.get("oom") and mode_of[name] + 1 < len(modes):
                    mode_of[name] += 1  # the same length again in the next mode
                    continue
                if r.get("oom"):
                    failed[name] = f"out of memory at {tokens} tokens"
                break
