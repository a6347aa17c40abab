"""Features that need a newer Airflow than the lowest supported one, refused with a typed error.

The provider installs on Airflow 3.2+; event-driven DAGs through JetStream (the common-messaging queue
``jetstream`` and its shared-stream trigger) use ``airflow.triggers.shared_stream``, new in Airflow 3.3, and sensors
started in the triggerer need 3.3's scheduler and triggerer.
"""

from __future__ import annotations

from importlib.metadata import version

from airflow.providers.common.compat.sdk import AirflowOptionalProviderFeatureException

from airflow_jetstream.client.errors import AirflowFeatureError
from airflow_jetstream.client.server_features import parse_version

#: A feature: the release it needs, its name, and what to do instead on an older Airflow.
SHARED_STREAMS = ((3, 3, 0), "event-driven DAGs from JetStream (shared-stream triggers, queue scheme 'jetstream')",
                  "poll with the JetStream sensors instead")
#: Airflow 3.2's scheduler ignores ``start_from_trigger`` (the task runs on a worker) and its triggerer renders no
#: templates, so a templated stream name would reach the server as ``{{ ... }}``.
START_FROM_TRIGGER = ((3, 3, 0), "sensors started in the triggerer (start_from_trigger=True)",
                      "leave start_from_trigger off (a deferrable sensor then pokes once on a worker, then defers)")


class AirflowVersionError(AirflowFeatureError, AirflowOptionalProviderFeatureException):
    """:class:`AirflowFeatureError` that Airflow's provider discovery also treats as an optional feature."""


def airflow_version() -> tuple[int, int, int]:
    """The installed Airflow release as ``(major, minor, patch)``."""
    return parse_version(version("apache-airflow-core")) or (0, 0, 0)


def require_airflow(feature: tuple[tuple[int, int, int], str, str]) -> None:
    """Raise :class:`AirflowVersionError` (reason ``airflow_too_old``) when Airflow is older than ``feature`` needs."""
    since, name, instead = feature
    installed = airflow_version()
    if installed < since:
        raise AirflowVersionError(
            f"{name} need Airflow {'.'.join(map(str, since))} or newer; Airflow "
            f"{'.'.join(map(str, installed))} is installed. Upgrade Airflow (with the constraints file, "
            f"docs/compatibility.md) or {instead}",
            reason="airflow_too_old",
        )
