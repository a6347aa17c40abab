"""How the ``nats`` connection reaches the data source: inside the registered class, from Spark conf.

``register`` registers a class built for the connection's fields (:func:`connected_source`): Spark pickles it
by value into the tasks (and Spark Connect into the registration), so the fields never pass through Spark
conf. They come from ``register(spark, settings)`` or from the private properties file
``JetStreamSparkSubmitOperator`` writes (``spark.jetstream.*``; secrets under ``spark.jetstream.secret.*``,
which Spark redacts and Spark Connect hides from its clients: conf cannot carry them over Connect).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

from airflow_jetstream.client.errors import InvalidSettingsError
from airflow_jetstream.client.settings import SECRET_FIELDS, SETTINGS_FIELDS, ConnectionSettings, settings_to_fields

CONF_PREFIX = "spark.jetstream."
SECRET_CONF_PREFIX = "spark.jetstream.secret."
#: Keys the submitting operator sets for the job itself (airflow_jetstream/spark/failure.py).
JOB_CONF_PREFIX = "spark.jetstream.job."
#: Fields that pick the authentication: options naming any of them replace all of the conf's.
AUTH_FIELDS = ("user", "password", "token", "nkey_seed_secret", "creds_file")
Source = TypeVar("Source", bound=type)


def conf_key(name: str) -> str:
    """The Spark conf key of a connection field (secrets under ``spark.jetstream.secret.``)."""
    return f"{SECRET_CONF_PREFIX if name in SECRET_FIELDS else CONF_PREFIX}{name}"


def settings_to_conf(settings: ConnectionSettings) -> dict[str, str]:
    """Spark conf entries carrying ``settings`` (defaults left out)."""
    return {conf_key(name): value for name, value in settings_to_fields(settings).items()}


def fields_from_conf(conf: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Connection fields from Spark conf pairs; an unknown ``spark.jetstream.*`` key is an error
    (``spark.jetstream.job.*`` are the submitting operator's, not the connection's)."""
    found: dict[str, str] = {}
    for key, value in conf:
        if not key.startswith(CONF_PREFIX) or key.startswith(JOB_CONF_PREFIX):
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


def connected_source(base: Source, fields: Mapping[str, str]) -> Source:
    """A subclass of the data source ``base`` whose ``connection_defaults`` are ``fields``.

    Built per registration and importable from no module, so cloudpickle sends it by value, the
    fields with it; ``base`` travels by reference (the Python workers import the package).
    """
    return type(f"Connected{base.__name__}", (base,), {"connection_defaults": dict(fields)})  # type: ignore[return-value]
