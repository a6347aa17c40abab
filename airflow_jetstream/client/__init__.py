"""asyncio JetStream toolkit on nats-py. Imports neither Airflow nor pyspark.

Spark executors, the Airflow triggerer and plain scripts use it directly::

    from airflow_jetstream.client import ConnectionSettings, open_connection, ensure_stream

    async with open_connection(ConnectionSettings(servers="127.0.0.1:4222")) as conn:
        await ensure_stream(conn, {"name": "ORDERS", "subjects": ["orders.>"]})
"""

from airflow_jetstream.client.admin.streams import (
    delete_stream,
    ensure_stream,
    find_stream,
    purge_stream,
    stream_info,
)
from airflow_jetstream.client.batches.atomic import publish_atomic_batch, publish_atomic_batches, stored_sequences
from airflow_jetstream.client.batches.batcher import Batcher
from airflow_jetstream.client.batches.fast import publish_fast_batch
from airflow_jetstream.client.batches.types import BatchItemResult, BatchMessage, BatchResult
from airflow_jetstream.client.connection import JetStreamConnection, account_info, connect, open_connection
from airflow_jetstream.client.errors import (
    AuthenticationError,
    BatchPublishError,
    ConnectionFailedError,
    ConsumerConfigError,
    ConsumerNotFoundError,
    ConsumerResetError,
    InvalidRequestError,
    InvalidSettingsError,
    InvalidSubjectError,
    JetStreamError,
    JetStreamNotEnabledError,
    PermissionDeniedError,
    RequestTimeoutError,
    ServerAPIError,
    StreamConfigError,
    StreamNotFoundError,
    TLSConfigurationError,
)
from airflow_jetstream.client.settings import ConnectionSettings

__all__ = [
    "AuthenticationError",
    "BatchItemResult",
    "BatchMessage",
    "BatchPublishError",
    "BatchResult",
    "Batcher",
    "ConnectionFailedError",
    "ConnectionSettings",
    "ConsumerConfigError",
    "ConsumerNotFoundError",
    "ConsumerResetError",
    "InvalidRequestError",
    "InvalidSettingsError",
    "InvalidSubjectError",
    "JetStreamConnection",
    "JetStreamError",
    "JetStreamNotEnabledError",
    "PermissionDeniedError",
    "RequestTimeoutError",
    "ServerAPIError",
    "StreamConfigError",
    "StreamNotFoundError",
    "TLSConfigurationError",
    "account_info",
    "connect",
    "delete_stream",
    "ensure_stream",
    "find_stream",
    "open_connection",
    "publish_atomic_batch",
    "publish_atomic_batches",
    "publish_fast_batch",
    "purge_stream",
    "stored_sequences",
    "stream_info",
]
