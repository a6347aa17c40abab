"""First contact with a real deployment: the scheduled example on its own schedule, secrets kept by Airflow.

One deployment for the module (tests.infra.airflow_local.LocalAirflow on PostgreSQL: api-server, scheduler,
dag-processor, triggerer; Airflow's default timetable settings) against a nats-server that admits only an
NKey user, with ``nats_default`` stored in the database holding the seed (``nkey_seed_secret``):

* the connections API (get and list, with a real login token) and the CLI show the seed as Airflow shows a
  password; nothing of it reaches a task log, a component log, an XCom or a rendered field;
* ``jetstream_orders_incremental`` runs three consecutive intervals through the scheduler (a backfill), each
  reading the orders stored in its interval, and an interval cleared and run again stores nothing twice.
  Time is compressed here, not in the DAG: the test serves the example with its hourly cron made a 20-second one
  (croniter's sixth field, seconds; the same file otherwise) and publishes orders into three consecutive
  intervals while Airflow starts. The scheduler's own cron runs are off (``[scheduler] use_job_schedule =
  False``), so the backfill's runs are the only ones; the DAG's timetable settings are Airflow's defaults.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import re
import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection
from airflow_jetstream.client.subjects import is_fence_subject
from airflow_jetstream.embedded import EmbeddedNatsServer
from tests.infra.airflow_local import LocalAirflow, write_private
from tests.infra.postgres import EmbeddedPostgres
from tests.support.airflow_api import Api
from tests.support.nats_calls import call_on_server
from tests.support.nkeys_util import new_user_nkey
from tests.support.polling import wait_until

# Real components and Spark on a shared 2-core box.
pytestmark = [pytest.mark.airflow_cli, pytest.mark.spark, pytest.mark.timeout(1800)]

EXAMPLES = Path(__file__).resolve().parents[1] / "dags_examples"
DAG_ID, STEP = "jetstream_orders_incremental", "stream_large_orders"
HOURLY = 'CronDataIntervalTimetable("@hourly"'
INTERVALS, ORDERS_PER_INTERVAL, MIN_AMOUNT = 3, 12, 50  # the example's --min-amount default is 50
#: The compressed interval: short enough that the three have passed by the time Airflow is up (the test no longer
#: waits on the clock), long enough that each interval's publish (a connection and 12 messages) lands inside it.
INTERVAL = timedelta(seconds=20)
STEP_LINE = re.compile(r"incremental step up to (\S+): read (\d+) message\(s\)")


@pytest.fixture(scope="module")
def nkey() -> tuple[str, str]:
    return new_user_nkey()


@pytest.fixture(scope="module")
def nats(nkey: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNatsServer]:
    server = EmbeddedNatsServer(store_dir=tmp_path_factory.mktemp("first-contact-nats"),
                                config={"authorization": {"users": [{"nkey": nkey[1]}]}}).start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def settings(nats: EmbeddedNatsServer, nkey: tuple[str, str]) -> ConnectionSettings:
    return ConnectionSettings(servers=nats.url, nkey_seed_secret=nkey[0], connect_timeout=2, request_timeout=10)


@dataclass
class IntervalOrders:
    """Orders published into the consecutive ``INTERVAL``-long intervals starting at ``start``."""

    start: datetime
    thread: threading.Thread
    errors: list[BaseException] = field(default_factory=list)

    def boundary(self, k: int) -> datetime:
        return self.start + k * INTERVAL

    def wait_published(self) -> None:
        self.thread.join(timeout=INTERVALS * INTERVAL.total_seconds() + 120)
        assert not self.thread.is_alive() and not self.errors, self.errors


def _order(n: int) -> bytes:
    return json.dumps({"order": n, "amount": (n * 37) % 100}).encode()


@pytest.fixture(scope="module")
def orders(settings: ConnectionSettings) -> IntervalOrders:
    """ORDERS_AGG (the example's config, plus a subject to publish on) and a thread that publishes
    ``ORDERS_PER_INTERVAL`` orders after each of the next interval boundaries, while Airflow starts."""
    spec = importlib.util.spec_from_file_location("orders_pipeline_common", EXAMPLES / "orders_pipeline_common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    call_on_server(settings, ensure_stream, {**common.AGG_STREAM_CONFIG, "subjects": ["orders.agg.>"]})
    now = datetime.now(UTC)
    step = int(INTERVAL.total_seconds())
    begun = now.replace(second=now.second - now.second % step, microsecond=0)  # the interval now running
    start = begun + (INTERVAL if now - begun > INTERVAL / 2 else timedelta(0))  # with at least half of it left
    errors: list[BaseException] = []

    def publish_all() -> None:
        try:
            for k in range(INTERVALS):
                begins = start + k * INTERVAL
                wait_until(lambda begins=begins: datetime.now(UTC) >= begins, f"interval {k} to begin", timeout=90,
                           every=0.2)
                numbers = range(k * ORDERS_PER_INTERVAL, (k + 1) * ORDERS_PER_INTERVAL)

                async def go(numbers: range = numbers) -> None:
                    async with open_connection(settings) as conn:
                        for n in numbers:
                            await conn.js.publish("orders.agg.emea", _order(n))

                asyncio.run(go())
        except BaseException as exc:  # handed to the test, which joins the thread
            errors.append(exc)

    thread = threading.Thread(target=publish_all, name="interval-orders", daemon=True)
    thread.start()
    return IntervalOrders(start=start, thread=thread, errors=errors)


@pytest.fixture(scope="module")
def dags(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example DAG as the user gets it, its hourly cron made ``INTERVAL``-long, beside what it imports."""
    folder = tmp_path_factory.mktemp("first-contact-dags")
    shutil.copy(EXAMPLES / "orders_pipeline_common.py", folder)
    shutil.copytree(EXAMPLES / "spark_apps", folder / "spark_apps")
    source = (EXAMPLES / f"{DAG_ID}.py").read_text()
    assert source.count(HOURLY) == 1, "the example's schedule is no longer the hourly CronDataIntervalTimetable"
    every = f'CronDataIntervalTimetable("* * * * * */{int(INTERVAL.total_seconds())}"'
    (folder / f"{DAG_ID}.py").write_text(source.replace(HOURLY, every))
    return folder


@pytest.fixture(scope="module")
def airflow(nats: EmbeddedNatsServer, nkey: tuple[str, str], dags: Path, postgres: EmbeddedPostgres,
            orders: IntervalOrders, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalAirflow]:
    with LocalAirflow(tmp_path_factory.mktemp("first-contact-airflow"), nats_url=nats.url, dags_folder=dags,
                      connections_in_db=True, nats_extra={"nkey_seed_secret": nkey[0], "connect_timeout": 5},
                      database_url=postgres.sqlalchemy_url,
                      extra_env={"AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False"}) as deployment:
        deployment.start()
        yield deployment


def test_the_nkey_seed_is_masked_where_airflow_masks_its_own_secrets(airflow: LocalAirflow,
                                                                     nkey: tuple[str, str]) -> None:
    seed = nkey[0]
    api = Api(airflow)
    got = api.text("GET", "/api/v2/connections/nats_default")
    listed = api.text("GET", "/api/v2/connections?limit=100")
    assert seed not in got and seed not in listed
    assert json.loads(json.loads(got)["extra"])["nkey_seed_secret"] == "***"
    by_id = {c["connection_id"]: c for c in json.loads(listed)["connections"]}
    assert json.loads(by_id["nats_default"]["extra"])["nkey_seed_secret"] == "***"

    # the CLI treats the seed as it treats a name Airflow itself masks (a reference connection's token)
    other_seed, reference = new_user_nkey()[0], "reference-t0ken-0123456789"
    airflow.cli("connections", "add", "nats_reference", "--conn-type", "nats", "--conn-host", "127.0.0.1",
                "--conn-extra", json.dumps({"token": reference}))
    added = airflow.cli("connections", "add", "nats_cli", "--conn-type", "nats", "--conn-host", "127.0.0.1",
                        "--conn-extra", json.dumps({"nkey_seed_secret": other_seed})).stdout
    assert "nats_cli" in added and other_seed not in added, added
    listing = ("connections", "list", "--show-values", "--hide-sensitive", "--output", "json")
    export = ("connections", "export", "-", "--file-format", "json")
    get_cli, get_reference = (("connections", "get", name, "-o", "json") for name in ("nats_cli", "nats_reference"))
    # each command once (a CLI call is seconds of Airflow's start-up); list and export print both connections
    printed = {command: airflow.cli(*command).stdout for command in (listing, export, get_cli, get_reference)}
    rows = {row["conn_id"]: row for row in json.loads(printed[listing])}
    assert rows["nats_cli"]["extra_dejson"] == rows["nats_reference"]["extra_dejson"] == "***"
    for ours, theirs in ((listing, listing), (export, export), (get_cli, get_reference)):
        # list --hide-sensitive prints every connection's extras in its get_uri column (apache/airflow#73157)
        shown, reference_shown = other_seed in printed[ours], reference in printed[theirs]
        assert shown == reference_shown, f"airflow {' '.join(ours)}: seed shown {shown}, token {reference_shown}"
    assert "nkey_seed_secret" in api.text("GET", "/api/v2/connections/nats_cli")
    assert other_seed not in api.text("GET", "/api/v2/connections/nats_cli")

    # Airflow's audit log keeps each CLI command with only its password flags masked: the seed given in
    # --conn-extra above is there in clear, which is why docs/connection.md imports a private file instead
    imported_seed = new_user_nkey()[0]
    secret_file = airflow.home / "nats_imported.json"
    write_private(secret_file, {"nats_imported": {"conn_type": "nats", "host": "127.0.0.1",
                                                  "extra": {"nkey_seed_secret": imported_seed}}})
    airflow.cli("connections", "import", str(secret_file))
    secret_file.unlink()
    audit = api.text("GET", "/api/v2/eventLogs?limit=200&order_by=-id")
    assert "cli_connections_import" in audit and "cli_connections_add" in audit, audit[-2000:]
    assert other_seed in audit, "the trap docs/connection.md warns about (Airflow masks only password flags)"
    assert imported_seed not in audit
    assert "***" in json.loads(api.text("GET", "/api/v2/connections/nats_imported"))["extra"]


def _polled(fetch: Any, what: str, timeout: float, every: float) -> Any:
    """``fetch()``'s first truthy value, asked every ``every`` seconds (the api-server shares the box)."""
    seen: list[Any] = []
    wait_until(lambda: seen.append(fetch()) or seen[-1], what, timeout=timeout, every=every)
    return seen[-1]


def _runs(api: Api) -> list[dict[str, Any]]:
    return api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?order_by=logical_date&limit=50")["dag_runs"]


def _finished(api: Api, count: int) -> list[dict[str, Any]] | None:
    """The runs once ``count`` of them ended in success; a failed run fails the test at once."""
    runs = _runs(api)
    failed = [r["dag_run_id"] for r in runs if r["state"] == "failed"]
    assert not failed, f"failed runs: {failed}"
    return runs if len(runs) == count and all(r["state"] == "success" for r in runs) else None


def _task(api: Api, run_id: str) -> str:
    return f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{STEP}"


def _step_log(api: Api, run_id: str, try_number: int) -> tuple[str, int]:
    """``(interval end, messages read)`` as the Spark step printed them into the task's log."""
    log = json.dumps(api.call("GET", f"{_task(api, run_id)}/logs/{try_number}?full_content=true"))
    found = STEP_LINE.findall(log.replace("\\n", "\n"))
    assert len(found) == 1, f"{run_id} try {try_number}: {found}"
    return found[0][0], int(found[0][1])


def _stored(settings: ConnectionSettings, stream: str) -> list[tuple[datetime, dict[str, Any]]]:
    """Every message of ``stream`` but its write fences: the time the server stored it and its JSON payload."""
    async def read(conn: Any) -> list[tuple[datetime, dict[str, Any]]]:
        last = (await conn.api_request(f"STREAM.INFO.{stream}", {}, context="test"))["state"]["last_seq"]
        out = []
        for seq in range(1, last + 1):
            msg = (await conn.api_request(f"STREAM.MSG.GET.{stream}", {"seq": seq}, context="test"))["message"]
            if is_fence_subject(msg["subject"]):
                continue
            stamp = re.sub(r"(\.\d{6})\d*", r"\1", msg["time"].replace("Z", "+00:00"))
            out.append((datetime.fromisoformat(stamp), json.loads(base64.b64decode(msg["data"]))))
        return out

    return call_on_server(settings, read)


def test_the_scheduled_example_runs_three_consecutive_intervals_and_a_cleared_one_stores_nothing_twice(
        airflow: LocalAirflow, orders: IntervalOrders, settings: ConnectionSettings, nkey: tuple[str, str]) -> None:
    orders.wait_published()
    last_end = orders.boundary(INTERVALS)
    wait_until(lambda: datetime.now(UTC) > last_end, "the third interval to end", timeout=90, every=0.5)
    api = Api(airflow)
    wait_until(lambda: any(d["dag_id"] == DAG_ID for d in api.call("GET", "/api/v2/dags")["dags"]),
               f"the dag-processor to load {DAG_ID}", timeout=240, every=1)
    airflow.cli("backfill", "create", "--dag-id", DAG_ID, "--from-date", orders.boundary(0).isoformat(),
                "--to-date", orders.boundary(INTERVALS - 1).isoformat(), "--reprocess-behavior", "completed",
                "--max-active-runs", "1")
    runs = _polled(lambda: _finished(api, INTERVALS), f"{INTERVALS} backfilled runs to succeed", timeout=1200,
                   every=2)
    intervals = [(datetime.fromisoformat(r["data_interval_start"]), datetime.fromisoformat(r["data_interval_end"]))
                 for r in runs]
    assert intervals == [(orders.boundary(k), orders.boundary(k + 1)) for k in range(INTERVALS)], "consecutive"

    # each run read the orders the server stored in its interval: counts from the server's own timestamps
    stored = _stored(settings, "ORDERS_AGG")
    per_interval = [sum(start <= when < end for when, _ in stored) for start, end in intervals]
    assert sum(per_interval) == INTERVALS * ORDERS_PER_INTERVAL and all(per_interval), per_interval
    assert [_step_log(api, r["dag_run_id"], 1)[1] for r in runs] == per_interval
    large = sorted(o["order"] for _, o in stored if o["amount"] >= MIN_AMOUNT)
    assert sorted(o["order"] for _, o in _stored(settings, "ORDERS_LARGE")) == large, "each large order once"

    # the middle interval cleared and run again (the UI's Clear): the same orders again, nothing stored twice
    middle = runs[1]["dag_run_id"]
    api.call("POST", f"/api/v2/dags/{DAG_ID}/clearTaskInstances",
             {"dry_run": False, "dag_run_id": middle, "task_ids": [STEP], "only_failed": False})
    wait_until(lambda: api.call("GET", _task(api, middle))["try_number"] == 2
               and api.call("GET", _task(api, middle))["state"] == "success",
               "the cleared step to run again", timeout=600, every=2)
    assert _step_log(api, middle, 2)[1] == per_interval[1]
    again = Counter(o["order"] for _, o in _stored(settings, "ORDERS_LARGE"))
    assert sorted(again) == large and set(again.values()) == {1}, "nothing stored twice"

    # the seed never left the connection: task and component logs, XComs, rendered fields
    seed = nkey[0]
    for run in runs:
        task = api.text("GET", _task(api, run["dag_run_id"]))
        assert seed not in task and "rendered_fields" in task
        xcoms = api.call("GET", f"{_task(api, run['dag_run_id'])}/xcomEntries")["xcom_entries"]
        for entry in xcoms:
            assert seed not in api.text("GET", f"{_task(api, run['dag_run_id'])}/xcomEntries/{entry['key']}")
        assert seed not in api.text("GET", f"{_task(api, run['dag_run_id'])}/logs/1?full_content=true")
    leaked = [str(path) for path in airflow.home.rglob("*")
              if path.is_file() and seed.encode() in path.read_bytes()]
    assert leaked == [], "files of the deployment holding the seed"
