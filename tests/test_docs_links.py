"""The README's and docs/' relative links reach a file that exists and,
where they name a section, a heading of that file (GitHub's anchors). A
renamed heading left docs/hash_table.md pointing at no section."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path):
    seen, anchors = {}, set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"#{1,6} (.*)", line)
        if not m:
            continue
        base = _anchor(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        anchors.add(base if n == 0 else f"{base}-{n}")
    return anchors


def _relative_links(path):
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if not re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            yield target


def test_the_anchor_rule_matches_githubs():
    assert _anchor("The `table` suite") == "the-table-suite"
    assert _anchor("Distributed training and serving") == "distributed-training-and-serving"
    assert _anchor("StringEmbedding: one op, one copy") == "stringembedding-one-op-one-copy"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_a_file_and_a_heading(doc):
    broken = []
    for target in _relative_links(doc):
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    assert not broken, f"{doc.name}: " + "; ".join(broken)
