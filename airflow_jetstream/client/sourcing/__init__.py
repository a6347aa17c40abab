"""Durable sourcing: provisioning server- and user-managed sources, health and status."""

from airflow_jetstream.client.sourcing.provision import (
    SERVER_MANAGED,
    USER_MANAGED,
    DurableSource,
    SourceUnhealthyError,
    provision_durable_source,
    source_status,
)

__all__ = [
    "SERVER_MANAGED",
    "USER_MANAGED",
    "DurableSource",
    "SourceUnhealthyError",
    "provision_durable_source",
    "source_status",
]
