"""Names and paths shared by the example orders DAGs (not a DAG file itself)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from airflow_jetstream.assets import jetstream_asset, kv_asset

RAW_STREAM = "ORDERS_RAW"
AGG_STREAM = "ORDERS_AGG"
CAPTURE_STREAM = "ADVISORIES"
CURSOR_CONSUMER = "orders-report"
LEDGER_BUCKET = "batch_ledger"
SPARK_APPS = Path(__file__).resolve().parent / "spark_apps"
OUTPUT_DIR = os.environ.get("JETSTREAM_DEMO_OUTPUT", "/tmp/airflow-jetstream-demo")
#: Stream replicas: 3 on a 3-node cluster (``make demo-cluster``), 1 on a single server.
REPLICAS = int(os.environ.get("JETSTREAM_DEMO_REPLICAS", "1"))
#: How long the raw stream remembers msg ids; the multi-host tier shortens it, so that a host cut off for longer than
#: the window costs seconds, not ten minutes (the write fences, not the window, keep a late retry out).
DUPLICATE_WINDOW = os.environ.get("JETSTREAM_DEMO_DUPLICATE_WINDOW", "10m")
#: How long the consumer's ledger claims hold its run's batches (the ledger's ``visibility_timeout``): past it, another
#: attempt may take them over. The multi-host tier shortens it, as the window, so that a consumer host cut off for
#: longer costs seconds; a consume job that outlasts it keeps its claims unless another attempt takes them.
CLAIM_DEADLINE = os.environ.get("JETSTREAM_DEMO_CLAIM_DEADLINE", "10m")

RAW_STREAM_CONFIG = {
    "name": RAW_STREAM,
    "description": "orders as the producing Spark job writes them (work queue: drained by sourcing)",
    "subjects": ["orders.raw.>"],
    "retention": "workqueue",
    "allow_atomic": True,
    "allow_batched": True,
    "duplicate_window": DUPLICATE_WINDOW,
    "max_age": "7d",
    "num_replicas": REPLICAS,
}
AGG_STREAM_CONFIG = {
    "name": AGG_STREAM,
    "description": "aggregate of all order sources, kept for replays",
    "retention": "limits",
    "max_age": "30d",
    "allow_direct": True,
    "num_replicas": REPLICAS,
}
#: ``host:port`` of the NATS server in the asset URIs (``make up`` sets it to its server).
NATS_SERVER = os.environ.get("JETSTREAM_DEMO_SERVER", "127.0.0.1:4222")
#: The pipeline's data as assets: tasks declare them as inlets/outlets, so Airflow's Assets view
#: draws the graph producer -> ORDERS_RAW -> (sourcing) -> ORDERS_AGG -> consumer, beside the ledger.
RAW_ASSET = jetstream_asset(NATS_SERVER, RAW_STREAM)
AGG_ASSET = jetstream_asset(NATS_SERVER, AGG_STREAM)
LEDGER_ASSET = kv_asset(NATS_SERVER, LEDGER_BUCKET)
#: The nats connection every task uses; JetStreamSparkSubmitOperator hands it to the Spark jobs.
NATS_CONN_ID = "nats_default"
SPARK_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"}


def run_key(run_id: str) -> str:
    """A short, stable key for a DAG run: the producer's job id and the output folder derive from it."""
    return hashlib.sha256(run_id.encode()).hexdigest()[:16]
