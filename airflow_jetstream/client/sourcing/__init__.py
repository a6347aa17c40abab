"""Durable sourcing: provisioning server- and user-managed sources, health and status."""

from airflow_jetstream.client.sourcing.health import SourceUnhealthyError
from airflow_jetstream.client.sourcing.provision import provision_durable_source
from airflow_jetstream.client.sourcing.spec import SERVER_MANAGED, USER_MANAGED, DurableSource
from airflow_jetstream.client.sourcing.status import source_status

__all__ = [
    "SERVER_MANAGED",
    "USER_MANAGED",
    "DurableSource",
    "SourceUnhealthyError",
    "provision_durable_source",
    "source_status",
]
