"""Metrics reach Airflow's Stats (here its real StatsD backend, read from a loopback UDP socket);
client code runs with no Airflow and no sink at all."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from airflow.sdk.observability import stats as airflow_stats
from airflow.sdk.observability.metrics import stats_utils

from airflow_jetstream.client import metrics
from airflow_jetstream.client.errors import StreamConfigError
from airflow_jetstream.hooks.jetstream import AirflowStatsSink, JetStreamHook, install_airflow_stats
from airflow_jetstream.operators.stream import JetStreamEnsureStreamOperator

REPO = Path(__file__).resolve().parents[1]


class StatsdReceiver:
    """A UDP socket on loopback collecting StatsD lines."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []

    def wait_for(self, prefix: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines:
                if line.startswith(prefix):
                    return line
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            self.lines.extend(data.decode().splitlines())
        raise AssertionError(f"no StatsD line starting with {prefix!r}; got {self.lines}")


@pytest.fixture
def statsd(monkeypatch: pytest.MonkeyPatch) -> Iterator[StatsdReceiver]:
    """Airflow's StatsD backend configured as in production ([metrics] statsd_on), sending to us."""
    receiver = StatsdReceiver()
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_HOST", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PORT", str(receiver.port))
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PREFIX", "airflow")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED", "True")
    airflow_stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
    previous_sink = metrics._sink
    install_airflow_stats()  # what importing the hook did; again here in case a test swapped sinks
    yield receiver
    metrics.set_metrics_sink(previous_sink)
    monkeypatch.delenv("AIRFLOW__METRICS__STATSD_ON")
    airflow_stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
    receiver.sock.close()


def test_importing_the_hook_installs_the_airflow_sink() -> None:
    script = (
        "from airflow_jetstream.client import metrics\n"
        "assert type(metrics._sink).__name__ == '_NoMetrics'\n"
        "import airflow_jetstream.hooks.jetstream\n"
        "print(type(metrics._sink).__module__, type(metrics._sink).__name__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1].split() == [AirflowStatsSink.__module__, AirflowStatsSink.__name__]


def test_operator_and_hook_metrics_reach_statsd(statsd: StatsdReceiver, nats_conn: str) -> None:
    op = JetStreamEnsureStreamOperator(task_id="ensure", config={"name": "METRICS", "subjects": ["metrics.>"]})
    op.execute(context={})
    assert statsd.wait_for("airflow.jetstream.connection.opened") == "airflow.jetstream.connection.opened:1|c"
    assert statsd.wait_for("airflow.jetstream.stream.ensured") == (
        "airflow.jetstream.stream.ensured,action=created:1|c"
    )


def test_errors_are_counted_by_reason(statsd: StatsdReceiver, nats_conn: str) -> None:
    JetStreamEnsureStreamOperator(task_id="a", config={"name": "IMMUTABLE", "subjects": ["imm.>"]}).execute({})
    change_storage = JetStreamEnsureStreamOperator(
        task_id="b", config={"name": "IMMUTABLE", "subjects": ["imm.>"], "storage": "memory"}
    )
    with pytest.raises(StreamConfigError) as caught:
        change_storage.execute({})
    line = statsd.wait_for("airflow.jetstream.error")
    assert line == f"airflow.jetstream.error,reason={caught.value.reason}:1|c"


def test_connection_failures_are_counted(statsd: StatsdReceiver, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    monkeypatch.setenv(
        "AIRFLOW_CONN_NATS_DEAD",
        json.dumps({"conn_type": "nats", "host": "127.0.0.1", "port": dead_port, "extra": {"connect_timeout": 1}}),
    )
    ok, message = JetStreamHook(nats_conn_id="nats_dead").test_connection()
    assert not ok and str(dead_port) in message
    assert statsd.wait_for("airflow.jetstream.error").startswith("airflow.jetstream.error,reason=")


def test_sink_forwards_timings_and_gauges(statsd: StatsdReceiver) -> None:
    metrics.timing("batch.commit_ms", 12.5, tags={"stream": "ORDERS"})
    metrics.gauge("sourcing.lag", 42, tags={"stream": "AGG"})
    assert statsd.wait_for("airflow.jetstream.batch.commit_ms") == (
        "airflow.jetstream.batch.commit_ms,stream=ORDERS:12.500000|ms"
    )
    assert statsd.wait_for("airflow.jetstream.sourcing.lag") == "airflow.jetstream.sourcing.lag,stream=AGG:42|g"


def test_client_works_without_airflow_and_without_a_sink(nats_server) -> None:
    """In a fresh interpreter (a Spark executor, say) nothing installs a sink and Airflow is never imported."""
    script = f"""
import asyncio, sys
from airflow_jetstream.client import ConnectionSettings, ensure_stream, metrics, open_connection

metrics.incr("anything", tags={{"reason": "x"}})
metrics.timing("anything", 1.0)
metrics.gauge("anything", 1)

async def main():
    async with open_connection(ConnectionSettings(servers={nats_server.url!r})) as conn:
        return await ensure_stream(conn, {{"name": "NOSINK", "subjects": ["nosink.>"]}})

result = asyncio.run(main())
assert result["action"] == "created", result
assert type(metrics._sink).__name__ == "_NoMetrics"
assert not any(m == "airflow" or m.startswith("airflow.") for m in sys.modules), "airflow was imported"
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_source_status_reports_sourcing_lag(settings) -> None:
    import asyncio

    from airflow_jetstream.client import ensure_stream, open_connection
    from airflow_jetstream.client.sourcing.spec import source_status

    class Recorder:
        def __init__(self) -> None:
            self.gauges: list[tuple[str, float, dict | None]] = []

        def incr(self, name, count=1, tags=None) -> None:
            return None

        def timing(self, name, millis, tags=None) -> None:
            return None

        def gauge(self, name, value, tags=None) -> None:
            self.gauges.append((name, value, tags))

    recorder = Recorder()

    async def go() -> dict:
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": "ORIGIN", "subjects": ["o.>"], "retention": "workqueue"})
            await ensure_stream(conn, {"name": "AGG", "sources": [{"name": "ORIGIN"}]})
            metrics.set_metrics_sink(recorder)
            try:
                return await source_status(conn, "AGG", "ORIGIN")
            finally:
                metrics.set_metrics_sink(None)

    status = asyncio.run(go())
    assert recorder.gauges == [("sourcing.lag", status["lag"] + (status["consumer_num_pending"] or 0),
                                {"stream": "AGG", "source": "ORIGIN"})]
