"""Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from airflow_jetstream.version import __version__

_SECRET = {"type": ["string", "null"], "format": "password"}
_TEXT = {"type": ["string", "null"]}


def _field(label: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"label": label, "description": description, "schema": dict(schema or _TEXT)}


CONN_FIELDS: dict[str, dict[str, Any]] = {
    "token": _field("Token", "Authentication token (instead of login/password).", _SECRET),
    "nkey_seed": _field("NKey seed", "User nkey seed (starts with 'SU'); kept secret.", _SECRET),
    "creds_file": _field("Credentials file", "Path to a .creds file (JWT + nkey seed) on the worker."),
    "tls_ca_file": _field("TLS CA file", "Path to the CA bundle that signed the server certificate."),
    "tls_cert_file": _field("TLS client certificate", "Path to the client certificate (mutual TLS)."),
    "tls_key_file": _field("TLS client key", "Path to the client key (mutual TLS)."),
    "tls_verify": _field(
        "Verify TLS", "Verify the server certificate (default true).", {"type": ["boolean", "null"], "default": True}
    ),
    "tls_hostname": _field("TLS server name", "Host name to verify when it differs from the server address."),
    "connect_timeout": _field(
        "Connect timeout (s)", "Seconds to wait per server when connecting (default 5).",
        {"type": ["number", "null"]},
    ),
    "request_timeout": _field(
        "Request timeout (s)", "Seconds to wait for JetStream API replies (default 5).",
        {"type": ["number", "null"]},
    ),
    "client_name": _field("Client name", "Connection name shown in the server's monitoring."),
    "domain": _field("JetStream domain", "JetStream domain (e.g. a leaf node's), if any."),
    "api_prefix": _field("JetStream API prefix", "Custom API prefix (instead of a domain), if any."),
}


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
