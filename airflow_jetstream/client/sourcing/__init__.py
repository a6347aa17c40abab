"""Durable sourcing: provisioning server- and user-managed sources, health and status.

The names below are imported on first use, so describing a source (``spec``) imports no nats-py."""

from typing import TYPE_CHECKING

from airflow_jetstream.client import lazy_exports

if TYPE_CHECKING:
    from airflow_jetstream.client.sourcing.provision import provision_durable_source
    from airflow_jetstream.client.sourcing.spec import DurableSource, source_status

__all__ = ["DurableSource", "provision_durable_source", "source_status"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "provision": ("provision_durable_source",),
    "spec": ("DurableSource", "source_status"),
})
