"""mkdocs hook: docstrings use Sphinx roles (``:class:`X```); show them as plain code in the site."""

from __future__ import annotations

import re
from typing import Any

_SPHINX_ROLE = re.compile(r":(?:class|func|meth|attr|mod|exc|data|obj):(?=<code>)")


def on_page_content(html: str, **kwargs: Any) -> str:
    return _SPHINX_ROLE.sub("", html)
