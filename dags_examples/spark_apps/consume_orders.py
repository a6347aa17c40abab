"""Spark job: consume the aggregate stream, compute revenue per region, write Parquet.

The read is bounded and advances the ``--cursor`` consumer only after the output is written, so a
failed job loses nothing and a re-run (or a replay after a consumer reset) reprocesses exactly the
messages past the cursor. The output of a run is overwritten, never appended, so re-runs do not
double count; a re-run of a run the ledger already shows consumed (an attempt whose success Airflow
never heard) leaves the output alone. Submitted by ``consume_orders`` in ``jetstream_orders_pipeline``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_jetstream.spark import consume, register

ORDER_SCHEMA = "order_id string, customer string, region string, amount double"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", help="only without JetStreamSparkSubmitOperator, which hands the connection over")
    parser.add_argument("--stream", default="ORDERS_AGG")
    parser.add_argument("--cursor", default="orders-report")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--ledger-bucket", default="batch_ledger")
    parser.add_argument("--claim-deadline", default="10m",
                        help="how long the ledger claims on the run's batches hold them (seconds or '90s', '10m')")
    args = parser.parse_args()

    spark = SparkSession.builder.appName("consume-orders").getOrCreate()
    register(spark)
    output = Path(args.output)
    options = {"stream": args.stream, "consumer": args.cursor}
    if args.servers:
        options["servers"] = args.servers
    with consume(spark, options, run_id=args.run_id, ledger_bucket=args.ledger_bucket,
                 visibility_timeout=args.claim_deadline) as (df, consumption):
        if consumption.already_consumed:
            # an earlier attempt consumed the run (its success unheard, e.g. its host cut off from Airflow): its
            # output and summary stand; overwriting them with this read, which that attempt's acknowledgement
            # emptied, would lose the run
            print(json.dumps({"already_consumed": True, "output_path": str(output / "region_totals")}))
        else:
            summary = write_output(spark, df, output)
            summary["read"] = consumption.to_dict()
            # written before the block ends, where the claims are settled: an attempt that consumed the run always
            # left its summary, even one that dies right after (a re-run then finds the run consumed)
            write_summary(output, summary)
    if not consumption.already_consumed:
        summary["read"] = consumption.to_dict()  # with what the acknowledgement removed
        write_summary(output, summary)
        print(json.dumps(summary))
    spark.stop()


def write_output(spark: SparkSession, df: DataFrame, output: Path) -> dict:
    """Revenue per region as Parquet (overwritten: a re-run of the same read replaces it); the summary of it."""
    orders = df.select("seq", F.from_json(F.col("payload").cast("string"), ORDER_SCHEMA).alias("o")).select(
        "seq", "o.*"
    )
    orders = orders.cache()
    totals = orders.groupBy("region").agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("revenue"))
    totals.write.mode("overwrite").parquet(str(output / "region_totals"))
    return {
        "rows_consumed": orders.count(),
        "distinct_orders": orders.select("order_id").distinct().count(),
        "regions": {r["region"]: r["orders"] for r in spark.read.parquet(str(output / "region_totals")).collect()},
        "output_path": str(output / "region_totals"),
    }


def write_summary(output: Path, summary: dict) -> None:
    output.mkdir(parents=True, exist_ok=True)
    (output / "consume_summary.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
