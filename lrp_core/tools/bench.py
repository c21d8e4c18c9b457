"""Speed and memory benchmark: ``python -m lrp_core.tools.bench``.

The default run (also ``--scaling``) prints a **scaling table**. Cases: timm
``deit_tiny_patch16_224``, ``deit_small_patch16_224`` and
``vit_base_patch16_224`` at batch 1, 8 and 16 (224² images, 197 tokens), and
Hugging Face BERT-base (``BertConfig()`` defaults, 2 labels) at batch 1 and 8 ×
128, 256 and 512 tokens (random token ids, full attention mask). All weights
are random (speed does not depend on them) and every random draw is seeded.

For every case and every method of :data:`lrp_core.api.METHODS`, and for a
plain forward + backward of the same model and batch (loss = the target logit,
gradients for the parameters as in training), it reports

* ms per sample (best of ``--repeat`` timed runs after one warm-up run),
* the ratio to forward + backward (what carries across machines),
* peak memory: each (case, method) and each case's forward + backward runs in
  a fresh subprocess, whose peak RSS (``ru_maxrss``) is reported, with the part
  above the loaded model and inputs (the RSS right before the first call), and
  the ratio of the peaks to forward + backward's (the target: ≤ 1.5).

Honest limits, on purpose:

* ``token_ablation`` runs one forward pass per token and sample (197, or up to
  512, per sample: minutes per case at the large sizes). It is timed only where
  batch × tokens ≤ ``--ablation-max`` (default 256: batch 1 up to 256 tokens);
  elsewhere the table shows "—" and a footnote says why.
* Long calls get fewer timed runs: after the warm-up, ``min(--repeat,
  --budget // warm-up time)`` runs (at least 1), and a call whose warm-up alone
  takes longer than ``--budget`` seconds (default 20) is timed by that one run.
  The ``runs`` field of ``--json`` records how many runs each number is the
  best of.
* A cell whose estimated peak (:func:`lrp_core.runtime.memory.estimate`, an upper
  bound) exceeds the memory available is not run (its row says so; e.g. a
  method that keeps one H×N×N map per block on a long decoder input), rather
  than pushing a shared machine into swap.

``--dtype bfloat16`` (or ``float16``) builds every model in that dtype (the weights are made in it, never
held in float32, so the peak RSS is the half model's): the memory row of a half-precision model
explained in float32 (``lrp_core.runtime.precision``), e.g.
``python -m lrp_core.tools.bench --models bert-base --batches 1 --lengths 128 --dtype bfloat16``.

**Decoder rows**, ``--decoders``: ``llama``, a Llama-shaped random
causal LM (``LlamaConfig``: width 512, 8 blocks, 8 heads / 2 key-value heads,
MLP 1376, vocabulary 32,000, sdpa) at 1 × 512, 1 × 1024, 1 × 4096 and 8 × 512
tokens, and ``qwen3-moe``, its mixture-of-experts twin (``Qwen3MoeConfig``: the same
attention, 8 experts of MLP 688 per block, top-2, random router) at 1 × 1024
(``--batches`` / ``--lengths`` give another grid), every method that runs
on decoders (:data:`lrp_core.methods.registry.DECODER_METHODS`). What is explained is
the next-token logit at the last position; the baseline is the same model's
forward with the LM head on the last position only (``logits_to_keep=1``, what
a next-token gradient needs), backward from the argmax logit into the
parameters. ``--quick --decoders`` runs the stand-in ``tiny-llama`` in process.

**Source rows**, ``--sources``: the cost of scoring S = 32 sources of a long context: ``llama``
at 1 × 4096 (``--lengths`` gives another length), the 32 sources equal token spans covering the context
before the read (last) token (:func:`equal_spans`); ``attnlrp`` and ``cp_lrp`` with ``sources=`` (one
forward and one backward), ``leave_one_out`` (S + 1 forwards) and ``context_cite`` (``n_ablations`` = 64
random masks + the full row: 65 forwards), the ablations replayed ``batch_size`` = :data:`SOURCE_BATCH_SIZE`
sequence per forward (so the peak is one ablated forward's, not 33 long rows'). The rows add the forward and
backward passes per explanation (``forward_passes`` / ``backward_passes``, from the explanation's
``options``). ``--quick --sources``: ``tiny-llama`` at 1 × 64, in process. ``--ignore-estimate`` runs a cell
whose memory estimate (an upper bound) exceeds the free memory.

``--quick`` is the short run: deit tiny and small at batch 1 and 16, all in
this process (no subprocesses, so no memory columns). ``--json PATH`` saves the
rows (rewritten after every row, so an interrupted run keeps what it measured),
``--markdown`` prints a Markdown table for the README at the end. The model
names ``tiny-vit``, ``tiny-bert`` and ``tiny-llama`` are seconds-fast stand-ins (2 blocks,
width 48 / 32 / 32) for the tests and for a smoke run of the machinery.
"""

from __future__ import annotations

import argparse
import functools
import json
from typing import Callable, Optional, Sequence

import torch
from tqdm.auto import tqdm

from ..adapters.vlm import VLM_REFUSED_METHODS
from ..api import METHODS
from ..errors import LRPError
from ..methods import registry
from ..methods.registry import DECODER_METHODS
from ..runtime import memory
from .bench_measure import (
    RESULT_TAG,
    BenchError,
    InProcess,
    best_time,
    call_for,
    equal_spans,
    forward_backward,
    measure,
    peak_rss_kb,
    rss_kb,
    run_worker,
    worker,
)
from .bench_models import (
    DECODER_MODELS,
    IMAGE_MODELS,
    TEXT_MODELS,
    TINY_MODELS,
    build_model,
    image_tokens,
    is_decoder,
    is_text,
    prepare,
)
from .bench_table import (
    ABLATION_MAX,
    BASELINE,
    BUDGET_S,
    HEADER,
    N_ABLATIONS,
    SOURCE_BATCH_SIZE,
    Case,
    Settings,
    format_row,
    make_row,
    markdown,
    save_json,
)
from .bench_vlm import VLM_BENCH_METHODS, VLM_MODELS, is_vlm, vlm_tokens

#: (batch, tokens) of the decoder rows, and of ``--quick --decoders`` (tiny-llama).
DECODER_SIZES = ((1, 512), (1, 1024), (1, 4096), (8, 512))
#: the mixture-of-experts row's size (qwen3-moe)
MOE_SIZES = ((1, 1024),)
QUICK_DECODER_SIZES = ((1, 32), (2, 32))
IMAGE_BATCHES = (1, 8, 16)
TEXT_BATCHES = (1, 8)
LENGTHS = (128, 256, 512)
QUICK_MODELS = ("deit_tiny_patch16_224", "deit_small_patch16_224")
QUICK_BATCHES = (1, 16)
#: The dtypes ``--dtype`` builds models in.
DTYPES = ("float32", "bfloat16", "float16")
#: ``--sources``: the methods, the number of sources, the sizes (full and ``--quick``) and the ablation options.
SOURCE_BENCH_METHODS = ("attnlrp", "cp_lrp", "leave_one_out", "context_cite")
N_SOURCES = 32
SOURCE_SIZES = ((1, 4096),)
QUICK_SOURCE_SIZES = ((1, 64),)


# ----------------------------------------------------------------------------------------------- the table


def make_cases(
    models: Sequence[str],
    batches: Optional[Sequence[int]] = None,
    lengths: Optional[Sequence[int]] = None,
    dtype: str = "float32",
    sources: bool = False,
) -> list[Case]:
    """Every ``(model, batch, length)`` case.

    Parameters
    ----------
    models : Sequence of str
        The model names.
    batches : Sequence of int or None
        The batch sizes; ``None``: 1, 8, 16 for images and 1, 8 for text.
    lengths : Sequence of int or None
        The text lengths in tokens; ``None``: 128, 256, 512. A decoder with neither ``batches`` nor ``lengths``
        gets :data:`DECODER_SIZES` (``qwen3-moe``: :data:`MOE_SIZES`; ``tiny-llama``: :data:`QUICK_DECODER_SIZES`).
        An image model's length is its own number of tokens.
    dtype : str
        The dtype the models are built in.
    sources : bool
        The ``--sources`` sizes for a decoder given neither: :data:`SOURCE_SIZES` (``tiny-llama``:
        :data:`QUICK_SOURCE_SIZES`).

    Returns
    -------
    list of Case
        The cases, model by model.
    """
    cases = []
    for name in models:
        if is_vlm(name):
            cases += [Case(name, B, vlm_tokens(name), dtype) for B in (batches or [1])]
        elif sources and is_decoder(name) and batches is None:
            default = QUICK_SOURCE_SIZES if name == "tiny-llama" else SOURCE_SIZES
            cases += [Case(name, 1, T, dtype) for T in (lengths or [T for _, T in default])]
        elif is_decoder(name) and batches is None and lengths is None:
            sizes = {"tiny-llama": QUICK_DECODER_SIZES, "qwen3-moe": MOE_SIZES}.get(name, DECODER_SIZES)
            cases += [Case(name, B, T, dtype) for B, T in sizes]
        elif is_text(name):
            cases += [Case(name, B, T, dtype) for B in (batches or TEXT_BATCHES) for T in (lengths or LENGTHS)]
        else:
            T = image_tokens(name)
            cases += [Case(name, B, T, dtype) for B in (batches or IMAGE_BATCHES)]
    return cases


def skip_reason(case: Case, method: str, settings: Settings) -> Optional[str]:
    """Why ``(case, method)`` is not timed, or ``None``.

    Parameters
    ----------
    case : Case
        The model and input size.
    method : str
        A method name.
    settings : Settings
        Its ``ablation_max`` limits where ``token_ablation`` is timed.

    Returns
    -------
    str or None
        The reason: a method that does not run on decoders, or ``token_ablation`` where batch × tokens exceeds
        ``settings.ablation_max``.
    """
    if is_vlm(case.model) and method in VLM_REFUSED_METHODS:
        return f"{method} is refused on VLMs (lrp_core.adapters.vlm.VLM_REFUSED_METHODS)"
    if is_decoder(case.model) and method not in DECODER_METHODS and method not in registry.SOURCE_METHODS:
        return f"{method} does not run on decoder LMs (lrp_core.methods.registry.DECODER_METHODS)"
    if method == "token_ablation" and case.batch * case.tokens > settings.ablation_max:
        return (
            f"token_ablation not timed where batch × tokens > {settings.ablation_max}: it runs one forward "
            f"pass per token and sample ({case.batch * case.tokens} here)"
        )
    return None


@functools.lru_cache(maxsize=None)
def case_facts(model: str, tokens: int) -> Optional[memory.SizeFacts]:
    """The memory estimate's facts of ``model`` at ``tokens`` tokens, from a weightless (meta) copy;
    ``None`` where the engine does not take the model."""
    from ..adapters import get_adapter

    try:
        with torch.device("meta"):
            adapter = get_adapter(build_model(model))
        return memory.facts_of(adapter, None, tokens=tokens)
    except LRPError:
        return None


def memory_reason(case: Case, method: str, free: Optional[int]) -> Optional[str]:
    """Why ``(case, method)`` is not run: its estimated peak exceeds ``free`` bytes; else ``None``.

    The source methods are priced at the ablated sequences per forward the bench gives them
    (:data:`SOURCE_BATCH_SIZE`).

    Parameters
    ----------
    case : Case
        The model and input size.
    method : str
        A method name (the baseline is never refused).
    free : int or None
        The memory available in bytes; ``None``: nothing is estimated.

    Returns
    -------
    str or None
        The reason, with the estimated peak and the available memory in GiB.
    """
    facts = case_facts(case.model, case.tokens) if free is not None and method != BASELINE else None
    size = SOURCE_BATCH_SIZE if method in registry.SOURCE_METHODS else 64
    need = memory.estimate(registry.get(method).memory, facts, case.batch, batch_size=size) if facts is not None else 0
    if free is None or need <= free:  # without a free size nothing is estimated: need is 0
        return None
    return (
        f"not run: estimated peak {need / 2**30:.1f} GiB > {free / 2**30:.1f} GiB available "
        f"(lrp_core.runtime.memory.estimate)"
    )


def run(
    cases: Sequence[Case],
    methods: Sequence[str] = METHODS,
    settings: Optional[Settings] = None,
    isolate: bool = True,
    printer: Callable[[str], None] = tqdm.write,
    json_path: Optional[str] = None,
    check_memory: bool = True,
) -> list[dict]:
    """Measure the baseline and every method on every case; print each row as it completes.

    Parameters
    ----------
    cases : Sequence of Case
        The cases (:func:`make_cases`).
    methods : Sequence of str
        The methods.
    settings : Settings or None
        How each call is measured; ``None``: :class:`Settings`' defaults.
    isolate : bool
        One fresh subprocess per ``(case, method)`` (peak memory), else in this process (``--quick``).
    printer : callable
        Prints a line (the table's rows as they complete).
    json_path : str or None
        Where the rows are saved after every row; ``None``: not saved.
    check_memory : bool
        ``False`` runs the cells whose estimated peak exceeds the available memory too (the estimate is an
        upper bound; the measured peak is the answer).

    Returns
    -------
    list of dict
        The rows (:func:`make_row`).
    """
    settings = settings or Settings()
    measure_one = run_worker if isolate else InProcess()
    free = memory.available(torch.device("cpu")) if check_memory else None
    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        printer(format_row(row))
        if json_path:
            save_json(json_path, rows, settings)

    printer(
        f"torch {torch.__version__}, {settings.threads or torch.get_num_threads()} thread(s), "
        f"{'one subprocess per (case, method)' if isolate else 'in process'}"
    )
    printer(HEADER)
    bar = tqdm(cases, desc="bench cases", unit="case")
    for case in bar:
        bar.set_postfix_str(f"{case.model} {case.size}")
        base = _try(measure_one, case, BASELINE, settings, emit)
        if base is not None:
            emit(make_row(case, BASELINE, base, base))
        for method in methods:
            reason = skip_reason(case, method, settings) or memory_reason(case, method, free)
            if reason:
                emit(make_row(case, method, None, None, note=reason))
                continue
            res = _try(measure_one, case, method, settings, emit)
            if res is not None:
                emit(make_row(case, method, res, base))
    bar.close()
    return rows


def _try(
    measure_one: Callable[[Case, str, Settings], dict],
    case: Case,
    method: str,
    settings: Settings,
    emit: Callable[[dict], None],
) -> Optional[dict]:
    """``measure_one(case, method, settings)``; on a worker failure an error row is emitted and ``None`` returned."""
    try:
        return measure_one(case, method, settings)
    except BenchError as e:
        emit(make_row(case, method, None, None, note=f"error: {e}"))
        return None


# ----------------------------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lrp_core.tools.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _add_tables(p)
    _add_cases(p)
    _add_measuring(p)
    p.add_argument("--_worker", help=argparse.SUPPRESS)
    return p


def _add_tables(p: argparse.ArgumentParser) -> None:
    """Which table: the scaling table (default), ``--quick``, the decoder, source and vision-language rows."""
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--scaling", action="store_true", help="the full scaling table (the default)")
    mode.add_argument(
        "--quick",
        action="store_true",
        help="short in-process run: deit tiny + small at batch 1 and 16 (with --decoders: "
        "tiny-llama at 1 × 32 and 2 × 32), no memory columns",
    )
    p.add_argument(
        "--decoders",
        action="store_true",
        help="the decoder rows: llama at "
        + ", ".join(f"{b} × {t}" for b, t in DECODER_SIZES)
        + " (a Llama-shaped random causal LM; see above) and qwen3-moe at "
        + ", ".join(f"{b} × {t}" for b, t in MOE_SIZES)
        + " (its mixture-of-experts twin)",
    )
    p.add_argument(
        "--sources",
        action="store_true",
        help=f"the source rows: llama at 1 × {SOURCE_SIZES[0][1]} (--lengths: others), {N_SOURCES} equal "
        f"sources, methods {', '.join(SOURCE_BENCH_METHODS)} (--quick: tiny-llama at 1 × "
        f"{QUICK_SOURCE_SIZES[0][1]})",
    )
    p.add_argument(
        "--vlm",
        action="store_true",
        help="the vision-language row: llava at 1 × 260 (a random LLaVA: CLIP ViT-B/16 at 224 px + the "
        "llama row's language model, 196 image + 64 text tokens; lrp_core.tools.bench_vlm), methods "
        f"{', '.join(VLM_BENCH_METHODS)} (--quick: tiny-llava)",
    )


def _add_cases(p: argparse.ArgumentParser) -> None:
    """The models, sizes and methods of the cases."""
    p.add_argument(
        "--models",
        help="comma-separated: timm ViT names, bert-base, llama, or the stand-ins "
        f"{', '.join(TINY_MODELS)} (default: {', '.join(IMAGE_MODELS + TEXT_MODELS)})",
    )
    p.add_argument(
        "--batches",
        help="comma-separated batch sizes for every model (default: 1,8,16 for images, 1,8 for text; --quick: 1,16)",
    )
    p.add_argument(
        "--lengths",
        help="comma-separated text lengths (tokens; default: "
        f"{','.join(map(str, LENGTHS))}; decoders: their sizes above)",
    )
    p.add_argument("--methods", default="all", help="'all' or comma-separated method names")


def _add_measuring(p: argparse.ArgumentParser) -> None:
    """How each cell is measured and where the rows go."""
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs after one warm-up (the best is reported)")
    p.add_argument(
        "--budget",
        type=float,
        default=BUDGET_S,
        help="seconds: slower calls get fewer timed runs (default %(default)s)",
    )
    p.add_argument(
        "--ablation-max",
        type=int,
        default=ABLATION_MAX,
        help="time token_ablation only where batch × tokens ≤ this (default %(default)s)",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="the dtype the models are built in; half dtypes are explained in float32 (lrp_core.runtime.precision)",
    )
    p.add_argument(
        "--ignore-estimate",
        action="store_true",
        help="run cells whose estimated peak (an upper bound) exceeds the available memory too; "
        "watch the machine's memory",
    )
    p.add_argument("--no-check-cost", action="store_true", help="do not also time each method without the check")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="save the rows as JSON (rewritten after every row)")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table for the README at the end")


def _ints(p: argparse.ArgumentParser, flag: str, text: Optional[str]) -> Optional[list[int]]:
    """``"1,8"`` → ``[1, 8]``; anything but positive integers is an error naming ``flag``."""
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        p.error(f"{flag} takes comma-separated positive integers, e.g. 1,8; got {text!r}")
    return values


def _methods(p: argparse.ArgumentParser, text: str, sources: bool = False, vlm: bool = False) -> tuple[str, ...]:
    """``--methods``: ``all`` (with ``--sources``: :data:`SOURCE_BENCH_METHODS`) or names; the source methods
    (leave_one_out, context_cite) only with ``--sources``."""
    known = METHODS + (tuple(registry.SOURCE_METHODS) if sources else ())
    if text == "all":
        return SOURCE_BENCH_METHODS if sources else VLM_BENCH_METHODS if vlm else METHODS
    methods = tuple(m.strip() for m in text.split(","))
    unknown = [m for m in methods if m not in known]
    if unknown:
        p.error(
            f"unknown method(s) {unknown}; choose 'all' or from {', '.join(known)}"
            + ("" if sources else f" ({', '.join(registry.SOURCE_METHODS)} with --sources)")
        )
    return methods


def _models(
    p: argparse.ArgumentParser,
    text: Optional[str],
    quick: bool,
    decoders: bool = False,
    sources: bool = False,
    vlm: bool = False,
) -> list[str]:
    if text is None and vlm:
        return ["tiny-llava" if quick else "llava"]
    if text is None and sources:
        return ["tiny-llama" if quick else "llama"]
    if text is None and decoders:
        return ["tiny-llama"] if quick else ["llama", "qwen3-moe"]
    if text is None:
        return list(QUICK_MODELS if quick else IMAGE_MODELS + TEXT_MODELS)
    import timm

    models = [m.strip() for m in text.split(",")]
    known = set(TEXT_MODELS + DECODER_MODELS + TINY_MODELS + VLM_MODELS)
    unknown = [m for m in models if m not in known and not timm.is_model(m)]
    if unknown:
        p.error(
            f"unknown model(s) {unknown}; choose timm ViT names (e.g. {', '.join(IMAGE_MODELS)}), "
            f"{', '.join(TEXT_MODELS + DECODER_MODELS)}, or the stand-ins {', '.join(TINY_MODELS)}"
        )
    return models


def main(argv: Optional[Sequence[str]] = None) -> list[dict]:
    """The command line: parse the arguments, run the benchmark, print the tables.

    Parameters
    ----------
    argv : Sequence of str or None
        The arguments (see the module docstring); ``None`` reads ``sys.argv``.

    Returns
    -------
    list of dict
        The rows (:func:`make_row`); none for a worker subprocess, which prints its result instead.
    """
    p = _parser()
    a = p.parse_args(argv)
    if a._worker is not None:
        print(RESULT_TAG + json.dumps(worker(json.loads(a._worker))), flush=True)
        return []
    if a.repeat < 1 or a.threads < 0 or a.budget <= 0 or a.ablation_max < 0:
        p.error("--repeat must be ≥ 1, --threads ≥ 0, --budget > 0 and --ablation-max ≥ 0")
    methods = _methods(p, a.methods, a.sources, a.vlm)
    models = _models(p, a.models, a.quick, a.decoders, a.sources, a.vlm)
    if a.sources and not all(is_decoder(m) for m in models):
        p.error(f"--sources measures decoder LMs only (llama, qwen3-moe, tiny-llama); got {', '.join(models)}")
    quick_batches = list(QUICK_BATCHES) if a.quick and not all(is_decoder(m) or is_vlm(m) for m in models) else None
    batches = _ints(p, "--batches", a.batches) or quick_batches
    lengths = _ints(p, "--lengths", a.lengths)
    if a.sources and lengths and min(lengths) <= N_SOURCES:
        p.error(
            f"--sources splits the context before the last token into {N_SOURCES} sources: --lengths must be "
            f"> {N_SOURCES}; got {a.lengths!r}"
        )
    settings = Settings(
        repeat=a.repeat,
        budget=a.budget,
        threads=a.threads,
        seed=a.seed,
        ablation_max=a.ablation_max,
        sources=N_SOURCES if a.sources else 0,
        check_cost=not a.no_check_cost,
    )
    if a.threads:
        torch.set_num_threads(a.threads)
    rows = run(
        make_cases(models, batches, lengths, a.dtype, a.sources),
        methods,
        settings,
        isolate=not a.quick,
        json_path=a.json,
        check_memory=not a.ignore_estimate,
    )
    if a.markdown:
        print("\n" + markdown(rows, settings, isolated=not a.quick), end="")
    return rows


#: the bench's names: the table and the command line here, the measuring of one case in :mod:`.bench_measure`
__all__ = [
    "main",
    "run",
    "make_cases",
    "skip_reason",
    "memory_reason",
    "case_facts",
    "prepare",
    "N_ABLATIONS",
    "BenchError",
    "InProcess",
    "RESULT_TAG",
    "best_time",
    "call_for",
    "equal_spans",
    "forward_backward",
    "measure",
    "peak_rss_kb",
    "rss_kb",
    "run_worker",
    "worker",
]


if __name__ == "__main__":
    main()
