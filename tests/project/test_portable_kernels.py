"""The tests that compare relevance digits with outputs made on another machine, run again on portable kernels.

The reference outputs in ``tests/fixtures`` (LXT's AttnLRP / CP-LRP maps, the PA-LRP authors' maps) were
computed on some other CPU; the notebooks' stored outputs too (``tests/course/test_notebooks.py`` runs nbval with both
kernel sets itself). A comparison that holds only with this machine's ATen kernels would fail on the next
machine, so the fixture tests are run once more in a subprocess with ``ATEN_CPU_CAPABILITY=default`` (the
portable kernels every x86 and ARM CPU has), which add and round in another order than AVX2 or AVX-512.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: the test files whose assertions read reference outputs stored in tests/fixtures
FIXTURE_TESTS = ["tests/rules/test_attnlrp.py", "tests/adapters/test_decoders_lxt.py", "tests/rules/test_pa_lrp.py"]


def _run(args: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default", HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_subprocess_runs_on_the_portable_kernels():
    res = _run(["-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"], timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "DEFAULT"


@pytest.mark.slow
def test_the_fixture_comparisons_hold_on_the_portable_kernels():
    for path in FIXTURE_TESTS:
        assert (ROOT / path).is_file(), path
    res = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", *FIXTURE_TESTS])
    tail = (res.stdout + res.stderr)[-6000:]
    assert res.returncode == 0, f"fixture tests failed on the portable kernels:\n{tail}"
