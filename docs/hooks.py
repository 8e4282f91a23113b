"""MkDocs hooks of the fiberlite site (``hooks:`` in mkdocs.yml).

- ``<!-- fiberlite-help: COMMAND -->`` in a page becomes the ``--help`` text of
  ``fiberlite COMMAND`` (``<!-- fiberlite-help -->``: of ``fiberlite`` itself), taken
  from the installed command at build time, so the page cannot fall behind it.
- Sphinx roles in docstrings (``:class:`~fiberlite.errors.RingError```), which
  Markdown renders as ``:class:<code>...</code>``, become plain code: ``RingError``.
"""
from __future__ import annotations

import argparse
import html
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELP_MARK = re.compile(r"^<!-- fiberlite-help(?::\s*([\w-]+))?\s*-->$", re.MULTILINE)
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):<code>(~?)([^<]*)</code>")
HELP_WIDTH = "88"


def help_text(command: str | None) -> str:
    """The ``--help`` output of ``fiberlite [command]``, at a fixed width, without colour."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from fiberlite.cli import parser

    saved = {k: os.environ.get(k) for k in ("COLUMNS", "NO_COLOR")}
    os.environ.update(COLUMNS=HELP_WIDTH, NO_COLOR="1")
    try:
        top = parser()
        if command is None:
            return top.format_help()
        for action in top._actions:
            if isinstance(action, argparse._SubParsersAction) and command in action.choices:
                return action.choices[command].format_help()
        raise ValueError(f"fiberlite has no command {command!r} (docs: <!-- fiberlite-help: {command} -->)")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def on_page_markdown(markdown: str, **kwargs) -> str:
    def block(match: re.Match) -> str:
        return "```text\n" + help_text(match.group(1)).rstrip() + "\n```"
    return HELP_MARK.sub(block, markdown)


def on_page_content(content: str, **kwargs) -> str:
    def plain(match: re.Match) -> str:
        short, target = match.group(1), html.unescape(match.group(2))
        if short:
            target = target.rsplit(".", 1)[-1]
        return f"<code>{html.escape(target)}</code>"
    return ROLE.sub(plain, content)
