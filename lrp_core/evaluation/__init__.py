"""Evaluation runner: every explanation method on the protocols of ``docs/METHODS.md`` §3.

Command line::

    python -m lrp_core.evaluation --model toy-vit --methods all --n 500 --out results/toy-vit.json
    python -m lrp_core.evaluation --model minilm-sentiment --methods all --out results/minilm.json

prints a method × metric table, writes ``{method: {metric: value}}`` as JSON
(``null`` where a metric does not apply; the extra row ``random`` is a
reference of seeded random maps, ``--no-baseline`` leaves it out), the run's
facts (curves, n, seed, clean accuracy, seconds, command) to
``<out>.meta.json`` and, for image models, a plot of the perturbation curves
next to it (``perturbation_<model>.png``).

On several processes (CPU cores, GPUs: one process per GPU)::

    torchrun --nproc_per_node 4 -m lrp_core.evaluation --model toy-vit --methods all \
        --samples 500 --device cuda --out results/toy-vit.json

writes the same files as one process (:mod:`.shards`: blocks of one batch,
spread over the ranks, gathered on rank 0); ``--resume`` continues a run that
was interrupted, from the finished blocks in ``<out>.partial/``. (Under
torchrun, write ``--samples`` or ``-n`` for ``--n``: torchrun's own parser takes
``--n`` for an abbreviation of its options.)

From a notebook::

    from lrp_core.evaluation import evaluate
    results = evaluate("toy-vit", methods=["rollout", "cdam"], n=32)

Image models (``kind == "image"``, :mod:`.images`)
    *Perturbation* (positive / negative, explaining the predicted and the true
    class) and *segmentation* on one-object scenes, *class sensitivity* on
    two-object scenes, *CDAM statistics* for ``cdam``. A model whose
    ``info["evaluation_data"]`` names built-in data (the toy ViT: ``"scenes"``,
    :func:`lrp_core.data.scene_sets` with held-out seeds, :data:`SCENE_SEED`,
    distinct from the training seeds) is evaluated on it; segmentation explains
    the predicted class.

Text models (``kind == "text"``, :mod:`.text`)
    Token-level rationale precision / recall / F1 at k = 10 … 80 on
    :func:`lrp_core.data.load_rationales`, explaining the true label, and
    ``token_f1@gold`` (k = the size of each human rationale), which stays
    informative on texts shorter than k words.

``--data PATH`` evaluates on your own data instead: the layouts are in
:mod:`lrp_core.data.folders` (:func:`load_data_folder`) and in ``--help``.

Modules: :mod:`.images` and :mod:`.text` (the protocols), :mod:`.batching`
(the engine calls they share), :mod:`.shards` (blocks, processes,
checkpoints), :mod:`.report` (tables, plots, JSON), :mod:`.run` (one whole
run), ``__main__`` (the command line).
"""

from ..data import SCENE_SEED, ImageSet, RationaleRecord, TextSet, load_data_folder, scene_sets
from .batching import TAM_BATCH
from .images import IMAGE_METRICS, evaluate_images, image_maps, predict, random_maps
from .report import SHORT, format_table, metric_value, plot_curves, write_run
from .run import evaluate, resolve_methods
from .text import evaluate_text, random_word_scores, text_accuracy, text_metric_names, text_word_scores

__all__ = [
    "evaluate",
    "evaluate_images",
    "evaluate_text",
    "resolve_methods",
    "image_maps",
    "predict",
    "random_maps",
    "IMAGE_METRICS",
    "text_word_scores",
    "text_accuracy",
    "random_word_scores",
    "text_metric_names",
    "format_table",
    "plot_curves",
    "write_run",
    "metric_value",
    "SHORT",
    "ImageSet",
    "TextSet",
    "RationaleRecord",
    "scene_sets",
    "load_data_folder",
    "SCENE_SEED",
    "TAM_BATCH",
]
