"""Airflow on the CeleryExecutor across five hosts (network namespaces on this machine, ``make up-hosts``).

One deployment for the module (:class:`tests.infra.hosts_deployment.HostsDeployment`): PostgreSQL and Redis on
``db``; api-server, scheduler and dag-processor on ``ctl``; a Celery worker, a triggerer, a NATS node and a Spark
worker on each of ``w1`` and ``w2``; the third NATS node and the Spark master on ``edge``. It proves that each host
is its own (address, ``/tmp``, files; the code read-only; every server on its host's address), that the examples
run there (the orders pipeline's Spark jobs submitted in client mode from a worker host to the master on ``edge``,
the event-driven DAG from a watcher on a triggerer host, the hourly incremental DAG on its own schedule), that the
JetStream view and the connection Test button answer from the api-server host, and that host faults cost time,
not data: the scheduler killed and restarted, a Spark executor killed while it writes and a NATS node's host killed
(all three in the pipeline's first run: they touch different hosts), a worker host killed while its task publishes
(Airflow's retry runs on the other one), and a worker host cut off from Airflow (the zombie: its retry runs
elsewhere while it may still publish) or from NATS, each for longer than the raw stream's duplicate window and the
consumer's claim deadline: first the producer's host, then, in the same run, the consumer's while its job holds the
run's ledger claims. Each fault's run must give every order exactly once in the aggregate stream and the output,
and its ledger must say consumed. Four pipeline runs in all: each costs minutes (two Spark jobs, a dozen Celery
tasks), the faults seconds.
Without a pipeline run, a triggerer host cut off from the database and the api-server while 1,000 sensors (deferred
by the scheduler, ended by their triggers: tests/airflow_dags) and the event watcher wait, for longer than the
triggerer health check and the shared-stream ack timeout: the other triggerer ends every sensor with no worker and
stores every message's event, those the cut one held included; after the heal nothing is left stuck and the repeat
events stay within the watcher's ``max_unconfirmed``.

Needs root and ``ip netns``; without them the module skips and says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.js.errors import NotFoundError

from airflow_jetstream.client import ConnectionSettings, open_connection
from airflow_jetstream.client.ledger.records import epoch_of
from tests.infra.airflow_local import LocalAirflow
from tests.infra.hosts import REPO
from tests.infra.hosts_deployment import NATS_PORT, NATS_ROUTE_PORT, WORKER_HOSTS, HostsDeployment
from tests.support.airflow_api import Api
from tests.support.consumer_claims import batch_records, server_now, stored_times, wait_claims
from tests.support.host_files import forbidden, probe, run_on
from tests.support.hosts_tier import (
    CLAIM_DEADLINE_SECONDS,
    DUPLICATE_WINDOW_SECONDS,
    MAX_UNCONFIRMED,
    SHARED_STREAM_ACK_TIMEOUT,
    nats_settings,
    run_state,
    started_deployment,
    stream_messages,
    task_rows,
    trigger,
    wait_run,
)
from tests.support.kv_keys import kv_keys
from tests.support.polling import wait_until
from tests.support.triggerer_cut import (
    PROCESS,
    SENSOR_DAG,
    SENSORS_PER_RUN,
    event_deliveries,
    fire,
    heartbeat,
    orphaned_triggers,
    prepare,
    processed_by_runs,
    publish,
    sensors,
    triggerer_jobs,
    watcher_ready,
    watcher_triggerer,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]

PIPELINE, INCREMENTAL = "jetstream_orders_pipeline", "jetstream_orders_incremental"
PUBLISH_READY = "publish_ready_orders"
ROWS = 2_000
FAULT_ROWS = 20_000  # enough that the producer is still publishing when its host dies
#: How long a host stays cut off: longer than the raw stream's duplicate window and the consumer's claim deadline (the
#: tier's FAULT_SETTINGS).
CUT_SECONDS = max(DUPLICATE_WINDOW_SECONDS, CLAIM_DEADLINE_SECONDS) + 10


@pytest.fixture(scope="module")
def hosts_deployment() -> Iterator[HostsDeployment]:
    with started_deployment() as deployment:
        yield deployment


@pytest.fixture(scope="module")
def hosts_nats(hosts_deployment: HostsDeployment) -> ConnectionSettings:
    return nats_settings(hosts_deployment)


def on_host(deployment: HostsDeployment, name: str, script: str) -> str:
    """The output of ``sh -c script`` run on host ``name`` as its processes run."""
    return run_on(deployment.hosts[name], ["sh", "-c", script])


def test_each_host_has_its_own_address_tmp_and_files(hosts_deployment: HostsDeployment) -> None:
    """Each host has its own address and listens only there; the machine's files are read-only on it except its own
    places (its disk, ``/tmp``, ``/dev/shm``, its ``etc``) and, on the worker hosts, the shared volume: the writable
    mounts seen from inside it are exactly those, writing anywhere else (root's home, /var/tmp, /etc, /run, the
    checkout, the venv, the other hosts' disks) fails, and what it writes lands in its own directories."""
    hosts = hosts_deployment.hosts.hosts
    for name, host in hosts.items():
        own = list(host.writable())
        writable, writes = probe(host, f"written-by-{name}", own, forbidden(host, REPO))
        assert writable == set(own), f"{name} can write {sorted(writable)}, not only {own}"
        assert {folder for folder, why in writes.items() if why == "written"} == set(own), writes
        assert {why for folder, why in writes.items() if folder not in own} == {"EROFS"}, writes
    writers: dict[Path, set[str]] = {}
    for name, host in hosts.items():
        for source in host.writable().values():
            writers.setdefault(source, set()).add(f"written-by-{name}")
    for source, names in writers.items():
        landed = {path.name for path in source.glob("written-by-*")}
        assert landed == names, f"{source} holds {landed}, written by {names}"
    for name, host in hosts.items():
        seen = on_host(hosts_deployment, name, "ip -4 -o addr show; echo TMP; ls \"$TMPDIR\"; echo PRIVATE; "
                       f"ls {host.root / 'private'}/*; echo SHARED; ls -d {host.root / 'shared'}/* 2>/dev/null || true")
        addresses, rest = seen.split("TMP", 1)
        tmp, rest = rest.split("PRIVATE", 1)
        private, shared = rest.split("SHARED", 1)
        assert f"inet {host.address}/24" in addresses, addresses
        assert set(re.findall(r"inet (\S+)/", addresses)) - {"127.0.0.1"} == {host.address}, addresses
        assert [line for line in tmp.split() if line.startswith("written-by-")] == [f"written-by-{name}"]
        listed = {block.split(":", 1)[0].rsplit("/", 1)[-1]: block.split(":", 1)[1].split()
                  for block in private.strip().split("\n\n")}
        assert all(not files for other, files in listed.items() if other != name), listed
        if name not in WORKER_HOSTS:
            assert not shared.strip(), f"{name} sees the workers' shared volume: {shared}"
    for source in writers:
        for path in source.glob("written-by-*"):
            path.unlink()
    for name, host in hosts.items():
        table = on_host(hosts_deployment, name, "ss -ltnH")
        local = {line.split()[3].rsplit(":", 1)[0].removeprefix("[::ffff:").rstrip("]")  # a JVM's IPv4-mapped form
                 for line in table.splitlines() if line.strip()}
        assert local <= {host.address}, f"{name} listens on {local}, not only on {host.address}"


def check_pipeline_run(deployment: HostsDeployment, run_id: str, rows: int) -> dict:
    """The run's summary after asserting it is exact: every order once in the output, nothing left in the raw
    stream, every task on a worker host."""
    workers = {deployment.hosts[name].address for name in WORKER_HOSTS}
    ran_on = {task: host for task, (_state, host, _tries) in task_rows(deployment.airflow, PIPELINE, run_id).items()}
    assert set(ran_on.values()) <= workers, ran_on
    summary = json.loads((deployment.root / "shared" / "output" / "summary.json").read_text())
    assert summary["rows_produced"] == summary["rows_consumed"] == summary["distinct_orders"] == rows, summary
    assert summary["messages_left_in_raw"] == 0, summary
    assert set(summary["batches_by_state"]) == {"consumed"}, summary
    return dict(summary)


def test_orders_pipeline_runs_its_spark_jobs_from_a_worker_host_on_the_master_of_another(
        hosts_deployment: HostsDeployment, hosts_nats: ConnectionSettings) -> None:
    """Also three faults that cost seconds, at once while the producer publishes (they touch different hosts): the
    scheduler killed and started again; a Spark executor killed (SIGKILL) while it writes, whose tasks Spark runs
    again (the fences store nothing twice); and a NATS node's host, ``edge`` (``n3`` and the Spark master), killed:
    the producer finishes on ``n1`` and ``n2`` and the executor left, then ``edge`` starts again. It is started only
    after the producer, as a new master kills the executors of applications it does not know. A kill that lands on
    an open atomic batch makes the guard fail the run (the server abandons the batch): resumed as an operator would,
    as in the NATS cut."""
    deployment = hosts_deployment
    airflow = deployment.airflow
    assert deployment.spark is not None
    before = stream_messages(hosts_nats, "ORDERS_AGG") + stream_messages(hosts_nats, "ORDERS_RAW")
    run_id = trigger(airflow, PIPELINE, {"rows": FAULT_ROWS})
    writer, gained = wait_publishing(deployment, hosts_nats, run_id, before)
    running = [app["name"] for app in deployment.spark.status()["activeapps"]]
    assert any(name.startswith("produce-orders-") for name in running), running  # on the master on edge
    killed = kill_executors(deployment, writer)
    assert deployment.hosts["edge"].kill(), "nothing ran on edge"
    assert killed and gained < FAULT_ROWS, (killed, gained)
    airflow.stop("scheduler", signal.SIGKILL)
    airflow.start_component("scheduler")
    try:
        wait_until(lambda: task_rows(airflow, PIPELINE, run_id)["produce_orders"][0] != "running",
                   "the producer to finish without n3 and the Spark master", timeout=600, every=1)
    finally:
        deployment.restart_host("edge")
    finish_run(airflow, run_id, "the executor or edge kill")
    check_pipeline_run(deployment, run_id, FAULT_ROWS)
    apps = [app["name"] for app in deployment.spark.status()["completedapps"]]
    assert "consume-orders" in apps, apps  # on the master started again


def finish_run(airflow: LocalAirflow, run_id: str, fault: str) -> None:
    """Wait for the run to succeed. A ``fault`` that kills a producer's Spark task while one of its atomic batches is
    open makes the guard fail the run (the server abandons the batch; where the kill lands is timing): then check
    and resume it as an operator would."""
    wait_until(lambda: run_ended(airflow, run_id), "the run to finish", timeout=1200, every=1)
    if run_state(airflow, PIPELINE, run_id) == "failed":
        resume_after_guard(airflow, run_id, fault)
    wait_run(airflow, PIPELINE, run_id, timeout=1200)


def resume_after_guard(airflow: LocalAirflow, run_id: str, fault: str) -> None:
    """The run failed on its guard alone: ``fault`` left an atomic batch open, which the server abandoned, and the
    guard ``no_batch_abandoned`` cannot tell a re-sent batch from a lost one. Check that the guard is all that failed
    and that the ledger holds every chunk, then resume as an operator would: mark the guard done and clear the
    consumer with what follows it."""
    tasks = task_rows(airflow, PIPELINE, run_id)
    failed = {task for task, (state, _host, _tries) in tasks.items() if state == "failed"}
    assert failed == {"no_batch_abandoned"}, tasks  # the guard, telling the truth; nothing else
    assert tasks["wait_batches_published"][0] == "success", tasks  # the ledger holds every chunk
    print(f"{fault} abandoned a batch: the guard failed the run; resumed as an operator would")
    api = Api(airflow)
    runs = f"/api/v2/dags/{PIPELINE}/dagRuns/{urllib.parse.quote(run_id)}"
    api.call("PATCH", f"{runs}/taskInstances/no_batch_abandoned",
             {"new_state": "success", "note": "batch re-sent: the ledger is complete"})
    api.call("POST", f"/api/v2/dags/{PIPELINE}/clearTaskInstances",
             {"dry_run": False, "dag_run_id": run_id, "task_ids": ["consume_orders"], "include_downstream": True,
              "only_failed": False, "reset_dag_runs": True})


def kill_executors(deployment: HostsDeployment, name: str) -> list[int]:
    """SIGKILL the Spark executors (JVM and its Python workers) running on host ``name``; returns their ids."""
    killed = []
    for pid in deployment.hosts[name].pids():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            if b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def processed(settings: ConnectionSettings) -> set[int]:
    async def go() -> set[int]:
        async with open_connection(settings) as conn:
            try:
                keys = await kv_keys(conn.js, "orders_ready_processed")
            except NotFoundError:  # the first run of process_ready_orders makes the bucket
                return set()
            return {int(key.split(".")[1]) for key in keys}

    return asyncio.run(go())


def test_event_driven_and_incremental_dags_run_on_their_own(hosts_deployment: HostsDeployment,
                                                              hosts_nats: ConnectionSettings) -> None:
    airflow = hosts_deployment.airflow
    run_id = trigger(airflow, PUBLISH_READY, {"count": 5})
    wait_run(airflow, PUBLISH_READY, run_id, timeout=300)
    wait_until(lambda: len(processed(hosts_nats)) >= 5, "process_ready_orders to process the 5 orders",
               timeout=300, every=1)
    assert processed(hosts_nats) == {1, 2, 3, 4, 5}
    triggerers = {host for (host,) in airflow.query("SELECT hostname FROM job WHERE job_type = 'TriggererJob'")}
    assert len(triggerers) == 2, triggerers
    wait_until(lambda: airflow.query("SELECT 1 FROM dag_run WHERE dag_id = :dag AND run_type = 'scheduled' "
                                     "AND state = 'success'", dag=INCREMENTAL),
               "the hourly incremental DAG's scheduled run to succeed", timeout=600, every=2)


#: Runs of the sensor DAG (50 sensors each): the sensors that wait when the triggerer host is cut off.
SENSOR_RUNS = 20
SENSORS = SENSOR_RUNS * SENSORS_PER_RUN
#: The watcher's messages published right before the cut, during it (taken by the cut triggerer's watcher) and once
#: the other triggerer took it over: more than ``MAX_UNCONFIRMED`` each.
BURST = 10
#: How long the triggerer host stays cut off at least: longer than Airflow's health check of a triggerer (30 s, then
#: the other takes its triggers over) and than the tier's shared-stream ack timeout (then the cut one gives up the
#: messages it holds).
TRIGGERER_CUT_SECONDS = SHARED_STREAM_ACK_TIMEOUT + 10


def test_triggerer_host_cut_off_while_1000_sensors_and_the_watcher_wait(hosts_deployment: HostsDeployment,
                                                                       hosts_nats: ConnectionSettings) -> None:
    """The worker host whose triggerer runs the event watcher (and about half of 1,000 deferred sensors) loses the
    database and the api-server, not NATS. The other triggerer takes every trigger over after Airflow's health
    check; the cut one, still on NATS, holds the messages its watcher took until the shared-stream ack timeout fails
    their events, then naks them and the other triggerer stores them. One write of the sensors' key during the cut
    ends all 1,000 on the other triggerer, no worker running for them. After the heal the cut triggerer runs again,
    no trigger is left without a live triggerer or a waiting task, and each message gave at least one asset event
    and was processed once; the repeat events are at most ``MAX_UNCONFIRMED`` (what the cut triggerer had handed to
    Airflow before it lost the database, stored when it gets it back)."""
    deployment, airflow = hosts_deployment, hosts_deployment.airflow
    started = time.monotonic()
    prepare(hosts_nats)
    wait_until(lambda: watcher_ready(hosts_nats), "the event watcher to run", timeout=300, every=1)
    runs = [trigger(airflow, SENSOR_DAG, {"key": "go"}) for _ in range(SENSOR_RUNS)]
    jobs = triggerer_jobs(airflow)

    def deferred_on(held: set[int]) -> bool:
        return sum(n for (state, job), n in sensors(airflow).items() if state == "deferred" and job in held) == SENSORS

    wait_until(lambda: deferred_on(set(jobs.values())), f"{SENSORS} sensors deferred, each on a triggerer",
               timeout=600, every=2)
    by_job = {job: name for name, job in jobs.items()}
    victim = by_job[watcher_triggerer(airflow)]
    survivor = next(name for name in WORKER_HOSTS if name != victim)
    held = {by_job[job]: n for (_state, job), n in sensors(airflow).items()}
    assert held.get(victim), f"the cut triggerer holds no sensor: {held}"
    waited = time.monotonic() - started
    events_before = len(event_deliveries(airflow))
    published = publish(hosts_nats, BURST, 0)  # right before the cut: some stored, some still with the watcher
    host = deployment.hosts[victim]
    for side in ("db", "ctl"):
        host.block(to=deployment.hosts[side].address)
    cut_at = time.monotonic()
    try:
        published += publish(hosts_nats, BURST, BURST)  # the cut triggerer's watcher takes these
        wait_until(lambda: deferred_on({jobs[survivor]}) and watcher_triggerer(airflow) == jobs[survivor],
                   f"the triggerer of {survivor} to take every trigger over", timeout=300, every=1)
        took_over = time.monotonic() - cut_at
        fire(hosts_nats, "go")
        wait_until(lambda: sensors(airflow) == {("success", None): SENSORS}, f"the {SENSORS} sensors to succeed",
                   timeout=300, every=1)
        ended = time.monotonic() - cut_at
        published += publish(hosts_nats, BURST, 2 * BURST)  # to the triggerer that took the watcher over
        wait_until(lambda: set(published) <= {seq for seq, _ in event_deliveries(airflow)},
                   "an asset event for every message, those the cut triggerer held included", timeout=300, every=1)
        stored = time.monotonic() - cut_at
        time.sleep(max(0.0, cut_at + TRIGGERER_CUT_SECONDS - time.monotonic()))  # the fault's length
    finally:
        host.heal()
    healed_at, cut_for = time.time(), time.monotonic() - cut_at
    published += publish(hosts_nats, 1, 3 * BURST)  # one more through the healed deployment

    def rejoined() -> bool:
        deployment.restart_exited()  # a triggerer that gave up while cut off starts again, as supervision would
        return heartbeat(airflow, triggerer_jobs(airflow)[victim]) > healed_at

    wait_until(rejoined, f"the triggerer of {victim} to heartbeat again", timeout=300, every=1)
    rejoined_after = time.time() - healed_at
    wait_until(lambda: set(published) <= set(processed_by_runs(airflow)), "every message processed",
               timeout=600, every=1)
    wait_until(lambda: not orphaned_triggers(airflow), "no trigger without a task, a watcher or a live triggerer",
               timeout=120, every=1)
    print(f"{victim} cut off for {cut_for:.0f} s: {SENSORS} sensors deferred in {waited:.0f} s ({held}); "
          f"{survivor} held every trigger {took_over:.0f} s into the cut, the sensors ended at {ended:.0f} s, every "
          f"message stored at {stored:.0f} s; {victim} heartbeat {rejoined_after:.0f} s after the heal; "
          f"{time.monotonic() - started:.0f} s in all")

    assert all(run_state(airflow, SENSOR_DAG, run) == "success" for run in runs)
    count = "SELECT count(*) FROM {} WHERE dag_id = :dag"
    on_workers = airflow.query(count.format("task_instance") + " AND (hostname <> '' OR pid IS NOT NULL)",
                               dag=SENSOR_DAG)
    tries = airflow.query(count.format("task_instance_history"), dag=SENSOR_DAG)
    assert on_workers == tries == [(0,)], "a sensor ran on a worker, or twice"
    xcoms = airflow.query(count.format("xcom") + " AND key = 'return_value'", dag=SENSOR_DAG)
    assert xcoms == [(SENSORS,)], "each sensor's XCom, stored by its trigger"
    deliveries = event_deliveries(airflow)[events_before:]
    events = Counter(seq for seq, _ in deliveries)
    assert set(events) == set(published), "an event for each message, none other"  # nothing lost
    assert any(delivered > 1 for _seq, delivered in deliveries), "no message came again from the cut triggerer"
    repeats = sum(events.values()) - len(events)
    print(f"{len(published)} messages, {repeats} repeat events")
    assert repeats <= MAX_UNCONFIRMED, events
    processed = processed_by_runs(airflow)
    assert {seq: processed[seq] for seq in published} == dict.fromkeys(published, 1), "each message processed once"
    assert not airflow.query("SELECT run_id FROM dag_run WHERE dag_id = :dag AND state = 'failed'", dag=PROCESS)
    victim_log = deployment.airflows[victim].log_tail(f"triggerer-{victim}", chars=10**8)
    assert "Ack timeout; force-failing subscriber" in victim_log  # what gave the held messages back


def test_view_and_test_button_answer_from_the_api_server_host(hosts_deployment: HostsDeployment) -> None:
    api = Api(hosts_deployment.airflow)
    view = api.call("GET", "/jetstream/api/connections/nats_default")
    assert "ORDERS_AGG" in {row["name"] for row in view["streams"]["streams"]}, view
    assert "error" not in view, view
    conn = {c["connection_id"]: c for c in api.call("GET", "/api/v2/connections")["connections"]}["nats_default"]
    tested = api.call("POST", "/api/v2/connections/test",
                      {k: conn[k] for k in ("connection_id", "conn_type", "host", "port", "login", "extra")} |
                      {"password": hosts_deployment.nats_password})
    assert tested["status"] is True and "JetStream enabled" in tested["message"], tested


#: Which hosts' disks may hold each secret: the one whose server checks it (and the NATS hosts' server config).
SECRET_HOMES = {"nats password": {"w1", "w2", "edge"}, "broker password": {"db"}, "database password": {"db"},
                "admin password": {"ctl"}, "jwt secret": {"ctl"}, "fernet key": set()}


def secrets_of(deployment: HostsDeployment) -> dict[str, str]:
    assert deployment.redis is not None and deployment.pg is not None
    return {"nats password": deployment.nats_password, "broker password": deployment.redis.password,
            "database password": deployment.pg.password, "admin password": deployment.airflow.password,
            "jwt secret": deployment.jwt_secret, "fernet key": deployment.fernet_key}


def test_no_secret_on_the_disk_of_a_host_that_does_not_need_it(hosts_deployment: HostsDeployment) -> None:
    """After the runs above: every file in each place a host can write is read (its disk with its home, /tmp,
    /dev/shm and etc, and the shared volume on the worker hosts: the first test proves that these are all the places
    it can write)."""
    found: dict[str, set[str]] = {name: set() for name in SECRET_HOMES}
    for name, host in hosts_deployment.hosts.hosts.items():
        files = {path for place in host.writable().values() for path in place.rglob("*")}
        assert host.private / "home" in files, "the host's HOME is not scanned"
        for path in files:
            if not path.is_file() or path.is_symlink() or path.stat().st_size > 50_000_000:
                continue
            data = path.read_bytes()
            for what, secret in secrets_of(hosts_deployment).items():
                if secret.encode() in data:
                    found[what].add(name)
    misplaced = {what: hosts - SECRET_HOMES[what] for what, hosts in found.items() if hosts - SECRET_HOMES[what]}
    assert not misplaced, f"secrets on hosts that do not need them: {misplaced}"


def wait_publishing(deployment: HostsDeployment, settings: ConnectionSettings, run_id: str,
                    before: int) -> tuple[str, int]:
    """Wait until the run's producer has published some but not all of its orders; returns its host's name and
    how many orders the aggregate had gained then."""
    by_address = {host.address: name for name, host in deployment.hosts.hosts.items()}
    seen: dict[str, tuple[str, int]] = {}

    def publishing() -> bool:
        state, address, _tries = task_rows(deployment.airflow, PIPELINE, run_id).get("produce_orders", ("", "", 0))
        if state != "running" or not address:
            return False
        gained = stream_messages(settings, "ORDERS_AGG") + stream_messages(settings, "ORDERS_RAW") - before
        seen["now"] = (by_address[address], gained)
        return gained > 0

    wait_until(publishing, "the producer to publish its first orders", timeout=600, every=0.2)
    return seen["now"]


def test_worker_host_killed_while_it_publishes_then_the_retry_runs_on_the_other(
        hosts_deployment: HostsDeployment, hosts_nats: ConnectionSettings) -> None:
    before = stream_messages(hosts_nats, "ORDERS_AGG") + stream_messages(hosts_nats, "ORDERS_RAW")
    run_id = trigger(hosts_deployment.airflow, PIPELINE, {"rows": FAULT_ROWS})
    victim, gained = wait_publishing(hosts_deployment, hosts_nats, run_id, before)
    killed_at = time.monotonic()
    assert hosts_deployment.hosts[victim].kill(), f"nothing ran on {victim}"
    assert gained < FAULT_ROWS, "the host died in the middle of the publish"
    try:
        finish_run(hosts_deployment.airflow, run_id, f"the kill of {victim}")
        print(f"the run finished {time.monotonic() - killed_at:.0f} s after {victim} was killed")
    finally:
        hosts_deployment.restart_host(victim)
    state, address, tries = task_rows(hosts_deployment.airflow, PIPELINE, run_id)["produce_orders"]
    survivor = next(name for name in WORKER_HOSTS if name != victim)
    assert (state, address) == ("success", hosts_deployment.hosts[survivor].address) and tries >= 2
    check_pipeline_run(hosts_deployment, run_id, FAULT_ROWS)


def start_publishing(deployment: HostsDeployment, settings: ConnectionSettings) -> tuple[str, str, str]:
    """Trigger a pipeline run and wait until its producer publishes: the run id, the producer's host and the other."""
    before = stream_messages(settings, "ORDERS_AGG") + stream_messages(settings, "ORDERS_RAW")
    run_id = trigger(deployment.airflow, PIPELINE, {"rows": FAULT_ROWS})
    victim, gained = wait_publishing(deployment, settings, run_id, before)
    assert gained < FAULT_ROWS, "the host is cut off in the middle of the publish"
    return run_id, victim, next(name for name in WORKER_HOSTS if name != victim)


def hold_cut(cut_at: float) -> None:
    """Keep the cut for ``CUT_SECONDS``, longer than the raw stream's duplicate window (a retry's msg ids are then
    new to the stream, and only the write fences keep its chunks from being stored twice) and than the ledger's
    claim deadline (a claim held through the cut has outlived it)."""
    time.sleep(max(0.0, cut_at + CUT_SECONDS - time.monotonic()))  # the fault's length, not a synchronisation


def producer_tries(deployment: HostsDeployment, run_id: str) -> dict[int, tuple[str, str]]:
    """``try_number -> (state, hostname)`` of the run's earlier producer attempts (Airflow's task history)."""
    rows = deployment.airflow.query(
        "SELECT try_number, state, hostname FROM task_instance_history WHERE dag_id = :dag AND run_id = :run "
        "AND task_id = 'produce_orders'", dag=PIPELINE, run=run_id)
    return {tries: (state, host) for tries, state, host in rows}


def run_ended(airflow: LocalAirflow, run_id: str) -> bool:
    """Whether the pipeline run has ended; a run cleared to resume is queued until the scheduler runs it again."""
    return run_state(airflow, PIPELINE, run_id) in ("success", "failed")


def wait_consumer_claims(deployment: HostsDeployment, settings: ConnectionSettings,
                         run_id: str) -> tuple[str, int, float]:
    """Wait until the run's consumer holds claims on its batches: the name of its host, its try number and when the
    claims were seen."""
    summary = wait_claims(settings, run_id, lambda: run_ended(deployment.airflow, run_id))
    seen_at = time.monotonic()
    _state, address, tries = task_rows(deployment.airflow, PIPELINE, run_id)["consume_orders"]
    assert summary is not None, task_rows(deployment.airflow, PIPELINE, run_id)
    return next(name for name in WORKER_HOSTS if deployment.hosts[name].address == address), tries, seen_at


def consumer_tries(deployment: HostsDeployment, run_id: str) -> dict[int, tuple[str, str]]:
    """``try_number -> (state, hostname)`` of every ``consume_orders`` attempt of the run, the last one included."""
    rows = deployment.airflow.query(
        "SELECT try_number, state, hostname FROM task_instance_history WHERE dag_id = :dag AND run_id = :run "
        "AND task_id = 'consume_orders'", dag=PIPELINE, run=run_id)
    tries = {number: (state, host) for number, state, host in rows}
    state, host, number = task_rows(deployment.airflow, PIPELINE, run_id)["consume_orders"]
    return {**tries, number: (state, host)}


def consume_logged(deployment: HostsDeployment, name: str, pattern: str) -> bool:
    """Whether a ``consume_orders`` task log on host ``name`` matches ``pattern`` (the logs are JSON lines: a quote
    of the job's output is escaped)."""
    return any(re.search(pattern, path.read_text(errors="replace"))
               for path in deployment.hosts[name].private.rglob("*.log") if "task_id=consume_orders" in str(path))


def test_worker_host_cut_off_from_airflow_while_it_publishes(hosts_deployment: HostsDeployment,
                                                             hosts_nats: ConnectionSettings) -> None:
    """The zombie across hosts: the producer's host loses the database, the broker and the api-server but not NATS.
    The scheduler fails the silent task and its retry runs on the other host while the zombie's Spark job may still
    publish; healed after the duplicate window, the zombie's attempt is not the one that succeeded. Then the
    consumer's host, while its job holds the run's ledger claims, is cut off from Airflow as long: its Spark job
    goes on with NATS and Airflow's retry runs on the other host. Either the zombie still holds the claims then,
    past their deadline, and the retry takes them over (the zombie's settle is refused), or the zombie consumed the
    run before and the retry, told so by the ledger, leaves its output: every order once either way."""
    deployment = hosts_deployment
    run_id, victim, survivor = start_publishing(deployment, hosts_nats)
    host = deployment.hosts[victim]
    for side in ("db", "ctl"):
        host.block(to=deployment.hosts[side].address)
    cut_at = time.monotonic()
    retry_on = deployment.hosts[survivor].address
    try:
        def retried() -> bool:
            _state, address, tries = task_rows(deployment.airflow, PIPELINE, run_id)["produce_orders"]
            return address == retry_on and tries >= 2

        wait_until(retried, f"the producer's retry to run on {survivor}", timeout=600, every=1)
        hold_cut(cut_at)
    finally:
        host.heal()
    print(f"{victim} cut off from Airflow for {time.monotonic() - cut_at:.0f} s")
    deployment.restart_exited()  # a component of the cut host that gave up meanwhile
    if wait_claims(hosts_nats, run_id, lambda: run_ended(deployment.airflow, run_id)) is None:
        resume_after_guard(deployment.airflow, run_id, f"the zombie producer on {victim}")  # its task was killed
    zombie, zombie_try, claims_at = wait_consumer_claims(deployment, hosts_nats, run_id)
    consumer = deployment.hosts[zombie]
    for side in ("db", "ctl"):
        consumer.block(to=deployment.hosts[side].address)
    cut_at = time.monotonic()
    other = deployment.hosts[next(name for name in WORKER_HOSTS if name != zombie)].address
    try:
        wait_until(lambda: any(number > zombie_try and address == other
                               for number, (_state, address) in consumer_tries(deployment, run_id).items()),
                   "the consumer's retry to run on the other host", timeout=600, every=1)
        hold_cut(cut_at)
    finally:
        consumer.heal()
    print(f"consumer host {zombie} cut off from Airflow for {time.monotonic() - cut_at:.0f} s, "
          f"{cut_at - claims_at:.1f} s after its claims were seen")
    wait_run(deployment.airflow, PIPELINE, run_id, timeout=1200)
    deployment.restart_exited()
    state, address, tries = task_rows(deployment.airflow, PIPELINE, run_id)["produce_orders"]
    assert (state, address) == ("success", retry_on) and tries >= 2
    cut_attempts = {n: row for n, row in producer_tries(deployment, run_id).items() if row[1] == host.address}
    assert cut_attempts and all(state != "success" for state, _ in cut_attempts.values()), cut_attempts
    check_pipeline_run(deployment, run_id, FAULT_ROWS)
    records = batch_records(hosts_nats, run_id)
    consumers = consumer_tries(deployment, run_id)
    attempts = {rec.attempts for rec in records}
    print(f"consume_orders tries {consumers}; ledger attempts {sorted(attempts)}")
    assert records and all(rec.state == "consumed" for rec in records), records
    assert consumers[zombie_try][1] == consumer.address and consumers[zombie_try][0] != "success", consumers
    if attempts != {1}:  # the zombie still held the claims at the retry: their deadline passed, the retry took them
        assert min(attempts) >= 2, attempts
        assert all("did not finish before its visibility deadline" in (rec.last_error or "") for rec in records)
        print(f"ClaimLostError in {zombie}'s logs: {consume_logged(deployment, zombie, 'ClaimLostError')}")
    else:  # the zombie consumed the run before its deadline; the retry, told so by the ledger, left the output
        retried_on = next(name for name in WORKER_HOSTS if name != zombie)
        assert consume_logged(deployment, retried_on, r"already_consumed\W{1,6}true"), consumers


def test_worker_host_cut_off_from_nats_while_it_publishes(hosts_deployment: HostsDeployment,
                                                          hosts_nats: ConnectionSettings) -> None:
    """The producer's host loses NATS but not Airflow: its clients and its own NATS node (cut from its peers) reach
    no JetStream leader. Its Spark tasks fail or wait and are run again; the ledger ends complete. An atomic batch
    open at the cut is abandoned by the server (its batch timeout, 10 s, is shorter than the cut): the guard
    ``no_batch_abandoned`` then fails the run, as it should (it cannot tell a re-sent batch from a lost one). An
    operator who sees the ledger complete marks the guard done and clears the consumer. Then the consumer's host,
    while its job holds the run's ledger claims, is cut off from NATS past the claims' deadline while Airflow still
    hears the task: either its attempt fails and Airflow's retry takes the expired claims over, or it survives the
    cut and, nobody having claimed the batches meanwhile, settles them after the heal. Every order once either way."""
    deployment = hosts_deployment
    airflow = deployment.airflow
    run_id, victim, _survivor = start_publishing(deployment, hosts_nats)
    host = deployment.hosts[victim]
    host.block(ports=(NATS_PORT, NATS_ROUTE_PORT))
    cut_at = time.monotonic()
    try:
        hold_cut(cut_at)
    finally:
        host.heal()
    deployment.restart_exited()
    claims = wait_claims(hosts_nats, run_id, lambda: run_ended(airflow, run_id))
    if claims is None:
        resume_after_guard(airflow, run_id, f"the cut of {victim}")
    zombie, zombie_try, claims_at = wait_consumer_claims(deployment, hosts_nats, run_id)
    consumer = deployment.hosts[zombie]
    consumer.block(ports=(NATS_PORT, NATS_ROUTE_PORT))
    cut_at = time.monotonic()
    try:
        cut_began = server_now(hosts_nats)  # by the servers' clock, read from the controller: after the block
        hold_cut(cut_at)
        cut_ended = server_now(hosts_nats)  # and before the heal
    finally:
        consumer.heal()
    print(f"consumer host {zombie} cut off from NATS for {time.monotonic() - cut_at:.0f} s, "
          f"{cut_at - claims_at:.1f} s after its claims were seen")
    wait_run(airflow, PIPELINE, run_id, timeout=1200)
    deployment.restart_exited()
    check_pipeline_run(deployment, run_id, FAULT_ROWS)
    assert_claims_outlasted(hosts_nats, deployment, run_id, zombie, zombie_try, (cut_began, cut_ended))


def assert_claims_outlasted(settings: ConnectionSettings, deployment: HostsDeployment, run_id: str, zombie: str,
                            zombie_try: int, cut: tuple[float, float]) -> None:
    """Assert that the consumer cut off on host ``zombie`` held its claims past their deadline: either nobody
    claimed the batches meanwhile and its settles were stored after the heal (``cut``: when the cut began and
    ended, by the servers' clock; a node cut off from its peers commits nothing), later than the deadline, or its
    attempt failed and a later one claimed the batches again."""
    records = batch_records(settings, run_id)
    consumers = consumer_tries(deployment, run_id)
    assert records and all(rec.state == "consumed" for rec in records), records
    attempts = {rec.attempts for rec in records}
    print(f"consume_orders tries {consumers}; ledger attempts {sorted(attempts)}")
    if attempts == {1}:  # the zombie's own claims, settled after the heal: held past the deadline, nobody took them
        stored = stored_times(settings, records)
        decided = [epoch_of(rec.consumed_at or "") - epoch_of(rec.claimed_at or "") for rec in records]
        held = [at - epoch_of(rec.claimed_at or "") for at, rec in zip(stored, records, strict=True)]
        print(f"claims held {min(held):.0f}-{max(held):.0f} s by the cut consumer (its settles decided "
              f"{min(decided):.0f}-{max(decided):.0f} s after claiming), stored {min(stored) - cut[1]:.1f} s after "
              "the cut ended")
        assert consumers[zombie_try] == ("success", deployment.hosts[zombie].address), consumers
        assert min(stored) >= cut[0], "the job settled before the cut began: the cut tested nothing"
        assert min(stored) >= cut[1], "a settle was stored while its writer's host was cut off from NATS"
        assert min(held) > CLAIM_DEADLINE_SECONDS, held
    else:  # the zombie's attempt failed; Airflow's retry claimed the batches again
        assert min(attempts) >= 2, attempts
        assert consumers[zombie_try][0] != "success", consumers
        print(f"ClaimLostError in {zombie}'s logs: {consume_logged(deployment, zombie, 'ClaimLostError')}")
