"""Message headers as NATS sends them: repeated names keep every value.

A NATS header block may repeat a name (``X-Multi: a`` and ``X-Multi: b``; nats.js ``append``, Go
``Header.Add``). nats-py's ``Msg.headers`` is a ``dict[str, str]`` and keeps the last value only.
:func:`parse_header_lines` (installed on every connection of the toolkit, see
:mod:`airflow_jetstream.client.natspy_internals`) returns a :class:`Headers` that is that same dict
(last value per name, so existing code sees nats-py's results) and also remembers every value of
a repeated name; :func:`header_values` and :func:`headers_json` give them to readers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_HEADER_LINE = re.compile(r"^[ \t]*([!-9;-~]+)[ \t]*:[ \t]*([^\r\n]*?)[ \t]*\r?$", re.M)


class Headers(dict[str, str]):
    """``dict[str, str]`` of a message's headers (last value per name), plus ``repeated``:
    every value, in order, of the names the message carries more than once."""

    __slots__ = ("repeated",)

    def __init__(self, pairs: list[tuple[str, str]] | None = None) -> None:
        super().__init__(pairs or ())
        self.repeated: dict[str, list[str]] = {}
        if pairs and len(self) != len(pairs):
            for name, value in pairs:
                self.repeated.setdefault(name, []).append(value)
            self.repeated = {name: values for name, values in self.repeated.items() if len(values) > 1}

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (list(self.items()), self.repeated))


def _rebuild(items: list[tuple[str, str]], repeated: dict[str, list[str]]) -> Headers:
    headers = Headers(items)
    headers.repeated = repeated
    return headers


def parse_header_lines(raw: bytes) -> Headers:
    """Header lines (``Name: Value`` separated by CRLF) as :class:`Headers`.

    Same names and values as nats-py's parser for valid headers (lines whose name has white space
    or non-ASCII characters are skipped, as there; values are UTF-8 with invalid bytes replaced),
    without its per-character scan, which costs more than the rest of receiving a message.
    """
    return Headers(_HEADER_LINE.findall(raw.decode("utf-8", "replace")))


def without(headers: Mapping[str, str], names: frozenset[str]) -> Headers | None:
    """``headers`` minus ``names`` (None when nothing is left), keeping every value of a repeated name."""
    repeated = getattr(headers, "repeated", None) or {}
    kept = Headers([(name, value) for name, value in headers.items() if name not in names])
    kept.repeated = {name: values for name, values in repeated.items() if name not in names}
    return kept or None


def header_values(headers: Mapping[str, str] | None) -> dict[str, list[str]]:
    """Every value of every header name, in the order received (a plain dict gives one value each)."""
    if not headers:
        return {}
    repeated = getattr(headers, "repeated", None) or {}
    return {name: list(repeated.get(name) or [value]) for name, value in headers.items()}


def headers_json(headers: Mapping[str, str] | None) -> dict[str, str | list[str]]:
    """Headers for a JSON document: a string per name, a list of strings for a repeated name."""
    if not headers:
        return {}
    repeated = getattr(headers, "repeated", None) or {}
    return {name: list(repeated[name]) if name in repeated else value for name, value in headers.items()}
