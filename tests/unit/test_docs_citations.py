"""The code cites the contract where it lives: a docs page, at a heading that exists.

Comments and docstrings say why with citations such as ``(docs/guarantees.md#5-crash-resume)``;
a renamed heading or a moved page would leave them pointing nowhere, and nothing else would
notice.  And no citation of a specification outside the repository comes back."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Not a path inside a string: a test's workspace has files such as "docs/guide.md".
CITATION = re.compile(r"(?<![\"'/\w])docs/([a-z0-9_-]+\.md)(?:#([a-z0-9_-]+))?")
OUTSIDE_SPEC = re.compile(r"\bSPEC\s*§")


def _tracked(*suffixes: str) -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return [REPO / name for name in listed if name.endswith(suffixes)]


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as
    hyphens."""
    anchors = set()
    for line in page.read_text("utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
            anchors.add(slug)
    return anchors


def test_every_docs_citation_in_the_code_names_a_page_and_a_heading_that_exist() -> None:
    broken = []
    for path in _tracked(".py", ".js", ".toml"):
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            for page_name, anchor in CITATION.findall(line):
                page = REPO / "docs" / page_name
                where = f"{path.relative_to(REPO)}:{number}: docs/{page_name}"
                if not page.is_file():
                    broken.append(f"{where} (no such page)")
                elif anchor and anchor not in _anchors(page):
                    broken.append(f"{where}#{anchor} (no such heading)")
    assert not broken, "\n".join(broken)


def test_nothing_cites_a_specification_outside_the_repository() -> None:
    cited = [
        f"{path.relative_to(REPO)}:{number}"
        for path in _tracked(".py", ".js", ".md", ".toml")
        if path.name != Path(__file__).name
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1)
        if OUTSIDE_SPEC.search(line)
    ]
    assert not cited, cited
