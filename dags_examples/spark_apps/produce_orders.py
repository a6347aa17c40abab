"""Spark job: generate a day of orders and write them into JetStream as atomic batches.

Submitted by the ``produce_orders`` task of ``jetstream_orders_pipeline``::

    spark-submit produce_orders.py --servers nats:4222 --run-id <airflow run id> --job-id <id> --rows 20000
"""

from __future__ import annotations

import argparse
import json

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_jetstream.spark import register

REGIONS = ["emea", "amer", "apac", "latam"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", required=True)
    parser.add_argument("--stream", default="ORDERS_RAW")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--ledger-bucket", default="batch_ledger")
    args = parser.parse_args()

    spark = SparkSession.builder.appName(f"produce-orders-{args.job_id}").getOrCreate()
    register(spark)
    regions = F.array(*[F.lit(r) for r in REGIONS])
    orders = (
        spark.range(args.rows, numPartitions=args.partitions)
        .withColumn("region", regions[F.col("id") % len(REGIONS)])
        .withColumn("customer", F.concat(F.lit("c-"), (F.col("id") * 7919 % 1000).cast("string")))
        .withColumn("amount", F.round((F.col("id") * 37 % 10_000) / 100.0 + 1.0, 2))
        .withColumn("order_id", F.concat(F.lit(f"{args.job_id}-"), F.col("id").cast("string")))
    )
    messages = orders.select(
        F.concat(F.lit("orders.raw."), F.col("region")).alias("subject"),
        F.to_json(F.struct("order_id", "customer", "region", "amount")).cast("binary").alias("payload"),
    )
    (
        messages.write.format("jetstream")
        .mode("append")
        .option("servers", args.servers)
        .option("stream", args.stream)
        .option("job_id", args.job_id)
        .option("run_id", args.run_id)
        .option("ledger_bucket", args.ledger_bucket)
        .option("mode", "atomic")
        .save()
    )
    print(json.dumps({"produced_rows": args.rows, "job_id": args.job_id}))
    spark.stop()


if __name__ == "__main__":
    main()
