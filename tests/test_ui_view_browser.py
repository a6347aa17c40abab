"""The JetStream view in Airflow 3's real UI, driven by headless Chromium.

On the shared api-server (tests/support/airflow_ui.py): the view refuses a request without
Airflow's login; in the browser logged in through Airflow's login page, the Browse menu entry
shows the view inside Airflow, the view shows the seeded stream, consumer, source, ledger run and
advisories, and a publish task run with ``airflow dags test`` has a "JetStream" extra link that
opens the view at its stream. Saves docs/img/jetstream-view.png and jetstream-in-airflow.png.
"""

from __future__ import annotations

import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.support import jetstream_view as seeded
from tests.support.airflow_cli import run_airflow
from tests.support.airflow_ui import VIEW_CONN, AirflowUI

pytestmark = pytest.mark.browser

IMG = Path(__file__).resolve().parents[1] / "docs" / "img"
DAG_ID = "jetstream_view_link"
LINK_DAG = f'''
import pendulum
from airflow.sdk import DAG
from airflow_jetstream.operators.publish import JetStreamAtomicBatchPublishOperator

with DAG(dag_id="{DAG_ID}", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), schedule=None):
    JetStreamAtomicBatchPublishOperator(task_id="publish", stream="{seeded.STREAM}", subject="orders.link",
                                        messages=[{{"data": {{"n": 1}}}}], nats_conn_id="{VIEW_CONN}")
'''


def _cell(page, row_id: str, column: str):
    """The cell of a view table's row under the column header ``column``."""
    row = page.locator(f'[id="{row_id}"]')
    headers = row.locator("xpath=ancestor::table//th").all_inner_texts()
    return row.locator("td").nth(headers.index(column))


def test_view_refuses_a_request_without_login(airflow_ui: AirflowUI) -> None:
    for path in (f"/jetstream/connections/{VIEW_CONN}", f"/jetstream/api/connections/{VIEW_CONN}", "/jetstream/"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{airflow_ui.url}{path}", timeout=10)
        assert refused.value.code == 401, path
        assert seeded.STREAM not in refused.value.read().decode()


def test_view_in_airflow_shows_streams_consumers_ledger(page, airflow_ui: AirflowUI) -> None:
    page.goto(f"{airflow_ui.url}/plugin/jetstream", wait_until="networkidle")  # Browse > JetStream
    frame = page.frame_locator("iframe")
    frame.locator("input[name=connection_id]").fill(VIEW_CONN)
    frame.get_by_role("button", name="Open").click()
    expect(frame.locator(f'[id="stream-{seeded.STREAM}"]')).to_be_visible()
    IMG.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMG / "jetstream-in-airflow.png"))

    page.goto(f"{airflow_ui.url}/jetstream/connections/{VIEW_CONN}", wait_until="networkidle")
    expect(_cell(page, f"stream-{seeded.STREAM}", "Messages")).to_have_text(str(seeded.MESSAGES))
    consumer = f"consumer-{seeded.STREAM}-{seeded.WORKER}"
    expect(_cell(page, consumer, "Pending")).to_have_text(str(seeded.MESSAGES - 2))
    expect(_cell(page, consumer, "Ack pending")).to_have_text("2")
    expect(page.locator(f'[id="consumer-{seeded.STREAM}-{seeded.PAUSED}"]')).to_contain_text("until")
    expect(page.locator(f'[id="source-{seeded.AGG}-{seeded.STREAM}"]')).to_be_visible()
    expect(_cell(page, f"run-{seeded.RUN_ID}", "Batches")).to_have_text(str(seeded.BATCHES))
    expect(_cell(page, f"run-{seeded.RUN_ID}", "Consumed")).to_have_text("1")
    expect(page.locator("table[data-section=advisories] tbody tr").first).to_be_visible()
    page.screenshot(path=str(IMG / "jetstream-view.png"), full_page=True)


def test_extra_link_of_a_publish_task_opens_the_view(page, airflow_ui: AirflowUI) -> None:
    (airflow_ui.home / "dags" / f"{DAG_ID}.py").write_text(textwrap.dedent(LINK_DAG))
    ran = run_airflow(["dags", "test", DAG_ID], airflow_ui.env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    runs = page.request.get(f"{airflow_ui.url}/api/v2/dags/{DAG_ID}/dagRuns").json()["dag_runs"]
    run_id = runs[0]["dag_run_id"]
    links = page.request.get(  # what the task page's "Extra links" buttons show
        f"{airflow_ui.url}/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/publish/links").json()
    assert links["extra_links"] == {"JetStream": f"/jetstream/connections/{VIEW_CONN}#stream-{seeded.STREAM}"}

    page.goto(f"{airflow_ui.url}/jetstream/", wait_until="networkidle")  # so the link is a new page load
    page.goto(f"{airflow_ui.url}{links['extra_links']['JetStream']}", wait_until="networkidle")
    expect(_cell(page, f"stream-{seeded.STREAM}", "Messages")).to_have_text(str(seeded.MESSAGES + 1))
