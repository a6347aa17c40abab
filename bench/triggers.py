"""Triggerer efficiency: N deferred advisory sensors on one event loop, shared vs one connection each.

Starts a real nats-server, the advisory capture stream and N ``JetStreamAdvisoryTrigger`` runs
waiting on one event loop (as in one triggerer), then reports the server's connection count
(``/connz``) and the memory each waiting trigger costs (Python heap via tracemalloc, and process
RSS). The baseline is the same N triggers with one NATS connection each (no pool)::

    .venv/bin/python bench/triggers.py            # N=200
    .venv/bin/python bench/triggers.py --triggers 500
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import sys
import tempfile
import time
import tracemalloc
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="bench-triggers-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection
from airflow_jetstream.client.advisories.capture import capture_stream_config
from airflow_jetstream.embedded import EmbeddedNatsServer
from airflow_jetstream.triggers import advisory as advisory_triggers


def rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def connections(server: EmbeddedNatsServer) -> int:
    return int(server.monitor("connz").get("num_connections", 0))


def reader_consumers(server: EmbeddedNatsServer) -> int:
    return int(server.monitor("jsz").get("consumers", 0))


async def wait_for(predicate, what: str, deadline: float = 120.0) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if await asyncio.to_thread(predicate):
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


@asynccontextmanager
async def own_connection(settings: ConnectionSettings):
    """The baseline: what each trigger would do without the pool."""
    async with open_connection(settings) as conn:
        yield conn


async def measure(server: EmbeddedNatsServer, count: int, shared: bool) -> dict[str, float]:
    original = advisory_triggers.shared_connection
    if not shared:
        advisory_triggers.shared_connection = own_connection
    try:
        since = datetime.now(UTC).isoformat()
        triggers = [advisory_triggers.JetStreamAdvisoryTrigger(advisory="stream_deleted", advisory_stream=f"S{i}",
                                                               start_time=since, fetch_timeout=30)
                    for i in range(count)]
        gc.collect()
        heap_before, rss_before = tracemalloc.get_traced_memory()[0], rss_bytes()
        started = time.perf_counter()
        runs = [asyncio.ensure_future(anext(t.run())) for t in triggers]

        def all_waiting() -> bool:
            ended = [run for run in runs if run.done()]
            if ended:
                raise RuntimeError(f"{len(ended)} trigger(s) ended instead of waiting: {ended[0].result().payload}")
            return reader_consumers(server) >= count

        await wait_for(all_waiting, f"{count} waiting triggers")
        ready = time.perf_counter() - started
        gc.collect()
        heap_after, rss_after = tracemalloc.get_traced_memory()[0], rss_bytes()
        conns = connections(server)
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        await wait_for(lambda: reader_consumers(server) == 0 and connections(server) == 0, "clean up")
        return {
            "connections": conns,
            "heap_per_trigger_kib": (heap_after - heap_before) / count / 1024,
            "rss_per_trigger_kib": (rss_after - rss_before) / count / 1024,
            "seconds_to_all_waiting": ready,
        }
    finally:
        advisory_triggers.shared_connection = original


async def main(count: int) -> dict[str, dict[str, float]]:
    with EmbeddedNatsServer() as server:
        host, port = server.url.split("://", 1)[1].rsplit(":", 1)
        # tracemalloc slows the loop down a lot: give JetStream API requests room
        os.environ["AIRFLOW_CONN_NATS_DEFAULT"] = json.dumps({"conn_type": "nats", "host": host, "port": int(port),
                                                              "extra": {"request_timeout": 60}})
        async with open_connection(ConnectionSettings(servers=server.url)) as conn:
            await ensure_stream(conn, capture_stream_config("ADVISORIES", max_age="1h"))
        await measure(server, 5, shared=True)  # warm imports and caches outside the measurement
        tracemalloc.start()
        shared = await measure(server, count, shared=True)
        own = await measure(server, count, shared=False)
        tracemalloc.stop()
    return {"shared": shared, "one_connection_each": own}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--triggers", type=int, default=200)
    args = parser.parse_args()
    logging.getLogger("airflow_jetstream").setLevel(logging.WARNING)
    results = asyncio.run(main(args.triggers))
    shared, own = results["shared"], results["one_connection_each"]
    print(f"{args.triggers} waiting advisory triggers on one event loop")
    print(f"{'':24}{'connections':>12}{'heap KiB/trigger':>18}{'RSS KiB/trigger':>17}{'s to wait':>11}")
    for name, row in results.items():
        print(f"{name:24}{row['connections']:>12}{row['heap_per_trigger_kib']:>18.1f}"
              f"{row['rss_per_trigger_kib']:>17.1f}{row['seconds_to_all_waiting']:>11.2f}")
    print(f"ratio (one each / shared): connections {own['connections'] / max(shared['connections'], 1):.0f}x, "
          f"heap {own['heap_per_trigger_kib'] / max(shared['heap_per_trigger_kib'], 0.01):.1f}x")
