"""The PySpark Python data source ``jetstream`` (register it with :func:`airflow_jetstream.spark.register`)."""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceWriter
from pyspark.sql.types import StructType

from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.spark.connection import with_connection_defaults
from airflow_jetstream.spark.options import DECODINGS, ReadOptions, WriteOptions, lowered
from airflow_jetstream.spark.reader import JetStreamReader, default_schema
from airflow_jetstream.spark.writer import JetStreamWriter


class JetStreamDataSource(DataSource):
    """``spark.read.format("jetstream")`` and ``df.write.format("jetstream")``.

    Options are validated when the reader or writer is built, on the driver: unknown or invalid
    options fail the job before anything is read or published. ``connection_defaults`` are the
    connection fields :func:`airflow_jetstream.spark.register` found in the session's conf;
    explicit options win over them.
    """

    connection_defaults: Mapping[str, str] = {}

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
        if overwrite:
            raise InvalidRequestError(
                "the jetstream data source only appends (a stream keeps what it stored); use "
                "df.write.format('jetstream').mode('append')",
                reason="overwrite_not_supported",
            )
        return JetStreamWriter(WriteOptions.parse(self._options()), schema)
