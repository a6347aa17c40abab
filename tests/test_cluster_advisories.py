"""Advisories on the 3-node cluster: an R3 capture stream that re-runs never downgrade, the sensor
finding ``stream_leader_elected`` after a leader SIGKILL, and the sensor waiting through the capture
stream's own election instead of failing.

The server publishes advisories as plain NATS messages: one published while the capture stream has no
serving leader is not stored (docs/advisories.md). A leader shown by the monitoring endpoint may not serve
yet (a poke's STREAM.INFO still went unanswered 1.5 s later), so the election test makes the advisory it waits
for only once the capture stream stores a probe stream's advisory again."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest

from airflow_jetstream.client.admin.streams import ensure_stream, stream_info
from airflow_jetstream.client.advisories.capture import find_captured
from airflow_jetstream.client.advisories.types import AdvisoryFilter
from airflow_jetstream.client.errors import JetStreamError, PlacementError
from airflow_jetstream.embedded import EmbeddedNatsCluster
from airflow_jetstream.operators.advisory import JetStreamAdvisoryStreamOperator
from airflow_jetstream.sensors.advisory import JetStreamAdvisorySensor
from tests.conftest import set_nats_cluster_connection
from tests.support.cluster_tools import call, move_leader_off, wait_for


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch, nats_cluster_module: EmbeddedNatsCluster) -> EmbeddedNatsCluster:
    set_nats_cluster_connection(monkeypatch, "nats_default", nats_cluster_module)
    JetStreamAdvisoryStreamOperator(task_id="capture", max_age="1h").execute(context={})
    return nats_cluster_module


def capture_config(cluster: EmbeddedNatsCluster) -> dict:
    return call(cluster, stream_info, "ADVISORIES")["config"]


def capture_stores_again(cluster: EmbeddedNatsCluster, since: datetime, probes: list[str]) -> bool:
    """One look: a new probe stream is created; True once the capture stream holds any probe's stream_created."""
    probes.append(f"PROBE{len(probes)}")
    try:
        call(cluster, ensure_stream, {"name": probes[-1], "subjects": [f"probe{len(probes)}.>"]})
        return any(call(cluster, find_captured, "ADVISORIES", start_time=since,
                        advisory_filter=AdvisoryFilter(advisory="stream_created", stream=probe))["advisory"]
                   for probe in probes)
    except JetStreamError:  # the cluster is still electing
        return False


def test_capture_stream_is_r3_and_a_rerun_with_defaults_keeps_it(cluster: EmbeddedNatsCluster) -> None:
    assert capture_config(cluster)["num_replicas"] == 3  # created with the cluster default
    again = JetStreamAdvisoryStreamOperator(task_id="capture").execute(context={})
    assert again["action"] == "unchanged" and again["num_replicas"] == 3
    assert capture_config(cluster)["max_age"] == 3600 * 10**9  # the default "7d" did not replace 1h either

    with pytest.raises(PlacementError) as err:
        JetStreamAdvisoryStreamOperator(task_id="capture", num_replicas=5).execute(context={})
    assert err.value.reason == "placement_failed" and "num_replicas" in str(err.value)
    assert capture_config(cluster)["num_replicas"] == 3


def test_sensor_finds_stream_leader_elected_after_a_leader_kill(cluster: EmbeddedNatsCluster) -> None:
    call(cluster, ensure_stream, {"name": "ELECT", "subjects": ["elect.>"], "num_replicas": 3})
    victim = wait_for(lambda: cluster.stream_leader("ELECT"), "a leader of ELECT")
    move_leader_off(cluster, "ADVISORIES", victim)  # the capture stream stays writable throughout
    since = datetime.now(UTC)
    cluster.kill(victim)
    try:
        sensor = JetStreamAdvisorySensor(task_id="elected", advisory="stream_leader_elected", advisory_stream="ELECT",
                                         start_time=since, poke_interval=0.5, timeout=60, deferrable=False)
        found = sensor.execute(context={})
    finally:
        cluster.restart(victim)
    assert found["type"] == "io.nats.jetstream.advisory.v1.stream_leader_elected"
    assert found["stream"] == "ELECT" and found["leader"] != victim


def test_sensor_waits_through_the_capture_streams_election(cluster: EmbeddedNatsCluster,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # pokes give up on the election within ~1.5 s, so several of them end in LeaderUnavailableError
    set_nats_cluster_connection(monkeypatch, "nats_default", cluster, leader_wait=0.5, request_timeout=1)
    victim = wait_for(lambda: cluster.stream_leader("ADVISORIES"), "a leader of ADVISORIES")
    since = datetime.now(UTC)
    outcome: dict = {}
    sensor = JetStreamAdvisorySensor(task_id="late", advisory="stream_created", advisory_stream="LATE",
                                     start_time=since,
                                     poke_interval=0.2, timeout=90, deferrable=False)

    def wait() -> None:
        try:
            outcome["found"] = sensor.execute(context={})
        except BaseException as exc:  # reported by the assertion below
            outcome["error"] = exc

    cluster.kill(victim)
    waiter = threading.Thread(target=wait)
    waiter.start()  # its pokes meet a capture stream without a leader
    try:
        wait_for(lambda: cluster.stream_leader("ADVISORIES") not in (None, victim), "a new capture leader")
        probes: list[str] = []
        wait_for(lambda: capture_stores_again(cluster, since, probes), "the capture stream storing advisories again")
        call(cluster, ensure_stream, {"name": "LATE", "subjects": ["late.>"]})
    finally:
        waiter.join(timeout=120)
        cluster.restart(victim)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["found"]["stream"] == "LATE" and outcome["found"]["action"] == "create"
