"""A real Airflow deployment: api-server, scheduler, dag-processor and triggerer as separate processes.

One deployment for the module (``tests.infra.airflow_local.LocalAirflow``: LocalExecutor,
PostgreSQL as users run it, everything on 127.0.0.1, log servers skipped) with the example DAGs against one real
nats-server. It proves that the orders pipeline runs to success through the scheduler with its
sensors deferred to the triggerer, that sensors started and ended in the triggerer need no worker at all, that the
examples share the server, and that the event-driven
DAG turns every published message into exactly one asset event (by stream sequence) across a clean
triggerer stop, two triggerers at once and, with the repeat made visible and harmless, a crash.
The UI test (headless Chromium) logs in, triggers the pipeline and opens a sensor's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection
from airflow_jetstream.client.admin.consumers import consumer_status, ensure_consumer
from airflow_jetstream.client.errors import ConsumerNotFoundError, StreamNotFoundError
from airflow_jetstream.embedded import EmbeddedNatsServer
from airflow_jetstream.embedded.server import free_port
from tests.infra.airflow_local import LocalAirflow, json_column
from tests.infra.postgres import EmbeddedPostgres, EmbeddedPostgresError
from tests.support.airflow_api import Api
from tests.support.airflow_ui import log_in
from tests.support.checkout import copy_checkout, git_status
from tests.support.chromium import CHROMIUM, install_chromium
from tests.support.kv_keys import kv_keys
from tests.support.nats_calls import call_on_server
from tests.support.polling import wait_until

# Real components on a shared 2-core box: a pipeline run takes 1-2 min idle, up to 10 min under heavy load.
pytestmark = [pytest.mark.airflow_cli, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[1]
PIPELINE, GUARDED, PUBLISH_READY, PROCESS_READY, ABANDONED = (
    "jetstream_orders_pipeline", "publish_orders_guarded", "publish_ready_orders", "process_ready_orders",
    "handle_abandoned_batches")
READY_STREAM, READY_CONSUMER, PROCESSED_BUCKET = "ORDERS_READY", "airflow_orders_ready", "orders_ready_processed"
PROBE = "deferred_message_probe"  # tests/airflow_dags: a JetStreamMessageSensor deferred to the triggerer
STARTED = "start_from_trigger_probe"  # tests/airflow_dags: state sensors the scheduler defers (start_from_trigger)
ENDED = "end_from_trigger_probe"  # tests/airflow_dags: sensors the scheduler defers and the triggerer ends
LOCAL_BUNDLE = "airflow.dag_processing.bundles.local.LocalDagBundle"
MAX_UNCONFIRMED = 4  # the watcher's bound on messages handed to Airflow and not yet confirmed stored: bounds repeats
#: The watcher consumer's ack_wait (the example's default is 30 s): how long the messages a killed triggerer held wait
#: before they come again. A live triggerer keeps its messages whatever the value (test_airflow_failover runs on 10 s).
ACK_WAIT = "10s"
#: Seconds without a heartbeat before a triggerer counts as dead and its triggers go to another (Airflow's default is
#: 30): a triggerer started after a SIGKILL waits that long for the killed one's watcher. As in test_airflow_failover.
HEALTH_CHECK = 15


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNatsServer]:
    server = EmbeddedNatsServer(store_dir=tmp_path_factory.mktemp("deploy-nats")).start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def airflow(nats: EmbeddedNatsServer, postgres: EmbeddedPostgres,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalAirflow]:
    home = tmp_path_factory.mktemp("deploy-airflow")
    bundles = [{"name": "dags-folder", "classpath": LOCAL_BUNDLE, "kwargs": {}},  # the examples (DAGS_FOLDER)
               {"name": "test-probes", "classpath": LOCAL_BUNDLE,
                "kwargs": {"path": str(ROOT / "tests" / "airflow_dags")}}]
    with LocalAirflow(home, nats_url=nats.url, dags_folder=ROOT / "dags_examples", database_url=postgres.sqlalchemy_url,
                      extra_env={"JETSTREAM_DEMO_MAX_UNCONFIRMED": str(MAX_UNCONFIRMED),
                                 "JETSTREAM_DEMO_ACK_WAIT": ACK_WAIT,
                                 "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": str(HEALTH_CHECK),
                                 "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles)}) as deployment:
        deployment.start()
        yield deployment


@pytest.fixture(scope="module")
def nats_settings(nats: EmbeddedNatsServer) -> ConnectionSettings:
    return ConnectionSettings(servers=nats.url, connect_timeout=2, request_timeout=5)


def wait_dag_parsed(airflow: LocalAirflow, dag_id: str) -> None:
    wait_until(lambda: airflow.query("SELECT 1 FROM dag WHERE dag_id = :dag AND NOT is_stale", dag=dag_id),
               f"the dag-processor to load {dag_id}", timeout=180, every=0.5)


def trigger(airflow: LocalAirflow, dag_id: str, conf: dict | None = None) -> str:
    wait_dag_parsed(airflow, dag_id)
    run = Api(airflow).call("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})
    return run["dag_run_id"]


def run_state(airflow: LocalAirflow, dag_id: str, run_id: str) -> str | None:
    rows = airflow.query("SELECT state FROM dag_run WHERE dag_id = :dag AND run_id = :run", dag=dag_id, run=run_id)
    return rows[0][0] if rows else None


def wait_run_finished(airflow: LocalAirflow, dag_id: str, run_id: str, timeout: float = 900,
                      on_poll=None) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if on_poll is not None:
            on_poll()
        state = run_state(airflow, dag_id, run_id)
        if state in ("success", "failed"):
            return state
        time.sleep(0.5)  # polling the scheduler's progress in the db; the deadline bounds it
    raise AssertionError(f"{dag_id} run {run_id} not finished after {timeout}s (state {state});\n"
                         f"{task_states(airflow, dag_id, run_id)}\n{airflow.log_tail('scheduler')}")


def task_states(airflow: LocalAirflow, dag_id: str, run_id: str) -> dict[str, str]:
    rows = airflow.query("SELECT task_id, state FROM task_instance WHERE dag_id = :dag AND run_id = :run",
                         dag=dag_id, run=run_id)
    return dict(rows)


def ready_events(airflow: LocalAirflow) -> list[dict]:
    """The payloads of the asset events the watcher stored, in storing order."""
    rows = airflow.query("SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                         "WHERE a.name = 'orders_ready' ORDER BY e.id")
    return [json_column(extra)["payload"] for (extra,) in rows]


def publish(settings: ConnectionSettings, count: int) -> list[int]:
    async def go() -> list[int]:
        async with open_connection(settings) as conn:
            return [(await conn.js.publish("orders.ready", json.dumps({"order": i}).encode())).seq
                    for i in range(count)]

    return asyncio.run(go())


def drained(settings: ConnectionSettings) -> bool:
    try:
        return call_on_server(settings, consumer_status, READY_STREAM, READY_CONSUMER)["drained"]
    except ConsumerNotFoundError:  # the watcher has not created it yet
        return False


def active_runs(airflow: LocalAirflow) -> list[tuple]:
    return airflow.query("SELECT run_id FROM dag_run WHERE dag_id = :dag AND state IN ('queued', 'running')",
                         dag=PROCESS_READY)


def processed_seqs(settings: ConnectionSettings) -> set[int]:
    async def go() -> set[int]:
        async with open_connection(settings) as conn:
            return {int(key.split(".")[1]) for key in await kv_keys(conn.js, PROCESSED_BUCKET)}

    return asyncio.run(go())


def _wait_events(airflow: LocalAirflow, settings: ConnectionSettings, seqs: set[int], what: str,
                 timeout: float = 120) -> None:
    wait_until(lambda: seqs <= {e["stream_seq"] for e in ready_events(airflow)} and drained(settings),
               what, timeout=timeout, every=0.2)


def _events_by_seq(airflow: LocalAirflow) -> Counter[int]:
    return Counter(e["stream_seq"] for e in ready_events(airflow))


def _repeats(airflow: LocalAirflow, seqs: list[int]) -> int:
    """Repeat events of ``seqs``; each must say it is one (the server counted the redelivery: delivered > 1)."""
    seen: set[int] = set()
    for event in ready_events(airflow):
        assert event["stream_seq"] not in seen or event["delivered"] > 1, event
        seen.add(event["stream_seq"])
    counts = _events_by_seq(airflow)
    return sum(counts[seq] - 1 for seq in seqs)


def test_event_driven_exactly_once_across_triggerer_stops(airflow: LocalAirflow,
                                                          nats_settings: ConnectionSettings) -> None:
    # the example creates its stream; until then the watcher waits with one line per back-off
    run_id = trigger(airflow, PUBLISH_READY, {"count": 10})
    assert wait_run_finished(airflow, PUBLISH_READY, run_id, timeout=200) == "success"
    expected = set(range(1, 11))
    _wait_events(airflow, nats_settings, expected, "10 asset events from publish_ready_orders")
    log = airflow.log_tail("triggerer", chars=10**7)
    waits = re.findall(r"Watcher on ORDERS_READY/airflow_orders_ready not started: .*?Checking again in", log)
    assert "Traceback" not in log and len(waits) <= 12, f"{len(waits)} back-off lines"

    # (a) clean SIGTERM while messages are in flight, then a restart: nothing lost. The provider takes over no
    # signal: the events Airflow stored in the triggerer's last state sync were never confirmed to the watcher, so
    # their messages come again, visibly, at most max_unconfirmed of them (docs/event-driven.md)
    start = max(expected)
    published = publish(nats_settings, 30)
    assert published == list(range(start + 1, start + 31))
    wait_until(lambda: len(ready_events(airflow)) > len(expected), "the first event of the burst", timeout=60,
               every=0.1)
    assert airflow.stop("triggerer", signal.SIGTERM) == 0
    airflow.start_component("triggerer")
    expected |= set(published)
    _wait_events(airflow, nats_settings, expected, "all events after a clean stop")
    assert set(_events_by_seq(airflow)) == expected
    repeated = _repeats(airflow, published)
    assert repeated <= MAX_UNCONFIRMED, repeated
    print(f"SIGTERM: {repeated} of {len(published)} message(s) repeated (bound {MAX_UNCONFIRMED})")

    # (c) two triggerers at once: each message is one event
    airflow.start_component("triggerer", key="triggerer-2")
    # running, its signal handlers set (the line before it sets them): else the burst may be over before it starts,
    # and a SIGTERM before its handlers ends it by the default action (exit -15; seen with the box loaded)
    wait_until(lambda: "Starting the triggerer" in airflow.log_tail("triggerer-2", chars=10**7),
               "the second triggerer to start", timeout=180, every=0.5)
    published = publish(nats_settings, 30)
    expected |= set(published)
    _wait_events(airflow, nats_settings, expected, "all events with two triggerers")
    assert set(_events_by_seq(airflow)) == expected and _repeats(airflow, published) == 0
    assert airflow.stop("triggerer-2", signal.SIGTERM) == 0

    # (b) SIGKILL mid-burst: nothing lost; a message whose event was stored but not acked repeats, visibly
    # (delivered > 1) and harmlessly (process_ready_orders processes each stream sequence once)
    before = len(ready_events(airflow))
    published = publish(nats_settings, 30)
    wait_until(lambda: len(ready_events(airflow)) > before, "the first event of the burst", timeout=60, every=0.1)
    airflow.stop("triggerer", signal.SIGKILL)
    airflow.start_component("triggerer")
    expected |= set(published)
    _wait_events(airflow, nats_settings, expected, f"all events after a crash (the watcher taken over after "
                 f"{HEALTH_CHECK} s without a heartbeat, its messages redelivered after ack_wait {ACK_WAIT})",
                 timeout=180)
    assert set(_events_by_seq(airflow)) == expected
    repeats = _repeats(airflow, published)
    assert repeats <= MAX_UNCONFIRMED, repeats
    # no later message needed: an event Airflow stored without a run of its own (docs/event-driven.md,
    # "Stranded events") is processed by the run that left it behind
    wait_until(lambda: processed_seqs(nats_settings) == expected and not active_runs(airflow),
               "process_ready_orders to process every stream sequence", timeout=240, every=0.5)
    failed = airflow.query("SELECT run_id FROM dag_run WHERE dag_id = :dag AND state != 'success'", dag=PROCESS_READY)
    assert failed == []
    print(f"SIGKILL: {repeats} of {len(published)} message(s) repeated, each processed once")


#: Personal data and a credential in a message: the run reads them, nothing a viewer can read holds them.
PLANTED = ("078-05-1120", "Bearer planted-9a0e")


def _files_holding(folder: Path, text: str) -> list[str]:
    return [str(path.relative_to(folder)) for path in folder.rglob("*")
            if path.is_file() and text.encode() in path.read_bytes()]


def test_no_message_body_in_the_triggerers_log_or_the_asset_events(airflow: LocalAirflow,
                                                                   nats_settings: ConnectionSettings) -> None:
    """Airflow's triggerer logs every event it fires (``Trigger fired event ... result=``) and keeps it as an
    asset event (``/api/v2/assets/events``), both readable by a viewer; the watcher's event says where the message
    is, and process_ready_orders reads the body back (asset_messages) and processes it."""
    async def go() -> int:
        async with open_connection(nats_settings) as conn:
            body = json.dumps({"order": 4242, "ssn": PLANTED[0]}).encode()
            return (await conn.js.publish("orders.ready", body, headers={"Authorization": PLANTED[1]})).seq

    seq = asyncio.run(go())
    wait_until(lambda: seq in processed_seqs(nats_settings) and not active_runs(airflow),
               "process_ready_orders to process the planted message", timeout=240, every=0.5)
    events = Api(airflow).text("GET", "/api/v2/assets/events?limit=200&order_by=-timestamp")
    assert f'"stream_seq": {seq}' in events.replace('\\"', '"') or f'"stream_seq":{seq}' in events, events[:2000]
    fired = [line for line in airflow.log_tail("triggerer", chars=10**7).splitlines() if "Trigger fired event" in line]
    assert any(str(seq) in line for line in fired), fired[-3:]
    for secret in PLANTED:
        assert secret not in events, "an asset event holds the message's body or headers"
        assert _files_holding(airflow.home, secret) == [], "a log (triggerer, task) holds the body or headers"


def test_a_deferred_message_sensor_leaves_no_body_in_the_triggerers_log(airflow: LocalAirflow,
                                                                        nats_settings: ConnectionSettings) -> None:
    """A JetStreamMessageSensor deferred to the triggerer: its trigger's event (logged by the triggerer as ``Trigger
    fired event ... result=``) says where the matching message is, and no log of the deployment holds the body or
    headers the message carried."""
    async def ensure() -> None:
        async with open_connection(nats_settings) as conn:
            await ensure_stream(conn, {"name": "PROBE", "subjects": ["probe.>"]})

    async def plant() -> int:
        async with open_connection(nats_settings) as conn:
            body = json.dumps({"order": 4343, "ssn": PLANTED[0]}).encode()
            return (await conn.js.publish("probe.orders", body, headers={"Authorization": PLANTED[1]})).seq

    asyncio.run(ensure())
    run_id = trigger(airflow, PROBE)
    wait_until(lambda: task_states(airflow, PROBE, run_id).get("wait_for_the_planted_message") == "deferred",
               "the message sensor to defer to the triggerer", timeout=300, every=0.5)
    seq = asyncio.run(plant())
    state = wait_run_finished(airflow, PROBE, run_id, timeout=300)
    assert state == "success", [(str(path), path.read_text(errors="replace")[-6000:])
                                for path in airflow.home.rglob("*.log") if PROBE in str(path)]
    # Airflow writes a deferred task's trigger log beside its task log (attempt=1.log.trigger.<id>.log)
    fired = [line for path in (airflow.home / "logs").rglob("*.log*") if f"dag_id={PROBE}" in str(path)
             for line in path.read_text(errors="replace").splitlines() if "Trigger fired event" in line]
    assert fired and "matched" in fired[-1] and re.search(rf"\bseq\W+{seq}\b", fired[-1]), fired[-5:]
    for secret in PLANTED:
        assert _files_holding(airflow.home, secret) == [], "a log (triggerer, task) holds the body or headers"


def test_sensors_started_from_the_triggerer_need_no_worker_until_their_trigger_fires(
        airflow: LocalAirflow, nats_settings: ConnectionSettings) -> None:
    """``start_from_trigger``: the scheduler defers each sensor itself (no worker ran it: no host, no pid, no
    first poke in its log, unlike the same sensor deferred from a worker), the triggerer renders the templated
    stream name, and once the consumers are drained a worker runs only ``execute_complete``, whose XCom is the
    state on the rendered stream."""
    stream = "SFT_RUN"

    async def prepare() -> None:
        async with open_connection(nats_settings) as conn:
            await ensure_stream(conn, {"name": stream, "subjects": ["sft.>"]})
            await ensure_stream(conn, {"name": f"{stream}_COPY", "sources": [{"name": stream}]})
            for name in ("A", "B", "C"):
                await ensure_consumer(conn, stream, {"name": name, "ack_policy": "explicit"})
            await conn.js.publish("sft.one", b"{}")

    async def drain() -> None:
        async with open_connection(nats_settings) as conn:
            for name in ("A", "B", "C"):
                sub = await conn.js.pull_subscribe_bind(name, stream=stream)
                for msg in await sub.fetch(1, timeout=5):
                    await msg.ack_sync()

    def deferred() -> dict[str, tuple[str, int | None, int]]:
        rows = airflow.query("SELECT task_id, hostname, pid, try_number FROM task_instance WHERE dag_id = :dag "
                             "AND run_id = :run AND state = 'deferred'", dag=STARTED, run=run_id)
        return {task: (host or "", pid, tries) for task, host, pid, tries in rows}

    asyncio.run(prepare())
    run_id = trigger(airflow, STARTED, {"stream": stream})
    waiting = ("drained_a", "drained_b", "drained_by_a_worker")
    wait_until(lambda: set(waiting) <= set(deferred()), "the drained sensors to defer", timeout=300, every=0.5)
    rows = deferred()
    assert [rows["drained_a"], rows["drained_b"]] == [("", None, 1)] * 2  # the scheduler's try: no worker ran them
    assert rows["drained_by_a_worker"][0] and rows["drained_by_a_worker"][1] is not None  # its worker's host, pid
    # The scheduler must have taken the worker's report of that deferral before the trigger fires: handled after the
    # resumed try started, Airflow 3.3 fails the resumed try (apache/airflow#72716, #71580).
    reported = f"TaskInstance Finished: dag_id={STARTED}, task_id=drained_by_a_worker, run_id={run_id},"
    wait_until(lambda: reported in airflow.log_tail("scheduler", 10**9), "the scheduler to take the worker's deferral",
               timeout=300, every=0.5)
    asyncio.run(drain())
    assert wait_run_finished(airflow, STARTED, run_id, timeout=300) == "success", task_states(airflow, STARTED, run_id)
    results = dict(airflow.query("SELECT task_id, value FROM xcom WHERE dag_id = :dag AND run_id = :run "
                                 "AND key = 'return_value'", dag=STARTED, run=run_id))
    for task in waiting:
        assert json_column(results[task])["stream"] == stream and json_column(results[task])["num_pending"] == 0
    assert json_column(results["caught_up"])["caught_up"] is True
    paths = [path for path in (airflow.home / "logs" / f"dag_id={STARTED}" / f"run_id={run_id}").rglob("attempt=*")
             if ".trigger." not in path.name]  # beside each its trigger's log, attempt=1.log.trigger.<id>.log
    assert {path.name for path in paths} == {"attempt=1.log"}  # one try each
    task_logs = {path.parent.name.removeprefix("task_id="): path.read_text(errors="replace") for path in paths}
    assert sorted(task_logs) == ["caught_up", *waiting]
    assert "Deferring: waiting" in task_logs.pop("drained_by_a_worker")
    for text in task_logs.values():  # the worker ran execute_complete only: no poke, no deferral of its own
        assert "Done: " in text and "Deferring: waiting" not in text and "Not yet:" not in text, text[-3000:]


def test_sensors_started_and_ended_in_the_triggerer_need_no_worker_at_all(
        airflow: LocalAirflow, nats: EmbeddedNatsServer, nats_settings: ConnectionSettings,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``start_from_trigger`` and ``end_from_trigger``: the scheduler defers the drained, KV and ledger sensors, the
    triggerer ends each as success once its condition holds; no worker ever ran them (no host, no pid, no task log
    beside the trigger's), the ``Done: ...`` line is in the trigger's log, and the XCom in the metadata database is
    what ``execute_complete`` returns, stored as a worker stores it (a JSON object a downstream task reads back
    as it is). A sensor deferred from a worker and ended by the triggerer ran on a worker once (its first poke)."""
    from airflow.sdk.bases.xcom import BaseXCom

    from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
    from airflow_jetstream.sensors.consumer import JetStreamConsumerDrainedSensor
    from airflow_jetstream.sensors.kv import JetStreamKeyValueSensor
    from airflow_jetstream.sensors.ledger import JetStreamBatchLedgerSensor
    from tests.conftest import set_nats_connection

    stream, bucket = "EFT_RUN", "EFT_MODELS"

    async def prepare() -> None:
        async with open_connection(nats_settings) as conn:
            await ensure_stream(conn, {"name": stream, "subjects": ["eft.>"]})
            for name in ("A", "B"):
                await ensure_consumer(conn, stream, {"name": name, "ack_policy": "explicit"})
            await conn.js.publish("eft.one", b"{}")
            await conn.js.create_key_value(bucket=bucket)

    async def make_true() -> None:
        async with open_connection(nats_settings) as conn:
            for name in ("A", "B"):
                sub = await conn.js.pull_subscribe_bind(name, stream=stream)
                for msg in await sub.fetch(1, timeout=5):
                    await msg.ack_sync()
            await (await conn.js.key_value(bucket)).put("model", b"ready")
            await (await BatchLedger.open(conn)).record(run_id, "b1", stream=stream, count=1, first_seq=1, last_seq=1)

    def tasks() -> dict[str, tuple[str, str, int | None]]:
        rows = airflow.query("SELECT task_id, state, hostname, pid FROM task_instance WHERE dag_id = :dag "
                             "AND run_id = :run", dag=ENDED, run=run_id)
        return {task: (state, host or "", pid) for task, state, host, pid in rows}

    asyncio.run(prepare())
    run_id = trigger(airflow, ENDED, {"stream": stream, "bucket": bucket})
    ended = ("drained", "kv", "ledger")
    wait_until(lambda: all(tasks().get(t, ("",))[0] == "deferred" for t in (*ended, "ended_after_a_worker")),
               "the sensors to defer", timeout=300, every=0.5)
    reported = f"TaskInstance Finished: dag_id={ENDED}, task_id=ended_after_a_worker, run_id={run_id},"
    wait_until(lambda: reported in airflow.log_tail("scheduler", 10**9), "the scheduler to take the worker's deferral",
               timeout=300, every=0.5)  # as in the start_from_trigger test above (apache/airflow#72716)
    asyncio.run(make_true())
    assert wait_run_finished(airflow, ENDED, run_id, timeout=300) == "success", tasks()
    rows = tasks()
    assert {task: rows[task] for task in ended} == {task: ("success", "", None) for task in ended}  # no worker
    assert rows["ended_after_a_worker"][0] == "success" and rows["ended_after_a_worker"][1]  # its worker's host

    # the XCom as stored (PostgreSQL's driver decodes the JSONB column) and as a worker's task reads it back
    stored = dict(airflow.query("SELECT task_id, value FROM xcom WHERE dag_id = :dag AND run_id = :run "
                                "AND key = 'return_value'", dag=ENDED, run=run_id))
    set_nats_connection(monkeypatch, "nats_default", nats.url)
    sensors = {"drained": JetStreamConsumerDrainedSensor(task_id="drained", stream=stream, consumer="A"),
               "kv": JetStreamKeyValueSensor(task_id="kv", bucket=bucket, key="model", value="ready"),
               "ledger": JetStreamBatchLedgerSensor(task_id="ledger", run_id=run_id, state="published"),
               "ended_after_a_worker": JetStreamConsumerDrainedSensor(task_id="w", stream=stream, consumer="B")}

    async def first_event(sensor: Any) -> dict:  # the same trigger without the flag, on the settled state
        events = sensor.make_trigger({}).run()
        event = await asyncio.wait_for(anext(events), timeout=30)
        await events.aclose()
        return event.payload

    expected = {task: sensor.execute_complete({}, asyncio.run(first_event(sensor))) for task, sensor in sensors.items()}
    # The KV entry's time: the triggerer's trigger saw the put delivered (nats-py's float timestamp, rounded to the
    # microsecond), this one reads the stored message (nanoseconds cut to microseconds): they may differ by 1 us.
    created = datetime.fromisoformat(stored["kv"]["created"]), datetime.fromisoformat(expected["kv"]["created"])
    assert abs((created[0] - created[1]).total_seconds()) <= 1e-6, created
    expected["kv"]["created"] = stored["kv"]["created"]
    for task in sensors:
        assert isinstance(stored[task], dict) and stored[task] == expected[task], (task, stored[task], expected[task])
        assert BaseXCom.deserialize_value(SimpleNamespace(value=stored[task])) == expected[task]
    assert stored["ledger"]["reached"] == 1 and stored["kv"]["value"] == "ready" and stored["drained"]["drained"]

    logs = airflow.home / "logs" / f"dag_id={ENDED}" / f"run_id={run_id}"
    for task in ended:
        files = sorted(path.name for path in (logs / f"task_id={task}").rglob("attempt=*"))
        assert len(files) == 1 and files[0].startswith("attempt=1.log.trigger."), (task, files)  # no task log
        text = (logs / f"task_id={task}" / files[0]).read_text(errors="replace")
        done = [line for line in text.splitlines() if "Done: " in line]
        assert len(done) == 1 and sensors[task].make_trigger({}).done_line(expected[task]) in done[0], text[-3000:]
    worker_log = (logs / "task_id=ended_after_a_worker" / "attempt=1.log").read_text(errors="replace")
    assert "Deferring: waiting" in worker_log and "Done: " not in worker_log, worker_log[-3000:]


def _abandon_batches(settings: ConnectionSettings, batch_ids: list[str]) -> None:
    """Open an atomic batch on ORDERS_GUARDED per id and never commit it: the server abandons each one."""
    async def go() -> None:
        async with open_connection(settings) as conn:
            for batch_id in batch_ids:
                await conn.nc.publish("orders.guarded.lost", b"{}",
                                      headers={"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": "1"})
            await conn.nc.flush()

    asyncio.run(go())


def _reported_batches(airflow: LocalAirflow) -> list[str]:
    rows = airflow.query("SELECT value FROM xcom WHERE dag_id = :dag AND task_id = 'report' "
                         "AND key = 'return_value'", dag=ABANDONED)
    return sorted(batch for (value,) in rows for batch in json_column(value))


def test_abandoned_batches_start_their_handler_on_its_own_schedule(airflow: LocalAirflow,
                                                                 nats_settings: ConnectionSettings) -> None:
    """handle_abandoned_batches is scheduled on an asset fed by the advisory capture: three batches left open on
    ORDERS_GUARDED are three advisories at once, each reported once, no run failed. (Airflow 3.3 started one run
    for the burst and gave it the first event only; the example reported one batch of three.)"""
    guarded = trigger(airflow, GUARDED)  # the capture stream and ORDERS_GUARDED, as a user would create them
    assert wait_run_finished(airflow, GUARDED, guarded, timeout=300) == "success"
    wait_until(lambda: _consumer_exists(nats_settings, "ADVISORIES", "airflow_orders_abandoned"),
               "the watcher's consumer on ADVISORIES (it reads only new advisories)", timeout=180, every=0.5)
    batch_ids = [f"lost-{n}" for n in range(3)]
    _abandon_batches(nats_settings, batch_ids)
    def handler_states() -> list[tuple]:
        return airflow.query("SELECT state FROM dag_run WHERE dag_id = :dag", dag=ABANDONED)

    finished = ("success", "failed")
    wait_until(lambda: _reported_batches(airflow) == batch_ids and all(
        state in finished for (state,) in handler_states()),
        "a report of each abandoned batch (the server abandons an idle batch after about 10 s)", timeout=240,
        every=0.5)
    states = handler_states()
    assert {state for (state,) in states} == {"success"}, states


def _consumer_exists(settings: ConnectionSettings, stream: str, consumer: str) -> bool:
    try:
        call_on_server(settings, consumer_status, stream, consumer)
    except (ConsumerNotFoundError, StreamNotFoundError):
        return False
    return True


def ui_trigger(page: Any, airflow: LocalAirflow, dag_id: str, rows: int) -> str:
    """Log in as a user does and trigger ``dag_id`` from its page with ``rows`` in the params form."""
    log_in(page, airflow.url, airflow.user, airflow.password)
    page.goto(f"{airflow.url}/dags/{dag_id}", wait_until="networkidle")
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog")
    dialog.locator("input[name=element_rows]").fill(str(rows))
    with page.expect_response(lambda r: r.url.endswith("/dagRuns") and r.request.method == "POST") as created:
        dialog.get_by_role("button", name="Trigger").click()
    run_id = created.value.json()["dag_run_id"]
    page.goto("about:blank")  # no auto-refreshing page while the run takes minutes
    return run_id


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Headless Chromium (Debian's package, installed where missing and possible), or None where it cannot be."""
    if install_chromium() is not None:
        yield None
        return
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-deploy")), executable_path=str(CHROMIUM), headless=True,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
            viewport={"width": 1280, "height": 1400})
        context.set_default_timeout(60_000)
        try:
            yield context.new_page()
        finally:
            context.close()


def test_pipeline_from_the_ui_through_the_scheduler_with_deferred_sensors(airflow: LocalAirflow, page: Any) -> None:
    """The UI (where Chromium is installed; else the REST API) triggers the pipeline; the scheduler runs it with
    its sensors deferred to the triggerer; the guarded publish example runs on the same server meanwhile."""
    guarded_run = trigger(airflow, GUARDED)
    wait_dag_parsed(airflow, PIPELINE)
    if page is not None:
        pipeline_run = ui_trigger(page, airflow, PIPELINE, rows=2000)
    else:
        print(f"{CHROMIUM} missing: the pipeline is triggered through the REST API instead of the UI")
        pipeline_run = trigger(airflow, PIPELINE, {"rows": 2000})
    deferred: set[str] = set()

    def watch_deferrals() -> None:
        rows = airflow.query("SELECT task_id FROM task_instance WHERE dag_id = :dag AND run_id = :run AND state = "
                             "'deferred' AND next_method = 'execute_complete'", dag=PIPELINE, run=pipeline_run)
        deferred.update(task_id for (task_id,) in rows)

    state = wait_run_finished(airflow, PIPELINE, pipeline_run, on_poll=watch_deferrals)
    assert state == "success", task_states(airflow, PIPELINE, pipeline_run)
    assert set(task_states(airflow, PIPELINE, pipeline_run).values()) == {"success"}
    assert "no_batch_abandoned" in deferred, f"the guard sensor must wait in the triggerer; deferred: {deferred}"
    summary = json.loads((airflow.home / "output" / "summary.json").read_text())
    assert summary["rows_consumed"] == summary["rows_produced"] == 2000
    if page is not None:  # the run's success and a deferred sensor's log, as the user sees them
        run_url = f"{airflow.url}/dags/{PIPELINE}/runs/{pipeline_run}"
        page.goto(run_url, wait_until="networkidle")
        page.get_by_text("success", exact=False).first.wait_for()
        page.goto(f"{run_url}/tasks/no_batch_abandoned", wait_until="networkidle")
        page.get_by_text("Deferring: waiting for batch_abandoned").first.wait_for()
        page.get_by_text("quiet period over").first.wait_for()
    assert wait_run_finished(airflow, GUARDED, guarded_run, timeout=200) == "success", \
        task_states(airflow, GUARDED, guarded_run)


def _processes_of(home: Path) -> list[int]:
    """PIDs whose environment names ``home`` as AIRFLOW_HOME (this test's deployment only)."""
    marker = f"AIRFLOW_HOME={home}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:  # gone meanwhile, or not ours to read
                continue
    return pids


def _start_up(checkout: Path, **settings: str) -> tuple[subprocess.Popen[str], list[str]]:
    """Run what `make up` runs in ``checkout`` (with ``settings`` such as UP_PORT in its environment) until it
    printed the login; returns the process and its output so far."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW__")) and k not in ("AIRFLOW_UP_PASSWORD", "UP_PORT",
                                                                               "UP_NATS_PORT", "UP_HOME")}
    env.update(**settings)
    proc = subprocess.Popen([sys.executable, "-m", "tests.infra.airflow_local"], env=env, cwd=checkout,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return proc, _read_until(proc, "Ctrl-C stops everything")


def _read_until(proc: subprocess.Popen[str], marker: str, timeout: float = 300) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while not any(marker in line for line in lines):
        line = proc.stdout.readline()
        assert line and time.monotonic() < deadline, "".join(lines)
        lines.append(line)
    return lines


def _log_size(home: Path, key: str) -> int:
    """How much of a component's log exists (0 before its first start): where the next start's lines begin."""
    log = home / "components" / f"{key}.log"
    return log.stat().st_size if log.exists() else 0


def _ctrl_c(proc: subprocess.Popen[str], home: Path, started: int) -> str:
    """Ctrl-C `make up`: each component exits on its own after one SIGTERM (the triggerer gives its triggers
    back, never "Forcing exit due to second exit signal"); returns the output, which ends with the stop time.

    ``started`` is where this run's lines begin in the triggerer's log. `make up` says "Ctrl-C stops everything"
    once the api-server answers, not once the triggerer runs: the Ctrl-C waits (bounded) for this run's triggerer to
    say "Starting the triggerer", the line Airflow logs just before it sets its signal handlers (a SIGTERM before
    them ends it by the default action, exit -15, with nothing logged)."""
    triggerer_log = home / "components" / "triggerer.log"
    wait_until(lambda: b"Starting the triggerer" in triggerer_log.read_bytes()[started:],
               "this run's triggerer to start (its signal handlers set)", timeout=180, every=0.5)
    logged = triggerer_log.stat().st_size
    proc.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal sends
    assert proc.wait(timeout=120) == 0
    out = proc.stdout.read()
    stopped = triggerer_log.read_text(errors="replace")[logged:]
    assert "Exiting gracefully upon receiving signal 15" in stopped and "second exit signal" not in stopped, stopped
    assert "did not exit after SIGTERM" not in out, out
    print(re.search(r"stopped in \d+ s", out).group(0))
    return out


def _component_pid(home: Path, command: str) -> int | None:
    """The PID of the process running ``airflow <command>`` in this deployment, if one runs."""
    for pid in _processes_of(home):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[2:3] == [command.encode()]:
                return pid
    return None


def _jetstream_asset_servers(api: Api) -> set[str]:
    """The ``host:port`` of every ``jetstream://`` asset Airflow knows, the ones no DAG declares any more too."""
    assets = api.call("GET", "/api/v2/assets?uri_prefix_pattern=jetstream://&only_active=false&limit=100")["assets"]
    return {asset["uri"].split("://", 1)[1].split("/", 1)[0] for asset in assets}


def _parsed_since(api: Api, dag_id: str, since: datetime) -> bool:
    parsed = api.call("GET", f"/api/v2/dags/{dag_id}")["last_parsed_time"]
    return parsed is not None and datetime.fromisoformat(parsed) > since


def test_make_up_on_postgres_restarts_a_crashed_component_and_is_the_same_deployment_next_time(tmp_path: Path) -> None:
    """What `make up` runs, in a copy of the clone: PostgreSQL said at start, the UI address and login printed,
    secrets in files of mode 600 that git ignores (``git status`` stays empty), a killed scheduler restarted (and
    said so), Ctrl-C stops every process with one SIGTERM each; a second run on the same clone is the same
    deployment: the login printed the first time works and so does an API token issued before the restart, the
    UI and nats-server keep their ports, and the example DAGs' assets keep one identity (a new nats-server port
    used to give each a second one)."""
    root = Path(tempfile.mkdtemp(prefix="make-up-"))  # under /tmp: the postgres user must reach the cluster
    root.chmod(0o711)
    checkout = copy_checkout(root / "clone", git=True)  # a user's clone: `make up` keeps its state in .up/
    up_home = checkout / ".up"
    home = up_home / "airflow"
    proc = None
    try:
        # this box's 8080/4222 may be anyone's: the first run is given free ports, the second one is given none
        ui_port, nats_port = free_port(), free_port()
        started = _log_size(home, "triggerer")
        proc, lines = _start_up(checkout, UP_PORT=str(ui_port), UP_NATS_PORT=str(nats_port))
        text = "".join(lines)
        assert re.search(r"metadata database: PostgreSQL \d+ on 127\.0\.0\.1:\d+", text), text
        assert f"Airflow UI: http://127.0.0.1:{ui_port}" in text and f"at nats://127.0.0.1:{nats_port}" in text
        password = re.search(r"login: admin / (\S+)", text).group(1)  # made up, as no AIRFLOW_UP_PASSWORD is set
        stored = home / "passwords.json"
        assert stored.stat().st_mode & 0o777 == 0o600 and json.loads(stored.read_text()) == {"admin": password}
        for secret in ("api-secrets.json", "airflow.cfg", "../postgres/password"):  # signing keys, fernet_key
            assert (home / secret).stat().st_mode & 0o777 == 0o600, secret
        components = _processes_of(home)
        assert len(components) >= 4, components

        api = Api(SimpleNamespace(url=f"http://127.0.0.1:{ui_port}", user="admin", password=password))
        conns = {c["connection_id"]: c for c in api.call("GET", "/api/v2/connections")["connections"]}
        assert conns["nats_default"]["conn_type"] == "nats" and conns["spark_default"]["host"] == "local[2]"
        nats_default = {k: conns["nats_default"][k] for k in ("connection_id", "conn_type", "host", "port")}
        tested = api.call("POST", "/api/v2/connections/test", nats_default)
        assert tested["status"] is True and "JetStream enabled" in tested["message"], tested  # Test button on
        wait_until(lambda: _jetstream_asset_servers(api), "the dag-processor to record the examples' assets",
                   timeout=240, every=1)
        assert _jetstream_asset_servers(api) == {f"127.0.0.1:{nats_port}"}
        assert git_status(checkout) == "", "nothing `make up` writes is a change git sees"
        first_login = api  # its token, issued by this run's api-server

        scheduler = _component_pid(home, "scheduler")
        assert scheduler is not None
        os.kill(scheduler, signal.SIGKILL)  # a crash: the others keep running, the scheduler comes back
        restarted = "".join(_read_until(proc, "scheduler exited with code -9; restarting it", timeout=60))
        wait_until(lambda: _component_pid(home, "scheduler") not in (None, scheduler),
                   "the scheduler to be started again", timeout=60, every=0.5)
        assert "Its log ends:" in restarted
        assert restarted.count("exited with code") == 1, f"only the killed scheduler exited:\n{restarted}"
        _ctrl_c(proc, home, started)
        assert _processes_of(home) == [], "every component stopped"

        second_start = datetime.now(UTC)
        started = _log_size(home, "triggerer")
        proc, lines = _start_up(checkout)  # the same clone, a second `make up`, nothing set
        text = "".join(lines)
        assert f"Airflow UI: http://127.0.0.1:{ui_port}" in text, "the UI keeps its port"
        assert f"nats-server (JetStream) at nats://127.0.0.1:{nats_port}" in text, "so does the nats-server"
        assert f"login: admin / {password}" in text
        assert first_login.call("GET", "/api/v2/connections/nats_default")["port"] == nats_port, \
            "a token issued before the restart still works: the API's signing secret is kept"
        api = Api(SimpleNamespace(url=f"http://127.0.0.1:{ui_port}", user="admin", password=password))
        conns = {c["connection_id"]: c for c in api.call("GET", "/api/v2/connections")["connections"]}
        assert conns["nats_default"]["port"] == nats_port, "nats_default points at this run's nats-server"
        wait_until(lambda: _parsed_since(api, "jetstream_orders_pipeline", second_start),
                   "the dag-processor to parse the examples again", timeout=240, every=1)
        assert _jetstream_asset_servers(api) == {f"127.0.0.1:{nats_port}"}, "one identity per stream"
        _ctrl_c(proc, home, started)
        assert _processes_of(home) == []
        assert git_status(checkout) == ""
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        for pid in _processes_of(home):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(EmbeddedPostgresError):
            EmbeddedPostgres(up_home / "postgres").stop()
        shutil.rmtree(root, ignore_errors=True)
