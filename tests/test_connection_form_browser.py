"""The ``nats`` connection form in Airflow 3's real UI, driven by headless Chromium.

Against ``airflow api-server`` on loopback (simple auth manager, everyone admin, sqlite in a temp
AIRFLOW_HOME), adds a "NATS JetStream" connection through the form, checks our labels, help texts
and masked secrets, saves it, and presses the Test button against a live nats-server (which requires
the token typed into the form) and against a dead port. Saves connection-form.png (docs/img under
`make screenshots`). An NKey seed typed into the form is never shown again: not by the edit form, nor by
the API it reads; saving the edit form untouched keeps the seed (the Test button still gets in).

The api-server and Chromium are shared with the other browser tests (tests/support/airflow_ui.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from airflow_jetstream.embedded import EmbeddedNatsServer
from airflow_jetstream.get_provider_info import CONN_FIELDS
from tests.support.airflow_ui import AirflowUI, free_port
from tests.support.nkeys_util import new_user_nkey
from tests.support.screenshots import screenshot_path

pytestmark = pytest.mark.browser

TOKEN = "form-t0ken-not-for-logs"


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNatsServer]:
    server = EmbeddedNatsServer(
        store_dir=tmp_path_factory.mktemp("nats-form"), config={"authorization": {"token": TOKEN}}
    ).start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def nkey_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedNatsServer, str]]:
    seed, public = new_user_nkey()
    server = EmbeddedNatsServer(
        store_dir=tmp_path_factory.mktemp("nats-form-nkey"), config={"authorization": {"users": [{"nkey": public}]}}
    ).start()
    yield server, seed
    server.close()


def _open_add_form(page, airflow_ui: AirflowUI, conn_id: str) -> None:
    page.goto(f"{airflow_ui.url}/connections", wait_until="networkidle")
    page.get_by_role("button", name="Add Connection").click()
    page.get_by_label("Connection ID").fill(conn_id)
    page.get_by_role("combobox").fill("NATS JetStream")
    page.get_by_role("option", name="NATS JetStream", exact=True).click()
    page.get_by_label("Servers").wait_for()


def _save(page, conn_id: str) -> None:
    page.get_by_role("button", name="Save").click()
    page.get_by_text("Connection has been successfully created").wait_for()
    page.get_by_role("row").filter(has_text=conn_id).wait_for()
    # the form, with what was typed into it, leaves the DOM only when its closing animation ends
    expect(page.locator("[name^=element_]")).to_have_count(0)


def _press_test(page, conn_id: str):
    row = page.get_by_role("row").filter(has_text=conn_id)
    with page.expect_response(lambda r: r.url.endswith("/connections/test")) as response:
        row.get_by_role("button", name="Test Connection").click()
    return response.value.json()


def test_connection_form_save_and_test(page, airflow_ui: AirflowUI, token_server: EmbeddedNatsServer) -> None:
    host, port = token_server.url.split("://", 1)[1].rsplit(":", 1)
    _open_add_form(page, airflow_ui, "nats_browser")
    dialog = page.get_by_role("dialog")

    # standard fields: relabelled, placeholders from the provider info, schema hidden
    # (expect() re-checks until the React form has settled, so a slow render is not a failure)
    expect(dialog.get_by_label("Servers")).to_have_attribute("placeholder",
                                                             "nats1.example.com:4222,nats2.example.com:4222")
    expect(dialog.get_by_label("User")).to_have_attribute("name", "login")
    expect(dialog.get_by_label("Password")).to_have_attribute("type", "password")
    expect(dialog.locator("input[name=schema]")).to_have_count(0)
    dialog.get_by_label("Servers").fill(host)
    dialog.get_by_label("Port").fill(port)

    # our extra fields (their section replaces the standard one): label, help text, secrets masked
    dialog.get_by_role("button", name="Extra Fields", exact=True).click()
    for key, field in CONN_FIELDS.items():
        widget = dialog.locator(f"[name=element_{key}]")
        root = dialog.locator("[data-part=root][role=group]").filter(has=page.locator(f"[name=element_{key}]"))
        expect(root.locator("label[data-part=label]").first).to_have_text(field["label"], use_inner_text=True)
        expect(root.locator("[data-part=helper-text]")).to_have_text(field["description"], use_inner_text=True)
        if field["schema"].get("format") == "password":
            expect(widget, f"{key} must be masked").to_have_attribute("type", "password")

    dialog.locator("[name=element_token]").fill(TOKEN)
    dialog.locator("[name=element_connect_timeout]").fill("2")
    assert dialog.locator("[name=element_tls_verify]").is_checked(), "'Verify TLS' must show its default: on"
    assert TOKEN not in dialog.inner_text(), "the token must not be shown in the form"
    dialog.screenshot(path=str(screenshot_path("connection-form.png")))
    _save(page, "nats_browser")

    # stored as typed; the REST API (what the UI reads back) masks the secret
    stored = page.request.get(f"{airflow_ui.url}/api/v2/connections/nats_browser").json()
    extra = json.loads(stored["extra"])
    assert (stored["conn_type"], stored["host"], stored["port"]) == ("nats", host, int(port))
    assert extra["token"] == "***" and extra["connect_timeout"] == 2
    assert extra.get("tls_verify") is not False, "an untouched 'Verify TLS' switch must not turn verification off"
    assert TOKEN not in page.content()

    # Test button against the live server: it only accepts the token saved through the form
    result = _press_test(page, "nats_browser")
    assert result["status"] is True, result
    assert "JetStream enabled" in result["message"]
    page.get_by_text("Test Connection Successful").wait_for()
    assert page.get_by_text(f"Connected to {token_server.url}").first.is_visible()


def test_connection_test_reports_a_dead_server(page, airflow_ui: AirflowUI) -> None:
    dead_port = str(free_port())
    _open_add_form(page, airflow_ui, "nats_dead")
    dialog = page.get_by_role("dialog")
    dialog.get_by_label("Servers").fill("127.0.0.1")
    dialog.get_by_label("Port").fill(dead_port)
    dialog.get_by_role("button", name="Extra Fields", exact=True).click()
    dialog.locator("[name=element_connect_timeout]").fill("1")
    _save(page, "nats_dead")

    result = _press_test(page, "nats_dead")
    assert result["status"] is False, result
    assert f"127.0.0.1:{dead_port}" in result["message"]
    toast = page.get_by_text(f"127.0.0.1:{dead_port}").first
    toast.wait_for()
    assert "reason:" in toast.inner_text()


def test_an_nkey_seed_typed_into_the_form_is_never_shown_again(
        page, airflow_ui: AirflowUI, nkey_server: tuple[EmbeddedNatsServer, str]) -> None:
    server, seed = nkey_server
    host, port = server.url.split("://", 1)[1].rsplit(":", 1)
    _open_add_form(page, airflow_ui, "nats_seed")
    dialog = page.get_by_role("dialog")
    dialog.get_by_label("Servers").fill(host)
    dialog.get_by_label("Port").fill(port)
    dialog.get_by_role("button", name="Extra Fields", exact=True).click()
    seed_field = dialog.locator("[name=element_nkey_seed_secret]")
    expect(seed_field).to_have_attribute("type", "password")
    seed_field.fill(seed)
    dialog.locator("[name=element_connect_timeout]").fill("2")
    _save(page, "nats_seed")

    stored = page.request.get(f"{airflow_ui.url}/api/v2/connections/nats_seed")
    listed = page.request.get(f"{airflow_ui.url}/api/v2/connections?limit=100")
    assert seed not in stored.text() and seed not in listed.text()
    assert json.loads(stored.json()["extra"])["nkey_seed_secret"] == "***"

    # the edit form shows the field masked and holds no seed; saved untouched, the seed is kept
    row = page.get_by_role("row").filter(has_text="nats_seed")
    row.get_by_role("button", name="Edit Connection").click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_role("button", name="Extra Fields", exact=True).click()
    expect(dialog.locator("[name=element_nkey_seed_secret]")).to_have_attribute("type", "password")
    assert seed not in page.content()
    dialog.get_by_role("button", name="Save").click()
    page.get_by_text("Connection has been successfully updated").wait_for()
    expect(page.locator("[name^=element_]")).to_have_count(0)
    result = _press_test(page, "nats_seed")
    assert result["status"] is True, result  # the server admits only this seed's user
    assert seed not in page.content()
