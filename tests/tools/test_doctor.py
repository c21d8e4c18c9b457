"""``python -m lrp_core.tools.doctor``: verifies an installation before a workshop, offline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lrp_core.tools import doctor

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CI": "true", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "lrp_core.tools.doctor", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_quick_run_passes_here():
    res = _run("--quick")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    for line in ("✓ python", "✓ import torch", "✓ lrp_core + widgets", "kernel python3", "✓ ready for the workshop"):
        assert line in out, out
    assert "✗" not in out


@pytest.mark.slow
def test_full_run_loads_every_embedded_model_and_a_widget():
    res = _run()
    assert res.returncode == 0, res.stdout + res.stderr
    for name in ("toy-vit", "dinov2-s14", "minilm-sentiment", "tiny-lm", "tiny-vlm", "tiny-s2s"):
        assert f"✓ model {name}" in res.stdout
    assert "✓ widget renders" in res.stdout


def test_a_missing_package_fails_with_a_fix(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "PACKAGES", [("no_such_module_xyz", "no-such-dist", None, True)])
    monkeypatch.setattr(doctor, "check_kernel", lambda: doctor.Result("kernel python3", "ok"))
    assert doctor.main(["--quick"]) == 1
    out = capsys.readouterr().out
    assert "✗ import no_such_module_xyz" in out and "fix: run `make install`" in out
    assert "1 essential check(s) failed" in out


def test_an_old_version_is_reported():
    res = doctor.check_package("numpy", "numpy", "999.0")
    assert res.status == "fail" and "older than 999.0" in res.detail and "numpy>=999.0" in res.fix


def test_a_check_that_raises_becomes_a_line(capsys):
    d = doctor.Doctor()
    r = d.run("model toy-vit", lambda: 1 / 0)
    assert r.status == "fail" and "ZeroDivisionError" in r.detail and d.failed == [r]
    assert "✗ model toy-vit" in capsys.readouterr().out


def test_warnings_do_not_fail(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "PACKAGES", [])
    monkeypatch.setattr(doctor, "check_threads", lambda: doctor.Result("threads", "warn", "too many", "fewer"))
    monkeypatch.setattr(doctor, "check_kernel", lambda: doctor.Result("kernel python3", "ok"))
    assert doctor.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "! threads: too many" in out and "fix: fewer" in out and "1 warning(s)" in out


def test_tiny_lm_check_fails_on_untrained_weights(monkeypatch):
    """The tiny-lm check asks for an answer, so random weights (a broken install) fail it with the fix."""
    from lrp_core import models

    real = models.load
    monkeypatch.setattr(models, "load", lambda name, **kw: real(name, pretrained=False))
    res = doctor.check_model("tiny-lm")
    assert res.status == "fail" and "not the trained ones" in res.detail and "reinstall" in res.fix


def test_tiny_vlm_check_answers_and_fails_on_untrained_weights(monkeypatch):
    """The tiny-vlm check asks for an answer to a held-out question: the trained weights pass, random ones fail."""
    assert doctor.check_model("tiny-vlm").status == "ok"
    from lrp_core import models

    real = models.load
    monkeypatch.setattr(models, "load", lambda name, **kw: real(name, pretrained=False))
    res = doctor.check_model("tiny-vlm")
    assert res.status == "fail" and "not the trained ones" in res.detail and "reinstall" in res.fix


def test_tiny_s2s_check_translates_and_fails_on_untrained_weights(monkeypatch):
    """The tiny-s2s check asks for an exact translation of a held-out sentence: trained passes, random fails."""
    assert doctor.check_model("tiny-s2s").status == "ok"
    from lrp_core import models

    real = models.load
    monkeypatch.setattr(models, "load", lambda name, **kw: real(name, pretrained=False))
    res = doctor.check_model("tiny-s2s")
    assert res.status == "fail" and "not the trained ones" in res.detail and "reinstall" in res.fix


def test_capacity_reports_ram_disk_and_learners():
    """Learners = available memory // the hub guarantee; no learner or a nearly full disk is a warning with a fix."""
    r = doctor.machine_capacity(total=32_000_000_000, available=25_000_000_000, disk_free=40_000_000_000)
    assert r.status == "ok"
    assert "RAM 32.0 GB, 25.0 GB available" in r.detail and "free disk 40.0 GB" in r.detail
    assert f"holds {int(25e9 // doctor.LEARNER_BYTES)} learners" in r.detail  # 25 GB // the hub guarantee
    low = doctor.machine_capacity(
        total=4_000_000_000, available=int(0.75 * doctor.LEARNER_BYTES), disk_free=40_000_000_000
    )
    assert low.status == "warn" and "holds 0 learners" in low.detail and low.fix
    full = doctor.machine_capacity(total=32_000_000_000, available=25_000_000_000, disk_free=500_000_000)
    assert full.status == "warn" and "free disk 0.5 GB" in full.detail and full.fix
    unknown = doctor.machine_capacity(None, None, 40_000_000_000)
    assert unknown.status == "warn" and "RAM unknown" in unknown.detail


def test_capacity_line_matches_this_machine():
    """The line reads this machine's memory and disk, and the doctor prints it."""
    total, available = doctor._memory_bytes()
    assert total and available and 0 < available <= total
    res = doctor.check_capacity()
    assert f"RAM {total / 1e9:.1f} GB" in res.detail and "free disk" in res.detail and "learner" in res.detail
    assert "memory and disk: RAM" in _run("--quick").stdout
