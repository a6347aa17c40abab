"""Features that need a newer Airflow than the lowest supported one, refused with a typed error.

The provider installs on Airflow 3.2+; event-driven DAGs through JetStream (the common-messaging queue
``jetstream`` and its shared-stream trigger) use ``airflow.triggers.shared_stream``, new in Airflow 3.3.
"""

from __future__ import annotations

from importlib.metadata import version

from airflow.providers.common.compat.sdk import AirflowOptionalProviderFeatureException

from airflow_jetstream.client.errors import AirflowFeatureError
from airflow_jetstream.client.server_features import parse_version

SHARED_STREAMS = ((3, 3, 0), "event-driven DAGs from JetStream (shared-stream triggers, queue scheme 'jetstream')")


class AirflowVersionError(AirflowFeatureError, AirflowOptionalProviderFeatureException):
    """:class:`AirflowFeatureError` that Airflow's provider discovery also treats as an optional feature."""


def airflow_version() -> tuple[int, int, int]:
    """The installed Airflow release as ``(major, minor, patch)``."""
    return parse_version(version("apache-airflow-core")) or (0, 0, 0)


def require_airflow(feature: tuple[tuple[int, int, int], str]) -> None:
    """Raise :class:`AirflowVersionError` (reason ``airflow_too_old``) when Airflow is older than ``feature`` needs."""
    since, name = feature
    installed = airflow_version()
    if installed < since:
        raise AirflowVersionError(
            f"{name} need Airflow {'.'.join(map(str, since))} or newer; Airflow "
            f"{'.'.join(map(str, installed))} is installed. Upgrade Airflow (with the constraints file, "
            "docs/compatibility.md) or poll with the JetStream sensors instead",
            reason="airflow_too_old",
        )
