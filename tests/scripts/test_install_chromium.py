"""scripts/install_chromium.sh asks apt only for what is missing, and never fights an installed Node.js.

Each case runs the script with ``PATH`` set to a folder of fakes only: an ``apt-get`` that records its
arguments (and can refuse, as apt does for Debian's npm beside NodeSource's nodejs), and, per case, a
``chromium``, ``npm`` or ``node`` that merely exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install_chromium.sh"
BASH = shutil.which("bash")

pytestmark = pytest.mark.skipif(BASH is None or shutil.which("id") is None, reason="needs bash and id")

FAKE_APT = """#!{bash}
echo "$*" >> "{log}"
case " $* " in
  *" -s "*npm*) [ -n "$NPM_CONFLICTS" ] && {{ echo "nodejs : Conflicts: npm" >&2; exit 100; }} ;;
esac
[ -n "$APT_FAILS" ] && {{ echo "E: Could not open lock file" >&2; exit 100; }}
exit 0
"""


def _run(tmp_path: Path, present: list[str], **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    log.touch()
    (bin_dir / "apt-get").write_text(FAKE_APT.format(bash=BASH, log=log))
    (bin_dir / "sudo").write_text(f'#!{BASH}\n[ "$1" = -n ] && shift\nexec "$@"\n')
    for name in present:
        (bin_dir / name).write_text(f"#!{BASH}\necho v20.20.2\n")
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    os.symlink(shutil.which("id"), bin_dir / "id")
    res = subprocess.run(
        [BASH, str(SCRIPT)],
        env={"PATH": str(bin_dir), "HOME": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return res, log.read_text().splitlines()


def _installs(calls: list[str]) -> list[str]:
    """The packages of the real (not simulated) ``apt-get install`` calls."""
    names = []
    for call in calls:
        words = call.split()
        if "install" in words and "-s" not in words:
            names += [w for w in words[words.index("install") + 1 :] if not w.startswith("-")]
    return names


def test_npm_present_chromium_absent_asks_for_chromium_only(tmp_path):
    res, calls = _run(tmp_path, ["npm", "node"], NPM_CONFLICTS="1")
    assert res.returncode == 0, res.stderr
    assert _installs(calls) == ["chromium", "fonts-dejavu-core"]
    assert not any("npm" in c for c in calls), calls  # npm is there: apt is never asked about it
    assert "could not install" not in res.stderr


def test_both_absent_installs_both(tmp_path):
    res, calls = _run(tmp_path, [])
    assert res.returncode == 0, res.stderr
    assert calls[0] == "update -q"
    assert _installs(calls) == ["chromium", "fonts-dejavu-core", "npm"]
    assert any(c.split()[:2] == ["install", "-s"] for c in calls), "npm is simulated before it is installed"


def test_both_present_asks_apt_nothing(tmp_path):
    res, calls = _run(tmp_path, ["chromium", "npm", "node"])
    assert res.returncode == 0 and calls == [] and res.stderr == ""


def test_npm_conflicting_with_node_is_not_forced_and_is_named(tmp_path):
    """A Node.js without npm that apt's npm would conflict with: the dry run refuses, nothing is forced."""
    res, calls = _run(tmp_path, ["chromium", "node"], NPM_CONFLICTS="1")
    assert res.returncode == 0
    assert _installs(calls) == []
    assert "npm" in res.stderr and "Node.js v20.20.2" in res.stderr and "tests/scripts/test_slides.py" in res.stderr


def test_apt_failing_names_what_is_missing_and_which_tests_need_it(tmp_path):
    res, _ = _run(tmp_path, ["npm"], APT_FAILS="1")
    assert res.returncode == 0  # the rest of the suite still runs; the browser tests say why they cannot
    assert "chromium" in res.stderr and "tests/widgets/test_browser.py" in res.stderr
    assert "tests/scripts/test_slides.py" in res.stderr
