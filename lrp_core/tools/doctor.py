"""Check an installation before a workshop: ``python -m lrp_core.tools.doctor``.

Runs every check a course room needs and prints one line per check — ✓ for
fine, ! for a warning, ✗ for a failure — with the fix for anything that is
not fine. The exit status is 1 if an essential check fails (imports, the
embedded models, a widget, the notebook kernel), 0 otherwise. Nothing here
touches the network: the embedded models ship with the library.

    python -m lrp_core.tools.doctor            # everything (about half a minute)
    python -m lrp_core.tools.doctor --quick    # skip loading the models and the widget
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ..runtime.versions import ADMITTED, lowest, outside

ROOT = Path(__file__).resolve().parents[2]  # the repository (lrp_core/tools/doctor.py)

#: (import name, distribution, minimal version, essential) — from pyproject.toml; torch, timm and transformers
#: are checked against their whole admitted range (lrp_core.runtime.versions)
PACKAGES = [
    ("torch", "torch", lowest(ADMITTED["torch"]), True),
    ("timm", "timm", lowest(ADMITTED["timm"]), True),
    ("transformers", "transformers", lowest(ADMITTED["transformers"]), True),
    ("numpy", "numpy", None, True),
    ("matplotlib", "matplotlib", "3.7", True),
    ("ipywidgets", "ipywidgets", "8.1", True),
    ("safetensors", "safetensors", None, True),
    ("PIL", "pillow", None, True),
    ("skimage", "scikit-image", None, True),
    ("ipykernel", "ipykernel", None, True),
    ("nbformat", "nbformat", None, False),
    ("nbval", "nbval", "0.11", False),
    ("jupyterlab", "jupyterlab", "4.2", False),
]

INSTALL = 'run `make install` (or: pip install -e ".[dev]") in the repository'


@dataclass
class Result:
    name: str
    status: str  # "ok", "warn" or "fail"
    detail: str = ""
    fix: str = ""
    essential: bool = True


@dataclass
class Doctor:
    results: list[Result] = field(default_factory=list)
    verbose: bool = True

    def run(self, name: str, fn: Callable[[], Result | None], essential: bool = True) -> Result:
        t0 = time.perf_counter()
        try:
            res = fn() or Result(name, "ok")
        except Exception as err:  # noqa: BLE001 - every failure becomes a line with a fix
            res = Result(name, "fail", f"{type(err).__name__}: {err}", _fix_for(name))
        res.name = name
        res.essential = essential
        dt = time.perf_counter() - t0
        if dt > 1 and res.status == "ok":
            res.detail = (res.detail + f" ({dt:.1f} s)").strip()
        self.results.append(res)
        if self.verbose:
            _print(res)
        return res

    @property
    def failed(self) -> list[Result]:
        return [r for r in self.results if r.status == "fail" and r.essential]


def _print(r: Result) -> None:
    mark = {"ok": "✓", "warn": "!", "fail": "✗"}[r.status if r.essential or r.status != "fail" else "warn"]
    print(f"{mark} {r.name}" + (f": {r.detail}" if r.detail else ""), flush=True)
    if r.status != "ok" and r.fix:
        print(f"    fix: {r.fix}", flush=True)


def _fix_for(name: str) -> str:
    if name.startswith("model "):
        return (
            "reinstall the package so that lrp_core/assets is complete (" + INSTALL + "); for dinov2-s14 "
            "also check that the cache folder is writable (RELEVANCE_LAB_CACHE points it elsewhere)"
        )
    if name.startswith("widget"):
        return 'pip install "ipywidgets>=8.1" in the course environment, then restart Jupyter'
    if name.startswith("kernel"):
        return "python -m ipykernel install --user --name python3 (run with the course environment's python)"
    return INSTALL


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


# ---------------------------------------------------------------- checks
def check_python() -> Result:
    v = platform.python_version()
    if sys.version_info < (3, 10):
        return Result("python", "fail", f"{v} at {sys.executable}", "the course needs Python ≥ 3.10")
    return Result("python", "ok", f"{v} ({sys.executable})")


def check_package(module: str, dist: str, minimum: str | None) -> Result:
    """Whether a package imports and is at least its minimum version.

    Parameters
    ----------
    module : str
        The module to import.
    dist : str
        Its distribution name on PyPI (for the installed version and the fix).
    minimum : str or None
        The oldest version accepted, or ``None`` for any.

    Returns
    -------
    Result
        ``ok`` with the version; ``fail`` with the error (and the install command) when the import fails, or with
        the ``pip install`` fix when the version is older than ``minimum``.
    """
    from importlib import metadata

    try:
        importlib.import_module(module)
    except Exception as err:  # noqa: BLE001
        return Result(f"import {module}", "fail", f"{type(err).__name__}: {err}", INSTALL)
    try:
        version = metadata.version(dist)
    except metadata.PackageNotFoundError:
        version = getattr(sys.modules[module], "__version__", "?")
    if dist in ADMITTED and version != "?" and (reason := outside(dist, version)) is not None:
        return Result(f"import {module}", "fail", reason.split(";")[0], f'pip install "{dist}{ADMITTED[dist]}"')
    if minimum and version != "?" and _version_tuple(version) < _version_tuple(minimum):
        return Result(
            f"import {module}", "fail", f"{version} is older than {minimum}", f'pip install "{dist}>={minimum}"'
        )
    return Result(f"import {module}", "ok", version)


def check_course_packages() -> Result:
    import lrp_core
    import widgets  # noqa: F401
    from lrp_core import METHODS

    return Result("lrp_core + widgets", "ok", f"lrp_core {lrp_core.__version__}, {len(METHODS)} methods")


def check_threads() -> Result:
    import torch

    cores = os.cpu_count() or 1
    n = torch.get_num_threads()
    omp = os.environ.get("OMP_NUM_THREADS")
    detail = f"torch uses {n} thread(s) on {cores} core(s); OMP_NUM_THREADS={omp or 'unset'}"
    if n > cores:
        return Result("threads", "warn", detail, f"export OMP_NUM_THREADS={cores} before starting Jupyter")
    if omp is None and cores > 4:
        return Result(
            "threads",
            "warn",
            detail + " (the notebooks set 1 thread themselves)",
            "on a shared machine with many learners, export OMP_NUM_THREADS=1 before starting Jupyter",
        )
    return Result("threads", "ok", detail + " — the notebooks set 1 thread themselves")


def _tiny_vlm_answers(m: Any) -> tuple[Optional[Result], Any]:
    """tiny-vlm answers a held-out question (its weights are the trained ones) and explains it to the image.

    Parameters
    ----------
    m : Any
        The loaded tiny-vlm.

    Returns
    -------
    tuple[Optional[Result], Any]
        ``(a failing Result or None, the AttnLRP explanation or None)``.
    """
    import torch

    from lrp_core import explain
    from lrp_core.data import make_vqa
    from lrp_core.models.tiny_vlm import HELD_OUT_SEED

    record = next(r for r in make_vqa(8, HELD_OUT_SEED + 1) if r.has_evidence)
    x = m.preprocess(record.image, record.question)
    with torch.no_grad():
        written = m.tokenizer.convert_ids_to_tokens(int(m.model(**x).logits[0, -1].argmax()))
    if written != record.answer:
        return Result(
            "model tiny-vlm",
            "fail",
            f"answered {written!r} to {record.question!r} where the answer is "
            f"{record.answer!r}: its weights are not the trained ones",
            "reinstall the package (lrp_core/assets/tiny_vlm/)",
        ), None
    exp = explain(m.model, x, method="attnlrp")
    if not torch.isfinite(exp.upsample()).all():
        return Result("model tiny-vlm", "fail", "the image map contains NaN/inf", _fix_for("model ")), None
    return None, exp


def _tiny_s2s_translates(m: Any) -> tuple[Optional[Result], Any]:
    """tiny-s2s translates a held-out sentence exactly; its input × gradient source maps (autograd) are computed.

    Parameters
    ----------
    m : Any
        The loaded tiny-s2s.

    Returns
    -------
    tuple[Optional[Result], Any]
        ``(a failing Result or None, an object whose .scores are the (1, K, S) maps, or None)``.
    """
    from types import SimpleNamespace

    from lrp_core.data.translation import make_translations
    from lrp_core.evaluation.alignment import alignment_data, gradient_source_maps
    from lrp_core.models.tiny_s2s import HELD_OUT_SEED, translate

    record = make_translations(1, HELD_OUT_SEED + 1, split="held_out")[0]
    written = translate(m.model, m.tokenizer, [record.source])[0]
    if written != record.target:
        return Result(
            "model tiny-s2s",
            "fail",
            f"translated {record.source!r} as {written!r} where the translation is {record.target!r}: its "
            "weights are not the trained ones",
            "reinstall the package (lrp_core/assets/tiny_s2s/)",
        ), None
    return None, SimpleNamespace(scores=gradient_source_maps(m.model, alignment_data(m.tokenizer, [record])))


def check_model(name: str) -> Result:
    """Whether an embedded model loads and explains one small input with finite scores.

    The tiny LM must also answer a held-out facts prompt correctly (its weights are the trained ones); a DINOv2
    model warns when its converted weights are not cached.

    Parameters
    ----------
    name : str
        The embedded model's name (:data:`lrp_core.models.EMBEDDED`).

    Returns
    -------
    Result
        ``ok`` with the load time; ``warn`` for uncached DINOv2 weights; ``fail`` for a wrong answer or a
        non-finite explanation.
    """
    import torch

    from lrp_core import explain
    from lrp_core.models import load

    t0 = time.perf_counter()
    m = load(name)
    t_load = time.perf_counter() - t0
    torch.manual_seed(0)
    if name == "minilm-sentiment":
        x = m.preprocess(["A warm and funny film."])
        exp = explain(m.model, x, method="cdam")
    elif name == "tiny-lm":  # it must answer, not only run: one held-out facts prompt, its answer's AttnLRP map
        from lrp_core.data.facts import make_facts
        from lrp_core.models.tiny_lm import HELD_OUT_SEED

        record = make_facts(1, HELD_OUT_SEED + 1)[0]
        x = m.preprocess([record.prompt])
        with torch.no_grad():
            written = m.tokenizer.convert_ids_to_tokens(int(m.model(**x).logits[0, -1].argmax()))
        if written != record.answer:
            return Result(
                f"model {name}",
                "fail",
                f"wrote {written!r} where the answer is {record.answer!r}: its weights are not the trained ones",
                "reinstall the package (lrp_core/assets/tiny_lm/)",
            )
        exp = explain(m.model, x, method="attnlrp")
    elif name == "tiny-vlm":  # it must answer too: one held-out question, its answer's AttnLRP map on the image
        failed, exp = _tiny_vlm_answers(m)
        if failed is not None:
            return failed
    elif name == "tiny-s2s":  # it must translate a held-out sentence exactly; its source maps must be finite
        failed, exp = _tiny_s2s_translates(m)
        if failed is not None:
            return failed
    else:
        size = m.info.get("image_size", 64)  # each embedded image model says its own input size
        h, w = (size, size) if isinstance(size, int) else tuple(size)
        x = torch.rand(1, 3, h, w)
        if getattr(m.model, "num_classes", 1) == 0:  # a backbone without a head: explain a concept
            from lrp_core import concept_target

            exp = explain(m.model, x, method="cdam", target=concept_target(m.model, x, name="self"))
        else:
            exp = explain(m.model, x)
    if not torch.isfinite(exp.scores).all():
        return Result(f"model {name}", "fail", "the explanation contains NaN/inf", _fix_for("model "))
    detail = f"loads in {t_load:.1f} s, explains"
    if name.startswith("dinov2"):
        from lrp_core.models import dinov2

        cache = dinov2.cache_dir()
        cached = any(cache.glob("dinov2_s14_*.safetensors")) if cache.is_dir() else False
        detail += f"; converted weights cached in {cache}" if cached else "; weights NOT cached"
        if not cached:
            return Result(
                f"model {name}",
                "warn",
                detail,
                f"make {cache} writable (or set RELEVANCE_LAB_CACHE); otherwise every load converts again",
            )
    return Result(f"model {name}", "ok", detail)


def check_widget() -> Result:
    import torch

    from lrp_core.models import load
    from widgets import RelevanceExplorer

    toy = load("toy-vit")
    torch.manual_seed(0)
    w = RelevanceExplorer(toy, torch.rand(1, 3, 64, 64))
    bundle = w._repr_mimebundle_()
    if "application/vnd.jupyter.widget-view+json" not in bundle:
        return Result("widget renders", "fail", "no widget view in the display bundle", _fix_for("widget"))
    png = w.static_png()
    if not png.startswith(b"\x89PNG"):
        return Result("widget renders", "fail", "the static picture is not a PNG", _fix_for("widget"))
    return Result("widget renders", "ok", f"RelevanceExplorer: widget view + static PNG ({len(png) // 1024} kB)")


def check_kernel() -> Result:
    try:
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    except ImportError:
        return Result("kernel python3", "fail", "jupyter_client is not installed", INSTALL)
    try:
        spec = KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        return Result(
            "kernel python3", "fail", "no kernel called python3 (the notebooks ask for it)", _fix_for("kernel")
        )
    exe = spec.argv[0]
    # jupyter_client starts a kernel whose argv[0] is a bare "python" with the server's own interpreter
    if exe in ("python", f"python{sys.version_info[0]}", "python%d.%d" % sys.version_info[:2], "{python}"):
        exe = sys.executable
    elif not os.path.isabs(exe):
        exe = shutil.which(exe) or exe
    probe = subprocess.run(
        [exe, "-c", "import lrp_core, widgets, torch; print(lrp_core.__file__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        return Result("kernel python3", "fail", f"its python ({exe}) cannot import lrp_core", _fix_for("kernel"))
    where = Path(probe.stdout.strip()).resolve().parent
    mine = Path(__file__).resolve().parents[1]  # lrp_core
    if where != mine:
        return Result(
            "kernel python3",
            "warn",
            f"its python ({exe}) imports lrp_core from {where}, not {mine}",
            _fix_for("kernel"),
        )
    return Result("kernel python3", "ok", f"runs {exe} and imports this lrp_core")


def check_notebooks() -> Result:
    nb_dir = ROOT / "notebooks"
    notebooks = sorted(nb_dir.glob("[0-9][0-9]_*.ipynb"))
    if not notebooks:
        return Result(
            "notebooks",
            "warn",
            f"no notebooks next to the package ({nb_dir})",
            "run the course from a clone of the repository",
        )
    sys.path.insert(0, str(nb_dir))
    try:
        import solutions

        n = len(solutions.all_exercises())
    finally:
        sys.path.remove(str(nb_dir))
    return Result("notebooks", "ok", f"{len(notebooks)} notebooks, {n} checked exercises in {nb_dir}")


#: memory one learner needs on a shared machine, in bytes: the hub guarantee of docs/TEACHING.md ("Memory"), the
#: largest kernel at its measured peak, widgets driven, rounded up to 0.5 GB (a test keeps it equal to
#: docs/results/notebook-memory.json)
LEARNER_BYTES = 2.0e9
#: free disk below which the DINOv2 cache (83 MiB) and the learners' saved notebooks get tight, in bytes
MIN_FREE_DISK = 1.0e9


def _memory_bytes() -> tuple[int | None, int | None]:
    """(total, available) memory in bytes: ``/proc/meminfo`` on Linux, ``sysconf`` elsewhere, None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return info.get("MemTotal"), info.get("MemAvailable", info.get("MemFree"))
    except OSError:
        pass
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page
    except (AttributeError, ValueError, OSError):  # Windows has no sysconf; macOS no SC_AVPHYS_PAGES
        return None, None


def machine_capacity(total: int | None, available: int | None, disk_free: int) -> Result:
    """RAM, free disk and how many learners the available memory holds (``LEARNER_BYTES`` each).

    Parameters
    ----------
    total, available : int or None
        Installed and available memory in bytes (None: unknown on this system).
    disk_free : int
        Free bytes on the disk of the repository.

    Returns
    -------
    Result
        ``ok`` with the learner count; ``warn`` when the memory holds no learner or the disk is nearly full.
    """
    gb = 1e9
    disk = f"free disk {disk_free / gb:.1f} GB"
    if available is None or total is None:
        return Result(
            "memory and disk",
            "warn",
            f"RAM unknown on this system; {disk}",
            f"plan {LEARNER_BYTES / gb:g} GB of RAM per learner (docs/TEACHING.md)",
        )
    learners = int(available // LEARNER_BYTES)
    detail = (
        f"RAM {total / gb:.1f} GB, {available / gb:.1f} GB available; {disk}; holds {learners} "
        f"learner{'s' if learners != 1 else ''} at {LEARNER_BYTES / gb:g} GB each"
    )
    if learners < 1:
        return Result(
            "memory and disk",
            "warn",
            detail,
            f"a kernel with its widgets needs up to {LEARNER_BYTES / gb:g} GB: close other programs or use a machine "
            "with more memory",
        )
    if disk_free < MIN_FREE_DISK:
        return Result("memory and disk", "warn", detail, "free at least 1 GB of disk for caches and saved notebooks")
    return Result("memory and disk", "ok", detail)


def check_capacity() -> Result:
    total, available = _memory_bytes()
    return machine_capacity(total, available, shutil.disk_usage(ROOT).free)


def check_writable() -> Result:
    import tempfile

    with tempfile.NamedTemporaryFile(dir=ROOT / "notebooks" if (ROOT / "notebooks").is_dir() else None):
        pass
    return Result("notebooks writable", "ok", "learners can save their work")


# ---------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    """Run every check and print the results and a verdict.

    Parameters
    ----------
    argv : list of str or None
        The command-line arguments (``--quick`` skips loading the models and rendering a widget); ``None`` reads
        ``sys.argv``.

    Returns
    -------
    int
        The exit status: 1 when an essential check failed, else 0.
    """
    ap = argparse.ArgumentParser(prog="python -m lrp_core.tools.doctor", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip loading the models and rendering a widget")
    args = ap.parse_args(argv)
    print(f"Transformer Relevance Lab — checking this installation ({platform.platform()})")
    doc = Doctor()
    doc.run("python", check_python)
    for module, dist, minimum, essential in PACKAGES:
        doc.run(f"import {module}", functools.partial(check_package, module, dist, minimum), essential)
    doc.run("lrp_core + widgets", check_course_packages)
    doc.run("threads", check_threads, essential=False)
    doc.run("memory and disk", check_capacity, essential=False)
    if not args.quick:
        from lrp_core.models import EMBEDDED

        for name in EMBEDDED:
            doc.run(f"model {name}", functools.partial(check_model, name))
        doc.run("widget renders", check_widget)
    doc.run("kernel python3", check_kernel)
    doc.run("notebooks", check_notebooks, essential=False)
    doc.run("notebooks writable", check_writable, essential=False)
    failed = doc.failed
    warned = [r for r in doc.results if r.status != "ok" and r not in failed]
    print()
    if failed:
        print(
            f"✗ {len(failed)} essential check(s) failed: "
            + ", ".join(r.name for r in failed)
            + ". Fix them before the workshop (see the 'fix:' lines)."
        )
        return 1
    print("✓ ready for the workshop" + (f" ({len(warned)} warning(s) above)" if warned else "") + ".")
    return 0


if __name__ == "__main__":
    sys.exit(main())
