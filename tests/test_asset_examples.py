"""Every ``jetstream://`` asset URI written in the docs, the README, docstrings and the example DAGs parses as
written: as the provider writes it (host in lower case, port given), so what a reader copies is what Airflow
stores (``jetstream://ORDERS/orders`` would be server ``orders:4222``, stream ``orders``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from airflow_jetstream.assets.jetstream import parse_asset_uri

ROOT = Path(__file__).resolve().parents[1]
_URI = re.compile(r"jetstream://[^\s`'\"()\],]*")


def _written_uris() -> list[tuple[str, str]]:
    """(file, uri) of every concrete example; placeholders (``<stream>``, ``{server}``, ``[:port]``, ``...``) are
    skipped, and so are OpenLineage namespaces (``jetstream://host:port``, no stream)."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "airflow_jetstream").rglob("*.py")), *sorted((ROOT / "dags_examples").rglob("*.py"))]
    found = []
    for path in files:
        for match in _URI.finditer(path.read_text(encoding="utf-8")):
            written = match.group(0)
            uri = written.rstrip(".:;")
            if any(mark in uri for mark in "<{[") or "..." in written or "/" not in uri.removeprefix("jetstream://"):
                continue
            found.append((str(path.relative_to(ROOT)), uri))
    return found


def test_the_examples_are_found():
    assert len(_written_uris()) >= 8


@pytest.mark.parametrize(("where", "uri"), _written_uris(), ids=lambda value: value)
def test_an_asset_uri_example_parses_as_written(where, uri):
    ref = parse_asset_uri(uri)
    assert ref.uri == uri, f"{where}: {uri} is read as server {ref.server!r}, stream {ref.stream!r}: write {ref.uri}"
