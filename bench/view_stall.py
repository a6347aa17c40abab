"""The JetStream view against a stalled NATS: concurrent page loads while Airflow's other pages keep answering.

Starts a nats-server (seeded with tests/support/jetstream_view.py) and Airflow's api-server (one worker,
sqlite, simple auth manager), then measures in one run:

- baseline: Airflow's own pages (``/api/v2/dags``, ``/api/v2/monitor/health``) fetched one after the other,
  NATS healthy, no view load;
- healthy: ``--loads`` concurrent loads of the view (one query), and how many NATS reads they made;
- stalled (SIGSTOP of the nats-server): ``--loads`` concurrent loads of the same query, then of
  ``--loads`` different queries (another ledger bucket each: no sharing, so ``view_concurrent_reads``
  bounds them), while Airflow's pages are fetched one after the other; status codes, seconds to answer,
  reads made (the api-server's log lines), and Airflow's page latency against the baseline.

    python bench/view_stall.py [--loads 20] [--view-timeout 10s]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.embedded import EmbeddedNatsServer
from tests.support import jetstream_view
from tests.support.airflow_cli import nats_conn_json
from tests.support.airflow_ui import running_api_server
from tests.support.stall import resume, stop

CONN = "nats_bench"
USER, PASSWORD = "admin", "bench-pw"
AIRFLOW_PAGES = ("/api/v2/dags", "/api/v2/monitor/health")


def reads(log: Path) -> int:
    return sum(f"JetStream view of {CONN}:" in line for line in log.read_text().splitlines())


async def timed(client: httpx.AsyncClient, path: str) -> tuple[int, float]:
    started = time.perf_counter()
    reply = await client.get(path)
    return reply.status_code, time.perf_counter() - started


async def airflow_pages(client: httpx.AsyncClient, until: asyncio.Event | None, rounds: int) -> list[float]:
    """Airflow's pages one after the other: ``rounds`` times, or until ``until`` is set."""
    took = []
    for _ in range(rounds):
        for path in AIRFLOW_PAGES:
            status, seconds = await timed(client, path)
            assert status == 200, (path, status)
            took.append(seconds)
        if until is not None and until.is_set():
            break
    return took


async def view_loads(client: httpx.AsyncClient, paths: list[str]) -> list[tuple[int, float]]:
    return list(await asyncio.gather(*(timed(client, path) for path in paths)))


def summary(name: str, results: list[tuple[int, float]], reads_made: int) -> None:
    codes: dict[int, int] = {}
    for status, _ in results:
        codes[status] = codes.get(status, 0) + 1
    seconds = sorted(s for _, s in results)
    print(f"{name}: {len(results)} loads -> {codes}, answered in {seconds[0]:.2f} / {statistics.median(seconds):.2f}"
          f" / {seconds[-1]:.2f} s (min / median / max), NATS reads made: {reads_made}")


def latency(name: str, took: list[float], baseline: float | None = None) -> float:
    median = statistics.median(took)
    ratio = f", x{median / baseline:.2f} the baseline" if baseline else ""
    print(f"{name}: {len(took)} requests, median {median * 1000:.1f} ms, max {max(took) * 1000:.1f} ms{ratio}")
    return median


async def run(url: str, log: Path, nats_pid: int, loads: int) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        token = (await client.post("/auth/token", json={"username": USER, "password": PASSWORD})).json()
        client.headers["Authorization"] = f"Bearer {token['access_token']}"
        await airflow_pages(client, None, 5)  # warm up
        base = latency("baseline: Airflow pages, NATS healthy, no view load", await airflow_pages(client, None, 30))
        same = f"/jetstream/api/connections/{CONN}"
        before = reads(log)
        summary("healthy NATS, one query", await view_loads(client, [same] * loads), reads(log) - before)

        stop(nats_pid)
        try:
            for name, paths in (("stalled NATS, one query", [f"{same}?ledger_bucket=stalled"] * loads),
                                ("stalled NATS, a different query each",
                                 [f"{same}?ledger_bucket=bench_{i}" for i in range(loads)])):
                before = reads(log)
                done = asyncio.Event()
                loading = asyncio.ensure_future(view_loads(client, paths))
                loading.add_done_callback(lambda _, finished=done: finished.set())
                took = await airflow_pages(client, done, 10_000)
                results = await loading
                summary(name, results, reads(log) - before)
                latency("  Airflow pages meanwhile", took, base)
        finally:
            resume(nats_pid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loads", type=int, default=20)
    parser.add_argument("--view-timeout", default="10s")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-view-") as tmp:
        server = EmbeddedNatsServer(store_dir=Path(tmp, "nats"), jetstream=jetstream_view.SERVER_JETSTREAM).start()
        try:
            jetstream_view.seed_view_data(ConnectionSettings(servers=server.url))
            with running_api_server(Path(tmp, "airflow"), USER, PASSWORD,
                                    AIRFLOW__JETSTREAM__VIEW_TIMEOUT=args.view_timeout,
                                    **{f"AIRFLOW_CONN_{CONN.upper()}": nats_conn_json(server.url)}) as ui:
                print(f"api-server (1 worker) {ui.url}, nats-server {server.url}, view_timeout {args.view_timeout}, "
                      f"load average {os.getloadavg()[0]:.1f}")
                assert server.process is not None
                asyncio.run(run(ui.url, ui.log, server.process.pid, args.loads))
        finally:
            server.close()


if __name__ == "__main__":
    main()
