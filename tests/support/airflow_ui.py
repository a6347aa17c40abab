"""One Airflow 3 api-server (UI + REST) for every browser test of a session, and a headless Chromium per module.

Imported by tests/conftest.py, so the connection-form and the JetStream view tests share the
api-server (simple auth manager with one admin user and a password, sqlite in a temp AIRFLOW_HOME);
each module's browser logs in through Airflow's login page. The api-server knows the ``nats``
connection ``nats_view`` (AIRFLOW_CONN_NATS_VIEW) to a nats-server seeded with what the view shows
(tests/support/jetstream_view.py).

Chromium is Debian's ``chromium`` package (tests/support/chromium.py installs it when missing), driven by
Playwright's Python package with ``executable_path``: no browser download.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.embedded import EmbeddedNatsServer
from airflow_jetstream.embedded.server import free_port
from tests.support import jetstream_view
from tests.support.airflow_cli import AIRFLOW, isolated_airflow_env, migrated_database, nats_conn_json
from tests.support.chromium import CHROMIUM, install_chromium

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEW_CONN = "nats_view"
USER, PASSWORD = "admin", "browser-test-pw"


@dataclass(frozen=True)
class AirflowUI:
    """The running api-server: its URL and the environment (home, database) the airflow CLI needs."""

    url: str
    env: dict[str, str]
    home: Path

    @property
    def log(self) -> Path:
        """The api-server's output."""
        return self.home / "api-server.log"


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"airflow api-server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=2) as resp:
                if json.load(resp)["metadatabase"]["status"] == "healthy":
                    return
        except OSError:
            pass
        time.sleep(0.5)  # polling a starting server: the deadline above bounds it
    raise AssertionError(f"airflow api-server not healthy after {timeout}s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def chromium() -> Path:
    problem = install_chromium()
    if problem:
        pytest.skip(f"Chromium cannot be installed here: {problem}")
    return CHROMIUM


@pytest.fixture(scope="session")
def view_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNatsServer]:
    """A nats-server holding streams, consumers, sources, ledger runs and captured advisories, and trouble."""
    server = EmbeddedNatsServer(store_dir=tmp_path_factory.mktemp("nats-view"),
                                jetstream=jetstream_view.SERVER_JETSTREAM).start()
    settings = ConnectionSettings(servers=server.url, connect_timeout=2, request_timeout=5)
    jetstream_view.seed_view_data(settings)
    jetstream_view.seed_trouble(settings)
    yield server
    server.close()


@contextmanager
def running_api_server(home: Path, user: str, password: str, **settings: str) -> Iterator[AirflowUI]:
    """An api-server in ``home`` (fresh sqlite db, simple auth with one admin ``user``) on a free loopback port,
    with Airflow ``settings`` (``AIRFLOW__...``/``AIRFLOW_CONN_...``); stopped on leaving."""
    (home / "dags").mkdir(parents=True, exist_ok=True)
    (home / "passwords.json").write_text(json.dumps({user: password}))
    env = isolated_airflow_env(
        home,
        AIRFLOW__CORE__AUTH_MANAGER="airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=f"{user}:admin",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(home / "passwords.json"),
        **settings,
    )
    migrated_database(env)
    port = free_port()
    log = home / "api-server.log"  # AirflowUI.log
    with log.open("w") as out:
        proc = subprocess.Popen(
            [AIRFLOW, "api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        yield AirflowUI(url=url, env=env, home=home)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.fixture(scope="session")
def airflow_ui(tmp_path_factory: pytest.TempPathFactory, view_server: EmbeddedNatsServer) -> Iterator[AirflowUI]:
    """Airflow 3's api-server on a free loopback port with a fresh sqlite database."""
    with running_api_server(
        tmp_path_factory.mktemp("airflow-ui-home"), USER, PASSWORD,
        AIRFLOW__CORE__TEST_CONNECTION="Enabled",
        AIRFLOW__JETSTREAM__PROBLEM_PENDING_IDLE="1s",  # the seeded idle consumers are problems at once
        **{f"AIRFLOW_CONN_{VIEW_CONN.upper()}": nats_conn_json(view_server.url)},
    ) as ui:
        yield ui


def log_in(page: Any, url: str, user: str, password: str) -> None:
    """Log in through Airflow's login page as a user does; returns once back on ``url/`` with the token cookie
    (waiting only for the network to go idle after the click can return before the login's redirect)."""
    page.goto(f"{url}/", wait_until="networkidle")  # redirected to the login page
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{url}/", wait_until="networkidle")
    assert any(cookie["name"] == "_token" for cookie in page.context.cookies()), "login set no token cookie"


@pytest.fixture(scope="module")
def browser_context(chromium: Path, airflow_ui: AirflowUI, tmp_path_factory: pytest.TempPathFactory):
    """The browser, logged in to Airflow through its login page (the UI keeps the token in a cookie).

    One per test module: while Playwright's sync API is open it runs an event loop in the main thread,
    so every later ``asyncio.run()`` of the session (most real-server tests) would fail.
    """
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(chromium),
            args=CHROMIUM_FLAGS,  # the new empty profile dir above is Chromium's --user-data-dir
            headless=True,
            viewport={"width": 1280, "height": 1900},
        )
        context.set_default_timeout(30_000)
        try:
            login = context.new_page()
            log_in(login, airflow_ui.url, USER, PASSWORD)
            login.close()
            yield context
        finally:
            context.close()


@pytest.fixture(scope="module")
def page(browser_context):
    """A tab of the shared browser, for one test module."""
    tab = browser_context.new_page()
    yield tab
    tab.close()
