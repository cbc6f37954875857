"""MkDocs hook for the docs site (``mkdocs.yml``): fenced blocks may say more than their language, e.g.
```` ```bash skip ```` for an example that ``tests/unit/test_docs_examples.py`` must not run; Python-Markdown's
fenced-code syntax takes one word after the fence, so the rest of the info string is dropped before rendering."""

from __future__ import annotations

import re
from typing import Any

#: An opening fence with a language and more words after it.
_INFO = re.compile(r"^(?P<fence>`{3,}|~{3,})(?P<lang>[\w#.+-]+)[ \t]+[^\n`]*$", re.MULTILINE)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """The page's Markdown with each fence's info string cut to its language."""
    return _INFO.sub(r"\g<fence>\g<lang>", markdown)
