"""The documentation site builds in strict mode (broken links, missing pages or references fail),
every page is in the navigation, and every page the navigation names exists."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    assert (tmp_path / "site" / "img" / "connection-form.png").exists()
