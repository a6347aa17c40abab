"""Spark job: one incremental step of a streaming query, run per DAG run with Trigger.AvailableNow.

Submitted by ``jetstream_orders_incremental``::

    spark-submit stream_orders.py --checkpoints <dir> --interval-start <ISO time> --interval-end <ISO time>

It reads the orders stored before ``--interval-end`` that the previous run did not read, keeps the
orders of at least ``--min-amount`` and writes them to ``--to-stream`` with the exactly-once sink.

Each run has its own checkpoint, ``<checkpoints>/<interval end>``, started as a copy of the previous
run's (``<checkpoints>/<interval start>``), so:

* the run reads what arrived since the previous run's end, up to its own interval's end
  (``end_time``: what is stored later is left for the next run, however late this one runs);
* clearing the run and running it again starts again from the same copy: it plans the same
  micro-batches (same query id, batch ids and bounds), so the sink skips what the first attempt
  stored and the next run, which starts from this run's end, is not affected.
"""

from __future__ import annotations

import argparse
import json
import shutil
import uuid
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_jetstream.spark import register


def checkpoint_for(root: Path, interval_start: str, interval_end: str) -> Path:
    """This run's checkpoint: a fresh copy of the previous run's. The first run's predecessor is a seed
    checkpoint holding only the query id, so a re-run of the first run keeps the query id too."""
    work, previous = root / interval_end, root / interval_start
    if not previous.exists():
        if root.exists() and any(p.name < interval_end for p in root.iterdir()):
            raise SystemExit(f"no checkpoint of the previous run ({previous}); run the intervals in order "
                             "(the DAG has depends_on_past) or start a new checkpoint root")
        previous.mkdir(parents=True)
        (previous / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n")  # Spark's query id file
    if work.exists():
        shutil.rmtree(work)  # a cleared run starts again from the previous run's end
    shutil.copytree(previous, work)
    return work


def run_step(spark: SparkSession, checkpoints: Path, interval_start: str, interval_end: str, *,
             from_stream: str, to_stream: str, min_amount: float, max_messages_per_trigger: str,
             connection: dict[str, str]) -> int:
    """Read what arrived before ``interval_end`` since the previous run; returns how many messages were read."""
    checkpoint = checkpoint_for(checkpoints, interval_start.replace(":", ""), interval_end.replace(":", ""))
    orders = (spark.readStream.format("jetstream")
              .options(**connection, stream=from_stream, end_time=interval_end,
                       max_messages_per_trigger=max_messages_per_trigger)
              .load())
    amount = F.get_json_object(F.col("payload").cast("string"), "$.amount").cast("double")
    large = orders.where(amount >= min_amount).select(
        F.regexp_replace("subject", r"^orders\.[^.]+\.", "orders.large.").alias("subject"), "payload")
    query = (large.writeStream.format("jetstream").options(**connection, stream=to_stream)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination()
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    print(f"jetstream: incremental step up to {interval_end}: read {rows} message(s) in "
          f"{len([p for p in query.recentProgress if p['numInputRows']])} micro-batch(es), checkpoint {checkpoint}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", help="only without JetStreamSparkSubmitOperator, which hands the connection over")
    parser.add_argument("--from-stream", default="ORDERS_AGG")
    parser.add_argument("--to-stream", default="ORDERS_LARGE")
    parser.add_argument("--checkpoints", required=True, type=Path)
    parser.add_argument("--interval-start", required=True)
    parser.add_argument("--interval-end", required=True)
    parser.add_argument("--min-amount", type=float, default=50.0)
    parser.add_argument("--max-messages-per-trigger", default="50000")
    args = parser.parse_args()

    spark = SparkSession.builder.appName("stream-orders").getOrCreate()
    register(spark)
    run_step(spark, args.checkpoints, args.interval_start, args.interval_end, from_stream=args.from_stream,
             to_stream=args.to_stream, min_amount=args.min_amount,
             max_messages_per_trigger=args.max_messages_per_trigger,
             connection={"servers": args.servers} if args.servers else {})
    spark.stop()

if __name__ == "__main__":
    main()
