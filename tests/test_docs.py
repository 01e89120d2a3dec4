"""The documentation holds together: every relative link of README.md and docs/*.md points at a
file that exists and, when it names an anchor, at a heading of that file (GitHub's anchors);
the README stays a landing page (at most 250 lines, Install and the two quick starts within
its first screen) and keeps the markers a tool regenerates the benchmark tables between.

Pure text: no build needed."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
FILES = [README, *DOCS]

README_MAX_LINES = 250
FIRST_SCREEN = 60  # lines within which Install and the two quick starts must start

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target) or ![alt](target), with an optional "title"; text may hold one level of [...]
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def prose_lines(text):
    """(line number, line) of `text` outside fenced code blocks, inline code spans blanked."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)[0] * len(match.group(1))
            continue
        if fence is not None:
            if line.strip().startswith(fence) and set(line.strip()) <= set(fence[0]):
                fence = None
            continue
        yield number, INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)


def headings(text):
    """[(line number, level, heading text)] of `text`'s ATX headings outside code blocks (inline
    code kept: it is part of the heading's text, and of its anchor)."""
    lines = text.splitlines()
    found = []
    for number, _ in prose_lines(text):
        match = HEADING.match(lines[number - 1])
        if match:
            found.append((number, len(match.group(1)), match.group(2)))
    return found


def slug(heading):
    """GitHub's anchor of a heading: its text as rendered (links to their text, emphasis and
    code marks dropped), lowercased, every character that is not a letter, digit, underscore,
    hyphen or space removed, and each space made a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = "".join(c for c in text if c.isalnum() or c in "_- ")
    return text.replace(" ", "-")


def anchors(path):
    """Every anchor of `path`'s headings, duplicates numbered as GitHub numbers them (the
    second "x" is "x-1", the third "x-2")."""
    seen, result = {}, set()
    for _, _, heading in headings(path.read_text()):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def links(path):
    """[(line number, target)] of the relative links of `path` (external ones left out)."""
    found = []
    for number, line in prose_lines(path.read_text()):
        for match in LINK.finditer(line):
            target = match.group(1)
            if not EXTERNAL.match(target):
                found.append((number, target))
    return found


def broken_links(path):
    problems = []
    for number, target in links(path):
        file_part, _, anchor = target.partition("#")
        where = f"{path.relative_to(REPO)}:{number}: [..]({target})"
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            problems.append(f"{where}: {file_part} does not exist")
            continue
        if anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            near = sorted(a for a in anchors(linked) if a[:6] == anchor[:6])
            problems.append(f"{where}: no heading of {linked.relative_to(REPO)} has the anchor "
                            f"#{anchor}" + (f" (similar: {', '.join(near)})" if near else ""))
    return problems


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(REPO)) for p in FILES])
def test_relative_links_resolve(path):
    """Every relative link of the file names an existing file, and its #anchor, if any, a
    heading of that file (of this one for a bare #anchor)."""
    problems = broken_links(path)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_readme_is_a_landing_page():
    """At most README_MAX_LINES lines; the Install, GPU quick start and CPU quick start
    headings, in that order, within the first FIRST_SCREEN lines."""
    text = README.read_text()
    count = len(text.splitlines())
    assert count <= README_MAX_LINES, \
        f"README.md has {count} lines, more than {README_MAX_LINES}: move detail into docs/"
    early = [(number, heading.lower()) for number, _, heading in headings(text)
             if number <= FIRST_SCREEN]
    wanted = {"Install": lambda h: "install" in h,
              "GPU quick start": lambda h: "gpu" in h and "quick start" in h,
              "CPU quick start": lambda h: "cpu" in h and "quick start" in h}
    where = {}
    for name, matches in wanted.items():
        lines = [number for number, heading in early if matches(heading)]
        assert lines, f"README.md: no {name} heading within its first {FIRST_SCREEN} lines " \
                      f"(its headings there: {[h for _, h in early]})"
        where[name] = lines[0]
    assert list(where.values()) == sorted(where.values()), \
        f"README.md: Install, GPU quick start and CPU quick start out of order: {where}"


@pytest.mark.parametrize("path, marker", [(README, "bench:summary"),
                                          (REPO / "docs" / "benchmark.md", "bench:full")],
                         ids=["README.md", "docs/benchmark.md"])
def test_bench_markers(path, marker):
    """The lines a tool regenerates the benchmark tables between: each marker exactly once, on
    a line of its own, begin before end."""
    lines = path.read_text().splitlines()
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    for tag in (begin, end):
        count = sum(line.strip() == tag for line in lines)
        assert count == 1, f"{path.relative_to(REPO)}: {tag} on {count} lines, not 1"
    stripped = [line.strip() for line in lines]
    assert stripped.index(begin) < stripped.index(end), \
        f"{path.relative_to(REPO)}: {end} before {begin}"


def test_slugs_follow_github():
    """The anchor rule on headings of the kinds these pages have."""
    assert slug("Codec speed: `qnccl codec-bench`") == "codec-speed-qnccl-codec-bench"
    assert slug("Hierarchical (`QNCCL_ALGO=hier`; src/engine/hierarchical.cc)") == \
        "hierarchical-qnccl_algohier-srcenginehierarchicalcc"
    assert slug("Measured: beside PyTorch's hooks") == "measured-beside-pytorchs-hooks"
    assert slug("Using the package from C and C++") == "using-the-package-from-c-and-c"
    assert slug("A **bold** [link](x.md) - here") == "a-bold-link---here"
