"""PySpark data source ``jetstream``: bounded parallel reads and atomic/fast batch writes (docs/spark.md); its entry
points, :func:`register` and :func:`consume` (a read acknowledged once the caller's block succeeded).

Imports the client toolkit and pyspark, never Airflow, so executors only need this package: after
``register(spark)``, ``spark.read.format("jetstream")`` and ``df.write.format("jetstream")``. Submitted with
``JetStreamSparkSubmitOperator(nats_conn_id=...)``, the ``servers`` option and credentials come from the
Airflow connection (:mod:`airflow_jetstream.spark.driver`).
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pyspark
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.ledger.records import BatchRecord
from airflow_jetstream.client.reading.read_plan import ReadPlan, acknowledge_read
from airflow_jetstream.client.settings import ConnectionSettings, settings_to_fields
from airflow_jetstream.spark.driver import (
    connected_source,
    progress,
    rate,
    record_failures,
    run,
    session_connection_fields,
    with_connection_defaults,
)
from airflow_jetstream.spark.options import (
    PARSERS,
    ReadOptions,
    WriteOptions,
    check_option_names,
    lowered,
)
from airflow_jetstream.spark.package import add_package_to_session, build_py_files, check_pyspark_install
from airflow_jetstream.spark.reader import (
    JetStreamReader,
    JetStreamStreamReader,
    check_streaming_read_support,
    default_schema,
    plan_for,
)
from airflow_jetstream.spark.writer import (
    JetStreamStreamWriter,
    JetStreamWriter,
    check_streaming_write_support,
    checkpoint_query_id,
)


class JetStreamDataSource(DataSource):
    """``spark.read``/``spark.readStream.format("jetstream")`` and ``df.write``/``df.writeStream.format("jetstream")``.

    Options are validated when the reader or writer is built, on the driver: unknown or invalid
    options fail the job before anything is read or published. ``connection_defaults`` are the
    connection fields :func:`airflow_jetstream.spark.register` found in the session's conf;
    explicit options win over them.
    """

    connection_defaults: Mapping[str, str] = {}

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        check_option_names(self.options)  # a typo fails at load()/save() (with .schema() given, at the first action)

    def _options(self) -> dict[str, str]:
        return with_connection_defaults(self.connection_defaults, lowered(self.options))

    @classmethod
    def name(cls) -> str:
        return "jetstream"

    def schema(self) -> str:
        decode = lowered(self.options).get("decode")  # parsed as the reader will: decode=UTF8 is utf-8
        return default_schema(PARSERS["decode"]("decode", decode) if decode else "none")

    def reader(self, schema: StructType) -> DataSourceReader:
        return JetStreamReader(ReadOptions.parse(self._options()), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        _refuse_overwrite(overwrite, "df.write.format('jetstream').mode('append')")
        return JetStreamWriter(WriteOptions.parse(self._options()), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = ReadOptions.parse(self._options(), streaming=True)
        check_streaming_read_support(options, pyspark.__version__)
        return JetStreamStreamReader(options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        _refuse_overwrite(overwrite, "df.writeStream.format('jetstream').outputMode('append')")
        # Spark hands the query's own checkpointLocation option to the sink too (its metadata file, which
        # holds the query id, is written before the sink is built)
        options = self._options()
        checkpoint = options.pop("checkpointlocation", None)
        check_streaming_write_support(options, pyspark.__version__)
        return JetStreamStreamWriter(WriteOptions.parse(options), schema, checkpoint_query_id(checkpoint))


def _refuse_overwrite(overwrite: bool, instead: str) -> None:
    if overwrite:
        raise InvalidRequestError(
            f"the jetstream data source only appends (a stream keeps what it stored); use {instead}",
            reason="overwrite_not_supported",
        )


#: The connection fields :func:`register` gave each session's format: :func:`consume` plans on the driver with them.
_REGISTERED_FIELDS: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()


def register(spark: Any, settings: ConnectionSettings | None = None, *, ship_package: bool = False) -> None:
    """Register the ``jetstream`` format with a SparkSession, classic or Spark Connect.

    :param settings: the NATS connection (e.g. ``JetStreamHook("nats_default").settings``): its fields
        become the format's defaults, carried inside the registered data source (pickled into the
        tasks and, on Spark Connect, into the registration), never in Spark conf. Without it, the
        fields of a job submitted by
        :class:`~airflow_jetstream.operators.spark_submit.JetStreamSparkSubmitOperator`
        (``spark.jetstream.*`` conf) are the defaults, if any.
    :param ship_package: first add this package (client + spark, and nats-py) to the session, so
        Python workers that lack it can run the data source: ``spark.addArtifacts(zip, pyfile=True)``
        on Spark Connect, ``SparkContext.addPyFile`` on a classic session. Calling register again
        (with or without it) is safe.
    """
    record_failures(spark)  # in a job of JetStreamSparkSubmitOperator: the cause of a failure, for the task
    check_pyspark_install()
    if ship_package:
        add_package_to_session(spark)
    defaults = session_connection_fields(spark) if settings is None else settings_to_fields(settings)
    _REGISTERED_FIELDS[spark] = defaults
    spark.dataSource.register(connected_source(JetStreamDataSource, defaults) if defaults else JetStreamDataSource)


@dataclasses.dataclass
class Consumption:
    """What a :func:`consume` block covers; ``removed`` is set once the read was acknowledged."""

    plan: ReadPlan
    claimed: list[BatchRecord]
    removed: int | None = None
    #: The ledger said every batch of the run was consumed before this block: an earlier attempt consumed the run
    #: (one whose success its scheduler never heard, say), so this one claimed nothing and must leave that
    #: attempt's output as it is, not replace it with its own read (which the earlier acknowledgement emptied).
    already_consumed: bool = False

    @property
    def claim_revisions(self) -> dict[str, int]:
        """Each claimed batch's fencing token: the ledger revision its claim was written at (a later claim of the
        batch has a higher one). Store it with the output so readers can trust the latest claim's only."""
        return {b.batch_id: b.revision for b in self.claimed}

    def to_dict(self) -> dict[str, Any]:
        return {**self.plan.to_dict(), "claimed_batches": [b.batch_id for b in self.claimed],
                "claim_revisions": self.claim_revisions, "already_consumed": self.already_consumed,
                "removed": self.removed}


async def _claim(conn: JetStreamConnection, run_id: str, ledger_bucket: str, owner: str,
                 visibility_timeout: float | str | timedelta) -> tuple[list[BatchRecord], bool]:
    """The claims taken on the run's batches, and whether the ledger says the run was consumed before."""
    ledger = await BatchLedger.open(conn, ledger_bucket, visibility_timeout=visibility_timeout)
    return await ledger.claim_run(run_id, owner=owner)


async def _finish(conn: JetStreamConnection, consumption: Consumption, ledger_bucket: str, error: str | None) -> None:
    """Settle the claims, then acknowledge the read: a job whose claims were taken over while it was frozen gets
    ``ClaimLostError`` from the ledger and acknowledges nothing (its cursor may lag its successor's)."""
    if consumption.claimed:
        ledger = await BatchLedger.open(conn, ledger_bucket)
        await ledger.settle(consumption.claimed, error=error)
    if error is None:
        consumption.removed = await acknowledge_read(conn, consumption.plan)


@contextmanager
def consume(spark: Any, options: Mapping[str, str], *, schema: StructType | str | None = None,
            run_id: str | None = None, ledger_bucket: str = "batch_ledger",
            owner: str = "spark-consume",
            visibility_timeout: float | str | timedelta = "10m") -> Iterator[tuple[Any, Consumption]]:
    """Consume a stream with acknowledgement deferred until the job succeeded::

        with consume(spark, {"servers": url, "stream": "ORDERS"}) as (df, consumption):
            df.groupBy("subject").count().write.mode("overwrite").parquet(out)
        # here the messages df covered are removed from the stream; new ones stay

    Interest and Limits streams need ``options["consumer"]``: a durable consumer (deliver policy
    ``all``, created when missing) that only this job uses as its cursor; the read starts after its
    ack floor and uses its filters, and the acknowledgement moves its ack floor to the read's end
    (an Interest stream then drops what no other consumer needs). A WorkQueue stream needs no
    consumer: the acknowledgement purges what was read.

    The bounds are fixed on entry, so every action on ``df`` sees the same messages. When the
    block raises, nothing is removed (a re-run reads the same messages plus newer ones); write the
    output idempotently (overwrite) so a re-run after a failure between writing and removing
    leaves each message in the output exactly once. With ``run_id`` the run's batches in the batch
    ledger are claimed on entry and marked consumed before the removal (released on failure); a job whose
    claims were lost meanwhile raises ``ClaimLostError`` and removes nothing. ``Consumption.claim_revisions``
    are the claims' tokens, to fence the output with (docs/ledger.md). ``Consumption.already_consumed`` says the
    run was consumed before (a re-run of a job whose success was not heard): keep that output, write none.
    ``visibility_timeout`` is the claims' deadline (seconds, ``"10m"`` or a timedelta): past it, another attempt
    may take the batches over; before it, a job that finds batches of the run held by another attempt gives back
    what it claimed and raises ``LedgerConflictError`` on entry, reading nothing.
    """
    opts = {**lowered(options), "consume": "true"}
    defaults = _REGISTERED_FIELDS.get(spark)
    defaults = session_connection_fields(spark) if defaults is None else defaults
    parsed = ReadOptions.parse(with_connection_defaults(defaults, opts))
    started = time.monotonic()
    plan = run(parsed.settings, plan_for, parsed)
    pinned = {**opts, "start_seq": str(plan.first_seq), "end_seq": str(max(plan.last_seq, 0)),
              "num_partitions": str(max(1, len(plan.ranges)))}
    if plan.workers:
        del pinned["num_partitions"]
    elif plan.subjects:
        pinned["filter_subjects"] = ",".join(plan.subjects)
    reader = spark.read.format("jetstream").options(**pinned)
    if schema is not None:
        reader = reader.schema(schema)
    df = reader.load()
    claims, already_consumed = run(parsed.settings, _claim, run_id, ledger_bucket, owner,
                                   visibility_timeout) if run_id else ([], False)
    consumption = Consumption(plan, claims, already_consumed=already_consumed)
    try:
        yield df, consumption
    except BaseException as exc:
        run(parsed.settings, _finish, consumption, ledger_bucket, f"{type(exc).__name__}: {exc}")
        raise
    run(parsed.settings, _finish, consumption, ledger_bucket, None)
    seconds = time.monotonic() - started
    progress(f"consume {plan.stream}: read {plan.messages} message(s) seq {plan.first_seq}..{plan.last_seq}, "
             f"removed {consumption.removed or 0}, {len(consumption.claimed)} batch(es) consumed, "
             f"in {seconds:.1f} s ({rate(plan.messages, seconds)})")


__all__ = ["build_py_files", "consume", "register"]
