"""The ``nats`` connection handed to a Spark job as Spark conf (``spark.jetstream.*``).

:class:`~airflow_jetstream.operators.spark_submit.JetStreamSparkSubmitOperator` writes the
connection's fields into a private properties file; :func:`airflow_jetstream.spark.register` reads
them from the session's conf and makes them the data source's defaults. Secret fields live under
``spark.jetstream.secret.*``, which Spark's default ``spark.redaction.regex`` redacts in its UI,
event log and ``--verbose`` output.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from airflow_jetstream.client.errors import InvalidSettingsError
from airflow_jetstream.client.settings import SECRET_FIELDS, SETTINGS_FIELDS, ConnectionSettings, settings_to_fields

CONF_PREFIX = "spark.jetstream."
SECRET_CONF_PREFIX = "spark.jetstream.secret."
#: Fields that pick the authentication: options naming any of them replace all of the conf's.
AUTH_FIELDS = ("user", "password", "token", "nkey_seed", "creds_file")


def conf_key(name: str) -> str:
    """The Spark conf key of a connection field (secrets under ``spark.jetstream.secret.``)."""
    return f"{SECRET_CONF_PREFIX if name in SECRET_FIELDS else CONF_PREFIX}{name}"


def settings_to_conf(settings: ConnectionSettings) -> dict[str, str]:
    """Spark conf entries carrying ``settings`` (defaults left out)."""
    return {conf_key(name): value for name, value in settings_to_fields(settings).items()}


def fields_from_conf(conf: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Connection fields from Spark conf pairs; an unknown ``spark.jetstream.*`` key is an error."""
    found: dict[str, str] = {}
    for key, value in conf:
        if not key.startswith(CONF_PREFIX):
            continue
        name = key.removeprefix(SECRET_CONF_PREFIX) if key.startswith(SECRET_CONF_PREFIX) else key[len(CONF_PREFIX):]
        if name not in SETTINGS_FIELDS or conf_key(name) != key:
            known = ", ".join(conf_key(n) for n in SETTINGS_FIELDS)
            raise InvalidSettingsError(f"unknown Spark conf key {key!r}; the jetstream data source knows {known}")
        found[name] = value
    return found


def with_connection_defaults(defaults: Mapping[str, str], options: Mapping[str, str]) -> dict[str, str]:
    """Options over the conf's connection fields; options that name any auth field replace all of the conf's."""
    base = dict(defaults)
    if any(options.get(name) for name in AUTH_FIELDS):
        for name in AUTH_FIELDS:
            base.pop(name, None)
    return {**base, **options}


def session_connection_fields(spark: object) -> dict[str, str]:
    """The connection fields in a SparkSession's conf (empty when the job got none)."""
    return fields_from_conf(spark.conf.getAll.items())  # type: ignore[attr-defined]
