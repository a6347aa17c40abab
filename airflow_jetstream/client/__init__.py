"""asyncio JetStream toolkit on nats-py. Imports neither Airflow nor pyspark.

Spark executors, the Airflow triggerer and plain scripts use it directly::

    from airflow_jetstream.client import ConnectionSettings, open_connection, ensure_stream

    async with open_connection(ConnectionSettings(servers="127.0.0.1:4222")) as conn:
        await ensure_stream(conn, {"name": "ORDERS", "subjects": ["orders.>"]})

The names below are imported on first use (PEP 562), so ``from airflow_jetstream.client.settings import
ConnectionSettings`` or a Spark worker unpickling the data source imports only the modules it needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_jetstream.client.lazy import lazy_exports

if TYPE_CHECKING:
    from airflow_jetstream.client.admin.consumer_reset import reset_consumer
    from airflow_jetstream.client.admin.consumers import consumer_info, delete_consumer, ensure_consumer
    from airflow_jetstream.client.admin.streams import (
        delete_stream,
        ensure_stream,
        find_stream,
        purge_stream,
        stream_info,
    )
    from airflow_jetstream.client.admin.worker_consumers import WorkerConsumerManager, ensure_worker_consumer
    from airflow_jetstream.client.advisories.filter import AdvisoryPredicateError
    from airflow_jetstream.client.batches.atomic import publish_atomic_batch, publish_atomic_batches
    from airflow_jetstream.client.batches.batcher import Batcher
    from airflow_jetstream.client.batches.fast import publish_fast_batch
    from airflow_jetstream.client.batches.types import BatchItemResult, BatchMessage, BatchResult
    from airflow_jetstream.client.connection import JetStreamConnection, account_info, connect, open_connection
    from airflow_jetstream.client.errors import (
        AirflowFeatureError,
        ApplyFunctionError,
        AuthenticationError,
        BatchesFailedError,
        BatchNotFoundError,
        BatchPublishError,
        BucketNotFoundError,
        ClaimLostError,
        ConnectionFailedError,
        ConsumerConfigError,
        ConsumerNotFoundError,
        ConsumerResetError,
        FastBatchError,
        InvalidFunctionError,
        InvalidKeyError,
        InvalidRequestError,
        InvalidSettingsError,
        InvalidSubjectError,
        JetStreamError,
        JetStreamNotEnabledError,
        KeyNotFoundError,
        KeyRevisionError,
        KeyValueError,
        LeaderUnavailableError,
        LedgerConflictError,
        LedgerError,
        LedgerNotFoundError,
        LedgerRecordError,
        LedgerWaitTimeoutError,
        LimitReachedError,
        NatsPyVersionError,
        PermissionDeniedError,
        PlacementError,
        RequestTimeoutError,
        ServerAPIError,
        ServerFeatureError,
        SparkInstallError,
        StreamConfigError,
        StreamNotFoundError,
        TLSConfigurationError,
        TooManySubjectsError,
    )
    from airflow_jetstream.client.reading.consume import consume
    from airflow_jetstream.client.reading.consume_options import ConsumeOptions
    from airflow_jetstream.client.settings import ConnectionSettings
    from airflow_jetstream.client.sourcing.health import SourceUnhealthyError

#: The public names other than the error classes of ``client/errors.py``, by the module that defines them.
_MODULES: dict[str, tuple[str, ...]] = {
    "admin.consumer_reset": ("reset_consumer",),
    "admin.consumers": ("consumer_info", "delete_consumer", "ensure_consumer"),
    "admin.worker_consumers": ("WorkerConsumerManager", "ensure_worker_consumer"),
    "reading.consume": ("consume",),
    "reading.consume_options": ("ConsumeOptions",),
    "admin.streams": ("delete_stream", "ensure_stream", "find_stream", "purge_stream", "stream_info"),
    "advisories.filter": ("AdvisoryPredicateError",),
    "batches.atomic": ("publish_atomic_batch", "publish_atomic_batches"),
    "batches.batcher": ("Batcher",),
    "batches.fast": ("publish_fast_batch",),
    "batches.types": ("BatchItemResult", "BatchMessage", "BatchResult"),
    "connection": ("JetStreamConnection", "account_info", "connect", "open_connection"),
    "settings": ("ConnectionSettings",),
    "sourcing.health": ("SourceUnhealthyError",),
}
#: The stable names; docs/api.md lists the same ones (tests/test_public_api.py holds them together).
__all__ = [
    "AdvisoryPredicateError",
    "AirflowFeatureError",
    "ApplyFunctionError",
    "AuthenticationError",
    "BatchItemResult",
    "BatchMessage",
    "BatchNotFoundError",
    "BatchPublishError",
    "BatchResult",
    "Batcher",
    "BatchesFailedError",
    "BucketNotFoundError",
    "ClaimLostError",
    "ConnectionFailedError",
    "ConnectionSettings",
    "ConsumeOptions",
    "ConsumerConfigError",
    "ConsumerNotFoundError",
    "ConsumerResetError",
    "FastBatchError",
    "InvalidFunctionError",
    "InvalidKeyError",
    "InvalidRequestError",
    "InvalidSettingsError",
    "InvalidSubjectError",
    "JetStreamConnection",
    "JetStreamError",
    "JetStreamNotEnabledError",
    "KeyNotFoundError",
    "KeyRevisionError",
    "KeyValueError",
    "LeaderUnavailableError",
    "LedgerConflictError",
    "LedgerError",
    "LedgerNotFoundError",
    "LedgerRecordError",
    "LedgerWaitTimeoutError",
    "LimitReachedError",
    "NatsPyVersionError",
    "PermissionDeniedError",
    "PlacementError",
    "RequestTimeoutError",
    "ServerAPIError",
    "ServerFeatureError",
    "SourceUnhealthyError",
    "SparkInstallError",
    "StreamConfigError",
    "StreamNotFoundError",
    "TLSConfigurationError",
    "TooManySubjectsError",
    "WorkerConsumerManager",
    "account_info",
    "connect",
    "consume",
    "consumer_info",
    "delete_consumer",
    "delete_stream",
    "ensure_consumer",
    "ensure_stream",
    "ensure_worker_consumer",
    "find_stream",
    "open_connection",
    "publish_atomic_batch",
    "publish_atomic_batches",
    "publish_fast_batch",
    "purge_stream",
    "reset_consumer",
    "stream_info",
]


__getattr__, __dir__ = lazy_exports(__name__, {
    "errors": tuple(name for name in __all__ if not any(name in names for names in _MODULES.values())), **_MODULES})
