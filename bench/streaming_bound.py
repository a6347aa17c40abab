"""What a streaming query costs pyspark itself, whatever the source: the yardsticks of ``spark_io --streaming``.

* :class:`MinimalSource` (format ``minimal``): the smallest Python data source pyspark accepts for
  batch and streaming reads, one in-memory row, no I/O. Its streaming-minus-batch time is the fixed
  cost pyspark adds to *every* streaming query with a Python data source (pyspark 4.x starts a new
  Python process for the source's planning, writes the offset and commit logs, plans the closing empty
  micro-batch of ``Trigger.AvailableNow``).
* Spark's own file source (JSON) read the same two ways: the fixed cost of a streaming query with a
  JVM source.

The classes are pickled by value (``register_pickle_by_value``) so the Python workers need not find
this file.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition


class MinimalReader(DataSourceReader):
    def read(self, partition: InputPartition) -> Iterator[tuple[str]]:
        yield ("x",)


class MinimalStreamReader(DataSourceStreamReader):
    def initialOffset(self) -> dict[str, int]:
        return {"n": 0}

    def latestOffset(self) -> dict[str, int]:
        return {"n": 1}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [InputPartition(0)] if end["n"] > start["n"] else []

    def read(self, partition: InputPartition) -> Iterator[tuple[str]]:
        yield ("x",)


class MinimalSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "minimal"

    def schema(self) -> str:
        return "v string"

    def reader(self, schema: Any) -> DataSourceReader:
        return MinimalReader()

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return MinimalStreamReader()


def register_minimal_source(spark: SparkSession) -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(MinimalSource)


def seconds(action: Callable[[], Any]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def batch_seconds(frame: Callable[[], DataFrame]) -> float:
    """One batch read: ``count()``."""
    return seconds(lambda: frame().count())


def streaming_seconds(frame: Callable[[], DataFrame]) -> float:
    """The same read as a streaming query: a new checkpoint, Trigger.AvailableNow, ``count()`` per micro-batch."""
    with tempfile.TemporaryDirectory() as checkpoint:
        return seconds(lambda: frame().writeStream.foreachBatch(lambda batch, _id: batch.count())
                       .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
                       .awaitTermination())


def one_row_frames(spark: SparkSession, jetstream_options: dict[str, str],
                   folder: str) -> dict[str, tuple[Any, Any]]:
    """name -> (batch frame, streaming frame) of one row: Spark's JSON file source (its file written in
    ``folder``), the minimal Python source, and the jetstream source (``jetstream_options`` name a
    one-message stream)."""
    with open(f"{folder}/row.json", "w", encoding="utf-8") as file:
        file.write('{"v": "x"}\n')
    register_minimal_source(spark)
    return {
        "Spark JSON file source": (lambda: spark.read.schema("v string").json(folder),
                                   lambda: spark.readStream.schema("v string").json(folder)),
        "minimal Python source": (lambda: spark.read.format("minimal").load(),
                                  lambda: spark.readStream.format("minimal").load()),
        "jetstream source": (lambda: spark.read.format("jetstream").options(**jetstream_options).load(),
                             lambda: spark.readStream.format("jetstream").options(**jetstream_options).load()),
    }


def fixed_costs(spark: SparkSession, jetstream_options: dict[str, str],
                rounds: int = 5) -> dict[str, tuple[float, float]]:
    """name -> (median batch seconds, median streaming seconds) of a one-row read, interleaved rounds."""
    with tempfile.TemporaryDirectory() as folder:
        frames = one_row_frames(spark, jetstream_options, folder)
        for batch, streaming in frames.values():  # warm up
            batch_seconds(batch)
            streaming_seconds(streaming)
        runs: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in frames}
        for _ in range(rounds):
            for name, (batch, streaming) in frames.items():
                runs[name][0].append(batch_seconds(batch))
                runs[name][1].append(streaming_seconds(streaming))
    return {name: (statistics.median(b), statistics.median(s)) for name, (b, s) in runs.items()}
