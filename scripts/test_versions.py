"""Run the coverage tests at the lowest and the newest admitted transformers and timm (``make test-versions``).

The ranges are ``lrp_core.runtime.versions.ADMITTED`` (pyproject.toml says the same). For each end of each range
that differs from the version this environment runs (which ``make test`` already tests), the version is installed
with ``pip --no-deps --target`` into ``.cache/versions/<name>-<version>`` — plus, into the same folder, whichever
of its own requirements this environment does not satisfy (transformers' ``tokenizers`` / ``huggingface-hub``
bounds) — and the coverage tests run with that folder first on ``PYTHONPATH``: the same torch and the same venv,
no reinstall. Before the tests, a fresh interpreter must import exactly the version asked for.

Usage: ``python scripts/test_versions.py [--only transformers|timm] [--pip-args "--no-index --find-links W"]
[-- extra pytest arguments]``. Exit status: pytest's first non-zero one, else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from lrp_core.runtime.versions import ADMITTED, lowest  # noqa: E402

ADAPTERS = "tests/adapters/"
#: the coverage tests each package's version decides: decoders, encoders and ViTs, the families of 2026, VLMs
COVERAGE: dict[str, list[str]] = {
    "transformers": [
        ADAPTERS + f
        for f in (
            "test_decoders.py",
            "test_decoders_gemma3.py",
            "test_decoders_gpt2.py",
            "test_decoders_gpt_oss.py",
            "test_decoders_lxt.py",
            "test_decoders_moe.py",
            "test_decoders_parallel.py",
            "test_decoders_phi3.py",
            "test_decoder_inputs.py",
            "test_text_families.py",
            "test_vision_families.py",
            "test_open_recognition.py",
            "test_llava.py",
            "test_idefics3.py",
            "test_gemma_vlms.py",
            "test_qwen2_5_vl.py",
            "test_task_heads.py",
            "test_embeddings.py",
            "test_deberta.py",
            "test_esm.py",
            "test_vit_variants.py",
            "test_vit_mae.py",
            "test_seq2seq_bart.py",
            "test_seq2seq_t5.py",
            "test_seq2seq_classifier.py",
            "test_seq2seq_whisper.py",
        )
    ],
    "timm": [
        ADAPTERS + f
        for f in ("test_vision_families.py", "test_eva.py", "test_swin.py", "test_vit_pooling.py", "test_cait.py")
    ],
}


def pip(args: list[str], extra: list[str]) -> subprocess.CompletedProcess:
    """``python -m pip <args>`` quietly, with ``extra`` (an index or a wheelhouse); raises on failure."""
    cmd = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "-q", *extra]
    return subprocess.run(cmd, check=True, capture_output=True, text=True)


def newest(name: str, extra: list[str]) -> str:
    """The newest version of ``name`` inside its admitted range that the index (or wheelhouse) offers."""
    spec = f"{name}{ADMITTED[name]}"
    out = pip(["install", "--dry-run", "--no-deps", "--ignore-installed", "--report", "-", spec], extra).stdout
    return json.loads(out)["install"][0]["metadata"]["version"]


def unmet(target: Path, name: str) -> list[str]:
    """The requirements of ``name`` (as installed in ``target``) that neither ``target`` nor this venv meets."""
    dist = next(metadata.distributions(name=name, path=[str(target)]))
    env = {**default_environment(), "extra": ""}
    missing = []
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        found = [d.version for d in metadata.distributions(name=req.name, path=[str(target), *sys.path])][:1]
        if not found or not req.specifier.contains(found[0], prereleases=True):
            missing.append(str(Requirement(f"{req.name}{req.specifier}")))
    return missing


def install(name: str, version: str, extra: list[str]) -> Path:
    """``name==version`` and its unmet requirements in ``.cache/versions/<name>-<version>``; the folder."""
    target = ROOT / ".cache" / "versions" / f"{name}-{version}"
    if not (target / ".complete").exists():
        pip(["install", "--no-deps", "--upgrade", "--target", str(target), f"{name}=={version}"], extra)
        for _ in range(3):  # a requirement's own requirements, a level or two down
            missing = unmet(target, name)
            if not missing:
                break
            pip(["install", "--no-deps", "--upgrade", "--target", str(target), *missing], extra)
        (target / ".complete").touch()
    return target


def imported_version(name: str, env: dict[str, str]) -> str:
    """The ``__version__`` a fresh interpreter with ``env`` imports for ``name``."""
    code = f"import {name}; print({name}.__version__)"
    return subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout


def run(name: str, version: str, extra: list[str], pytest_args: list[str]) -> int:
    """The coverage tests of ``name`` at ``version``; pytest's exit status."""
    target = install(name, version, extra)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]).rstrip(":")}
    got = imported_version(name, env).strip()
    if got != version:
        print(f"test-versions: asked for {name} {version}, the interpreter imports {got}", file=sys.stderr)
        return 1
    print(f"test-versions: {name} {version} (from {target.relative_to(ROOT)})", flush=True)
    start = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *COVERAGE[name], *pytest_args]
    code = subprocess.run(cmd, env=env, cwd=ROOT).returncode
    print(f"test-versions: {name} {version}: exit {code} in {time.monotonic() - start:.0f} s", flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    """Each end of each admitted range not already installed here: its coverage tests."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(COVERAGE), action="append", help="one package (repeatable)")
    ap.add_argument("--pip-args", default="", help="extra pip arguments, e.g. an index or a wheelhouse")
    ap.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = ap.parse_args(argv)
    extra = shlex.split(args.pip_args)
    status = 0
    for name in args.only or sorted(COVERAGE):
        here = metadata.version(name)
        for version in dict.fromkeys([lowest(ADMITTED[name]), newest(name, extra)]):
            if version == here:
                print(f"test-versions: {name} {version} is this environment's: tested by the main run", flush=True)
                continue
            status = status or run(name, version, extra, args.pytest_args)
    return status


if __name__ == "__main__":
    sys.exit(main())
