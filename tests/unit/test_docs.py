"""Every citation of the documentation resolves: ``docs/math.md T4`` names a file in docs/ and a label in it.

A citation is a path ``docs/<name>.md`` followed by section labels (``§2.5``, ``§10.3–10.4``, ``T4/T5``, ``T2(d)``,
``A5``) and optionally a quoted phrase (``§1 "K-atom regime"``, ``"θ semantics"``) that must occur in the cited
section (or anywhere in the file when no label precedes it). Labels are defined by the headings of the file and
by paragraphs that open with a bold label (``**T2(a) Dominant atom.**``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SCANNED = ["src", "tests", "bench", "docs", "README.md", "CONTRIBUTING.md", "CHANGELOG.md"]

LABEL = r"(?:§\d+(?:\.\d+)*|T\d+(?:\([a-f]\))?|A\d+)"
RANGE_END = r"(?:§?\d+(?:\.\d+)*|T\d+(?:\([a-f]\))?|A\d+)"
PHRASE = r'(?:,?\s+"[^"\n]+")'
CITATION = re.compile(
    rf"docs/(?P<file>[a-z][a-z0-9-]*)\.md`?"
    rf"(?P<labels>(?:{PHRASE}|(?:[ ,;]+(?:and\s+)?{LABEL}(?:\s*[–/-]\s*{RANGE_END})?{PHRASE}?))*)"
)
ITEM = re.compile(rf"(?P<label>{LABEL})(?:\s*[–/-]\s*(?P<end>{RANGE_END}))?(?:,?\s+\"(?P<phrase>[^\"\n]+)\")?")
LEADING_PHRASE = re.compile(r'^,?\s+"(?P<phrase>[^"\n]+)"')
HEADING = re.compile(r"^(?P<hashes>#+)\s+(?P<title>.+)$")
BOLD_LABEL = re.compile(rf"^\*\*(?P<label>{LABEL})")
# The names of the specification files this repository replaced; no citation may use them any more.
RETIRED = re.compile(r"\b(?:MATH|THETA_ALGORITHMS|DESIGN)\.md\b|\bTHETA_ALGORITHMS\b")


def scanned_files() -> list[Path]:
    files: list[Path] = []
    for entry in SCANNED:
        path = ROOT / entry
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.suffix in {".py", ".md"} and p.is_file())
    return [f for f in files if f.resolve() != Path(__file__).resolve()]


def _heading_level(line: str) -> int | None:
    heading = HEADING.match(line)
    return len(heading["hashes"]) if heading else None


def sections(doc: Path) -> dict[str, str]:
    """Label → text of the section it opens: a heading's up to the next heading of the same or a higher level, a
    bold-labelled paragraph's up to the next blank line or heading."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    found: dict[str, str] = {}
    for start, line in enumerate(lines):
        level = _heading_level(line)
        following = range(start + 1, len(lines))
        if level is not None:
            end = next((k for k in following if (_heading_level(lines[k]) or level + 1) <= level), len(lines))
            labels = re.findall(LABEL, HEADING.match(line)["title"])
        elif bold := BOLD_LABEL.match(line):
            end = next((k for k in following if not lines[k].strip() or _heading_level(lines[k])), len(lines))
            labels = [bold["label"]]
        else:
            continue
        for label in labels:
            found.setdefault(label, "\n".join(lines[start:end]))
    return found


def expand(label: str, end: str | None) -> list[str]:
    """The labels a range names: T4–T8 → T4 … T8; §2.6–2.9 → its two ends (subsections need not be contiguous)."""
    if end is None:
        return [label]
    kind = label[0]
    if not end.startswith(kind) and kind == "§":
        end = "§" + end
    if kind in "TA" and end[0] == kind and label[1:].isdigit() and end[1:].isdigit():
        return [f"{kind}{k}" for k in range(int(label[1:]), int(end[1:]) + 1)]
    return [label, end]


def citations() -> list[tuple[str, str, str, str | None]]:
    """(where, file, label or '', phrase) for every citation in the scanned files."""
    found = []
    for path in scanned_files():
        text = path.read_text(encoding="utf-8")
        for match in CITATION.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            where = f"{path.relative_to(ROOT)}:{line}"
            labels = match["labels"]
            if lead := LEADING_PHRASE.match(labels):
                found.append((where, match["file"], "", lead["phrase"]))
            items = list(ITEM.finditer(labels))
            if not items and not lead:
                found.append((where, match["file"], "", None))
            for item in items:
                for label in expand(item["label"], item["end"]):
                    found.append((where, match["file"], label, item["phrase"]))
    return found


def unresolved(cited: list[tuple[str, str, str, str | None]]) -> list[str]:
    problems = []
    cache: dict[str, dict[str, str] | None] = {}
    for where, name, label, phrase in cited:
        doc = DOCS / f"{name}.md"
        if name not in cache:
            cache[name] = sections(doc) if doc.is_file() else None
        labels = cache[name]
        if labels is None:
            problems.append(f"{where}: docs/{name}.md does not exist")
            continue
        if label and label not in labels:
            problems.append(f"{where}: docs/{name}.md has no section {label}")
            continue
        scope = labels[label] if label else doc.read_text(encoding="utf-8")
        if phrase and phrase.casefold() not in scope.casefold():
            problems.append(f'{where}: "{phrase}" is not in docs/{name}.md {label or ""}'.rstrip())
    return problems


def test_every_citation_resolves() -> None:
    cited = citations()
    assert len(cited) > 150, "the citation pattern no longer finds the code's citations"
    assert unresolved(cited) == []


def test_no_citation_uses_a_retired_file_name() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in scanned_files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if RETIRED.search(line)
    ]
    assert offenders == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("see docs/math.md T99", "has no section T99"),
        ("see docs/math.md §2.5–2.77", "has no section §2.77"),
        ('see docs/theta-algorithms.md §3 "no such phrase"', '"no such phrase" is not in'),
        ("see docs/nowhere.md §1", "does not exist"),
    ],
)
def test_a_broken_citation_is_reported(tmp_path: Path, text: str, problem: str, monkeypatch) -> None:
    source = tmp_path / "src" / "module.py"
    source.parent.mkdir()
    source.write_text(f'"""{text}."""\n', encoding="utf-8")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    monkeypatch.setattr(f"{__name__}.SCANNED", ["src"])
    problems = unresolved(citations())
    assert len(problems) == 1 and problem in problems[0]


def test_ranges_and_bold_labels_resolve() -> None:
    assert expand("T4", "T8") == ["T4", "T5", "T6", "T7", "T8"]
    assert expand("§2.6", "2.9") == ["§2.6", "§2.9"]
    labels = sections(DOCS / "math.md")
    assert {"§2.3", "T1", "T2", "T2(a)", "T2(f)", "A5", "§10.3", "§11"} <= labels.keys()


def test_relative_links_in_the_documentation_resolve() -> None:
    link = re.compile(r"\]\((?!https?:|#)(?P<target>[^)#\s]+)")
    broken = [
        f"{path.relative_to(ROOT)}: {m['target']}"
        for path in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted(DOCS.glob("*.md"))]
        if path.is_file()
        for m in link.finditer(path.read_text(encoding="utf-8"))
        if not (path.parent / m["target"]).exists()
    ]
    assert broken == []
