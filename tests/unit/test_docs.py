"""The docs as a reader meets them: every relative link of the README and of docs/ leads to a file (and an
anchor to a heading of it), and the README stays a page that starts a reader, the rest living in docs/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as dashes."""
    out = set()
    for heading in re.findall(r"^#+\s+(.+?)\s*$", page.read_text(), re.M):
        text = re.sub(r"[`*]", "", heading).strip().lower()
        out.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return out


def _code_free(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


def test_every_relative_link_leads_somewhere():
    broken = []
    for page in PAGES:
        for target in LINK.findall(_code_free(page.read_text())):
            if re.match(r"^[a-z]+://|^mailto:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading in {dest.name})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readme_starts_a_reader_and_docs_holds_the_rest():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300, "README.md is for starting: move the rest to docs/"
    assert "make run" in readme and "make test" in readme
    for page in ("contracts", "training", "operations", "development", "config"):
        assert (REPO / "docs" / f"{page}.md").is_file()
        assert f"docs/{page}.md" in readme, f"the README does not lead to docs/{page}.md"
