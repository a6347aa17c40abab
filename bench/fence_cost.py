"""Benchmark: which part of a write fence costs, one atomic batch in flight, in one run.

One embedded nats-server, one stream (``--storage``), 100-byte messages, batches of 1000 messages, in ``--rounds``
interleaved rounds (the order reverses every round; one warm-up round first), each writing ``--messages``:

* ``plain``: 1000 messages per atomic batch (:func:`publish_atomic_batch`), no fence;
* ``plus_message``: 999 and one more message on a new subject of the fence namespace, without a header: what one
  more message and one more subject per batch cost;
* ``plus_expectation``: the same with ``Nats-Expected-Last-Subject-Sequence: 0`` on it: the server's check at commit;
* ``fenced``: 999 messages through :func:`publish_chunk` with a fence id, as the Spark writer and the publish
  operator send them: the above plus the client's work (the chunk's digest, the fence's payload).

Prints the median rate of each against ``plain`` and the median CPU microseconds per message of this process and of
the nats-server: on a loaded box the CPU columns move far less than the rates. Run:
``.venv/bin/python bench/fence_cost.py [--storage memory] [--messages 50000] [--rounds 7]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cpu_time import process_cpu_seconds

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection
from airflow_jetstream.client.batches.atomic import publish_atomic_batch
from airflow_jetstream.client.batches.publish_chunks import TargetStream, check_target_stream, publish_chunk
from airflow_jetstream.client.batches.types import BatchMessage
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.embedded import EmbeddedNatsServer

PAYLOAD = b"x" * 100
STREAM, SUBJECT = "FENCECOST", "fencecost.x"
Write = Callable[[JetStreamConnection, TargetStream, str, int], Awaitable[object]]


def extra(tag: str, batch: int, **expectation: int) -> BatchMessage:
    """The 1000th message: on a new subject of the fence namespace, as a fence would be."""
    return BatchMessage(f"_FENCE.{STREAM}.{tag}-{batch}", b"{}", **expectation)


WRITES: dict[str, Write] = {
    "plain": lambda conn, _, tag, n: publish_atomic_batch(conn, [BatchMessage(SUBJECT, PAYLOAD)] * 1000),
    "plus_message": lambda conn, _, tag, n: publish_atomic_batch(
        conn, [BatchMessage(SUBJECT, PAYLOAD)] * 999 + [extra(tag, n)]),
    "plus_expectation": lambda conn, _, tag, n: publish_atomic_batch(
        conn, [BatchMessage(SUBJECT, PAYLOAD)] * 999 + [extra(tag, n, expected_last_subject_seq=0)]),
    "fenced": lambda conn, target, tag, n: publish_chunk(
        conn, [BatchMessage(SUBJECT, PAYLOAD)] * 999, target=target, fence_id=f"{tag}-{n}", max_msgs=999),
}


async def measure(conn: JetStreamConnection, target: TargetStream, write: Write, messages: int,
                  server_pid: int) -> tuple[float, float, float]:
    """Messages per second (the caller's, 999 or 1000 per batch), and client / server CPU us per message."""
    await conn.api_request(f"STREAM.PURGE.{STREAM}", {}, context=f"stream {STREAM!r}")
    tag = uuid.uuid4().hex
    server_before, client_before, started = process_cpu_seconds(server_pid), time.process_time(), time.perf_counter()
    for batch in range(messages // 1000):
        await write(conn, target, tag, batch)
    elapsed = time.perf_counter() - started
    return (messages / elapsed, (time.process_time() - client_before) * 1e6 / messages,
            (process_cpu_seconds(server_pid) - server_before) * 1e6 / messages)


async def main(args: argparse.Namespace) -> None:
    with EmbeddedNatsServer() as server:
        settings = ConnectionSettings(servers=server.url, request_timeout=30)
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": STREAM, "subjects": ["fencecost.>"], "allow_atomic": True,
                                       "storage": args.storage})
            target = await check_target_stream(conn, STREAM, mode="atomic", fence=True)
            print(f"fence_cost: {args.messages:,} messages per write, {args.storage} storage, {args.rounds} rounds, "
                  f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)
            runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in WRITES}
            for round_no in range(args.rounds + 1):  # round 0 warms up and is not counted
                for name in WRITES if round_no % 2 == 0 else reversed(WRITES):
                    measured = await measure(conn, target, WRITES[name], args.messages, server.process.pid)
                    if round_no:
                        runs[name].append(measured)
    plain = runs["plain"]
    for name, values in runs.items():
        rate = statistics.median(v[0] for v in values)
        per_round = " / ".join(f"{v[0] / p[0]:.2f}" for v, p in zip(values, plain, strict=True))
        print(f"{name:<18}{rate:>10,.0f} msgs/s {rate / statistics.median(p[0] for p in plain):5.2f}x   client CPU "
              f"{statistics.median(v[1] for v in values):4.2f} us/msg   server CPU "
              f"{statistics.median(v[2] for v in values):4.2f} us/msg   per round {per_round}")
    print(f"load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--storage", choices=("file", "memory"), default="file")
    parser.add_argument("--messages", type=int, default=50_000, help="messages per write (batches of 1000)")
    parser.add_argument("--rounds", type=int, default=7)
    asyncio.run(main(parser.parse_args()))
