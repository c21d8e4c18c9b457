"""The release files agree with the package: licence, version, changelog."""

from __future__ import annotations

from pathlib import Path

import tomllib
import yaml

import lrp_core

ROOT = Path(__file__).resolve().parents[2]


def test_licence_version_and_citation_agree():
    """pyproject, ``lrp_core.__version__`` and CITATION.cff name one version; all three say MIT, as LICENSE is."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert project["version"] == lrp_core.__version__ == cff["version"]
    assert project["license"] == {"text": "MIT"} and cff["license"] == "MIT"
    assert (cff["cff-version"], cff["type"], cff["title"]) == ("1.2.0", "software", "Transformer Relevance Lab")
    assert all(set(a) == {"name"} for a in cff["authors"])  # an entity, not invented persons
    licence = (ROOT / "LICENSE").read_text().splitlines()
    assert licence[0] == "MIT License" and licence[2] == "Copyright (c) 2026 the Transformer Relevance Lab authors"


def test_changelog_has_an_unreleased_section():
    """Keep a Changelog: a title, then the unreleased changes first."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert text.startswith("# Changelog\n") and headings[0] == "## [Unreleased]"
