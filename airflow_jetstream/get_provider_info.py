"""Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point.

Airflow reads it in every process (CLI, scheduler, api-server, workers), so this module is plain data
and imports nothing but the version: no client, no nats-py, no Airflow, no pyspark
(tests/test_import_cost.py holds it to that).
``CONN_FIELDS`` is the connection form, written out from the one field table
(``airflow_jetstream.client.settings.CONNECTION_FIELDS`` via ``form_fields()``); a test keeps them equal
and prints the literal to paste when the table changes.
"""

from __future__ import annotations

import copy
from typing import Any

from airflow_jetstream.version import __version__

INTEGRATION = "NATS JetStream"

#: The connection form's extra fields: ``form_fields()`` of client/settings.py, as a literal.
CONN_FIELDS: dict[str, dict[str, Any]] = {
    "token": {
        "label": "Token",
        "description": "Authentication token (instead of login/password).",
        "schema": {"type": ["string", "null"], "format": "password"},
    },
    "nkey_seed": {
        "label": "NKey seed",
        "description": "User nkey seed (starts with 'SU'); kept secret.",
        "schema": {"type": ["string", "null"], "format": "password"},
    },
    "creds_file": {
        "label": "Credentials file",
        "description": "Path to a .creds file (JWT + nkey seed) on the worker.",
        "schema": {"type": ["string", "null"]},
    },
    "tls_ca_file": {
        "label": "TLS CA file",
        "description": "Path to the CA bundle that signed the server certificate.",
        "schema": {"type": ["string", "null"]},
    },
    "tls_cert_file": {
        "label": "TLS client certificate",
        "description": "Path to the client certificate (mutual TLS).",
        "schema": {"type": ["string", "null"]},
    },
    "tls_key_file": {
        "label": "TLS client key",
        "description": "Path to the client key (mutual TLS).",
        "schema": {"type": ["string", "null"]},
    },
    "tls_verify": {
        "label": "Verify TLS",
        "description": "Verify the server certificate (default true).",
        "schema": {"type": ["boolean", "null"], "default": True},
    },
    "tls_hostname": {
        "label": "TLS server name",
        "description": "Host name to verify when it differs from the server address.",
        "schema": {"type": ["string", "null"]},
    },
    "connect_timeout": {
        "label": "Connect timeout (s)",
        "description": "Seconds to wait per server when connecting (default 5).",
        "schema": {"type": ["number", "null"]},
    },
    "request_timeout": {
        "label": "Request timeout (s)",
        "description": "Seconds to wait for JetStream API replies (default 5).",
        "schema": {"type": ["number", "null"]},
    },
    "leader_wait": {
        "label": "Leader wait (s)",
        "description": ("Seconds to keep retrying while a clustered stream or consumer elects a leader "
                        "(default 30; 0 = no retries)."),
        "schema": {"type": ["number", "null"]},
    },
    "client_name": {
        "label": "Client name",
        "description": "Connection name shown in the server's monitoring.",
        "schema": {"type": ["string", "null"]},
    },
    "domain": {
        "label": "JetStream domain",
        "description": "JetStream domain (e.g. a leaf node's), if any.",
        "schema": {"type": ["string", "null"]},
    },
    "api_prefix": {
        "label": "JetStream API prefix",
        "description": "Custom API prefix (instead of a domain), if any.",
        "schema": {"type": ["string", "null"]},
    },
}

HOOK_MODULES = ["airflow_jetstream.hooks.jetstream"]
OPERATOR_MODULES = [
    "airflow_jetstream.operators.stream",
    "airflow_jetstream.operators.publish",
    "airflow_jetstream.operators.sourcing",
    "airflow_jetstream.operators.consumer",
    "airflow_jetstream.operators.advisory",
    "airflow_jetstream.operators.consume",
    "airflow_jetstream.operators.kv",
    "airflow_jetstream.operators.spark_submit",
]
SENSOR_MODULES = [
    "airflow_jetstream.sensors.advisory",
    "airflow_jetstream.sensors.consumer",
    "airflow_jetstream.sensors.ledger",
    "airflow_jetstream.sensors.message",
    "airflow_jetstream.sensors.kv",
]
TRIGGER_MODULES = [
    "airflow_jetstream.triggers.advisory",
    "airflow_jetstream.triggers.consumer",
    "airflow_jetstream.triggers.ledger",
    "airflow_jetstream.triggers.message",
    "airflow_jetstream.triggers.await_message",
    "airflow_jetstream.triggers.kv",
]


def _modules(modules: list[str]) -> list[dict[str, Any]]:
    return [{"integration-name": INTEGRATION, "python-modules": list(modules)}]


def get_provider_info() -> dict[str, Any]:
    """The provider's metadata (a new dict on every call: callers may change it)."""
    return {
        "package-name": "airflow-jetstream",
        "name": INTEGRATION,
        "description": "NATS JetStream: hook, operators, sensors, triggers and a PySpark data source.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": "https://docs.nats.io/nats-concepts/jetstream",
                "tags": ["protocol"],
            }
        ],
        "hooks": _modules(HOOK_MODULES),
        "operators": _modules(OPERATOR_MODULES),
        "sensors": _modules(SENSOR_MODULES),
        "triggers": _modules(TRIGGER_MODULES),
        "connection-types": [
            {
                "hook-class-name": "airflow_jetstream.hooks.jetstream.JetStreamHook",
                "hook-name": INTEGRATION,
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
                "conn-fields": copy.deepcopy(CONN_FIELDS),
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
