"""Which files of a working directory stay behind: ``.gitignore`` and
``.fiberliteignore`` rules (gitignore syntax), plus caches and virtual environments.

Rules are read in every directory the walk enters; a path is judged by the rules of
its directory and of every directory above it, the deeper ones last, and in each
directory the ``.gitignore`` before the ``.fiberliteignore`` (so that the latter can
re-include with ``!pattern`` what the former excludes). The last rule that matches
decides, as in git. A directory that is excluded is not entered: nothing in it can
be re-included.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

IGNORE_FILES = (".gitignore", ".fiberliteignore")

# never worth sending: version control, caches, build and tool droppings
BUILTIN = """
.git/
.hg/
.svn/
__pycache__/
*.py[cod]
.pytest_cache/
.mypy_cache/
.ruff_cache/
.tox/
.nox/
.ipynb_checkpoints/
.eggs/
*.egg-info/
.DS_Store
"""

# a directory holding one of these is a Python environment: never sent
ENVIRONMENT_MARKERS = ("pyvenv.cfg", "conda-meta")


@dataclass(frozen=True)
class Rule:
    """One pattern line: its regular expression over a path relative to the rule's
    directory, whether it re-includes (``!``) and whether it matches directories only."""

    regex: re.Pattern
    negate: bool
    dir_only: bool


def _glob(pattern: str) -> str:
    """A gitignore glob as a regular expression (``*`` and ``?`` stop at ``/``)."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i) and (i == 0 or pattern[i - 1] == "/"):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i) and i + 2 == n and (i == 0 or pattern[i - 1] == "/"):
            out.append(".*")
            i += 2
        elif c == "*":
            while i < n and pattern[i] == "*":
                i += 1
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern.startswith(("[!", "[^"), i) else i + 1)
            if end < 0:
                out.append(re.escape(c))
                i += 1
                continue
            body = pattern[i + 1:end]
            if body[:1] in ("!", "^"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def parse_rule(line: str) -> Rule | None:
    """A rule from one line of an ignore file (None for blanks and comments)."""
    line = line.rstrip("\n").rstrip("\r")
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(line) > len(stripped):
        stripped += " "  # "foo\ " keeps its escaped space
    line = stripped
    if not line or line.startswith("#"):
        return None
    negate = line.startswith("!")
    if negate:
        line = line[1:]
    elif line.startswith(("\\!", "\\#")):
        line = line[1:]
    dir_only = line.endswith("/") and not line.endswith("\\/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.lstrip("/")
    regex = ("^" if anchored else "^(?:.*/)?") + _glob(line) + "$"
    return Rule(re.compile(regex, re.DOTALL), negate, dir_only)


def parse_rules(text: str) -> list[Rule]:
    return [r for r in (parse_rule(line) for line in text.splitlines()) if r is not None]


BUILTIN_RULES = parse_rules(BUILTIN)


class Rules:
    """The rules that apply inside one directory of the walk (``base``, relative to the
    root, ``""`` for the root itself): its parent's and its own."""

    def __init__(self, sets: tuple[tuple[str, tuple[Rule, ...]], ...] = (("", tuple(BUILTIN_RULES)),)) -> None:
        self.sets = sets

    def enter(self, base: str, directory: str) -> "Rules":
        """The rules inside ``directory`` (whose path relative to the root is ``base``)."""
        found: list[Rule] = []
        for name in IGNORE_FILES:
            try:
                with open(os.path.join(directory, name), encoding="utf-8", errors="replace") as fh:
                    found += parse_rules(fh.read())
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                continue
        return Rules(self.sets + ((base, tuple(found)),)) if found else self

    def ignored(self, rel: str, is_dir: bool) -> bool:
        """True when ``rel`` (a path relative to the root, ``/``-separated) stays behind."""
        verdict = False
        for base, rules in self.sets:
            if base:
                if not rel.startswith(base + "/"):
                    continue
                sub = rel[len(base) + 1:]
            else:
                sub = rel
            for rule in rules:
                if rule.dir_only and not is_dir:
                    continue
                if rule.regex.match(sub):
                    verdict = not rule.negate
        return verdict


def is_environment(directory: str) -> bool:
    """True for a virtual environment or conda environment directory."""
    return any(os.path.exists(os.path.join(directory, m)) for m in ENVIRONMENT_MARKERS)
