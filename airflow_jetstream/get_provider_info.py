"""Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point.

Airflow reads it in every process (CLI, scheduler, api-server, workers), so this module is plain data
and imports nothing but the version: no client, no nats-py, no Airflow, no pyspark
(tests/test_import_cost.py holds it to that).
``CONN_FIELDS`` is the connection form: the labels of ``ConnectionSettings``' extras
(``airflow_jetstream.client.settings.CONNECTION_FIELDS`` reads them from here); a test holds its types to
the settings' types.
"""

from __future__ import annotations

import copy
from typing import Any

from airflow_jetstream import __version__

INTEGRATION = "NATS JetStream"


def _field(kind: str, label: str, description: str, *, secret: bool = False, default: Any = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": [kind, "null"]}
    if secret:
        schema["format"] = "password"
    if default is not None:
        schema["default"] = default
    return {"label": label, "description": description, "schema": schema}


#: The connection form's extra fields: one per extra field of ``ConnectionSettings`` (client/settings.py).
CONN_FIELDS: dict[str, dict[str, Any]] = {
    "token": _field("string", "Token", "Authentication token (instead of login/password).", secret=True),
    "nkey_seed_secret": _field("string", "NKey seed", "User nkey seed (starts with 'SU'); kept secret.", secret=True),
    "creds_file": _field("string", "Credentials file", "Path to a .creds file (JWT + nkey seed) on the worker."),
    "tls_ca_file": _field("string", "TLS CA file", "Path to the CA bundle that signed the server certificate."),
    "tls_cert_file": _field("string", "TLS client certificate", "Path to the client certificate (mutual TLS)."),
    "tls_key_file": _field("string", "TLS client key", "Path to the client key (mutual TLS)."),
    "tls_verify": _field("boolean", "Verify TLS", "Verify the server certificate (default true).", default=True),
    "tls_hostname": _field("string", "TLS server name", "Host name to verify when it differs from the server address."),
    "connect_timeout": _field("number", "Connect timeout (s)",
                              "Seconds to wait per server when connecting (default 5)."),
    "request_timeout": _field("number", "Request timeout (s)",
                              "Seconds to wait for JetStream API replies (default 5)."),
    "leader_wait": _field("number", "Leader wait (s)", "Seconds to keep retrying while a clustered stream or consumer "
                          "elects a leader (default 30; 0 = no retries)."),
    "client_name": _field("string", "Client name", "Connection name shown in the server's monitoring."),
    "domain": _field("string", "JetStream domain", "JetStream domain (e.g. a leaf node's), if any."),
    "api_prefix": _field("string", "JetStream API prefix", "Custom API prefix (instead of a domain), if any."),
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


def _option(description: str, kind: str, default: str) -> dict[str, Any]:
    return {"description": description, "version_added": "0.1.0", "type": kind, "example": None, "default": default}


#: Airflow's ``[jetstream]`` section (``AIRFLOW__JETSTREAM__<OPTION>``): the JetStream view's bounds and when it
#: flags a problem (docs/ui.md). Durations are seconds or strings like ``"90s"``, ``"5m"``, ``"24h"``.
CONFIG_SECTION: dict[str, Any] = {
    "description": "The JetStream view in Airflow's UI (Browse > JetStream): how much it reads, how long it "
                   "waits, and when it flags a problem.",
    "options": {
        "view_cache_seconds": _option(
            "Seconds a read of a connection is reused by every page load with the same query (one read per "
            "connection however many people open the page); 0 reads on every load.", "float", "5"),
        "view_concurrent_reads": _option(
            "Reads of one connection running at once in an api-server worker (different ledger buckets or capture "
            "streams); a page that would need more waits, and answers 503 if the wait outlasts view_timeout.",
            "integer", "2"),
        "view_timeout": _option(
            "Seconds a page waits for NATS before it answers 503 with the typed error (unreachable or stalled "
            "server).", "string", "10s"),
        "view_request_timeout": _option(
            "Seconds each NATS request of the view may take at most (the connection's own timeouts, capped).",
            "string", "5s"),
        "view_page_size": _option("Rows per page of each section.", "integer", "50"),
        "view_max_streams": _option(
            "Streams read per connection; more are counted and flagged (read_incomplete), not read.", "integer",
            "1000"),
        "view_max_consumers": _option(
            "Consumers read per connection, over all streams; more are counted and flagged, not read.", "integer",
            "5000"),
        "view_ledger_entries": _option(
            "Newest ledger entries read per page of the ledger section (older ones: the section's older link).",
            "integer", "5000"),
        "view_advisories": _option("Newest messages of the capture stream read (the advisory window).", "integer",
                                   "1000"),
        "problem_advisory_age": _option(
            "Abandoned batches, given-up and terminated messages younger than this are problems.", "string", "24h"),
        "problem_pending_idle": _option(
            "A pull consumer with pending messages, no pull request waiting and nothing delivered for this long is "
            "a problem (consumer_idle).", "string", "5m"),
        "problem_redelivered": _option(
            "A consumer with at least this many redelivered messages is a problem (consumer_redelivering).",
            "integer", "1"),
        "problem_source_stalled": _option(
            "A source whose backlog has not shrunk, or that had no activity, for this long is a problem "
            "(source_stalled).", "string", "60s"),
    },
}


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
        "config": {"jetstream": copy.deepcopy(CONFIG_SECTION)},
        "plugins": [{"name": "jetstream", "plugin-class": "airflow_jetstream.ui.plugin.JetStreamViewPlugin"}],
        "extra-links": ["airflow_jetstream.ui.links.JetStreamViewLink",
                        "airflow_jetstream.ui.links.JetStreamLedgerRunLink"],
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
