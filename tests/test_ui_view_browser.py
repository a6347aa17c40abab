"""The JetStream view in Airflow 3's real UI (a real api-server), driven by headless Chromium.

On the shared api-server (tests/support/airflow_ui.py), whose nats-server holds the seeded trouble
(tests/support/jetstream_view.py): an API client without a login gets 401 and a browser goes to Airflow's
login page; logged in, the Browse menu entry shows the view inside Airflow; the page puts the problems on
top (an abandoned batch with its batch id, a given-up message, the ledger run's failed and overdue batches,
a broken source, a slow consumer) with the rows marked; a publish task run with ``airflow dags test`` has a
"JetStream" extra link, stored relative, that opens the view at the row of the stream it published to
(named by its result: the task gives only a subject).
Saves jetstream-view.png (problems flagged) and jetstream-in-airflow.png (docs/img under `make screenshots`).
"""

from __future__ import annotations

import textwrap
import urllib.error
import urllib.request

import pytest
from playwright.sync_api import expect

from tests.support import jetstream_view as seeded
from tests.support.airflow_cli import run_airflow
from tests.support.airflow_ui import VIEW_CONN, AirflowUI
from tests.support.screenshots import screenshot_path

pytestmark = pytest.mark.browser

DAG_ID = "jetstream_view_link"
LINK_DAG = f'''
import pendulum
from airflow.sdk import DAG
from airflow_jetstream.operators.publish import JetStreamAtomicBatchPublishOperator

with DAG(dag_id="{DAG_ID}", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), schedule=None):
    JetStreamAtomicBatchPublishOperator(task_id="publish", subject="orders.link",  # no stream=: from the result
                                        messages=[{{"data": {{"n": 1}}}}], nats_conn_id="{VIEW_CONN}")
'''


def _cell(page, row_id: str, column: str):
    """The cell of a view table's row under the column header ``column``."""
    row = page.locator(f'[id="{row_id}"]')
    headers = row.locator("xpath=ancestor::table//th").all_inner_texts()
    return row.locator("td").nth(headers.index(column))


def test_without_login_api_clients_get_401_and_browsers_the_login_page(airflow_ui: AirflowUI) -> None:
    for path in (f"/jetstream/connections/{VIEW_CONN}", f"/jetstream/api/connections/{VIEW_CONN}", "/jetstream/"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{airflow_ui.url}{path}", timeout=10)
        assert refused.value.code == 401, path
        assert seeded.STREAM not in refused.value.read().decode()
    request = urllib.request.Request(f"{airflow_ui.url}/jetstream/connections/{VIEW_CONN}",
                                     headers={"Accept": "text/html,application/xhtml+xml"})
    with urllib.request.urlopen(request, timeout=10) as landed:  # follows the redirect, as a browser does
        assert landed.status == 200 and "/auth/login?next=" in landed.url, landed.url
        assert seeded.STREAM not in landed.read().decode()


def test_view_in_airflow_puts_problems_first(page, airflow_ui: AirflowUI) -> None:
    page.goto(f"{airflow_ui.url}/plugin/jetstream", wait_until="networkidle")  # Browse > JetStream
    frame = page.frame_locator("iframe")
    frame.locator("input[name=connection_id]").fill(VIEW_CONN)
    frame.get_by_role("button", name="Open").click()
    expect(frame.locator("#problems[data-level=error]")).to_be_visible()
    page.screenshot(path=str(screenshot_path("jetstream-in-airflow.png")))

    page.goto(f"{airflow_ui.url}/jetstream/connections/{VIEW_CONN}?per_page=8", wait_until="networkidle")
    problems = page.locator("table[data-section=problems] tbody tr")
    expect(problems.first).to_have_attribute("class", "row-error")
    for kind in ("batch_abandoned", "max_deliveries", "ledger_failed", "source_inactive"):
        expect(page.locator(f'#problems tr[data-kind="{kind}"]')).to_have_count(1)
    abandoned = page.locator('#problems tr[data-kind="batch_abandoned"]')
    expect(abandoned).to_contain_text(seeded.ABANDONED_BATCH)
    abandoned.get_by_role("link").click()  # to the advisory's row, on its page of the advisory table
    row = page.locator("tr[id^=advisory-].row-error", has_text="batch_abandoned")
    expect(row).to_contain_text(f"batch={seeded.ABANDONED_BATCH}")
    page.goto(f"{airflow_ui.url}/jetstream/connections/{VIEW_CONN}?per_page=8", wait_until="networkidle")
    consumer = f"consumer-{seeded.TROUBLE}-{seeded.SLOW}"
    expect(page.locator(f'[id="{consumer}"]')).to_have_attribute("data-problem", "warning")
    page.screenshot(path=str(screenshot_path("jetstream-view.png")), full_page=True)


def test_a_stream_past_the_first_page_and_its_rows(page, airflow_ui: AirflowUI) -> None:
    page.goto(f"{airflow_ui.url}/jetstream/connections/{VIEW_CONN}", wait_until="networkidle")
    expect(page.locator("[data-count=streams]")).to_contain_text("showing 1-50 of")
    page.locator(f'[id="stream-{seeded.AGG}"]').click()  # the anchor of a stream on another page
    expect(_cell(page, f"stream-{seeded.AGG}", "Messages")).to_have_text(str(seeded.MESSAGES))
    expect(page.locator(f'[id="source-{seeded.AGG}-{seeded.STREAM}"]')).to_be_visible()


def test_extra_link_of_a_publish_task_opens_the_view_at_its_stream(page, airflow_ui: AirflowUI) -> None:
    (airflow_ui.home / "dags" / f"{DAG_ID}.py").write_text(textwrap.dedent(LINK_DAG))
    ran = run_airflow(["dags", "test", DAG_ID], airflow_ui.env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    runs = page.request.get(f"{airflow_ui.url}/api/v2/dags/{DAG_ID}/dagRuns").json()["dag_runs"]
    run_id = runs[0]["dag_run_id"]
    links = page.request.get(  # what the task page's "Extra links" buttons show
        f"{airflow_ui.url}/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/publish/links").json()
    link = f"/jetstream/connections/{VIEW_CONN}?stream={seeded.STREAM}#stream-{seeded.STREAM}"
    assert links["extra_links"] == {"JetStream": link}, "stored relative: it opens on any later deployment"

    page.goto(f"{airflow_ui.url}/jetstream/", wait_until="networkidle")  # so the link is a new page load
    page.goto(f"{airflow_ui.url}{link}", wait_until="networkidle")
    expect(_cell(page, f"stream-{seeded.STREAM}", "Messages")).to_have_text(str(seeded.MESSAGES + 1))
