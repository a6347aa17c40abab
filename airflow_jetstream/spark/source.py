"""The PySpark Python data source ``jetstream`` (register it with :func:`airflow_jetstream.spark.register`)."""

from __future__ import annotations

from collections.abc import Mapping

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
from airflow_jetstream.spark.connection import with_connection_defaults
from airflow_jetstream.spark.options import (
    DECODINGS,
    ReadOptions,
    StreamReadOptions,
    WriteOptions,
    check_option_names,
    lowered,
)
from airflow_jetstream.spark.reader import JetStreamReader, default_schema
from airflow_jetstream.spark.stream_reader import JetStreamStreamReader, check_streaming_read_support
from airflow_jetstream.spark.stream_writer import (
    JetStreamStreamWriter,
    check_streaming_write_support,
    checkpoint_query_id,
)
from airflow_jetstream.spark.writer import JetStreamWriter


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
        decode = lowered(self.options).get("decode", "none").lower()
        return default_schema(decode if decode in DECODINGS else "none")

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
