"""The README and the guides in docs/: every relative link and image names a file that exists, and every
anchor (``#section``) names a heading that the target file has, as GitHub makes anchors from headings. The
README stays a five-minute read that starts with the two commands."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import ROOT

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target), the target up to whitespace or the closing parenthesis; an optional title.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`[^`]*`")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each line outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: the text as rendered (code marks and link targets dropped),
    lower case, every character that is not a letter, digit, underscore, hyphen or space removed, spaces
    made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in "_- ")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor the headings of ``path`` produce; a repeated one gets -1, -2 ... as on GitHub."""
    seen: dict[str, int] = {}
    result = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def broken_links(path: Path) -> list[str]:
    """One line per link or image of ``path`` that does not resolve: ``file:line: target (why)``."""
    problems = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto: ...
                continue
            where, _, anchor = target.partition("#")
            file = (path.parent / where).resolve() if where else path
            name = f"{path.relative_to(ROOT)}:{number}: {target}"
            if not file.exists():
                problems.append(f"{name} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                problems.append(f"{name} (no heading in {file.name} makes #{anchor})")
    return problems


def test_every_link_and_image_in_the_readme_and_docs_resolves():
    problems = [problem for path in markdown_files() for problem in broken_links(path)]
    assert not problems, "\n".join(problems)


def test_every_image_in_docs_img_is_shown_by_the_readme_or_a_guide():
    """A screenshot ``make screenshots`` no longer makes is not left behind, out of date."""
    shown = {(path.parent / target).resolve() for path in markdown_files()
             for _, line in prose_lines(path.read_text(encoding="utf-8"))
             for target in LINK.findall(INLINE_CODE.sub("", line))}
    unshown = [p.name for p in sorted((ROOT / "docs" / "img").glob("*.png")) if p.resolve() not in shown]
    assert not unshown, f"images in docs/img that no page shows: {unshown}"


def test_the_readme_links_every_guide_in_docs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {target.partition("#")[0] for target in LINK.findall(readme)}
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"docs/{p.name}" not in linked]
    assert not missing, f"guides the README does not link: {missing}"


def test_the_readme_is_read_in_five_minutes_and_starts_with_the_two_commands():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; keep it to 250 and move the rest to docs/"
    opening = next(index for index, line in enumerate(lines) if line.startswith("```"))
    first_block = lines[opening + 1:]
    first_block = first_block[:first_block.index("```")]
    assert [line.removeprefix("$ ").split()[:2] for line in first_block] == [["make", "run"], ["make", "test"]]


def test_github_anchors_are_made_as_github_makes_them():
    assert slug("The first GPU: `make gpu-check`") == "the-first-gpu-make-gpu-check"
    assert slug("10. Watch cost") == "10-watch-cost"
    assert slug("The test suite's time") == "the-test-suites-time"
    assert slug("Will it fit? Estimate memory before launching") == "will-it-fit-estimate-memory-before-launching"
    assert slug("A folder with `train/` and `val/`") == "a-folder-with-train-and-val"
    assert slug("Series cost (step points, system samples, energy)") == "series-cost-step-points-system-samples-energy"


def test_a_missing_file_or_heading_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr("tests.project.test_docs_links.ROOT", tmp_path)
    (tmp_path / "other.md").write_text("# Other\n\n## Same\n\n## Same\n\n```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#same-1) [ok](#page) ![gone](img/gone.png) [bad](other.md#not-a-heading)\n"
        "[bad](other.md#same-2) `[code](nowhere.md)` [web](https://example.org/x.md)\n"
        "```\n[fenced](nowhere.md)\n```\n"
    )
    assert broken_links(page) == [
        "page.md:3: img/gone.png (no such file)",
        "page.md:3: other.md#not-a-heading (no heading in other.md makes #not-a-heading)",
        "page.md:4: other.md#same-2 (no heading in other.md makes #same-2)",
    ]
