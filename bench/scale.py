"""How time and memory grow with input size, for every path that takes user-sized input.

One embedded nats-server; for each path three sizes a factor of 4 apart:

- ``operator``: :class:`JetStreamAtomicBatchPublishOperator` publishing a JSON Lines file of
  ~100-byte messages (``split=True``, validating pass then sending pass);
- ``ledger_list`` / ``ledger_reap``: a batch ledger run with N batches (a tenth of them expired claims),
  written as the ledger writes a run (its records plus its 16 counts shards): the streaming listing, the
  reaper; ``ledger_batches``, the sorted listing that holds every record, is the contrast; ``ledger_watch``,
  the baseline, is nats-py's own KV watcher reading the latest value of every key (the server's
  last-per-subject delivery, with no ledger work): how the listing grows when the server is the bound. The
  sensor's summary reads the counts shards only (one request at any size): ``bench/ledger_poke.py`` measures it;
- ``capture``: the advisory capture reader scanning N captured advisories (``find_captured``: batched direct gets,
  as a poke reads);
- ``cursor``: a bounded read of an N-message stream through its cursor consumer
  (``plan_read`` + ``read_range`` + ``acknowledge_read``), counting what it reads;
- ``consume``: :func:`consume` (what ``JetStreamConsumeOperator`` runs) through a durable pull
  consumer, a function per batch of 1000, acknowledged after it returned;
- ``poke_advisory`` / ``poke_kv`` / ``poke_message``: ``POKES`` sensor pokes (the trigger's own ``check``, as the
  sensor runs it) against a capture stream, bucket or stream holding N items, of which one is what the sensor
  waits for (an advisory of its stream and batch, its key, a message on its subject): a poke reads without a
  consumer and only what concerns it, so its time should not grow with N (goal: flat, x1.3 at most per 4x).

Each measurement runs in a fresh child process: it does the same work on a small warm-up input
first, then reads its peak RSS (``ru_maxrss``), does the measured work and reads it again.
Printed per size: the input size, the step's own count (messages published, batches listed or
summarised, claims reaped, advisories scanned, messages read), seconds, input items per second,
peak RSS and its growth over the warm-up; per path the growth
ratios per 4x input: time (goal ~4, within 1.3x of linear: <= 5.2) and peak RSS (goal < 1.3)::

    .venv/bin/python bench/scale.py
    .venv/bin/python bench/scale.py --paths operator --base 100 --steps 1   # one 2.5M-message file
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection
from airflow_jetstream.client.advisories import AdvisoryFilter, find_captured
from airflow_jetstream.client.advisories.capture import capture_stream_config
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.kv.bucket import ensure_bucket
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.ledger.counts import encode_counts, recounted
from airflow_jetstream.client.ledger.records import SHARDS, BatchRecord, batch_key, counts_key
from airflow_jetstream.client.ledger.store import Write, write
from airflow_jetstream.client.reading.consume import ConsumeOptions, consume
from airflow_jetstream.client.reading.read_plan import acknowledge_read, plan_read
from airflow_jetstream.client.reading.stored import read_range
from airflow_jetstream.embedded import EmbeddedNatsServer

PATHS = ("operator", "ledger_list", "ledger_batches", "ledger_watch", "ledger_reap", "capture", "cursor", "consume",
         "poke_advisory", "poke_kv", "poke_message")
#: Paths whose time should stay flat as the input grows (a poke reads only what concerns it).
FLAT = ("poke_advisory", "poke_kv", "poke_message")
#: Pokes per measurement of a poke path.
POKES = 200
#: Input sizes per path at --base 1: (smallest size, warm-up size).
SIZES = {"operator": (25_000, 2_000), "ledger": (6_250, 500), "capture": (25_000, 2_000), "cursor": (25_000, 2_000),
         "consume": (6_250, 500), "poke": (25_000, 2_000)}
FACTOR = 4
RUN = "daily"
ADVISORY = "$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED"
#: The durable (cursor) consumer of this child process: its warm-up reads the warm stream from the start.
CONSUMER = f"scale-{os.getpid()}"


def family(path: str) -> str:
    return path.split("_")[0]


def message_line(n: int) -> str:
    return f'{{"data":{{"order":{n},"customer":"c-{n % 977:04d}","amount":{n % 1000}.25,"note":"scale"}}}}\n'


# --- inputs (written by the parent, outside the measured process) -----------------------------------


async def _flush_until(conn: JetStreamConnection, stream: str, count: int) -> None:
    await conn.nc.flush()
    for _ in range(6000):
        if (await conn.js.stream_info(stream)).state.messages >= count:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"stream {stream} did not reach {count} messages")


async def make_input(conn: JetStreamConnection, path: str, size: int, workdir: Path) -> str:
    """Create the input of ``path`` with ``size`` items; returns what the child needs to find it."""
    name = f"{family(path).upper()}{size}"
    if path == "operator":
        await ensure_stream(conn, {"name": name, "subjects": [f"{name.lower()}.>"], "allow_atomic": True})
        file = workdir / f"{name}.jsonl"
        with file.open("w") as out:
            for start in range(0, size, 10_000):
                out.write("".join(message_line(n) for n in range(start, min(size, start + 10_000))))
        return str(file)
    if family(path) == "ledger":
        bucket = f"{name}_{path.split('_')[1]}"
        await BatchLedger.open(conn, bucket)
        now = datetime.now(UTC)
        for record in ledger_records(size, now):
            await conn.nc.publish(f"$KV.{bucket}.{batch_key(RUN, record.batch_id)}", record.encode())
        await _flush_until(conn, f"KV_{bucket}", size)
        shards = recounted(RUN, ledger_records(size, now), {}, now.timestamp())  # the run's counts, as the ledger keeps
        await write(conn, bucket, [Write(counts_key(RUN, n), encode_counts(shards[n]), 0) for n in range(SHARDS)],
                    context="scale bench counts")
        return bucket
    if path == "capture":  # the stream as JetStreamAdvisoryStreamOperator makes it (direct gets allowed)
        await ensure_stream(conn, capture_stream_config(name, max_age="1h", subjects=[f"{ADVISORY}.{name}"]))
        stamp = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        for index in range(size):
            body = {"type": "io.nats.jetstream.advisory.v1.stream_batch_abandoned", "id": f"a{index}",
                    "timestamp": stamp, "stream": name, "batch": f"b{index}", "reason": "timeout"}
            await conn.nc.publish(f"{ADVISORY}.{name}", json.dumps(body).encode())
        await _flush_until(conn, name, size)
        return name
    if family(path) == "poke":
        return await make_poke_input(conn, path, f"{path.upper()}{size}", size)
    await ensure_stream(conn, {"name": name, "subjects": [f"{name.lower()}.>"]})
    for index in range(size):
        await conn.nc.publish(f"{name.lower()}.{index % 8}", message_line(index).encode())
    await _flush_until(conn, name, size)
    return name


def ledger_records(size: int, now: datetime) -> Iterator[BatchRecord]:
    """The records of a run of ``size`` batches: every tenth an expired claim, the others published."""
    stamp, past = now.isoformat(), (now - timedelta(hours=1)).isoformat()
    for index in range(size):
        claimed = index % 10 == 0
        yield BatchRecord(run_id=RUN, batch_id=f"b{index:07d}", stream="DATA", count=1000, first_seq=index * 1000 + 1,
                          last_seq=index * 1000 + 1000, created_at=stamp, updated_at=stamp,
                          state="in_progress" if claimed else "published", attempts=1 if claimed else 0,
                          owner="w1" if claimed else None, claim_id=f"c{index}" if claimed else None,
                          claimed_at=past if claimed else None, deadline=past if claimed else None)


async def make_poke_input(conn: JetStreamConnection, path: str, name: str, size: int) -> str:
    """``size`` items of which only the last concerns the poke (its advisory, its key, its subject)."""
    if path == "poke_advisory":
        own = [f"{ADVISORY}.{name}_S{j}" for j in range(50)] + [f"{ADVISORY}.{name}_TARGET"]
        await ensure_stream(conn, capture_stream_config(name, max_age="1h", subjects=own))
        stamp = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        for index in range(size + 1):
            stream = f"{name}_TARGET" if index == size else f"{name}_S{index % 50}"
            body = {"type": "io.nats.jetstream.advisory.v1.stream_batch_abandoned", "id": f"a{index}",
                    "timestamp": stamp, "stream": stream, "batch": f"b{index}", "reason": "timeout"}
            await conn.nc.publish(f"{ADVISORY}.{stream}", json.dumps(body).encode())
        await _flush_until(conn, name, size + 1)
        return name
    if path == "poke_kv":
        bucket = name.lower()
        await ensure_bucket(conn, bucket)
        for index in range(size):
            await conn.nc.publish(f"$KV.{bucket}.k{index}", b"waiting")
        await conn.nc.publish(f"$KV.{bucket}.target", b"ready")
        await _flush_until(conn, f"KV_{bucket}", size + 1)
        return bucket
    await ensure_stream(conn, {"name": name, "subjects": [f"{name.lower()}.>"], "allow_direct": True})
    for index in range(size):
        await conn.nc.publish(f"{name.lower()}.other.{index % 8}", message_line(index).encode())
    await conn.nc.publish(f"{name.lower()}.target", b"{}")
    await _flush_until(conn, name, size + 1)
    return name


def poke_trigger(path: str, target: str) -> Any:
    """The trigger whose ``check`` is the sensor's poke for ``path``."""
    if path == "poke_advisory":
        from airflow_jetstream.triggers.advisory import JetStreamAdvisoryTrigger

        return JetStreamAdvisoryTrigger(advisory="batch_abandoned", advisory_stream=f"{target}_TARGET",
                                        capture_stream=target, start_time="1970-01-01T00:00:00+00:00")
    if path == "poke_kv":
        from airflow_jetstream.triggers.kv import JetStreamKeyValueTrigger

        return JetStreamKeyValueTrigger(bucket=target, key="target", value="ready")
    from airflow_jetstream.triggers.await_message import JetStreamAwaitMessageTrigger

    return JetStreamAwaitMessageTrigger(stream=target, filter_subject=f"{target.lower()}.target",
                                        apply_function="builtins.bool", start_seq=1)


# --- the measured work (in the child) ---------------------------------------------------------------


def run_operator(settings: ConnectionSettings, target: str) -> int:
    from airflow_jetstream.operators.publish import JetStreamAtomicBatchPublishOperator

    stream = Path(target).stem
    result = JetStreamAtomicBatchPublishOperator(task_id="scale", messages_file=target, subject=f"{stream.lower()}.in",
                                                 stream=stream, split=True).execute(context={})
    return result["count"]


async def run_async(settings: ConnectionSettings, path: str, target: str) -> int:
    async with open_connection(settings) as conn:
        if family(path) == "ledger":
            ledger = await BatchLedger.open(conn, target, create=False)
            if path == "ledger_list":
                count = 0
                async for _ in ledger.iter_batches(RUN):
                    count += 1
                return count
            if path == "ledger_batches":
                return len(await ledger.batches(RUN))
            if path == "ledger_watch":
                return await _watch_all(conn, target)
            reaped = await ledger.reap(RUN)
            return reaped["returned_count"] + reaped["failed_count"]
        if path == "capture":
            flt = AdvisoryFilter(advisory="batch_abandoned", stream=target, batch="never")
            found = await find_captured(conn, target, start_time="1970-01-01T00:00:00Z", advisory_filter=flt)
            return found["scanned"]
        if family(path) == "poke":
            for _ in range(POKES):
                if await poke_trigger(path, target).check(conn) is None:
                    raise RuntimeError(f"{path}: the poke did not find what it waits for in {target}")
            return POKES
        if path == "consume":
            stored = (await conn.js.stream_info(target)).state.messages
            options = ConsumeOptions(per_batch=True, batch_size=1000, max_messages=stored)
            return (await consume(conn, target, lambda batch: None, consumer=CONSUMER, options=options))["processed"]
        plan = await plan_read(conn, target, consumer=CONSUMER)
        count = 0
        async for chunk in read_range(conn, target, plan.first_seq, plan.last_seq):
            count += len(chunk)
        await acknowledge_read(conn, plan)
        return count


async def _watch_all(conn: JetStreamConnection, bucket: str) -> int:
    """The baseline of ``ledger_list``: every key's latest value through nats-py's KV watcher."""
    watcher = await (await conn.js.key_value(bucket)).watchall()
    count = 0
    try:
        async for entry in watcher:
            if entry is None:  # nats-py's marker: every key's latest value was delivered
                return count
            count += 1
    finally:
        await watcher.stop()
    return count


def child(path: str, url: str, warm: str, target: str) -> None:
    settings = ConnectionSettings(servers=url, request_timeout=30)
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="scale-airflow-"))  # the poke paths import Airflow
    os.environ["AIRFLOW_CONN_NATS_DEFAULT"] = json.dumps(
        {"conn_type": "nats", "host": host, "port": int(port), "extra": {"request_timeout": 30}})

    def work(what: str) -> int:
        if path == "operator":
            return run_operator(settings, what)
        return asyncio.run(run_async(settings, path, what))

    work(warm)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.perf_counter()
    items = work(target)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps({"items": items, "seconds": seconds, "peak_mb": peak, "growth_mb": peak - before}))


# --- the parent ----------------------------------------------------------------------------------


def measure(path: str, url: str, warm: str, target: str) -> dict[str, Any]:
    run = subprocess.run([sys.executable, __file__, "--child", path, url, warm, target], capture_output=True,
                         text=True, timeout=3600)
    line = next((x for x in run.stdout.splitlines() if x.startswith("RESULT ")), None)
    if run.returncode or line is None:
        raise RuntimeError(f"{path} {target}: child failed\n{run.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def on_server(url: str, func: Callable[[JetStreamConnection], Awaitable[Any]]) -> Any:
    async def call() -> Any:
        async with open_connection(ConnectionSettings(servers=url, request_timeout=30)) as conn:
            return await func(conn)

    return asyncio.run(call())


def run_path(path: str, url: str, workdir: Path, base: float, steps: int) -> list[dict[str, Any]]:
    """Measure ``path`` at ``steps`` sizes; print a row per size and the growth ratios."""
    smallest, warm_size = SIZES[family(path)]
    warm = on_server(url, lambda conn: make_input(conn, path, warm_size, workdir))
    results = []
    for step in range(steps):
        size = int(smallest * base) * FACTOR ** step
        target = on_server(url, lambda conn, s=size: make_input(conn, path, s, workdir))
        result = measure(path, url, warm, target)
        results.append({"path": path, "size": size, **result})
        print(f"{path:<15} {size:>9} {result['items']:>9} {result['seconds']:>8.2f} {size / result['seconds']:>9.0f} "
              f"{result['peak_mb']:>8.0f} {result['growth_mb']:>9.1f}", flush=True)
    for small, big in itertools.pairwise(results):
        time_ratio = big["seconds"] / small["seconds"]
        peak_ratio = big["peak_mb"] / small["peak_mb"]
        bound = 1.3 if path in FLAT else FACTOR * 1.3
        verdict = "ok" if time_ratio <= bound and peak_ratio < 1.3 else "MISSED"
        print(f"{'':<15} x{FACTOR} input: time x{time_ratio:.2f}, peak RSS x{peak_ratio:.2f} "
              f"(growth {small['growth_mb']:.1f} -> {big['growth_mb']:.1f} MB) {verdict}", flush=True)
    if len(results) > 2:  # over the whole span: the smallest step's fixed costs and timer noise weigh less
        span = results[-1]["seconds"] / results[0]["seconds"]
        per_step = span ** (1 / (len(results) - 1))
        verdict = "ok" if per_step <= (1.3 if path in FLAT else FACTOR * 1.3) else "MISSED"
        print(f"{'':<15} x{FACTOR ** (len(results) - 1)} input overall: time x{span:.2f}, "
              f"x{per_step:.2f} per x{FACTOR} {verdict}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated subset of {','.join(PATHS)}")
    parser.add_argument("--base", type=float, default=1.0, help="multiply every size by this")
    parser.add_argument("--steps", type=int, default=3, help="how many sizes (each 4x the previous)")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    paths = [p for p in args.paths.split(",") if p]
    unknown = set(paths) - set(PATHS)
    if unknown:
        parser.error(f"unknown path(s) {sorted(unknown)}; use {', '.join(PATHS)}")
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (others share this box)")
    with tempfile.TemporaryDirectory(prefix="scale-") as tmp, EmbeddedNatsServer(store_dir=f"{tmp}/nats") as srv:
        print(f"{'path':<15} {'size':>9} {'result':>9} {'seconds':>8} {'size/s':>9} {'peak MB':>8} {'growth MB':>9}")
        rows = [row for path in paths for row in run_path(path, srv.url, Path(tmp), args.base, args.steps)]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
