"""Every relative link in README.md and docs/*.md resolves: the file (or folder) exists inside
the repository, and a `#anchor` names a heading of the target page (GitHub's heading ids).

Links inside fenced code blocks and inline code are not links; absolute URLs (`https:`,
`mailto:`) are not checked (no network here). The checker is tested on pages made to fail,
so a pass over the real pages means something.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 250
THE_TWO_COMMANDS = ("uv run tfl launch jobs/mnist.py --cluster cluster.example.json", "uv run pytest")

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ID = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:|^//")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code spans blanked."""
    lines: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        match = _FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)[0] * len(match.group(1))
            continue
        if fence is not None:
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
            continue
        lines.append((number, line))
    return lines


def github_slug(heading: str) -> str:
    """GitHub's id for a heading: markdown removed, lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every id a page's headings get (a repeated heading gets -1, -2, ...), plus explicit <a id>."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in _prose_lines(text):
        heading = _HEADING.match(line)
        if heading:
            slug = github_slug(heading.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
        found.update(_HTML_ID.findall(line))
    return found


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every markdown link outside code."""
    found: list[tuple[int, str]] = []
    for number, line in _prose_lines(text):
        line = _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        found.extend((number, target) for target in _LINK.findall(line))
    return found


def broken_links(root: Path, pages: list[Path]) -> tuple[list[str], int]:
    """The problems of every relative link in `pages` (one line each), and how many were checked."""
    root = root.resolve()
    problems: list[str] = []
    checked = 0
    for page in pages:
        for number, target in links(page.read_text(encoding="utf-8")):
            if _SCHEME.match(target):
                continue
            checked += 1
            where = f"{page.relative_to(root)}:{number}: link {target!r}"
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / unquote(path_part)).resolve() if path_part else page.resolve()
            if dest != root and root not in dest.parents:
                problems.append(f"{where} leaves the repository")
            elif not dest.exists():
                problems.append(f"{where}: no such file {dest.relative_to(root)}")
            elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest.read_text(encoding="utf-8")):
                problems.append(f"{where}: {dest.relative_to(root)} has no heading with id #{anchor}")
    return problems, checked


def doc_pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def test_every_relative_link_in_readme_and_docs_resolves() -> None:
    pages = doc_pages(ROOT)
    problems, checked = broken_links(ROOT, pages)
    assert problems == []
    # The README links to its pages: a checker that found no links would pass for nothing.
    assert checked >= len(pages)


def test_the_readme_is_a_front_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_MAX_LINES
    for command in THE_TWO_COMMANDS:
        assert f"\n{command}\n" in readme, command


def test_broken_links_are_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# A page\n\n## Two words: `code` here\n\n## A page\n", encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "\n".join(
            [
                "# Front",
                "[ok](docs/page.md) [ok](docs/page.md#two-words-code-here) [ok](docs/page.md#a-page-1)",
                "[ok](#front) [ok](docs/) [web](https://example.com/nothing) `[code](missing.md)`",
                "[gone](docs/missing.md)",
                "[bad anchor](docs/page.md#no-such-heading)",
                "[bad local anchor](#nowhere)",
                "[outside](../elsewhere.md)",
                "```",
                "[in a fence](fenced-missing.md)",
                "```",
            ]
        ),
        encoding="utf-8",
    )
    problems, checked = broken_links(tmp_path, doc_pages(tmp_path))
    assert checked == 9
    assert problems == [
        "README.md:4: link 'docs/missing.md': no such file docs/missing.md",
        "README.md:5: link 'docs/page.md#no-such-heading': docs/page.md has no heading with id #no-such-heading",
        "README.md:6: link '#nowhere': README.md has no heading with id #nowhere",
        "README.md:7: link '../elsewhere.md' leaves the repository",
    ]


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Kubernetes: `tfl export k8s`", "kubernetes-tfl-export-k8s"),
        ("Elastic runs (`--min-tasks`) on Kubernetes", "elastic-runs---min-tasks-on-kubernetes"),
        ("Preemption: the notice, the agreed checkpoint, the retry", "preemption-the-notice-the-agreed-checkpoint-the-retry"),
        ("1. An image with TensorFlow, tfl and the job", "1-an-image-with-tensorflow-tfl-and-the-job"),
        ("`jobs/mnist.py`", "jobsmnistpy"),
        ("See [the page](x.md) now", "see-the-page-now"),
    ],
)
def test_github_slug(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug
