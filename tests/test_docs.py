"""Every documentation page the code cites exists in the repository, and so does every section it
cites (``docs/theory.md §2``); nothing cites a file that is not in the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [p for d in ("accountant", "mechanisms", "policies", "examples", "benchmarks", "tests")
           for p in sorted((ROOT / d).rglob("*.py"))] + [ROOT / "README.md",
                                                        *sorted((ROOT / "docs").glob("*.md"))]
CITATION = re.compile(r"docs/([a-z-]+\.md)(?:`?\s*§\s*([0-9]+[a-z]?))?")


def _citations() -> list[tuple[str, str, str | None]]:
    found = []
    for path in SOURCES:
        for page, section in CITATION.findall(path.read_text(encoding="utf-8")):
            found.append((str(path.relative_to(ROOT)), page, section or None))
    return found


def test_the_code_cites_the_docs() -> None:
    assert len(_citations()) >= 10  # the test has something to check


@pytest.mark.parametrize("where, page, section", _citations())
def test_cited_page_and_section_exist(where: str, page: str, section: str | None) -> None:
    doc = ROOT / "docs" / page
    assert doc.is_file(), f"{where} cites docs/{page}, which is not in the repository"
    if section is not None:
        headings = re.findall(r"^## ([0-9]+[a-z]?)\.", doc.read_text(encoding="utf-8"), re.M)
        assert section in headings, f"{where} cites docs/{page} §{section}, which has no such section"


def test_nothing_cites_files_outside_the_repository() -> None:
    outside = re.compile(r"\b(THEORY|ARCHITECTURE|STYLE)\.md\b|\.\./shared")
    offenders = [str(p.relative_to(ROOT)) for p in SOURCES
                 if p.name != "test_docs.py" and outside.search(p.read_text(encoding="utf-8"))]
    assert offenders == []


def test_relative_links_between_pages_resolve() -> None:
    for page in (ROOT / "docs").glob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).resolve().exists(), f"{page.name} links {target}"
