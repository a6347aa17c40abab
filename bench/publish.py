"""Publishing throughput: atomic batches, fast batch and the Batcher against their baseline and ceiling.

One run, one embedded nats-server, 100-byte messages, for each stream storage (file, memory):

- baseline: ``js.publish`` awaited one by one (one round trip per message);
- atomic: :func:`publish_atomic_batches`, 1000 messages per batch, one batch after another
  (``atomic_x2`` / ``atomic_x4``: two / four batches in flight, ``concurrency=2`` / ``4``);
  ``atomic_fenced``: batches of 999 messages each fenced (:func:`publish_chunks` with ``fence_prefix``: the
  fence makes 1000), target >= 0.9x ``atomic`` in messages of the caller per second;
- fast: :func:`publish_fast_batch`, all messages in one fast batch (default flow, 1000);
- batcher: :class:`Batcher` under 64 concurrent publishers, each awaiting its own result
  (``fence=False``: pipelined publishes, and with ``atomic=True``; ``batcher_fenced``: the default, every item
  with a msg id and its fence in atomic groups, in items per second);
- ceiling: fire-and-forget core ``nc.publish`` into the stream (no acks), timed until the stream
  holds every message.

For every method it also reports CPU time per message of the nats-server process (from
``/proc/<pid>/stat``) and of this client process: on a shared 2-core machine these say whether a
method is bound by the server's own work or by the client.

On an embedded 3-node cluster (:class:`EmbeddedNatsCluster`) in the same run, atomic batches (one
in flight) and the fast batch go into an R1 and an R3 file stream, interleaved, and the R3/R1
ratio is printed (``--cluster-only`` runs just that part, ``--no-cluster`` skips it).

Each method runs ``--repeat`` times, interleaved, and the median rate is reported with its ratio to
the baseline and to the ceiling, plus the targets of issue 3 (atomic >= 20x baseline and >= 0.5x
ceiling, fast >= 0.7x ceiling; the atomic targets are checked for each atomic row) and the
server's own bound for atomic batches on one stream (one core divided by its CPU per message: the
server handles every message of a stream on one goroutine)::

    .venv/bin/python bench/publish.py
    .venv/bin/python bench/publish.py --messages 50000 --storage file --repeat 5 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cpu_time import process_cpu_seconds

from airflow_jetstream.client import (
    Batcher,
    BatchMessage,
    ConnectionSettings,
    ensure_stream,
    open_connection,
    publish_fast_batch,
)
from airflow_jetstream.client.admin.streams import purge_stream, stream_info
from airflow_jetstream.client.batches.atomic import fence_count, publish_atomic_batches
from airflow_jetstream.client.batches.publish_chunks import publish_chunks
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.embedded import EmbeddedNatsCluster, EmbeddedNatsServer

PAYLOAD = b"x" * 100
PUBLISHERS = 64
TARGETS = (
    *((atomic, against, target) for atomic in ("atomic", "atomic_x2", "atomic_x4")
      for against, target in (("baseline", 20.0), ("ceiling", 0.5))),
    ("fast", "ceiling", 0.7),
)


async def stored(conn: JetStreamConnection, stream: str) -> int:
    """Messages in ``stream`` but the write fences of fenced atomic batches."""
    return int((await stream_info(conn, stream))["state"]["messages"]) - await fence_count(conn, stream)


async def wait_stored(conn: JetStreamConnection, stream: str, count: int, deadline: float = 120.0) -> None:
    end = time.monotonic() + deadline
    while await stored(conn, stream) < count:
        if time.monotonic() > end:
            raise TimeoutError(f"{stream} did not reach {count} messages within {deadline}s")
        await asyncio.sleep(0.002)


async def baseline(conn: JetStreamConnection, subject: str, n: int) -> None:
    for _ in range(n):
        await conn.js.publish(subject, PAYLOAD)


def atomic(concurrency: int) -> Callable[[JetStreamConnection, str, int], Awaitable[None]]:
    async def run(conn: JetStreamConnection, subject: str, n: int) -> None:
        await publish_atomic_batches(conn, [BatchMessage(subject, PAYLOAD)] * n, batch_size=1000,
                                     concurrency=concurrency)

    return run


def atomic_fenced(stream: str) -> Callable[[JetStreamConnection, str, int], Awaitable[None]]:
    """Atomic batches of 999 messages and their fence (the server's 1000), one after another, a fresh fence
    prefix per run."""
    async def run(conn: JetStreamConnection, subject: str, n: int) -> None:
        chunks = (([BatchMessage(subject, PAYLOAD)] * min(999, n - i)) for i in range(0, n, 999))
        await publish_chunks(conn, chunks, stream=stream, fence_prefix=uuid.uuid4().hex, max_msgs=999)

    return run


async def fast(conn: JetStreamConnection, subject: str, n: int) -> None:
    await publish_fast_batch(conn, [BatchMessage(subject, PAYLOAD)] * n)


def batcher(atomic_groups: bool, fence: bool = False) -> Callable[[JetStreamConnection, str, int], Awaitable[None]]:
    async def run(conn: JetStreamConnection, subject: str, n: int) -> None:
        prefix = uuid.uuid4().hex
        async with Batcher(conn, max_batch=1000, atomic=atomic_groups, fence=fence) as pool:
            async def publisher(k: int) -> None:
                for i in range(n // PUBLISHERS):
                    msg_id = f"{prefix}-{k}-{i}" if fence else None
                    (await pool.publish(subject, PAYLOAD, msg_id=msg_id)).raise_for_error()

            await asyncio.gather(*(publisher(k) for k in range(PUBLISHERS)))

    return run


async def measure(conn: JetStreamConnection, stream: str, subject: str, method, n: int, ceiling: bool,
                  server_pid: int) -> tuple[float, float, float]:
    """Messages per second, and server / client CPU microseconds per message, of one run."""
    await purge_stream(conn, stream)
    server_before, client_before = process_cpu_seconds(server_pid), time.process_time()
    started = time.perf_counter()
    if ceiling:
        publish = conn.nc.publish
        for _ in range(n):
            await publish(subject, PAYLOAD)
        await conn.nc.flush()
        await wait_stored(conn, stream, n)
    else:
        await method(conn, subject, n)
    elapsed = time.perf_counter() - started
    server_us = (process_cpu_seconds(server_pid) - server_before) * 1e6 / n
    client_us = (time.process_time() - client_before) * 1e6 / n
    if await stored(conn, stream) != n:
        raise RuntimeError(f"{stream}: expected {n} stored messages after {method}, got {await stored(conn, stream)}")
    return n / elapsed, server_us, client_us


async def bench_storage(conn: JetStreamConnection, storage: str, args: argparse.Namespace,
                        server_pid: int) -> dict[str, dict[str, float]]:
    stream = f"BENCH_{storage.upper()}"
    subject = f"bench.{storage}.x"
    await ensure_stream(conn, {"name": stream, "subjects": [f"bench.{storage}.>"], "storage": storage,
                               "allow_atomic": True, "allow_batched": True})
    plan = [
        ("baseline", baseline, args.baseline_messages, False),
        ("atomic", atomic(1), args.messages, False),
        ("atomic_fenced", atomic_fenced(stream), args.messages, False),
        ("atomic_x2", atomic(2), args.messages, False),
        ("atomic_x4", atomic(4), args.messages, False),
        ("fast", fast, args.messages, False),
        ("batcher", batcher(False), args.batcher_messages, False),
        ("batcher_atomic", batcher(True), args.batcher_messages, False),
        ("batcher_fenced", batcher(False, fence=True), args.batcher_messages, False),
        ("ceiling", None, args.messages, True),
    ]
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name, *_ in plan}
    for round_no in range(args.repeat):
        for name, method, n, is_ceiling in plan:
            runs[name].append(await measure(conn, stream, subject, method, n, is_ceiling, server_pid))
        print(f"  [{storage}] round {round_no + 1}/{args.repeat}: " +
              ", ".join(f"{k} {v[-1][0]:,.0f}" for k, v in runs.items()), flush=True)
    return {name: {"rate": statistics.median(r[0] for r in values),
                   "server_us": statistics.median(r[1] for r in values),
                   "client_us": statistics.median(r[2] for r in values)} for name, values in runs.items()}


def report(storage: str, medians: dict[str, dict[str, float]]) -> list[str]:
    base, ceil = medians["baseline"]["rate"], medians["ceiling"]["rate"]
    lines = [f"\n{storage} storage, 100-byte messages (medians; CPU in microseconds per message)",
             f"{'method':<16}{'msgs/s':>12}{'x baseline':>12}{'x ceiling':>11}{'server CPU':>12}{'client CPU':>12}"]
    for name, row in medians.items():
        rate = row["rate"]
        lines.append(f"{name:<16}{rate:>12,.0f}{rate / base:>12.1f}{rate / ceil:>11.2f}"
                     f"{row['server_us']:>12.1f}{row['client_us']:>12.1f}")
    fence_ratio = medians["atomic_fenced"]["rate"] / medians["atomic"]["rate"]
    lines.append(f"target atomic_fenced >= 0.9x atomic (fences cost under 10 %): {fence_ratio:.2f}x "
                 f"{'MET' if fence_ratio >= 0.9 else 'MISSED'}")
    for method, against, target in TARGETS:
        ratio = medians[method]["rate"] / medians[against]["rate"]
        lines.append(f"target {method} >= {target}x {against}: {ratio:.2f}x {'MET' if ratio >= target else 'MISSED'}")
    # nats-server processes every message of a stream on that stream's one goroutine, so one core
    # divided by the server CPU per message bounds what any client can reach on one stream.
    bound = 1e6 / medians["atomic"]["server_us"]
    lines.append(f"server bound for atomic on one stream (one core / {medians['atomic']['server_us']:.1f} us): "
                 f"{bound:,.0f} msgs/s = {bound / base:.1f}x baseline, {bound / ceil:.2f}x ceiling")
    return lines


async def bench_cluster(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Atomic and fast batch rates into an R1 and an R3 file stream of one embedded 3-node cluster."""
    with EmbeddedNatsCluster(size=3) as cluster:
        settings = ConnectionSettings(servers=cluster.servers, request_timeout=10)
        async with open_connection(settings) as conn:
            for replicas in (1, 3):
                await ensure_stream(conn, {"name": f"BENCH_R{replicas}", "subjects": [f"bench.r{replicas}.>"],
                                           "num_replicas": replicas, "allow_atomic": True, "allow_batched": True})
            client_node = next(n.name for n in cluster.nodes if n.port == conn.nc.connected_url.port)
            print(f"3-node cluster {cluster.servers}, client on {client_node}, leaders: R1 on "
                  f"{cluster.stream_leader('BENCH_R1')}, R3 on {cluster.stream_leader('BENCH_R3')}", flush=True)
            plan = [(f"{name}_r{replicas}", method, replicas)
                    for name, method in (("atomic", atomic(1)), ("fast", fast)) for replicas in (1, 3)]
            rates: dict[str, list[float]] = {name: [] for name, *_ in plan}
            for round_no in range(args.repeat):
                for name, method, replicas in plan:
                    stream, subject = f"BENCH_R{replicas}", f"bench.r{replicas}.x"
                    await purge_stream(conn, stream)
                    started = time.perf_counter()
                    await method(conn, subject, args.messages)
                    rates[name].append(args.messages / (time.perf_counter() - started))
                    if await stored(conn, stream) != args.messages:
                        raise RuntimeError(f"{stream}: expected {args.messages} stored messages after {name}")
                print(f"  [cluster] round {round_no + 1}/{args.repeat}: " +
                      ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rates.items()), flush=True)
    return {name: {"rate": statistics.median(values)} for name, values in rates.items()}


def report_cluster(medians: dict[str, dict[str, float]]) -> list[str]:
    lines = ["\n3-node cluster, file storage, 100-byte messages (medians)",
             f"{'method':<10}{'R1 msgs/s':>12}{'R3 msgs/s':>12}{'R3 / R1':>9}"]
    for method in ("atomic", "fast"):
        r1, r3 = medians[f"{method}_r1"]["rate"], medians[f"{method}_r3"]["rate"]
        lines.append(f"{method:<10}{r1:>12,.0f}{r3:>12,.0f}{r3 / r1:>9.2f}")
    return lines


async def main(args: argparse.Namespace) -> dict[str, dict[str, dict[str, float]]]:
    storages = ["file", "memory"] if args.storage == "both" else [args.storage]
    results: dict[str, dict[str, dict[str, float]]] = {}
    if args.cluster_only:
        results["cluster"] = await bench_cluster(args)
        print("\n".join(report_cluster(results["cluster"])))
        return results
    with EmbeddedNatsServer() as server:
        async with open_connection(ConnectionSettings(servers=server.url, request_timeout=10)) as conn:
            print(f"nats-server {server.url}, {args.messages} msgs (baseline {args.baseline_messages}, batcher "
                  f"{args.batcher_messages} from {PUBLISHERS} publishers), {args.repeat} rounds, "
                  f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)
            for storage in storages:
                results[storage] = await bench_storage(conn, storage, args, server.process.pid)
    if args.cluster:
        results["cluster"] = await bench_cluster(args)
    for storage, medians in results.items():
        print("\n".join(report_cluster(medians) if storage == "cluster" else report(storage, medians)))
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--baseline-messages", type=int, default=3_000)
    parser.add_argument("--batcher-messages", type=int, default=PUBLISHERS * 200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--storage", choices=("file", "memory", "both"), default="both")
    parser.add_argument("--json", help="also write the medians to this JSON file")
    parser.add_argument("--cluster", action=argparse.BooleanOptionalAction, default=True,
                        help="also compare R3 and R1 streams on an embedded 3-node cluster (default on)")
    parser.add_argument("--cluster-only", action="store_true", help="run only the cluster comparison")
    arguments = parser.parse_args()
    medians = asyncio.run(main(arguments))
    if arguments.json:
        Path(arguments.json).write_text(json.dumps(medians, indent=2))
