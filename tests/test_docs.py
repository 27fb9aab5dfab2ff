"""No comment, docstring, page or config cites a file that is not in the repository.

Scanned (CHECKED_SUFFIXES, CHECKED_NAMES): Markdown, YAML, TOML, shell, the Makefile and .ci/run
whole; of Python files their comments and docstrings only, since a string in code is data (a
substring to match, a message) and a wrong path there fails its own tests. A citation is found by
three rules, each kept narrow so that what it finds is meant as a repository path:

- a repo-relative path: a word with at least one '/' whose first part is a top-level name of the
  repository (`docs/design.md`, `model/train.py`, `launcher/`, `.ci/run`), or whose last part is an
  upper-case Markdown name (a README.md in a directory of another repository). Not preceded by '/',
  '.', '~', '$', '-' or a word character, so paths on a node (/opt/venv, ~/nanocluster/runs,
  "$HOME"/nanocluster/code) and the tail of a longer path are not read as ours. A path relative to
  another directory (`launch/plan.py` inside launcher/, `../README.md`) is not checked by this rule;
- a bare upper-case Markdown name (`README.md`): found in the repository root or in the citing
  file's own directory;
- a Markdown link target `[text](target)` in a .md file, resolved from that file's directory.

Not citations: URLs (removed first), and words holding a pattern or placeholder (`*`, `?`, `<run>`,
`{root}`, `$HOME`, or an upper-case word such as PROFILE in `node/requirements-PROFILE.txt`), which
name a family of files or files made at run time. A cited path exists when it is a listed file or a
directory holding one; trailing sentence punctuation and '...' are dropped.

The repository is what git lists: tracked files plus new files not ignored, so a page being written
counts before its first commit and a build output never does.

A section of a Markdown page is cited as `page.md#anchor` (in any line of a checked file, a
message in Python code included, since an operator reads it), as a link `[text](#anchor)` inside a
page, or by its heading, `page.md, "Heading"` (or `README, "Heading"`). The page must exist (from
the repository root or the citing file's directory) and have that anchor: the ids mkdocs gives its
headings, computed by Python-Markdown with mkdocs.yml's extensions (toc's default slugify:
lowercase, punctuation removed, spaces to hyphens; a repeated heading gets _1, _2).
"""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import markdown
import yaml
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parent.parent

CHECKED_SUFFIXES = (".py", ".md", ".yml", ".yaml", ".toml", ".sh")
CHECKED_NAMES = ("Makefile", ".ci/run")

URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")
PATH_WORD = re.compile(r"(?<![\w/.~$-])[\w.*?<>{}$/-]*/[\w.*?<>{}$/-]*")
"""A run of path characters holding a '/'; pattern characters are in the run so it can be left out whole."""
PATTERN_CHARS = set("*?<>{}$")
PLACEHOLDER = re.compile(r"(?<![A-Za-z])[A-Z]{2,}(?![A-Za-z])")
BARE_MD = re.compile(r"(?<![\w/.~$-])[A-Z][A-Z0-9_-]*\.md\b")
MD_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


@dataclass(frozen=True)
class Citation:
    file: str
    line: int
    cited: str
    """The path as written (a link: as it resolves from the repository root)."""
    candidates: tuple[str, ...]
    """Where it may be, from the repository root: it exists when one of these does."""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.cited}"


def listed_files(root: Path) -> list[str]:
    """The repository's files as git lists them: tracked, and new ones not ignored."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted(set(out.stdout.splitlines()))


def is_checked(path: str) -> bool:
    return path.endswith(CHECKED_SUFFIXES) or path in CHECKED_NAMES or Path(path).name == "Makefile"


def _clean(word: str) -> str:
    return word.rstrip(".,;:'\"`)")


def prose_lines(path: str, text: str) -> Iterable[tuple[int, str]]:
    """(line number, text) of what is read for citations: a Python file's comments and docstrings
    (every string standing alone as a statement), any other file whole."""
    if not path.endswith(".py"):
        yield from enumerate(text.splitlines(), start=1)
        return
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            yield from enumerate(node.value.value.splitlines(), start=node.lineno)


def _is_pattern(word: str) -> bool:
    if PATTERN_CHARS & set(word):
        return True
    head, _, last = word.rpartition("/")
    return bool(PLACEHOLDER.search(head if BARE_MD.fullmatch(last) else word))


def citations_in(path: str, text: str, top_level: set[str]) -> Iterable[Citation]:
    """Every repository path `text` (the file at repo-relative `path`) cites, by the rules above."""
    here = os.path.dirname(path)
    for number, line in prose_lines(path, text):
        found: set[Citation] = set()
        if path.endswith(".md"):
            for target in MD_LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
                    continue
                target = target.split("#")[0]
                if target:
                    resolved = os.path.normpath(os.path.join(here, target))
                    found.add(Citation(path, number, resolved, (resolved,)))
        line = URL.sub(" ", line)
        for word in PATH_WORD.findall(line):
            word = _clean(word)
            if "/" not in word or word.startswith(("./", "../")) or _is_pattern(word):
                continue
            if word.split("/")[0] in top_level or BARE_MD.fullmatch(word.rpartition("/")[2]):
                cited = os.path.normpath(word)
                found.add(Citation(path, number, cited, (cited,)))
        for name in BARE_MD.findall(line):
            found.add(Citation(path, number, name, (name, os.path.join(here, name))))
        yield from sorted(found, key=str)


def missing_citations(root: Path, files: list[str]) -> tuple[list[Citation], int]:
    """(citations of files that are not among `files`, how many citations were checked)."""
    listed = set(files)
    dirs = {str(parent) for f in files for parent in Path(f).parents if str(parent) != "."}
    top_level = {f.split("/")[0] for f in files}

    def exists(citation: Citation) -> bool:
        return any(c in listed or c in dirs for c in citation.candidates)

    missing, checked = [], 0
    for path in files:
        if not is_checked(path):
            continue
        try:
            text = (root / path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for citation in citations_in(path, text, top_level):
            checked += 1
            if not exists(citation):
                missing.append(citation)
    return missing, checked


def test_every_citation_in_the_repository_names_a_file_in_it():
    missing, checked = missing_citations(ROOT, listed_files(ROOT))
    assert checked > 100, "the rules found almost no citations: are they still reading the tree?"
    assert missing == [], "cited but not in the repository:\n" + "\n".join(map(str, missing))


# The synthetic tree's top-level names (guide/, engine/, bin/) are not the repository's, and the
# missing names are built from parts, so that this file itself cites nothing missing.
GONE = "gone" + ".py"
NOTES = "NOTES" + ".md"


def planted_tree(tmp_path: Path) -> list[str]:
    files = {
        "README.md": f"See [the guide](guide/index.md) and [gone](guide/{GONE}).\n![plot](guide/plot.png)\n",
        "guide/index.md": "# Guide\nBack to [the README](../README.md); [a section](#guide); [web](https://x.org/a.md).\n",
        "guide/plot.png": "",
        "engine/train.py": (
            # Two literals, so that this line holds no citation of a section of guide/index.md.
            '"""The trainer (guide/index.md,'
            f' "Training"); see engine/{GONE} and {NOTES}."""\n'
            '# Paths that are not ours: /opt/engine/x.py ~/nanocluster/engine/y.py "$HOME"/engine/z.py\n'
            "# Patterns and placeholders: engine/*.py, engine/<name>.py, {root}/engine/w.py, engine/NAME.py\n"
            "# A URL: https://example.org/engine/v.py; the tree: engine/, engine/train.py, engine/...\n"
            f'PATHS = ["engine/{GONE}"]  # a string in code is data, not a citation; shared/{NOTES} is one\n'
        ),
        "engine/run.py": "# Relative to engine/: run/plan.py is not checked. README.md is at the root.\n",
        "bin/README.md": "Read README.md (this directory's) and [the trainer](../engine/train.py).\n",
        "Makefile": f"lint:\n\t$(BIN)/python bin/{GONE}\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return sorted(files)


def test_the_check_finds_planted_missing_citations_and_nothing_else(tmp_path):
    missing, checked = missing_citations(tmp_path, planted_tree(tmp_path))
    assert sorted((c.file, c.line, c.cited) for c in missing) == [
        ("Makefile", 2, f"bin/{GONE}"),
        ("README.md", 1, f"guide/{GONE}"),
        ("engine/train.py", 1, NOTES),
        ("engine/train.py", 1, f"engine/{GONE}"),
        ("engine/train.py", 5, f"shared/{NOTES}"),
    ]
    assert checked >= 12


def test_a_missing_citation_is_reported_with_its_file_and_line(tmp_path):
    (tmp_path / "infra").mkdir()
    (tmp_path / "infra" / "contract.py").write_text(f'"""Line one."""\n# infra/{GONE}, the old home\n')
    missing, _ = missing_citations(tmp_path, ["infra/contract.py"])
    assert [str(c) for c in missing] == [f"infra/contract.py:2: infra/{GONE}"]


# --- sections: a page's anchor or heading ---------------------------------------------------------

ANCHORED = re.compile(r"(?<![\w/.~$-])((?:[\w.-]+/)*[\w.-]+\.md)#([\w-]+)")
"""page.md#anchor, the page from the repository root or the citing file's directory."""
NAMED = re.compile(r'(?<![\w/.~$-])((?:[\w.-]+/)*(?:[\w.-]+\.md|README)),\s*\\?"([^"\\]+)\\?"')
"""page.md, "Heading" or README, "Heading" (in a Python string its quotes may be escaped)."""
SECTIONS_NOT_CHECKED_IN = "tests/test_docs.py"
"""This file: its examples and planted trees cite made-up pages and sections on purpose."""
MKDOCS_DEFAULT_EXTENSIONS = ("toc", "tables", "fenced_code")
"""What mkdocs always adds to the markdown_extensions of mkdocs.yml."""


@dataclass(frozen=True)
class SectionCitation:
    file: str
    line: int
    cited: str
    """As written: page.md#anchor, #anchor or page.md, "Heading"."""
    candidates: tuple[str, ...]
    """Where the page may be, from the repository root: the first listed file is it."""
    anchor: str
    """The id the section has on that page (a cited heading's: slugified)."""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.cited}"


@cache
def mkdocs_markdown() -> markdown.Markdown:
    """Python-Markdown as mkdocs runs it: its default extensions and mkdocs.yml's, with their settings."""
    names, settings = list(MKDOCS_DEFAULT_EXTENSIONS), {}
    for entry in yaml.safe_load((ROOT / "mkdocs.yml").read_text()).get("markdown_extensions", []):
        name, config = next(iter(entry.items())) if isinstance(entry, dict) else (entry, None)
        if name not in names:
            names.append(name)
        settings[name] = config or {}
    return markdown.Markdown(extensions=names, extension_configs=settings)


def page_anchors(text: str) -> set[str]:
    """Every id the page has once rendered: its headings' (toc) and any HTML element's."""
    md = mkdocs_markdown()
    try:
        return set(re.findall(r'\bid="([^"]+)"', md.convert(text)))
    finally:
        md.reset()


def heading_anchor(heading: str) -> str:
    return slugify(heading, "-")


def section_citations_in(path: str, text: str, top_level: set[str]) -> Iterable[SectionCitation]:
    """Every section `text` (the file at repo-relative `path`) cites, by the rules above; every line
    is read, code too (a message that cites a section is read by an operator)."""
    here = os.path.dirname(path)

    def candidates(page: str) -> tuple[str, ...]:
        from_root, from_here = os.path.normpath(page), os.path.normpath(os.path.join(here, page))
        return (from_root, from_here) if from_root.split("/")[0] in top_level else (from_here, from_root)

    for number, line in enumerate(text.splitlines(), start=1):
        line = URL.sub(" ", line)
        found: set[SectionCitation] = set()
        for page, anchor in ANCHORED.findall(line):
            found.add(SectionCitation(path, number, f"{page}#{anchor}", candidates(page), anchor))
        if path.endswith(".md"):
            for target in MD_LINK.findall(line):
                if target.startswith("#"):
                    found.add(SectionCitation(path, number, target, (path,), target[1:]))
        for page, heading in NAMED.findall(line):
            page_file = page if page.endswith(".md") else f"{page}.md"
            found.add(
                SectionCitation(path, number, f'{page}, "{heading}"', candidates(page_file), heading_anchor(heading))
            )
        yield from sorted(found, key=str)


def missing_sections(root: Path, files: list[str]) -> tuple[list[str], int]:
    """(one line per cited section whose page or anchor does not exist, how many were checked)."""
    listed = set(files)
    top_level = {f.split("/")[0] for f in files}
    anchors: dict[str, set[str]] = {}
    missing, checked = [], 0
    for path in files:
        if not is_checked(path) or path == SECTIONS_NOT_CHECKED_IN:
            continue
        try:
            text = (root / path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for citation in section_citations_in(path, text, top_level):
            checked += 1
            page = next((c for c in citation.candidates if c in listed), None)
            if page is None:
                missing.append(f"{citation}: no page {citation.candidates[0]}")
                continue
            if page not in anchors:
                anchors[page] = page_anchors((root / page).read_text(encoding="utf-8"))
            if citation.anchor not in anchors[page]:
                missing.append(f"{citation}: {page} has no anchor #{citation.anchor}")
    return missing, checked


def test_every_cited_section_is_an_anchor_of_its_page():
    missing, checked = missing_sections(ROOT, listed_files(ROOT))
    assert checked > 50, "the rules found almost no cited sections: are they still reading the tree?"
    assert missing == [], "cited sections that do not exist:\n" + "\n".join(missing)


# Made-up anchors and headings, built from parts so that this file itself cites none.
NO_ANCHOR = "no-such" + "-section"
GONE_PAGE = "gone" + ".md"


def test_the_check_finds_missing_pages_and_anchors_and_nothing_else(tmp_path):
    files = {
        "docs/guide.md": (
            "# The guide\n## Step time, after an eval\n## Setup\n## Setup\n"
            f"See [setup](#setup), [again](#setup_1), [the trainer](other.md#the-trainer), [gone](#{NO_ANCHOR}).\n"
            "```\n# not a heading\n```\n"
        ),
        "docs/other.md": f"# The trainer\nBack to [the guide](guide.md#the-guide), [nowhere](guide.md#{NO_ANCHOR}).\n",
        "README.md": f"Read docs/guide.md#step-time-after-an-eval and docs/{GONE_PAGE}#setup.\n",
        "engine/train.py": (
            '"""The steps (docs/guide.md, "Step time, after an eval"); (README, "Setup")."""\n'
            f'print("see docs/guide.md#{NO_ANCHOR}")  # a message: read too\n'
            "# https://example.org/docs/guide.md#not-ours is a URL\n"
            'NOTE = "(docs/other.md, \\"The trainer\\")"\n'
        ),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    missing, checked = missing_sections(tmp_path, sorted(files))
    assert missing == [
        f"README.md:1: docs/{GONE_PAGE}#setup: no page docs/{GONE_PAGE}",
        f"docs/guide.md:5: #{NO_ANCHOR}: docs/guide.md has no anchor #{NO_ANCHOR}",
        f"docs/other.md:2: guide.md#{NO_ANCHOR}: docs/guide.md has no anchor #{NO_ANCHOR}",
        'engine/train.py:1: README, "Setup": README.md has no anchor #setup',
        f"engine/train.py:2: docs/guide.md#{NO_ANCHOR}: docs/guide.md has no anchor #{NO_ANCHOR}",
    ]
    assert checked == 12


def test_a_heading_is_cited_by_the_anchor_mkdocs_gives_it():
    assert heading_anchor("Idle stop (autostop)") == "idle-stop-autostop"
    assert heading_anchor("`fab train`") == "fab-train"
    assert "idle-stop-autostop" in page_anchors((ROOT / "docs" / "cost.md").read_text())
