"""Every relative link in the project's pages reaches a file, and every #anchor a heading of it (GitHub's slugs);
the benchmarks overview stays one screen. Fast: reads files only, no network."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md",
         *sorted((ROOT / "benchmarks" / "results").glob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\".*\")?\s*$")
CODE_SPAN = re.compile(r"(`+)(?:.(?!\1))*?.?\1")


def prose_lines(text):
    """The page's lines outside fenced code blocks, with inline code spans blanked (links there are not links)."""
    inside = False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield CODE_SPAN.sub("", line)


def slug(heading):
    """GitHub's anchor for a heading: its text without markup, lower-cased, punctuation but - and _ dropped,
    spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays, its target goes
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page):
    """Every anchor GitHub gives the page's headings, repeats numbered -1, -2, ... as GitHub does."""
    seen, found = {}, set()
    inside = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        match = None if inside else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page):
    """The page's link targets, inline and reference-style, outside code."""
    for line in prose_lines(page.read_text()):
        yield from LINK.findall(line)
        ref = REFERENCE.match(line)
        if ref:
            yield ref.group(1)


def broken_links(page):
    """Each relative link of the page whose file, or whose #anchor, does not exist."""
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...: not checked (no network)
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor.lower() not in anchors(file):
            broken.append(f"{target}: no heading with that anchor in {file.relative_to(ROOT)}")
    return broken


def test_the_slug_is_githubs():
    assert slug("GPU rows: running them on a lent GPU machine (`device_kit.sh`)") == \
        "gpu-rows-running-them-on-a-lent-gpu-machine-device_kitsh"
    assert slug("CQL's backup, with and without the entropy term") == "cqls-backup-with-and-without-the-entropy-term"
    assert slug("Beside RLlib 2.60 on the [same](x.md) fake nodes") == "beside-rllib-260-on-the-same-fake-nodes"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_and_anchor_resolves(page):
    assert broken_links(page) == []


def test_the_benchmarks_overview_fits_one_screen_and_links_every_results_page():
    overview = ROOT / "benchmarks" / "README.md"
    assert len(overview.read_text().splitlines()) <= 150
    linked = {(overview.parent / t.partition("#")[0]).resolve() for t in links(overview)}
    for page in (ROOT / "benchmarks" / "results").glob("*.md"):
        assert page.resolve() in linked, f"{page.name} is not linked from benchmarks/README.md"
