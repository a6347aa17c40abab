"""One write attempt of the ``jetstream`` data source's task code, stopped by itself at a chosen point.

Run as ``python -m tests.support.fenced_writer <json>`` by tests/test_write_fence.py: it writes rows ``0 ..
rows-1`` (payload ``{"id": n}``) of partition 0 as Spark's writer task does (``JetStreamWriter._write``, no JVM
needed), and when chunk ``at_chunk`` reaches ``point`` it writes ``marker`` and sends itself ``signal``:

* ``before_first``: before the chunk's first message is written;
* ``mid_batch``: after the chunk's first message (the batch is open on the server, not committed);
* ``after_commit``: after the server acknowledged the chunk's commit, before the ledger records it;
* ``after_record``: after the ledger recorded it.

A SIGSTOP freezes the attempt there (a GC pause, a frozen VM); the test resumes it with SIGCONT later.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from airflow_jetstream.client.batches import atomic
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.spark.driver import run
from airflow_jetstream.spark.options import WriteOptions
from airflow_jetstream.spark.writer import JetStreamWriter, chunk_id

POINTS = ("before_first", "mid_batch", "after_commit", "after_record")


def install_stop(spec: dict[str, Any]) -> None:
    """Patch the writer's steps so that chunk ``at_chunk`` stops at ``point`` (once)."""
    key = chunk_id(spec["job_id"], 0, spec["at_chunk"])
    batch_marker = f"{key}-a".encode()
    state = {"writes": 0, "fired": False}
    real_write, real_record = atomic.write_raw, BatchLedger.record

    def stop_at(point: str) -> None:
        if spec["point"] == point and not state["fired"]:
            state["fired"] = True
            Path(spec["marker"]).write_text(point)
            os.kill(os.getpid(), getattr(signal, spec["signal"]))

    async def write_frames(nc: Any, frames: bytes) -> None:
        if batch_marker in frames:
            state["writes"] += 1
            if state["writes"] == 1:
                stop_at("before_first")
            else:
                await nc.flush()  # the first message reached the server: the batch is open
                stop_at("mid_batch")
        await real_write(nc, frames)

    async def record(self: BatchLedger, run_id: str, batch_id: str, **kwargs: Any) -> Any:
        if batch_id == key:
            stop_at("after_commit")
        stored = await real_record(self, run_id, batch_id, **kwargs)
        if batch_id == key:
            stop_at("after_record")
        return stored

    atomic.write_raw = write_frames  # type: ignore[assignment]
    BatchLedger.record = record  # type: ignore[method-assign]


def rows(count: int, subject: str, size: int) -> list[pa.RecordBatch]:
    payloads = [json.dumps({"id": n}).encode() for n in range(count)]
    return [pa.RecordBatch.from_pydict({"subject": [subject] * len(payloads[i:i + size]),
                                        "payload": payloads[i:i + size]},
                                       schema=pa.schema([("subject", pa.string()), ("payload", pa.binary())]))
            for i in range(0, count, size)]


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec.get("point"):
        install_stop(spec)
    options = WriteOptions.parse({"servers": spec["servers"], "stream": spec["stream"], "job_id": spec["job_id"],
                                  "batch_size": str(spec["batch_size"]), "inflight": "1",
                                  "ledger_bucket": spec["ledger_bucket"], "fence": spec.get("fence", "true")})
    schema = StructType([StructField("subject", StringType()), StructField("payload", BinaryType())])
    writer = JetStreamWriter(options, schema)
    report = run(options.settings, writer._write, 0, spec["attempt"],
                 iter(rows(spec["rows"], spec["subject"], spec["batch_size"])))
    print(json.dumps(report.to_dict()))


if __name__ == "__main__":
    main()
