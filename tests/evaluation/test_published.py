"""The package's copies of the published tables are docs/results' tables, and the course reads them there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lrp_core.errors import UnknownNameError
from lrp_core.evaluation.published import ASSETS, PUBLISHED, bundle, published, write

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


@pytest.mark.parametrize("name", PUBLISHED)
def test_the_package_copy_is_the_published_table(name):
    assert json.loads((ASSETS / f"{name}.json").read_text()) == bundle(RESULTS, name), (
        f"run `python -m lrp_core.evaluation.published docs/results` after a new {name} run"
    )


def test_a_published_run_carries_its_table_and_facts():
    run = published("toy-vit")
    meta = json.loads((RESULTS / "toy-vit.meta.json").read_text())
    assert run.results == json.loads((RESULTS / "toy-vit.json").read_text())
    assert (run.n, run.accuracy, run.command) == (meta["n"], meta["accuracy"], meta["command"])
    with pytest.raises(UnknownNameError, match="published: toy-vit"):
        published("imagenet")


def test_write_copies_every_run(tmp_path):
    written = write(RESULTS, tmp_path)
    assert sorted(p.name for p in written) == sorted(f"{n}.json" for n in PUBLISHED)
    assert all(json.loads(p.read_text()) == json.loads((ASSETS / p.name).read_text()) for p in written)
