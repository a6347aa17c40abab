"""Benchmark: the ``jetstream`` Spark data source against plain nats-py baselines, in one run.

One embedded nats-server, Spark ``local[2]``, the same DataFrame of ``--rows`` rows (~100 byte JSON
payloads, 2 partitions) for every write:

* write baseline: ``foreachPartition`` publishing one awaited ``js.publish`` per row;
* data source ``mode=atomic`` (atomic batches of 1000, batch ledger on) and ``mode=fast`` (fast batches
  of 10,000), default options;
* read baseline: one process, a nats-py pull consumer fetching 500 at a time and acking every message
  (the plain loop); also shown: the same loop on an ``ack_policy: none`` consumer;
* data source read of the same stream (all columns materialised by an aggregate);
* streaming, median of 3 interleaved rounds: the same read as a streaming query (Trigger.AvailableNow,
  the aggregate in ``foreachBatch``) against the batch read, and a copy of the stream into a new one
  as a streaming query (source and sink) against the same copy as a batch job (batch writer).

Prints rows/s (with the nats-server process's CPU microseconds per row, from ``/proc``, to show how
much of the shared 2 cores the server itself needs) and the ratios against the targets (atomic >= 8x,
bulk >= 15x, read >= 2x, streaming read and streaming sink >= 0.8x their batch counterparts).
Run: ``.venv/bin/python bench/spark_io.py [--rows 200000]``.

``--bulk`` instead compares the data source's ``mode=fast`` with a bare fast batch in the same Spark job
shape (``mapInArrow``: each of the 2 tasks publishes its rows as fast batches of 10,000 through the
client's ``publish_chunk`` with the same per-row msg ids; no stream check, ledger or job record),
in ``--rounds`` interleaved rounds, and prints the median ratio (target >= 0.8x).

``--fence`` instead compares the atomic write (chunks fenced, the default) with ``fence=false`` in
``--rounds`` interleaved rounds (which goes first alternates), and prints the median ratio (target >= 0.9x:
fences cost under 10 %) and the median ratios of CPU per row, of this process with Spark's JVM and Python
workers below it and of the nats-server, which a loaded box moves far less than the rates.

``--standalone`` instead compares the data source on ``local[2]`` with the same writes and read on a
Spark standalone cluster (master + 2 workers of 1 core each, ``EmbeddedSparkCluster``), same rows,
same nats-server, in one run: executors are separate JVMs with their own Python workers there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from cpu_time import process_cpu_seconds, tree_cpu_seconds
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from streaming_bound import fixed_costs

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection, stream_info
from airflow_jetstream.client.batches.atomic import fence_count
from airflow_jetstream.embedded import EmbeddedNatsServer
from airflow_jetstream.spark import register

TARGETS = {"atomic": 8.0, "fast": 15.0, "read": 2.0, "stream_read": 0.8, "stream_sink": 0.8}


def make_frame(spark: SparkSession, rows: int) -> Any:
    """``rows`` orders as (subject, payload) with ~100-byte JSON payloads, in 2 partitions."""
    return spark.range(0, rows, numPartitions=2).select(
        F.concat(F.lit("bench.orders."), (F.col("id") % 8).cast("string")).alias("subject"),
        F.to_json(F.struct(
            F.col("id").alias("order_id"),
            F.concat(F.lit("customer-"), (F.col("id") % 977).cast("string")).alias("customer"),
            (F.col("id") % 1000 / 7).cast("decimal(10,2)").alias("amount"),
            F.lit("2026-01-31T12:00:00Z").alias("created"),
            F.lit("EUR").alias("currency"),
        )).alias("payload"),
    ).cache()


def naive_partition(url: str, stream_subject_prefix: str):
    def publish_rows(rows: Any) -> None:
        import nats

        async def run() -> None:
            nc = await nats.connect(url)
            js = nc.jetstream()
            for row in rows:
                await js.publish(stream_subject_prefix + row.subject, row.payload.encode())
            await nc.close()

        asyncio.run(run())

    return publish_rows


async def make_stream(settings: ConnectionSettings, name: str, subject: str, **flags: Any) -> None:
    async with open_connection(settings) as conn:
        await ensure_stream(conn, {"name": name, "subjects": [f"{subject}.>"], **flags})


async def stored(settings: ConnectionSettings, name: str) -> int:
    """Rows in stream ``name``: its messages but the write fences of atomic chunks."""
    async with open_connection(settings) as conn:
        return int((await stream_info(conn, name))["state"]["messages"]) - await fence_count(conn, name)


@contextlib.contextmanager
def comparison(what: str, rows: int, rounds: int) -> Iterator[tuple[Any, ConnectionSettings, SparkSession, Any, int]]:
    """One nats-server and a ``local[2]`` session with the bench frame cached, for ``--<what>``'s interleaved rounds:
    yields (server, settings, spark, frame, the server's pid)."""
    print(f"spark_io --{what}: {rows:,} rows, local[2], {rounds} interleaved rounds, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}")
    with EmbeddedNatsServer() as server:
        spark = session("local[2]")
        frame = make_frame(spark, rows)
        frame.count()
        try:
            yield server, ConnectionSettings(servers=server.url, request_timeout=30), spark, frame, server.process.pid
        finally:
            spark.stop()


def fenced_vs_unfenced(rows: int, rounds: int) -> int:
    """The atomic write with its chunks fenced (the default) against ``fence=false`` (today's writes before
    fences), interleaved rounds in one run; the target is >= 0.9x."""
    with comparison("fence", rows, rounds) as (server, settings, _, frame, pid):
        rates: dict[str, list[tuple[float, float, float]]] = {"unfenced": [], "fenced": []}
        for index in range(rounds + 1):  # round 0 warms both paths up and is not counted
            for kind in ("unfenced", "fenced") if index % 2 == 0 else ("fenced", "unfenced"):
                name = f"{kind.upper()}{index}"
                asyncio.run(make_stream(settings, name, name.lower(), allow_atomic=True))
                prefixed = frame.withColumn("subject", F.concat(F.lit(f"{name.lower()}."), "subject"))

                def write(data: Any = prefixed, stream: str = name, fence: str = str(kind == "fenced")) -> None:
                    data.write.format("jetstream").mode("append").options(
                        servers=server.url, stream=stream, job_id=stream.lower(), fence=fence.lower()).save()

                measured = timed_cpu(f"round {index}: atomic, {kind}" + (" (warm-up)" if index == 0 else ""), rows,
                                     write, pid)
                if asyncio.run(stored(settings, name)) != rows:
                    raise SystemExit(f"stream {name} does not hold {rows} rows")
                if index:
                    rates[kind].append(measured)
    ratios = [f[0] / u[0] for f, u in zip(rates["fenced"], rates["unfenced"], strict=True)]
    median = statistics.median(ratios)
    print(f"fenced / unfenced per round: {' / '.join(f'{r:.2f}' for r in ratios)}; median {median:.2f}x "
          f"(>= 0.9x) {'met' if median >= 0.9 else 'NOT met'}")
    for column, what in ((1, "Spark (driver, JVM, Python workers)"), (2, "nats-server")):
        fenced, unfenced = (statistics.median(r[column] for r in rates[k]) for k in ("fenced", "unfenced"))
        print(f"CPU per row, {what}: fenced {fenced:.1f} us, unfenced {unfenced:.1f} us (medians): "
              f"{fenced / unfenced:.2f}x")
    return 0 if median >= 0.9 else 2


async def pull_fetch_baseline(settings: ConnectionSettings, stream: str, expected: int, *, ack: bool) -> float:
    """One process, one pull consumer, ``fetch(500)`` in a loop. ``ack``: the plain loop (default
    consumer config, every message acked); otherwise a consumer with ``ack_policy: none``."""
    from nats.js.api import AckPolicy, ConsumerConfig

    config = ConsumerConfig() if ack else ConsumerConfig(ack_policy=AckPolicy.NONE)
    async with open_connection(settings) as conn:
        sub = await conn.js.pull_subscribe("", stream=stream, config=config)
        started = time.perf_counter()
        got = 0
        while got < expected:
            for msg in await sub.fetch(500, timeout=10):
                got += 1
                if ack:
                    await msg.ack()
        elapsed = time.perf_counter() - started
        await sub.unsubscribe()
    return got / elapsed


def read_stream(spark: SparkSession, sink: dict[str, str], stream: str, rows: int | None) -> None:
    """Read the whole stream with every column materialised (count and payload bytes)."""
    got = (spark.read.format("jetstream").options(**sink, stream=stream, num_partitions="2").load()
           .agg(F.count("*").alias("n"), F.sum(F.length("payload")).alias("bytes"), F.max(F.size("headers")),
                F.max("timestamp"), F.max("subject")).collect()[0])
    if rows is not None and got["n"] != rows:
        raise SystemExit(f"read {got['n']} rows, expected {rows}")


def stream_read(spark: SparkSession, sink: dict[str, str], stream: str, rows: int) -> float:
    """The same read as :func:`read_stream` as a streaming query: Trigger.AvailableNow, a new
    checkpoint, the same aggregate on the micro-batch (foreachBatch). Returns the seconds the query's
    micro-batches took (Spark's ``triggerExecution``: planning, reading, the aggregate, offset and
    commit logs), i.e. the query's time without its start and stop."""
    counted: list[int] = []

    def materialise(batch: Any, _batch_id: int) -> None:
        counted.append(batch.agg(F.count("*").alias("n"), F.sum(F.length("payload")), F.max(F.size("headers")),
                                 F.max("timestamp"), F.max("subject")).collect()[0]["n"])

    with tempfile.TemporaryDirectory() as checkpoint:
        query = (spark.readStream.format("jetstream").options(**sink, stream=stream, num_partitions="2").load()
                 .writeStream.foreachBatch(materialise).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    if sum(counted) != rows:
        raise SystemExit(f"streaming read {sum(counted)} rows, expected {rows}")
    return micro_batch_seconds(query)


def micro_batch_seconds(query: Any) -> float:
    return sum(progress["durationMs"].get("triggerExecution", 0) for progress in query.recentProgress) / 1000


def copy_stream(spark: SparkSession, sink: dict[str, str], source: str, target: str, *, streaming: bool) -> None:
    """Copy ``source`` into ``target`` (atomic mode) with a batch job, or a streaming query (AvailableNow)."""
    if streaming:
        frame = spark.readStream.format("jetstream").options(**sink, stream=source, num_partitions="2").load()
    else:
        frame = spark.read.format("jetstream").options(**sink, stream=source, num_partitions="2").load()
    write_frame(frame, sink, target, streaming=streaming)


def write_frame(frame: Any, sink: dict[str, str], target: str, *, streaming: bool) -> None:
    """Write (subject, payload) rows into ``target`` (atomic): the batch writer or the streaming sink (AvailableNow)."""
    out = frame.select(F.concat(F.lit(f"{target.lower()}."), "subject").alias("subject"), "payload")
    if not streaming:
        out.write.format("jetstream").mode("append").options(**sink, stream=target, job_id=target.lower()).save()
        return
    with tempfile.TemporaryDirectory() as checkpoint:
        (out.writeStream.format("jetstream").options(**sink, stream=target).option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start().awaitTermination())


def write_files(spark: SparkSession, sink: dict[str, str], folder: str, target: str, *, streaming: bool) -> None:
    """Parquet files of (subject, payload) into ``target``: Spark's file source in front of the writer or the sink."""
    if streaming:
        frame = spark.readStream.schema("subject string, payload string").parquet(folder)
    else:
        frame = spark.read.parquet(folder)
    write_frame(frame, sink, target, streaming=streaming)


def streaming_rates(spark: SparkSession, settings: ConnectionSettings, source: str, rows: int, pid: int,
                    rounds: int = 3) -> dict[str, float]:
    """Interleaved rounds of: the batch read and the streaming read of ``source``; the batch writer and
    the streaming sink fed by Spark's parquet file source with the same rows; the batch copy and the
    streaming copy of ``source`` (source and sink)."""
    sink = {"servers": settings.servers[0], "request_timeout": str(settings.request_timeout)}
    with tempfile.TemporaryDirectory() as folder:
        spark.read.format("jetstream").options(**sink, stream=source, num_partitions="2").load() \
            .select("subject", F.col("payload").cast("string").alias("payload")).write.mode("overwrite").parquet(folder)
        rates: dict[str, list[float]] = {key: [] for key in (
            "read", "stream_read", "stream_read_running", "write", "stream_write", "copy", "stream_copy")}
        for round_ in range(rounds):
            rates["read"].append(timed("batch read", rows, lambda: read_stream(spark, sink, source, rows), pid))
            running: list[float] = []
            rates["stream_read"].append(timed("streaming read (AvailableNow, foreachBatch)", rows,
                                              lambda r=running: r.append(stream_read(spark, sink, source, rows)), pid))
            rates["stream_read_running"].append(rows / running[0])
            print(f"  {'  its micro-batches (start/stop excluded)':<44} {rows / running[0]:>10,.0f} rows/s", flush=True)
            for kind, streaming, label, action in (
                    ("write", False, "files -> batch writer mode=atomic", write_files),
                    ("stream_write", True, "files -> streaming sink mode=atomic", write_files),
                    ("copy", False, "batch copy read + write mode=atomic", copy_stream),
                    ("stream_copy", True, "streaming copy read + write mode=atomic", copy_stream)):
                target = f"{source}_{kind.upper()}{round_}"
                asyncio.run(make_stream(settings, target, target.lower(), allow_atomic=True))
                origin = folder if action is write_files else source
                rates[kind].append(timed(label, rows, lambda a=action, o=origin, t=target, s=streaming: a(
                    spark, sink, o, t, streaming=s), pid))
                if asyncio.run(stored(settings, target)) != rows:
                    raise SystemExit(f"stream {target} does not hold {rows} messages")
    return {key: statistics.median(values) for key, values in rates.items()}


def timed(label: str, rows: int, action: Any, server_pid: int) -> float:
    return timed_cpu(label, rows, action, server_pid)[0]


def timed_cpu(label: str, rows: int, action: Any, server_pid: int) -> tuple[float, float, float]:
    """Rows per second of ``action``, and the CPU microseconds per row of this process with everything below it
    (Spark's JVM and Python workers) and of the nats-server."""
    server_before, spark_before = process_cpu_seconds(server_pid), tree_cpu_seconds(os.getpid())
    started = time.perf_counter()
    action()
    rate = rows / (time.perf_counter() - started)
    server_us = (process_cpu_seconds(server_pid) - server_before) * 1e6 / rows
    spark_us = (tree_cpu_seconds(os.getpid()) - spark_before) * 1e6 / rows
    print(f"  {label:<44} {rate:>10,.0f} rows/s   server CPU {server_us:5.1f} us/row   Spark CPU {spark_us:5.1f} "
          "us/row", flush=True)
    return rate, spark_us, server_us


def session(master: str) -> SparkSession:
    spark = (SparkSession.builder.master(master).appName("jetstream-bench").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.executor.memory", "512m").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def data_source_rates(spark: SparkSession, settings: ConnectionSettings, rows: int, tag: str, pid: int) -> dict:
    """Warm up, then time an atomic write, a bulk write and a read of ``rows`` rows on this session."""
    sink = {"servers": settings.servers[0]}
    frame = make_frame(spark, rows)
    frame.count()
    asyncio.run(make_stream(settings, f"WARM_{tag}", f"warm{tag}", allow_atomic=True, allow_batched=True))
    warm = frame.withColumn("subject", F.concat(F.lit(f"warm{tag}."), "subject")).limit(20_000)
    for mode in ("atomic", "fast"):
        warm.write.format("jetstream").mode("append").options(**sink, stream=f"WARM_{tag}", mode=mode).save()
    rates = {}
    for mode in ("atomic", "fast"):
        name = f"{mode.upper()}_{tag}"
        asyncio.run(make_stream(settings, name, name.lower(), allow_atomic=True, allow_batched=True))
        rates[mode] = timed(f"{tag}: data source mode={mode}", rows, lambda m=mode, n=name: (
            frame.withColumn("subject", F.concat(F.lit(f"{n.lower()}."), "subject")).write.format("jetstream")
            .mode("append").options(**sink, stream=n, mode=m, job_id=f"bench-{n.lower()}").save()), pid)
        if asyncio.run(stored(settings, name)) != rows:
            raise SystemExit(f"stream {name} does not hold {rows} messages")
    rates["read"] = max(timed(f"{tag}: data source read, 2 partitions", rows,
                              lambda: read_stream(spark, sink, f"ATOMIC_{tag}", rows), pid) for _ in range(2))
    return rates


def bare_fast_batches(url: str, job_id: str, batch_size: int = 10_000) -> Any:
    """A ``mapInArrow`` function: the task's rows as fast batches with the writer's per-row msg ids."""
    def publish(batches: Any) -> Any:
        import pyarrow as pa
        from pyspark import TaskContext

        from airflow_jetstream.client.batches.publish_chunks import publish_chunk
        from airflow_jetstream.client.batches.types import BatchMessage

        partition = TaskContext.get().partitionId()

        async def run() -> None:
            async with open_connection(ConnectionSettings(servers=url, request_timeout=30)) as conn:
                pending: list[BatchMessage] = []
                row = chunk = 0
                for batch in batches:
                    subjects = batch.column("subject").to_pylist()
                    payloads = batch.column("payload").cast(pa.binary()).to_pylist()
                    for subject, payload in zip(subjects, payloads, strict=True):
                        pending.append(BatchMessage(subject, payload, None, f"{job_id}-{partition}-{row}"))
                        row += 1
                    while len(pending) >= batch_size:
                        await publish_chunk(conn, pending[:batch_size], mode="fast",
                                            batch_id=f"{job_id}-{partition}-{chunk}")
                        del pending[:batch_size]
                        chunk += 1
                if pending:
                    await publish_chunk(conn, pending, mode="fast", batch_id=f"{job_id}-{partition}-{chunk}")

        asyncio.run(run())
        yield from ()

    return publish


def bulk_vs_bare(rows: int, rounds: int) -> int:
    """The data source's bulk write against a bare fast batch with the same ids, interleaved rounds."""
    with comparison("bulk", rows, rounds) as (server, settings, _, frame, pid):

        def bare(name: str) -> None:
            prefixed = frame.withColumn("subject", F.concat(F.lit(f"{name.lower()}."), "subject"))
            prefixed.mapInArrow(bare_fast_batches(server.url, name.lower()), "n long").collect()

        def data_source(name: str) -> None:
            (frame.withColumn("subject", F.concat(F.lit(f"{name.lower()}."), "subject")).write.format("jetstream")
             .mode("append").options(servers=server.url, stream=name, mode="fast", job_id=name.lower()).save())

        async def slowest_task(job_id: str) -> float:
            from airflow_jetstream.client.kv.job_records import get_job_record

            async with open_connection(settings) as conn:
                record = await get_job_record(conn, job_id)
            return max(report["seconds"] for report in record["reports"])

        rates: dict[str, list[float]] = {"bare": [], "fast": []}
        for index in range(rounds + 1):  # round 0 warms both paths up and is not counted
            for kind, action in (("bare", bare), ("fast", data_source)):
                name = f"{kind.upper()}{index}"
                asyncio.run(make_stream(settings, name, name.lower(), allow_batched=True))
                label = f"round {index}: " + ("bare fast batch (mapInArrow)" if kind == "bare" else "data source bulk")
                rate = timed(label + (" (warm-up)" if index == 0 else ""), rows, lambda a=action, n=name: a(n), pid)
                if asyncio.run(stored(settings, name)) != rows:
                    raise SystemExit(f"stream {name} does not hold {rows} messages")
                if kind == "fast":
                    task = asyncio.run(slowest_task(name.lower()))
                    print(f"    slowest write task {task:.2f} s of a {rows / rate:.2f} s job "
                          f"(the rest: planning, scheduling, commit)", flush=True)
                if index:
                    rates[kind].append(rate)
        # what a job costs besides its rows: the same two paths writing 2 rows (one per task)
        fixed: dict[str, list[float]] = {"bare": [], "fast": []}
        tiny = frame.limit(2).repartition(2).cache()
        tiny.count()
        for index in range(rounds):
            for kind in ("bare", "fast"):
                name = f"FIXED{kind.upper()}{index}"
                asyncio.run(make_stream(settings, name, name.lower(), allow_batched=True))
                prefixed = tiny.withColumn("subject", F.concat(F.lit(f"{name.lower()}."), "subject"))
                started = time.perf_counter()
                if kind == "bare":
                    prefixed.mapInArrow(bare_fast_batches(server.url, name.lower()), "n long").collect()
                else:
                    (prefixed.write.format("jetstream").mode("append")
                     .options(servers=server.url, stream=name, mode="fast", job_id=name.lower()).save())
                fixed[kind].append(time.perf_counter() - started)
    ratios = [bulk / bare_rate for bulk, bare_rate in zip(rates["fast"], rates["bare"], strict=True)]
    median = statistics.median(ratios)
    extra = statistics.median(fixed["fast"]) - statistics.median(fixed["bare"])
    bare_seconds = rows / statistics.median(rates["bare"])
    print(f"a 2-row job: bare {statistics.median(fixed['bare']):.2f} s, data source "
          f"{statistics.median(fixed['fast']):.2f} s (writer check, ledger, job record: {extra:+.2f} s per job)")
    print(f"bound: with the bare per-row rate and that fixed cost, {rows:,} rows could reach "
          f"{bare_seconds / (bare_seconds + extra):.2f}x")
    print(f"bulk / bare per round: {' / '.join(f'{r:.2f}' for r in ratios)}; median {median:.2f}x "
          f"(>= 0.8x) {'met' if median >= 0.8 else 'NOT met'}")
    return 0 if median >= 0.8 else 2


def standalone_vs_local(rows: int) -> int:
    """The data source on local[2] and on a standalone cluster, same rows and server, one run."""
    from tests.infra.spark_cluster import EmbeddedSparkCluster

    print(f"spark_io --standalone: {rows:,} rows, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    with EmbeddedNatsServer() as server:
        settings = ConnectionSettings(servers=server.url, request_timeout=30)
        spark = session("local[2]")
        local = data_source_rates(spark, settings, rows, "local", server.process.pid)
        spark.stop()
        with EmbeddedSparkCluster(workers=2, cores=1) as cluster:
            spark = session(cluster.master_url)
            standalone = data_source_rates(spark, settings, rows, "standalone", server.process.pid)
            spark.stop()
    print("standalone (2 workers x 1 core) vs local[2]")
    for key in ("atomic", "fast", "read"):
        ratio = standalone[key] / local[key]
        print(f"  {key:<8} {standalone[key]:>10,.0f} vs {local[key]:>10,.0f} rows/s  ({ratio:.2f}x)")
    return 0


def streaming_only(rows: int) -> int:
    """Only the streaming comparisons (``--streaming``), on a stream the atomic writer fills first."""
    print(f"spark_io --streaming: {rows:,} rows, local[2], {os.cpu_count()} CPUs, Python {platform.python_version()}")
    with EmbeddedNatsServer() as server:
        settings = ConnectionSettings(servers=server.url, request_timeout=30)
        spark = session("local[2]")
        frame = make_frame(spark, rows)
        for name, count in (("WARM", max(1, rows // 10)), ("SOURCE", rows), ("ONE", 1)):
            asyncio.run(make_stream(settings, name, name.lower(), allow_atomic=True))
            frame.limit(count).withColumn("subject", F.concat(F.lit(f"{name.lower()}."), "subject")).write \
                .format("jetstream").mode("append").options(servers=server.url, stream=name).save()
        streaming_rates(spark, settings, "WARM", max(1, rows // 10), server.process.pid, rounds=1)  # warm up
        print("streaming (stream SOURCE, median of 3 interleaved rounds)")
        streaming = streaming_rates(spark, settings, "SOURCE", rows, server.process.pid)
        fixed = fixed_costs(spark, {"servers": server.url, "stream": "ONE"})
        spark.stop()
    ratios = streaming_ratios(streaming, fixed, rows)
    return 0 if all(ratio >= TARGETS[key] for key, ratio in ratios.items()) else 2


def streaming_ratios(streaming: dict[str, float], fixed: dict[str, tuple[float, float]], rows: int) -> dict[str, float]:
    """Print the streaming medians, the fixed cost of a query per source and the ratios against the targets
    and against the best a source with pyspark's own fixed cost could reach; return the targets' ratios."""
    print("medians")
    for key, value in streaming.items():
        print(f"  {key:<20} {value:>10,.0f} rows/s")
    print("fixed cost of one streaming query (one-row read, median of 5: batch / streaming / difference)")
    for name, (batch, stream) in fixed.items():
        print(f"  {name:<24} {batch:5.2f} s / {stream:5.2f} s / {stream - batch:5.2f} s")
    python_fixed = max(0.0, fixed["minimal Python source"][1] - fixed["minimal Python source"][0])
    file_fixed = max(0.0, fixed["Spark JSON file source"][1] - fixed["Spark JSON file source"][0])
    read_seconds, write_seconds = rows / streaming["read"], rows / streaming["write"]
    bounds = {"stream_read": read_seconds / (read_seconds + python_fixed),
              "stream_sink": write_seconds / (write_seconds + file_fixed)}
    ratios = {"stream_read": streaming["stream_read"] / streaming["read"],
              "stream_sink": streaming["stream_write"] / streaming["write"]}
    print(f"ratios (target; the best ratio a query whose source adds nothing to pyspark's/Spark's own fixed cost "
          f"reaches at {rows:,} rows)")
    for key, ratio in ratios.items():
        print(f"  {key:<12} {ratio:6.2f}x  (>= {TARGETS[key]:g}x) {'met' if ratio >= TARGETS[key] else 'NOT met'}"
              f"  bound {bounds[key]:.2f}x")
    print(f"  stream_read, micro-batches only: {streaming['stream_read_running'] / streaming['read']:.2f}x; "
          f"streaming copy (source + sink) vs batch copy: {streaming['stream_copy'] / streaming['copy']:.2f}x")
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--standalone", action="store_true", help="compare local[2] with a standalone cluster")
    parser.add_argument("--streaming", action="store_true", help="only the streaming read and sink comparisons")
    parser.add_argument("--bulk", action="store_true", help="compare mode=fast with a bare fast batch")
    parser.add_argument("--fence", action="store_true", help="compare fenced atomic writes with fence=false")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of --bulk and --fence")
    args = parser.parse_args()
    rows = args.rows
    if args.bulk:
        return bulk_vs_bare(rows, args.rounds)
    if args.fence:
        return fenced_vs_unfenced(rows, args.rounds)
    if args.standalone:
        return standalone_vs_local(rows)
    if args.streaming:
        return streaming_only(rows)
    print(f"spark_io: {rows:,} rows, local[2], {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}")
    with EmbeddedNatsServer() as server:
        settings = ConnectionSettings(servers=server.url, request_timeout=30)
        spark = (SparkSession.builder.master("local[2]").appName("jetstream-bench")
                 .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        frame = make_frame(spark, rows)
        frame.count()
        sink = {"servers": server.url}
        pid = server.process.pid

        asyncio.run(make_stream(settings, "WARM", "warm", allow_atomic=True, allow_batched=True))
        # warm up (Python workers started, JVM code compiled) as a long-running Spark application would be
        warm = frame.withColumn("subject", F.concat(F.lit("warm."), "subject"))
        warm.limit(2000).foreachPartition(naive_partition(server.url, ""))
        for mode in ("atomic", "fast"):
            warm.limit(20_000).write.format("jetstream").mode("append").options(**sink, stream="WARM", mode=mode).save()
        read_stream(spark, sink, "WARM", None)
        asyncio.run(make_stream(settings, "NAIVE", "naive"))
        asyncio.run(make_stream(settings, "ATOMIC", "atomic", allow_atomic=True))
        asyncio.run(make_stream(settings, "BULK", "fast", allow_batched=True))

        print("write")
        naive = timed("baseline foreachPartition, awaited js.publish", rows,
                      lambda: frame.foreachPartition(naive_partition(server.url, "naive.")), pid)
        atomic = timed("data source mode=atomic", rows, lambda: (
            frame.withColumn("subject", F.concat(F.lit("atomic."), "subject")).write.format("jetstream")
            .mode("append").options(**sink, stream="ATOMIC", job_id="bench-atomic").save()), pid)
        bulk = timed("data source mode=fast", rows, lambda: (
            frame.withColumn("subject", F.concat(F.lit("bulk."), "subject")).write.format("jetstream")
            .mode("append").options(**sink, stream="BULK", mode="fast", job_id="bench-bulk").save()), pid)
        for name in ("NAIVE", "ATOMIC", "BULK"):
            count = asyncio.run(stored(settings, name))
            if count != rows:
                print(f"  !! stream {name} holds {count} messages, expected {rows}")
                return 1

        print("read (stream ATOMIC, best of 2)")
        baseline = max(asyncio.run(pull_fetch_baseline(settings, "ATOMIC", rows, ack=True)) for _ in range(2))
        print(f"  {'baseline pull fetch(500) + ack, one process':<44} {baseline:>10,.0f} rows/s")
        no_ack = max(asyncio.run(pull_fetch_baseline(settings, "ATOMIC", rows, ack=False)) for _ in range(2))
        print(f"  {'(pull fetch(500), ack_policy none)':<44} {no_ack:>10,.0f} rows/s")
        read_rate = max(timed("data source read, 2 partitions", rows,
                              lambda: read_stream(spark, sink, "ATOMIC", rows), pid) for _ in range(2))
        print("streaming (stream ATOMIC, median of 3 interleaved rounds)")
        streaming = streaming_rates(spark, settings, "ATOMIC", rows, pid)
        asyncio.run(make_stream(settings, "ONE", "one", allow_atomic=True))
        frame.limit(1).withColumn("subject", F.concat(F.lit("one."), "subject")).write.format("jetstream") \
            .mode("append").options(**sink, stream="ONE").save()
        fixed = fixed_costs(spark, {**sink, "stream": "ONE"})
        spark.stop()

    ratios = {"atomic": atomic / naive, "fast": bulk / naive, "read": read_rate / baseline,
              **streaming_ratios(streaming, fixed, rows)}
    print(f"read vs the ack_policy none loop: {read_rate / no_ack:.1f}x")
    print("ratios (target)")
    ok = True
    for key, ratio in ratios.items():
        met = ratio >= TARGETS[key]
        ok = ok and met
        print(f"  {key:<11} {ratio:6.2f}x  (>= {TARGETS[key]:g}x) {'met' if met else 'NOT met'}")
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
