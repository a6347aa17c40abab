"""What the multi-host tier's triggerer cut (tests/test_hosts_deployment.py) reads and writes: the sensors' task
instances and triggers, the triggerers' jobs, the event-driven example's asset events and what its runs processed
(Airflow's tables; what the runs processed is read by the single-host failover test too), and the messages and the
key it publishes (NATS)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection
from airflow_jetstream.client.admin.consumers import consumer_status
from airflow_jetstream.client.errors import ConsumerNotFoundError, StreamNotFoundError
from airflow_jetstream.client.kv.bucket import ensure_bucket
from airflow_jetstream.client.kv.keys import put_key
from tests.infra.airflow_local import LocalAirflow, json_column
from tests.support.nats_calls import call_on_server

#: tests/airflow_dags/triggerer_cut_sensors.py: 50 KV key sensors a run, deferred by the scheduler, ended by their
#: triggers; 20 runs are 1,000 sensors.
SENSOR_DAG, SENSOR_BUCKET, SENSORS_PER_RUN = "triggerer_cut_sensors", "triggerer_cut", 50
#: The event-driven example (dags_examples/event_driven_dag.py): its stream, consumer, watcher and processing DAG.
READY_STREAM = {"name": "ORDERS_READY", "subjects": ["orders.ready"], "max_age": "7d"}
READY_CONSUMER, WATCHER, PROCESS = "airflow_orders_ready", "orders_ready_watcher", "process_ready_orders"


def prepare(settings: ConnectionSettings) -> None:
    """The sensors' bucket and the example's stream (as ``publish_ready_orders`` makes it: R3 on the cluster)."""

    async def go() -> None:
        async with open_connection(settings) as conn:
            await ensure_bucket(conn, SENSOR_BUCKET)
            await ensure_stream(conn, READY_STREAM)

    asyncio.run(go())


def watcher_ready(settings: ConnectionSettings) -> bool:
    """The watcher made its consumer and has taken every message so far."""
    try:
        return bool(call_on_server(settings, consumer_status, READY_STREAM["name"], READY_CONSUMER)["drained"])
    except (ConsumerNotFoundError, StreamNotFoundError):
        return False


def publish(settings: ConnectionSettings, count: int, first: int) -> list[int]:
    """Publish orders ``first`` .. ``first + count - 1`` on the example's subject; returns their stream sequences."""

    async def go() -> list[int]:
        async with open_connection(settings) as conn:
            return [(await conn.js.publish("orders.ready", json.dumps({"order": n}).encode())).seq
                    for n in range(first, first + count)]

    return asyncio.run(go())


def fire(settings: ConnectionSettings, key: str) -> None:
    """The one write that ends every sensor waiting for ``key``."""
    call_on_server(settings, put_key, SENSOR_BUCKET, key, "go")


def triggerer_jobs(airflow: LocalAirflow) -> dict[str, int]:
    """Host name -> the id of the newest triggerer job started there (a triggerer's job host name ends with
    ``triggerer-<host>``)."""
    rows = airflow.query("SELECT hostname, max(id) FROM job WHERE job_type = 'TriggererJob' GROUP BY hostname")
    return {hostname.rsplit("/", 1)[-1].removeprefix("triggerer-"): job for hostname, job in rows}


def heartbeat(airflow: LocalAirflow, job: int) -> float:
    """The job's last heartbeat (epoch seconds; 0 if none)."""
    found = airflow.query("SELECT latest_heartbeat FROM job WHERE id = :job", job=job)
    return found[0][0].timestamp() if found and found[0][0] else 0.0


def sensors(airflow: LocalAirflow) -> Counter[tuple[str | None, int | None]]:
    """How many sensor task instances are in each ``(state, triggerer job id of their trigger)``."""
    rows = airflow.query("SELECT ti.state, t.triggerer_id FROM task_instance ti LEFT JOIN trigger t ON t.id = "
                         "ti.trigger_id WHERE ti.dag_id = :dag", dag=SENSOR_DAG)
    return Counter((state, triggerer) for state, triggerer in rows)


def watcher_triggerer(airflow: LocalAirflow) -> int | None:
    """The triggerer job id running the example's watcher, if one does."""
    found = airflow.query("SELECT t.triggerer_id FROM asset_watcher w JOIN trigger t ON t.id = w.trigger_id "
                          "WHERE w.name = :name", name=WATCHER)
    return found[0][0] if found else None


def event_deliveries(airflow: LocalAirflow) -> list[tuple[int, int]]:
    """``(stream_seq, delivered)`` of each asset event the watcher stored, in storing order."""
    rows = airflow.query("SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                         "WHERE a.name = 'orders_ready' ORDER BY e.id")
    return [(payload["stream_seq"], payload["delivered"]) for payload in
            (json_column(extra)["payload"] for (extra,) in rows)]


def processed_by_runs(airflow: LocalAirflow) -> Counter[int]:
    """How many runs of ``process_ready_orders`` processed each stream sequence (their XComs)."""
    found = airflow.query("SELECT value FROM xcom WHERE dag_id = :dag AND task_id = 'process' "
                          "AND key = 'return_value'", dag=PROCESS)
    return Counter(seq for (value,) in found for seq in json_column(value)["processed"])


def orphaned_triggers(airflow: LocalAirflow) -> list[tuple[int, str]]:
    """Triggers that neither a deferred task instance nor an asset watcher needs, or that no live triggerer holds
    (the newest job of each host): ``(id, classpath)``."""
    return [(trigger, classpath) for trigger, classpath in airflow.query(
        "SELECT t.id, t.classpath FROM trigger t WHERE (NOT EXISTS (SELECT 1 FROM task_instance ti WHERE "
        "ti.trigger_id = t.id AND ti.state = 'deferred') AND NOT EXISTS (SELECT 1 FROM asset_watcher w WHERE "
        "w.trigger_id = t.id)) OR t.triggerer_id IS NULL OR t.triggerer_id NOT IN (SELECT max(id) FROM job "
        "WHERE job_type = 'TriggererJob' GROUP BY hostname)")]
