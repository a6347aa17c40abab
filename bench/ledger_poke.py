"""The batch ledger at size: a poke at 1k / 10k / 100k / 1M batches, a Spark write task's ledger work, and 1,000
waiting ledger triggers (idle CPU, event latency); each against today's code measured in the same run.

The baseline is another checkout of the repository (``--baseline-tree``, e.g. ``git worktree add /tmp/ledger-base
f9aee87``), run in subprocesses against the same server and the same runs. A run of N batches is made fast: its
records (about a quarter consumed, 1 % claimed and in progress, the rest published) go in as one fast batch
into the ledger bucket, then the run's 16 counts shards; each size's bucket is deleted after its measurements.

    .venv/bin/python bench/ledger_poke.py --baseline-tree /tmp/ledger-base
    .venv/bin/python bench/ledger_poke.py --sizes 1000,10000 --triggers 200 --baseline-tree /tmp/ledger-base

Run it under /work/tools/heavy (the box otherwise quiet). Prints one JSON line per measurement and a table.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="bench-ledger-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
RUN = "bench__2026-11-27T00:00:00+00:00"
NOW = 1_800_000_000.0


# ---------------------------------------------------------------------------------------------- the runs

def records(size: int, start: int = 0) -> Iterator[dict[str, Any]]:
    """The records of a run of ``size`` batches: a quarter consumed, 1 % in progress (a future deadline)."""
    created = "2026-11-27T00:00:00+00:00"
    for i in range(start, size):
        state = "in_progress" if i % 100 == 0 else "consumed" if i % 4 == 1 else "published"
        rec: dict[str, Any] = {"run_id": RUN, "batch_id": f"job-{i % 64}-{i}", "stream": "ORDERS", "count": 1000,
                               "first_seq": i * 1000 + 1, "last_seq": i * 1000 + 1000, "state": state,
                               "attempts": 0 if state == "published" else 1, "created_at": created,
                               "updated_at": created}
        if state == "in_progress":
            rec.update(claim_id=f"c{i}", claimed_at=created, deadline="2099-01-01T00:00:00+00:00")
        yield rec


async def make_run(conn: Any, bucket: str, size: int) -> float:
    """Create the bucket and a run of ``size`` batches; returns the seconds it took."""
    from airflow_jetstream.client import BatchMessage
    from airflow_jetstream.client.admin.streams import ensure_stream
    from airflow_jetstream.client.batches.fast import publish_fast_batch
    from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
    from airflow_jetstream.client.ledger.counts import encode_counts, recounted
    from airflow_jetstream.client.ledger.records import SHARDS, BatchRecord, batch_key, counts_key
    from airflow_jetstream.client.ledger.store import Write, write

    started = time.perf_counter()
    await BatchLedger.open(conn, bucket)
    await ensure_stream(conn, {"name": f"KV_{bucket}", "allow_batched": True})  # this bench's bulk load only
    for start in range(0, size, 100_000):
        messages = [BatchMessage(f"$KV.{bucket}.{batch_key(RUN, r['batch_id'])}",
                                 json.dumps(r, separators=(",", ":")).encode())
                    for r in records(min(size, start + 100_000), start)]
        result = await publish_fast_batch(conn, messages, flow=2000)
        assert result.count == len(messages), result
    shards = recounted(RUN, (BatchRecord(**r) for r in records(size)), {}, NOW)
    await write(conn, bucket, [Write(counts_key(RUN, n), encode_counts(shards[n]), 0) for n in range(SHARDS)],
                context="bench counts")
    return time.perf_counter() - started


async def delete_bucket(conn: Any, bucket: str) -> None:
    await conn.api_request(f"STREAM.DELETE.KV_{bucket}")


# ---------------------------------------------------------------------------------- one side's measurements

def poke_times(url: str, bucket: str, repeats: int, reap: bool) -> list[float]:
    """Seconds of each of ``repeats`` pokes (the sensor's one look at the run) with this process's code."""
    from airflow_jetstream.client import ConnectionSettings, open_connection

    try:
        from airflow_jetstream.client.ledger.wait import LedgerWait
    except ImportError:  # today's code
        from airflow_jetstream.client.ledger.batch_ledger import ledger_status  # type: ignore[attr-defined]
    else:
        async def ledger_status(conn: Any, run_id: str, state: str, *, bucket: str, reap: bool) -> dict[str, Any]:
            return await LedgerWait(run_id, state, bucket, reap=reap).check(conn)

    async def go() -> list[float]:
        async with open_connection(ConnectionSettings(servers=url, request_timeout=60)) as conn:
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                status = await ledger_status(conn, RUN, "consumed", bucket=bucket, reap=reap)
                times.append(time.perf_counter() - started)
                assert status["batches"] > 0, status
            return times

    return asyncio.run(go())


def write_task(url: str, bucket: str, chunks: int, inflight: int = 4) -> dict[str, float]:
    """A Spark write task's ledger work with this process's code: its lookups of what is recorded (a listing of
    the run today), then one record per stored chunk, ``inflight`` chunks at a time (the writer's default for
    atomic chunks); seconds of each."""
    from airflow_jetstream.client import ConnectionSettings, open_connection
    from airflow_jetstream.client.ledger.batch_ledger import BatchLedger

    try:
        from airflow_jetstream.spark.writer import PartitionLedger
    except ImportError:  # today's code: every task lists the run
        PartitionLedger = None

    async def go() -> dict[str, float]:
        async with open_connection(ConnectionSettings(servers=url, request_timeout=60)) as conn:
            ledger = await BatchLedger.open(conn, bucket)
            task = f"task-{random.randrange(1 << 30)}"
            started = time.perf_counter()
            if PartitionLedger is not None:
                mine = PartitionLedger(ledger, RUN, task, 0)
                recorded = [c for c in range(chunks) if await mine.recorded(c)]
            else:
                prefix = f"{task}-0-"
                recorded = [r.batch_id async for r in ledger.iter_batches(RUN) if r.batch_id.startswith(prefix)]
            looked = time.perf_counter() - started
            assert not recorded
            gate = asyncio.Semaphore(inflight)

            async def record(c: int) -> None:
                async with gate:
                    await ledger.record(RUN, f"{task}-0-{c}", stream="ORDERS", count=1000)

            started = time.perf_counter()
            await asyncio.gather(*(record(c) for c in range(chunks)))
            return {"lookup_s": looked, "record_s": time.perf_counter() - started}

    return asyncio.run(go())


def waiting_triggers(url: str, count: int, bucket: str, idle: float, events: int) -> dict[str, Any]:
    """``count`` ledger triggers of this process's code waiting on one event loop (a triggerer), each on its own run
    of one published batch: CPU seconds per minute while nothing happens, then the latency of ``events`` runs
    consumed one after the other (from another thread and connection), from the start of the write that completes
    the run (its mark_consumed) to the trigger's event."""
    os.environ["AIRFLOW_CONN_NATS_DEFAULT"] = json.dumps({"conn_type": "nats", "host": url.split("//")[1]})
    import inspect

    from airflow_jetstream.client import ConnectionSettings, open_connection
    from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
    from airflow_jetstream.triggers.ledger import JetStreamBatchLedgerTrigger

    named = "ledger_bucket" if "ledger_bucket" in inspect.signature(JetStreamBatchLedgerTrigger).parameters \
        else "bucket"
    consumed_at: dict[str, float] = {}

    async def setup() -> None:
        async with open_connection(ConnectionSettings(servers=url, request_timeout=60)) as conn:
            ledger = await BatchLedger.open(conn, bucket)
            await asyncio.gather(*(ledger.record(f"r{n}", "b0", stream="ORDERS", count=1) for n in range(count)))

    def consume(order: list[int]) -> None:
        async def go() -> None:
            async with open_connection(ConnectionSettings(servers=url, request_timeout=60)) as conn:
                ledger = await BatchLedger.open(conn, bucket)
                for n in order:
                    claim = await ledger.claim(f"r{n}", "b0", owner="bench")
                    consumed_at[f"r{n}"] = time.time()  # the final write starts: its round trip counts in
                    await ledger.mark_consumed(claim)
                    await asyncio.sleep(0.05)
        asyncio.run(go())

    async def main() -> dict[str, Any]:
        await setup()
        fired: dict[str, float] = {}

        async def wait(n: int) -> None:
            trigger = JetStreamBatchLedgerTrigger(run_id=f"r{n}", **{named: bucket}, poll_interval=10.0)
            event = await anext(trigger.run())
            assert event.payload["status"] == "success", event.payload
            fired[f"r{n}"] = time.time()

        tasks = [asyncio.ensure_future(wait(n)) for n in range(count)]
        await asyncio.sleep(15)  # every trigger started and settled
        cpu0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        await asyncio.sleep(idle)
        cpu1, wall1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
        order = random.sample(range(count), events)
        consumer = threading.Thread(target=consume, args=(order,))
        consumer.start()
        while consumer.is_alive() or len(fired) < events:
            await asyncio.sleep(0.05)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        latencies = sorted(fired[r] - consumed_at[r] for r in consumed_at)
        return {"triggers": count, "idle_cpu_s_per_min": cpu / (wall1 - wall0) * 60,
                "latency_p50_s": statistics.median(latencies),
                "latency_p99_s": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
                "latency_max_s": latencies[-1], "events": len(latencies)}

    return asyncio.run(main())


ROLES = {"poke": poke_times, "write_task": write_task, "triggers": waiting_triggers}


def baseline(tree: str, role: str, *args: Any) -> Any:
    """Run ``role`` with today's code (``tree`` first on the path) in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": tree}
    proc = subprocess.run([sys.executable, __file__, "--role", role, json.dumps(args)], env=env, cwd=tree,
                          capture_output=True, text=True, check=False, timeout=3600)
    if proc.returncode:
        raise RuntimeError(f"baseline {role} failed: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ours(role: str, *args: Any) -> Any:
    proc = subprocess.run([sys.executable, __file__, "--role", role, json.dumps(args)],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, check=False,
                          timeout=3600)
    if proc.returncode:
        raise RuntimeError(f"{role} failed: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------- main

def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--baseline-tree", required=True)
    parser.add_argument("--triggers", type=int, default=1000)
    parser.add_argument("--idle", type=float, default=60.0)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--chunks", type=int, default=100)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from airflow_jetstream.client import ConnectionSettings, open_connection
    from airflow_jetstream.embedded import EmbeddedNatsServer

    def emit(**row: Any) -> None:
        print(json.dumps(row), flush=True)

    with tempfile.TemporaryDirectory(prefix="bench-ledger-store-") as store, \
            EmbeddedNatsServer(store_dir=store) as server:
        url = server.url

        def on_server(coro_fn: Any, *a: Any) -> Any:
            async def go() -> Any:
                async with open_connection(ConnectionSettings(servers=url, request_timeout=120)) as conn:
                    return await coro_fn(conn, *a)
            return asyncio.run(go())

        pokes = []
        for size in (int(s) for s in args.sizes.split(",")):
            bucket = f"bench_{size}"
            made = on_server(make_run, bucket, size)
            emit(measure="make_run", batches=size, seconds=round(made, 1))
            slow = 2 if size >= 1_000_000 else 5
            row: dict[str, Any] = {"measure": "poke", "batches": size}
            for reap in (False, True):
                new = ours("poke", url, bucket, 20, reap)
                old = baseline(args.baseline_tree, "poke", url, bucket, 1 if reap and size >= 1_000_000 else slow,
                               reap)
                tag = "reap_" if reap else ""
                row.update({f"{tag}new_ms": round(statistics.median(new) * 1000, 2),
                            f"{tag}baseline_ms": round(statistics.median(old) * 1000, 1)})
            row["ratio"] = round(row["baseline_ms"] / row["new_ms"], 1)
            row["reap_ratio"] = round(row["reap_baseline_ms"] / row["reap_new_ms"], 1)
            if size == 100_000:
                new_task = ours("write_task", url, bucket, args.chunks)
                old_task = baseline(args.baseline_tree, "write_task", url, bucket, args.chunks)
                emit(measure="write_task", batches_in_run=size, chunks=args.chunks,
                     new_lookup_ms=round(new_task["lookup_s"] * 1000, 1),
                     baseline_lookup_ms=round(old_task["lookup_s"] * 1000, 1),
                     new_record_ms_per_chunk=round(new_task["record_s"] * 1000 / args.chunks, 2),
                     baseline_record_ms_per_chunk=round(old_task["record_s"] * 1000 / args.chunks, 2))
            emit(**row)
            pokes.append(row)
            on_server(delete_bucket, bucket)
        for previous, row in itertools.pairwise(pokes):
            emit(measure="growth_per_10x", batches=f"{previous['batches']}->{row['batches']}",
                 new=round(row["new_ms"] / previous["new_ms"], 2),
                 baseline=round(row["baseline_ms"] / previous["baseline_ms"], 1),
                 reap_new=round(row["reap_new_ms"] / previous["reap_new_ms"], 2),
                 reap_baseline=round(row["reap_baseline_ms"] / previous["reap_baseline_ms"], 1))
        if args.triggers:
            new = ours("triggers", url, args.triggers, "bench_triggers_new", args.idle, args.events)
            old = baseline(args.baseline_tree, "triggers", url, args.triggers, "bench_triggers_old", args.idle,
                           args.events)
            emit(measure="triggers", new=new, baseline=old,
                 idle_cpu_ratio=round(old["idle_cpu_s_per_min"] / max(new["idle_cpu_s_per_min"], 1e-3), 1),
                 p50_ratio=round(old["latency_p50_s"] / new["latency_p50_s"], 1))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--role":
        role_args = json.loads(sys.argv[3])
        print(json.dumps(ROLES[sys.argv[2]](*role_args)))
    else:
        main()
