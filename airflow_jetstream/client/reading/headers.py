"""Message headers as NATS sends them: a block may repeat a name (nats.js ``append``, Go ``Header.Add``), and
nats-py's ``dict[str, str]`` keeps the last value only. :func:`parse_header_lines` (installed on every connection of
the toolkit) returns :class:`Headers`, that same dict plus every value of a repeated name, which
:func:`header_values` and :func:`headers_json` give to readers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_jetstream.client.natspy_internals import natspy_header_pairs, natspy_parse_header_lines


class Headers(dict[str, str]):
    """``dict[str, str]`` of a message's headers (last value per name), plus ``repeated``:
    every value, in order, of the names the message carries more than once."""

    __slots__ = ("repeated",)

    def __init__(self, pairs: list[tuple[str, str]] | dict[str, str] | None = None) -> None:
        super().__init__(pairs or ())
        self.repeated: dict[str, list[str]] = {}
        if isinstance(pairs, list) and len(self) != len(pairs):  # a dict has no repeated names
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
    """Header lines (``Name: Value`` separated by CRLF) as :class:`Headers`: the dict is nats-py's own parse, so
    nats-py's users of a toolkit connection (KV, JetStream contexts) read what nats-py gives them; a block with more
    lines than names is read again line by line, by the same parser, for ``repeated``."""
    parsed = natspy_parse_header_lines(raw)
    if raw.rstrip(b"\r\n").count(b"\r\n") < len(parsed):  # as many lines as names: none repeated
        return Headers(parsed)
    return Headers(natspy_header_pairs(raw))  # the same dict, and every value of a repeated name


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
    return {name: values if len(values) > 1 else values[0] for name, values in header_values(headers).items()}
