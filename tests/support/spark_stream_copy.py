"""A streaming query that copies stream ``<prefix>_SRC`` to ``<prefix>_DST`` with the jetstream source and sink.

Used in-process by tests/test_spark_streaming.py and, as ``python -m tests.support.spark_stream_copy``,
as a separate Spark driver that a test kills. Each row keeps its payload; its subject becomes
``<prefix>.dst.<last token of the source subject>``. With ``hold`` and ``gate`` the task that reaches
the row whose payload is ``hold`` waits (up to ``HOLD_LIMIT`` seconds, then fails) until the file
``gate`` exists, so a test can catch a micro-batch in the middle of its write.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

#: How long a held task waits for its gate before it fails (a driver nobody kills does not hang).
HOLD_LIMIT = 300.0


def gated_payload(hold: bytes, gate: str) -> Any:
    """A UDF returning the payload unchanged, holding the row whose payload is ``hold`` until ``gate`` exists."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    def passed(payload):  # type: ignore[no-untyped-def]  # no hints: pyspark would infer a pandas UDF
        import os
        import time

        if payload == hold:
            deadline = time.monotonic() + HOLD_LIMIT
            while not os.path.exists(gate):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"gate {gate} not opened within {HOLD_LIMIT} s")
                time.sleep(0.05)
        return payload

    return F.udf(passed, BinaryType())


def start_copy(spark: Any, server_url: str, prefix: str, checkpoint: Path, *, hold: bytes | None = None,
               gate: Path | None = None, **read_options: str) -> Any:
    """Start the copy with ``Trigger.AvailableNow`` and return the StreamingQuery."""
    from pyspark.sql import functions as F

    source = (spark.readStream.format("jetstream")
              .options(servers=server_url, stream=f"{prefix}_SRC", **read_options).load())
    payload = F.col("payload")
    if hold is not None and gate is not None:
        payload = gated_payload(hold, str(gate))(payload)
    out = source.select(
        F.concat(F.lit(f"{prefix}.dst."), F.substring_index("subject", ".", -1)).alias("subject"),
        payload.alias("payload"))
    return (out.writeStream.format("jetstream").options(servers=server_url, stream=f"{prefix}_DST")
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("server_url")
    parser.add_argument("prefix")
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--hold", help="the payload of the row to hold (UTF-8)")
    parser.add_argument("--gate", type=Path)
    parser.add_argument("--option", action="append", default=[], help="a read option, name=value")
    args = parser.parse_args()

    from tests.support.spark_session import local_spark

    for spark in local_spark(f"stream-copy-{args.prefix}"):
        read_options = dict(option.split("=", 1) for option in args.option)
        query = start_copy(spark, args.server_url, args.prefix, args.checkpoint, gate=args.gate,
                           hold=args.hold.encode() if args.hold else None, **read_options)
        query.awaitTermination()


if __name__ == "__main__":
    main()
