"""Spark job: one incremental step of a streaming query, run per DAG run with Trigger.AvailableNow.

Submitted by ``jetstream_orders_incremental``::

    spark-submit stream_orders.py --checkpoints <dir> --interval-end <ISO time>

It reads the orders stored before ``--interval-end`` that the previous run did not read, keeps the
orders of at least ``--min-amount`` and writes them to ``--to-stream`` with the exactly-once sink.

Each run has its own checkpoint, ``<checkpoints>/<interval end>``, started as a copy of the previous
run's: the newest checkpoint of an earlier interval end. So:

* the run reads what arrived since the previous run's end, up to its own interval's end
  (``end_time``: what is stored later is left for the next run, however late this one runs);
* a run after intervals that had no run (a scheduler that was down, ``catchup=False``) goes on from
  the last run that ran: nothing is skipped;
* clearing the run and running it again, even after later runs, starts again from the same copy: it
  plans the same micro-batches (same query id, batch ids and bounds), so the sink skips what the
  first attempt stored and the later runs, which start from this run's end, are not affected.

The previous run is found from the checkpoints, not from the run's data interval start, so the step
works with any timetable (Airflow 3's default cron timetable gives each run an interval of length 0).
"""

from __future__ import annotations

import argparse
import json
import shutil
import uuid
from datetime import datetime
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_jetstream.spark import register

#: The first run's predecessor: a checkpoint holding only the query id, so a re-run of the first run keeps it too.
SEED = "seed"


def _end_of(folder: Path) -> datetime | None:
    """The interval end a checkpoint folder is named after (None for the seed and anything else)."""
    try:
        when = datetime.fromisoformat(folder.name)
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def checkpoint_for(root: Path, interval_end: str) -> Path:
    """This run's checkpoint, ``<root>/<interval end>``: a fresh copy of the newest checkpoint of an earlier
    interval end (the previous run's), or of the seed for the first run."""
    try:
        end = datetime.fromisoformat(interval_end)
    except ValueError:
        raise SystemExit(f"--interval-end {interval_end!r} is not an ISO time (e.g. 2026-01-01T10:00:00+00:00)") \
            from None
    if end.tzinfo is None:
        raise SystemExit(f"--interval-end {interval_end!r} has no time zone (Airflow's data_interval_end has one)")
    work = root / interval_end.replace(":", "")
    earlier = [(when, folder) for folder in (root.iterdir() if root.exists() else ())
               if (when := _end_of(folder)) is not None and when < end]
    previous = max(earlier)[1] if earlier else root / SEED
    if not earlier and not previous.exists():
        previous.mkdir(parents=True)
        (previous / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n")  # Spark's query id file
    if work.exists():
        shutil.rmtree(work)  # a cleared run starts again from the previous run's end
    shutil.copytree(previous, work)
    return work


def run_step(spark: SparkSession, checkpoints: Path, interval_end: str, *, from_stream: str, to_stream: str,
             min_amount: float, max_messages_per_trigger: str, connection: dict[str, str]) -> int:
    """Read what arrived before ``interval_end`` since the previous run; returns how many messages were read."""
    checkpoint = checkpoint_for(checkpoints, interval_end)
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
    parser.add_argument("--interval-end", required=True)
    parser.add_argument("--min-amount", type=float, default=50.0)
    parser.add_argument("--max-messages-per-trigger", default="50000")
    args = parser.parse_args()

    spark = SparkSession.builder.appName("stream-orders").getOrCreate()
    register(spark)
    run_step(spark, args.checkpoints, args.interval_end, from_stream=args.from_stream,
             to_stream=args.to_stream, min_amount=args.min_amount,
             max_messages_per_trigger=args.max_messages_per_trigger,
             connection={"servers": args.servers} if args.servers else {})
    spark.stop()

if __name__ == "__main__":
    main()
