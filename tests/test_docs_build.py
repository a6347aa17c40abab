"""The documentation site builds in strict mode (broken links, missing pages or references fail),
every page is in the navigation, and every page the navigation names exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _nav_pages(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [page for item in node for page in _nav_pages(item)]
    if isinstance(node, dict):
        return [page for value in node.values() for page in _nav_pages(value)]
    return []


def _mkdocs_config() -> dict:
    return yaml.safe_load((REPO / "mkdocs.yml").read_text())


def test_every_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    nav = _nav_pages(_mkdocs_config()["nav"])
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert not sorted(set(pages) - set(nav)), "pages missing from mkdocs.yml nav"
    assert not sorted(set(nav) - set(pages)), "nav entries without a page"
    assert len(nav) == len(set(nav)), "a page is listed twice in the nav"


def test_docs_use_the_browser_test_screenshot() -> None:
    assert (DOCS / "img" / "connection-form.png").stat().st_size > 10_000
    assert "img/connection-form.png" in (DOCS / "connection.md").read_text()


def test_mkdocs_strict_build(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    api = (tmp_path / "site" / "api.html").read_text()
    assert "JetStreamHook" in api and "JetStreamEnsureStreamOperator" in api
    assert ":class:<code>" not in api and ":meth:<code>" not in api, "Sphinx roles must render as code"
    assert (tmp_path / "site" / "img" / "connection-form.png").exists()
    lost = [f"docs/{page}: {heading}" for page, headings in _markdown_headings().items()
            for heading in headings if heading not in _html_headings(tmp_path / "site" / _html_path(page))]
    assert lost == [], "headings rendered as text (a line starting with a raw tag like <option> swallows the rest)"


def _markdown_headings() -> dict[str, list[str]]:
    """Each page's ``##``/``###`` headings outside code fences, as their text."""
    found: dict[str, list[str]] = {}
    for page in sorted(DOCS.rglob("*.md")):
        fenced = False
        headings = found.setdefault(page.relative_to(DOCS).as_posix(), [])
        for line in page.read_text().splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced and re.match(r"#{2,3} ", line):
                headings.append(re.sub(r"[`*]", "", line.lstrip("#").strip()))
    return found


def _html_path(page: str) -> str:
    return page.removesuffix(".md") + ".html"


def _html_headings(html_file: Path) -> set[str]:
    html = html_file.read_text()
    texts = re.findall(r"<h[23][^>]*>(.*?)</h[23]>", html, flags=re.S)
    return {unescape(re.sub(r"<[^>]+>", "", text)).replace("\u00b6", "").strip() for text in texts}


SNIPPET_PAGES = ("getting-started.md", "operators/stream.md", "assets.md")


def _dag_snippets(page: str) -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), flags=re.S)
    return [block for block in blocks if "DAG(" in block]


@pytest.mark.parametrize("page", SNIPPET_PAGES)
def test_dag_snippets_are_complete_dag_files(page: str, tmp_path: Path) -> None:
    """Each DAG snippet of these pages, saved as a file, is a DAG file Airflow parses without errors."""
    from airflow.dag_processing.dagbag import DagBag

    snippets = _dag_snippets(page)
    assert snippets, f"{page} has no DAG snippet"
    for index, snippet in enumerate(snippets):
        (tmp_path / f"snippet_{index}.py").write_text(snippet)
    bag = DagBag(dag_folder=tmp_path, safe_mode=False)
    assert not bag.import_errors, bag.import_errors
    assert len(bag.dags) >= len(snippets)
    assert all(dag.tasks for dag in bag.dags.values()), "a snippet's DAG has no task"


def test_connection_page_examples_are_valid_connections() -> None:
    """Every ``AIRFLOW_CONN_*`` example of docs/connection.md parses into client settings."""
    from airflow.sdk import Connection

    from airflow_jetstream.client.errors import InvalidSettingsError
    from airflow_jetstream.hooks.jetstream import settings_from_connection

    examples = re.findall(r"export (AIRFLOW_CONN_\w+)='(.*?)'", (DOCS / "connection.md").read_text(), flags=re.S)
    assert len(examples) >= 5
    for name, value in examples:
        conn_id = name.removeprefix("AIRFLOW_CONN_").lower()
        if value.lstrip().startswith("{"):
            conn = Connection.from_json(value, conn_id=conn_id)
        else:
            conn = Connection.from_uri(value, conn_id=conn_id)
        assert conn.conn_type == "nats", name
        if "tls_ca_file" in value:  # the CA file of the example does not exist here: that is the only complaint
            with pytest.raises(InvalidSettingsError, match=re.escape("/etc/nats/ca.pem' does not exist")):
                settings_from_connection(conn)
            continue
        settings = settings_from_connection(conn)
        assert all(server.startswith("nats://") for server in settings.servers), name


def _table_runs(text: str) -> list[tuple[int, list[str]]]:
    """Each run of consecutive table lines (``|...``) outside code fences, with its first line number."""
    runs: list[tuple[int, list[str]]] = []
    fenced = False
    current: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        is_row = not fenced and line.startswith("|")
        if is_row and not current:
            start = number
        if is_row:
            current.append(line)
        elif current:
            runs.append((start, current))
            current = []
    if current:
        runs.append((start, current))
    return runs


def test_every_table_has_a_header_and_is_not_split() -> None:
    """Rows cut off from their table by a paragraph render as plain text: every run of table lines
    must start with a header row and its ``|---|`` separator."""
    separator = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$")
    broken = [f"docs/{page.relative_to(DOCS).as_posix()}:{start}"
              for page in sorted(DOCS.rglob("*.md"))
              for start, rows in _table_runs(page.read_text())
              if len(rows) < 2 or not separator.match(rows[1])]
    assert broken == []
