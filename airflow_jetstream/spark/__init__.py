"""PySpark data source ``jetstream``: bounded parallel reads and atomic/fast batch writes (docs/spark.md).

Imports the client toolkit and pyspark, never Airflow, so executors only need this package: after
``register(spark)``, ``spark.read.format("jetstream")`` and ``df.write.format("jetstream")``. Submitted with
``JetStreamSparkSubmitOperator(nats_conn_id=...)``, the ``servers`` option and credentials come from the
Airflow connection (:mod:`airflow_jetstream.spark.driver`).
"""

from __future__ import annotations

from collections.abc import Mapping
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

from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.settings import ConnectionSettings, settings_to_fields
from airflow_jetstream.spark.driver import (
    connected_source,
    record_failures,
    session_connection_fields,
    with_connection_defaults,
)
from airflow_jetstream.spark.options import (
    PARSERS,
    ReadOptions,
    StreamReadOptions,
    WriteOptions,
    check_option_names,
    lowered,
)
from airflow_jetstream.spark.package import add_package_to_session, build_py_files, check_pyspark_install
from airflow_jetstream.spark.reader import (
    JetStreamReader,
    JetStreamStreamReader,
    check_streaming_read_support,
    consume,
    default_schema,
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
        options = StreamReadOptions.parse(self._options())
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
    spark.dataSource.register(connected_source(JetStreamDataSource, defaults) if defaults else JetStreamDataSource)


__all__ = ["build_py_files", "consume", "register"]
