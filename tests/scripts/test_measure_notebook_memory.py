"""``scripts/measure_notebook_memory.py`` reads a process's peak and current resident size from /proc."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import measure_notebook_memory as mnm  # noqa: E402


def test_peak_and_resident_size_of_this_process():
    """A 200 MB array raises the peak by about 200 MB; after it is freed the peak stays, the resident size drops."""
    before = mnm._status_mb(os.getpid())
    block = np.ones(200_000_000 // 8)  # 200 MB, touched
    during = mnm._status_mb(os.getpid())
    del block
    after = mnm._status_mb(os.getpid())
    assert 0 < before["VmRSS"] <= before["VmHWM"]
    assert during["VmHWM"] >= before["VmRSS"] + 190
    assert after["VmRSS"] < during["VmRSS"] - 150 and after["VmHWM"] > after["VmRSS"] + 150  # the peak stays
