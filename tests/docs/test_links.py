"""Every reference from one of lmpo's texts to a doc and its section resolves.

Checked in README.md, CONTRIBUTING.md, SECURITY.md, docs/*.md, the examples and src/ (docstrings and comments):

- a relative markdown link ``[text](x.md#anchor)`` names an existing file and, with ``#anchor``, a heading whose
  GitHub anchor that is (or an ``<a id>`` in the file);
- a plain ``docs/x.md#anchor`` names an existing doc and one of its anchors;
- a section cited by name, ``docs/x.md, "Section"`` (lmpo's way of citing a section in prose), names a heading of
  that doc (its text without markdown, or its short title: the part before its first ``:``, `` (`` or `` — ``)
  or a paragraph's bold lead-in (``**Multi-turn tasks.**``);
- in a doc, a section of the same doc cited as ``see "Section"``, ``below ("Section")`` or ``above ("Section")``
  is one of its sections.
"""

from __future__ import annotations

import re
import unicodedata
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKDOWN = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "SECURITY.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted((ROOT / "examples").rglob("*.md"))]
SOURCES = [*sorted((ROOT / "src").rglob("*.py")), *sorted((ROOT / "examples").rglob("*.py"))]

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PLAIN = re.compile(r"(?<![\w/.(])(docs/[\w.-]+\.md)#([\w-]+)")
CITED = re.compile(r"(docs/[\w.-]+\.md),\s+\"([^\"]+)\"")
SAME_DOC = re.compile(r"\b(?:[Ss]ee|below|above) \(?\"([^\"]+)\"")


def _text_of_heading(line: str) -> str:
    """A heading's text as shown: links become their text, markup characters are dropped."""
    text = line.lstrip("#").strip()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "").strip()


def github_anchor(heading_text: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (letters, digits, ``-`` and ``_`` stay),
    spaces become ``-``."""
    out = []
    for ch in heading_text.lower():
        if ch == " ":
            out.append("-")
        elif ch in "-_" or unicodedata.category(ch)[0] in "LN":
            out.append(ch)
    return "".join(out)


@cache
def headings(path: Path) -> tuple[set[str], set[str]]:
    """(anchors, heading texts) of a markdown file; code blocks are skipped, repeated anchors get ``-1``, ``-2``…
    as on GitHub, and ``<a id="…">`` / ``<a name="…">`` count as anchors."""
    anchors: set[str] = set()
    texts: set[str] = set()
    seen: dict[str, int] = {}
    fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
            continue
        if fence:
            continue
        anchors.update(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", line))
        texts.update(re.findall(r"^(?:[-*] )?\*\*([^*]+?)\.\*\*", line.strip()))
        if re.match(r"#{1,6} ", line):
            text = _text_of_heading(line)
            texts.add(text)
            texts.add(re.split(r":| \(| — ", text)[0].strip())
            anchor = github_anchor(text)
            n = seen.get(anchor, 0)
            seen[anchor] = n + 1
            anchors.add(anchor if n == 0 else f"{anchor}-{n}")
    return anchors, texts


def _prose(path: Path) -> str:
    """The file's text with line breaks (and a comment's ``#``) joined into spaces, so that a citation wrapped
    over two lines reads as one."""
    text = path.read_text(encoding="utf-8")
    return re.sub(r"[ \t]*\n[ \t]*(?:#[ \t]*)?", " ", text) if path.suffix == ".py" else re.sub(r"\s*\n\s*", " ", text)


def _problems_in(path: Path) -> list[str]:
    problems = []
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            doc = (path.parent / file).resolve() if file else path
            if not doc.exists():
                problems.append(f"link ({target}): no file {doc.relative_to(ROOT) if ROOT in doc.parents else doc}")
            elif anchor and doc.suffix == ".md" and anchor not in headings(doc)[0]:
                problems.append(f"link ({target}): {doc.name} has no heading with the anchor #{anchor}")
    for file, anchor in PLAIN.findall(text):
        doc = ROOT / file
        if not doc.is_file():
            problems.append(f"{file}#{anchor}: no such doc")
        elif anchor not in headings(doc)[0]:
            problems.append(f"{file}#{anchor}: {file} has no heading with that anchor")
    for file, section in CITED.findall(_prose(path)):
        doc = ROOT / file
        if not doc.is_file():
            problems.append(f'{file}, "{section}": no such doc')
        elif section not in headings(doc)[1]:
            problems.append(f'{file}, "{section}": {file} has no section of that name')
    if path.suffix == ".md":
        problems += [f'"{section}": this doc has no section of that name' for section in SAME_DOC.findall(_prose(path))
                     if section not in headings(path)[1]]
    return problems


def test_every_doc_link_and_cited_section_resolves():
    problems = [f"{path.relative_to(ROOT)}: {problem}" for path in MARKDOWN + SOURCES for problem in _problems_in(path)]
    assert not problems, "\n".join(problems)


def test_the_checks_catch_a_missing_section(tmp_path):
    """The checks fail on what they are there to catch (an anchor, a file and a cited section that are not
    there), and pass GitHub's anchor of a heading with punctuation and code."""
    assert github_anchor(_text_of_heading("### Measured: RL on the tool task (CPU)")) == \
        "measured-rl-on-the-tool-task-cpu"
    assert github_anchor(_text_of_heading("### `budget` — Limits the driver enforces")) == \
        "budget--limits-the-driver-enforces"
    page = tmp_path / "page.md"
    page.write_text('# Title\n\n## Results (v2)\n\n[ok](#results-v2) [bad](#results-v3) [gone](nothing.md)\n'
                    'docs/trainer.md#no-such-section and (docs/multiturn.md, "Learning to call the tool")\n'
                    'see "Results (v2)" and see "Results (v3)"\n')
    problems = " | ".join(_problems_in(page))
    assert "#results-v3" in problems and "#results-v2" not in problems
    assert "nothing.md" in problems and "no-such-section" in problems and "Learning to call the tool" in problems
    assert '"Results (v3)"' in problems and '"Results (v2)"' not in problems
