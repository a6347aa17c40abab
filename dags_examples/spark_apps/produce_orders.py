"""Spark job: generate a day of orders and write them into JetStream as atomic batches.

Submitted by the ``produce_orders`` task of ``jetstream_orders_pipeline``::

    spark-submit produce_orders.py --run-id <airflow run id> --job-id <id> --rows 20000

The NATS servers and credentials come from the ``nats`` connection the operator hands over
(``spark.jetstream.*`` conf, read by ``register(spark)``); ``--servers`` is for a bare spark-submit.
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
    parser.add_argument("--servers", help="only without JetStreamSparkSubmitOperator, which hands the connection over")
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
    options = {"stream": args.stream, "job_id": args.job_id, "run_id": args.run_id,
               "ledger_bucket": args.ledger_bucket, "mode": "atomic"}
    if args.servers:
        options["servers"] = args.servers
    messages.write.format("jetstream").mode("append").options(**options).save()
    print(json.dumps({"produced_rows": args.rows, "job_id": args.job_id}))
    spark.stop()


if __name__ == "__main__":
    main()
