"""asyncio JetStream toolkit on nats-py. Imports neither Airflow nor pyspark.

Spark executors, the Airflow triggerer and plain scripts use it directly::

    from airflow_jetstream.client import ConnectionSettings, open_connection, ensure_stream

    async with open_connection(ConnectionSettings(servers="127.0.0.1:4222")) as conn:
        await ensure_stream(conn, {"name": "ORDERS", "subjects": ["orders.>"]})

The names below are imported on first use (PEP 562), so ``from airflow_jetstream.client.settings import
ConnectionSettings`` or a Spark worker unpickling the data source imports only the modules it needs.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_jetstream.client.admin.consumers import ensure_consumer
    from airflow_jetstream.client.admin.streams import ensure_stream, stream_info
    from airflow_jetstream.client.admin.worker_consumers import WorkerConsumerManager, ensure_worker_consumer
    from airflow_jetstream.client.batches.atomic import fence_count, publish_atomic_batch
    from airflow_jetstream.client.batches.batcher import Batcher
    from airflow_jetstream.client.batches.fast import publish_fast_batch
    from airflow_jetstream.client.batches.types import BatchMessage
    from airflow_jetstream.client.connection import open_connection
    from airflow_jetstream.client.errors import JetStreamError, KeyRevisionError
    from airflow_jetstream.client.reading.apply_function import ConsumeOptions
    from airflow_jetstream.client.reading.consume import consume
    from airflow_jetstream.client.settings import ConnectionSettings

#: The stable names, by the module that defines them; docs/api.md lists the same ones (tests/test_public_api.py
#: holds them together). Every other name of the toolkit is internal: importable from its module, not stable.
_MODULES: dict[str, tuple[str, ...]] = {
    "admin.consumers": ("ensure_consumer",),
    "admin.streams": ("ensure_stream", "stream_info"),
    "admin.worker_consumers": ("WorkerConsumerManager", "ensure_worker_consumer"),
    "batches.atomic": ("fence_count", "publish_atomic_batch"),
    "batches.batcher": ("Batcher",),
    "batches.fast": ("publish_fast_batch",),
    "batches.types": ("BatchMessage",),
    "connection": ("open_connection",),
    "errors": ("JetStreamError", "KeyRevisionError"),
    "reading.consume": ("consume",),
    "reading.apply_function": ("ConsumeOptions",),
    "settings": ("ConnectionSettings",),
}
__all__ = [
    "BatchMessage",
    "Batcher",
    "ConnectionSettings",
    "ConsumeOptions",
    "JetStreamError",
    "KeyRevisionError",
    "WorkerConsumerManager",
    "consume",
    "ensure_consumer",
    "ensure_stream",
    "ensure_worker_consumer",
    "fence_count",
    "open_connection",
    "publish_atomic_batch",
    "publish_fast_batch",
    "stream_info",
]


def lazy_exports(package: str, modules: Mapping[str, tuple[str, ...]]) -> tuple[
        Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` (this one, kv, ledger, sourcing, advisories): ``modules``
    maps a module (relative to the package) to the names it defines; a name's module is imported when the name is
    first read (PEP 562), and the value kept, so importing a package imports none of its modules."""
    where = {name: f"{package}.{module}" for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__


__getattr__, __dir__ = lazy_exports(__name__, _MODULES)
