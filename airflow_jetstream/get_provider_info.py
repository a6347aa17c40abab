"""Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from airflow_jetstream.client.settings import CONNECTION_FIELDS, FieldSpec
from airflow_jetstream.version import __version__

_JSON_TYPES = {str: "string", bool: "boolean", float: "number"}


def _form_field(spec: FieldSpec) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": [_JSON_TYPES[spec.kind], "null"]}
    if spec.secret:
        schema["format"] = "password"
    if spec.kind is bool:
        schema["default"] = True
    return {"label": spec.label, "description": spec.description, "schema": schema}


#: The connection form's extra fields, from the one field table in client/settings.py.
CONN_FIELDS: dict[str, dict[str, Any]] = {name: _form_field(spec) for name, spec in CONNECTION_FIELDS.items()}


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-jetstream",
        "name": "NATS JetStream",
        "description": "NATS JetStream: hook, operators, sensors, triggers and a PySpark data source.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "NATS JetStream",
                "external-doc-url": "https://docs.nats.io/nats-concepts/jetstream",
                "tags": ["protocol"],
            }
        ],
        "hooks": [
            {"integration-name": "NATS JetStream", "python-modules": ["airflow_jetstream.hooks.jetstream"]}
        ],
        "operators": [
            {
                "integration-name": "NATS JetStream",
                "python-modules": [
                    "airflow_jetstream.operators.stream",
                    "airflow_jetstream.operators.publish",
                    "airflow_jetstream.operators.sourcing",
                    "airflow_jetstream.operators.consumer",
                    "airflow_jetstream.operators.advisory",
                    "airflow_jetstream.operators.consume",
                    "airflow_jetstream.operators.kv",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "NATS JetStream",
                "python-modules": [
                    "airflow_jetstream.sensors.advisory",
                    "airflow_jetstream.sensors.consumer",
                    "airflow_jetstream.sensors.ledger",
                    "airflow_jetstream.sensors.message",
                    "airflow_jetstream.sensors.kv",
                ],
            }
        ],
        "triggers": [
            {
                "integration-name": "NATS JetStream",
                "python-modules": [
                    "airflow_jetstream.triggers.advisory",
                    "airflow_jetstream.triggers.consumer",
                    "airflow_jetstream.triggers.ledger",
                    "airflow_jetstream.triggers.message",
                    "airflow_jetstream.triggers.await_message",
                    "airflow_jetstream.triggers.kv",
                ],
            }
        ],
        "connection-types": [
            {
                "hook-class-name": "airflow_jetstream.hooks.jetstream.JetStreamHook",
                "hook-name": "NATS JetStream",
                "connection-type": "nats",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema"],
                    "relabeling": {"host": "Servers", "login": "User"},
                    "placeholders": {
                        "host": "nats1.example.com:4222,nats2.example.com:4222",
                        "port": "4222",
                        "login": "user (optional)",
                        "password": "password (optional)",
                        "extra": '{"tls_ca_file": "/etc/nats/ca.pem"}',
                    },
                },
                "conn-fields": CONN_FIELDS,
            }
        ],
        "plugins": [{"name": "jetstream", "plugin-class": "airflow_jetstream.ui.plugin.JetStreamViewPlugin"}],
        "extra-links": ["airflow_jetstream.ui.links.JetStreamViewLink"],
        "queues": ["airflow_jetstream.queues.jetstream.JetStreamMessageQueueProvider"],
        "asset-uris": [
            {
                "schemes": ["jetstream"],
                "handler": "airflow_jetstream.assets.jetstream.sanitize_uri",
                "factory": "airflow_jetstream.assets.jetstream.create_asset",
                "to_openlineage_converter": "airflow_jetstream.assets.jetstream.convert_asset_to_openlineage",
            }
        ],
    }
