"""Memory that does not grow with the input: 300k messages through the publish operator; the
ledger's summary computed while streaming its listing, exact when the ledger changes meanwhile.

The task runs in a subprocess that reads its own peak RSS (``ru_maxrss``) after a warm-up publish
and after the big one. Holding every message (a dict, a BatchMessage and its bytes: ~1 KB each, as
the operator did before it streamed) raised the peak by 288 MB (measured); streaming holds one chunk.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from airflow_jetstream.client import ConnectionSettings, open_connection
from airflow_jetstream.client.ledger import BatchLedger, store
from tests.conftest import airflow_conn_env
from tests.support.nats_calls import with_streams

MESSAGES = 300_000
#: Peak RSS growth allowed for the big publish: far below the ~300 MB a list of every message takes.
MAX_GROWTH_MB = 48

TASK = """
import json, resource, sys
from airflow_jetstream.operators.publish import JetStreamAtomicBatchPublishOperator

def publish(path):
    return JetStreamAtomicBatchPublishOperator(task_id="big", messages_file=path, subject="big.in", stream="BIG",
                                               split=True).execute(context={})

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

warm = publish(sys.argv[1])
before = peak_mb()
result = publish(sys.argv[2])
print("RESULT " + json.dumps({"before_mb": before, "after_mb": peak_mb(), "warm": warm["count"],
                              "count": result["count"], "chunks": result["chunks"],
                              "xcom_bytes": len(json.dumps(result))}))
"""


def write_messages(path: Path, count: int) -> None:
    with path.open("w") as out:
        for start in range(0, count, 10_000):
            out.write("".join(f'{{"data":{{"order":{n},"customer":"c-{n % 977:04d}","amount":{n % 1000}.25}}}}\n'
                              for n in range(start, min(count, start + 10_000))))


def test_publishing_300k_messages_from_a_file_keeps_peak_memory_flat(nats_server, tmp_path):
    with_streams(ConnectionSettings(servers=nats_server.url), lambda conn: asyncio.sleep(0),
                 [{"name": "BIG", "subjects": ["big.>"], "allow_atomic": True}])
    warm, big = tmp_path / "warm.jsonl", tmp_path / "big.jsonl"
    write_messages(warm, 5_000)
    write_messages(big, MESSAGES)
    host, port = nats_server.url.split("://", 1)[1].rsplit(":", 1)
    name, value = airflow_conn_env("nats_default", host=host, port=int(port))
    env = {**os.environ, name: value}
    run = subprocess.run([sys.executable, "-c", TASK, str(warm), str(big)], env=env, capture_output=True,
                         text=True, timeout=600, cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert (result["warm"], result["count"], result["chunks"]) == (5_000, MESSAGES, MESSAGES // 1000)
    assert result["xcom_bytes"] < 600  # a summary, not a per-chunk list
    growth = result["after_mb"] - result["before_mb"]
    print(f"peak RSS {result['before_mb']:.0f} MB -> {result['after_mb']:.0f} MB for {MESSAGES} messages")
    assert growth < MAX_GROWTH_MB, f"peak RSS grew {growth:.0f} MB publishing {MESSAGES} messages"


RUN = "scale-run"
BATCHES = 1200


def touch_while_listing(monkeypatch, ledger: BatchLedger, touch: str) -> None:
    """The next listing is interrupted once by a real write: batch ``touch`` is consumed by "someone else" right
    after the listing delivered it, so (the listing reads 1000 keys per pull) its newer record comes again."""
    real = store.latest
    pending = [touch]

    async def latest(conn, bucket, run_id):
        async for item in real(conn, bucket, run_id):
            yield item
            if pending and item[1].endswith(pending[0]):
                batch = pending.pop()
                await ledger.mark_consumed(await ledger.claim(RUN, batch, owner="other"))

    monkeypatch.setattr(store, "latest", latest)


def test_ledger_listing_streams_and_never_counts_a_batch_updated_during_the_listing_twice(settings, monkeypatch):
    """The listing (a run recorded before the ledger kept counts, a recount, the reaper) holds one chunk; a
    summary computed from it counts a batch updated meanwhile once. The counts say the same in one read."""
    async def scenario():
        async with open_connection(settings) as conn:
            ledger = await BatchLedger.open(conn, "SCALE_LEDGER")
            await asyncio.gather(*(ledger.record(RUN, f"b{index:04d}", stream="ORDERS", count=10)
                                   for index in range(BATCHES)))
            quiet = await store.listed_summary(conn, ledger.bucket, RUN, time.time())
            touch_while_listing(monkeypatch, ledger, "b0001")
            listed = [rec.batch_id async for rec in ledger.iter_batches(RUN)]
            touch_while_listing(monkeypatch, ledger, "b0002")
            during = await store.listed_summary(conn, ledger.bucket, RUN, time.time())
            return quiet, listed, during, await ledger.summary(RUN)

    quiet, listed, during, counted = asyncio.run(scenario())
    assert quiet["batches"] == BATCHES and quiet["states"]["published"] == BATCHES
    assert len(listed) == BATCHES + 1 and listed.count("b0001") == 2  # the raw stream: b0001 came twice
    assert during["batches"] == BATCHES, "a batch updated during the listing must be counted once"
    assert during["states"] == {"published": BATCHES - 2, "in_progress": 0, "consumed": 2, "failed": 0}
    assert (counted["counted_by"], counted["batches"], counted["states"]) == ("counts", BATCHES, during["states"])


def test_a_spark_write_task_reports_a_bounded_number_of_sequence_ranges():
    from airflow_jetstream.spark.writer import MAX_REPORTED_RANGES, PartitionReport

    report = PartitionReport(partition=0, attempt=0)
    report.add_range(1, 1000)
    report.add_range(1001, 2000)  # continues the previous chunk: one range
    for chunk in range(1, MAX_REPORTED_RANGES + 50):  # interleaved with other tasks: gaps
        report.add_range(chunk * 10_000 + 1, chunk * 10_000 + 1000)
    assert report.ranges[0] == [1, 2000]
    assert len(report.ranges) == MAX_REPORTED_RANGES and report.ranges_omitted == 50
    assert len(json.dumps(report.to_dict())) < 4000
