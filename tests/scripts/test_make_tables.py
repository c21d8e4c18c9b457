"""The docs' generated tables and counts are the ones scripts/make_tables.py writes from the registry."""

from __future__ import annotations

from pathlib import Path

from by_path import module_from_path

ROOT = Path(__file__).resolve().parents[2]
TABLES = module_from_path("make_tables", ROOT / "scripts" / "make_tables.py")


def test_every_page_holds_its_generated_parts_as_generated():
    for rel in TABLES.PAGES:
        text = (ROOT / rel).read_text(encoding="utf-8")
        assert TABLES.MARKED.search(text), f"{rel} has no generated part"
        assert TABLES.render(text) == text, f"{rel}: run python scripts/make_tables.py"


def test_a_stale_count_and_table_are_rewritten():
    from lrp_core.adapters import ADAPTERS
    from lrp_core.methods import registry

    text = "(<!-- tables:adapter-count -->29<!-- /tables:adapter-count --> entries)"
    assert (
        TABLES.render(text) == f"(<!-- tables:adapter-count -->{len(ADAPTERS)}<!-- /tables:adapter-count --> entries)"
    )
    table = TABLES.render("<!-- tables:methods-by-kind --><!-- /tables:methods-by-kind -->")
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == list(registry.METHOD_NAMES)
    pa_lrp = rows[registry.METHOD_NAMES.index("pa_lrp")].split("|")[2:-1]
    assert [c.strip() for c in pa_lrp] == ["✓", "✓", "refused", "refused"]  # VLMs and Swin refuse it
