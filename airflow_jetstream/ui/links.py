"""The "JetStream" extra link of the provider's operators: a task's connection (and stream) in the view."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.providers.common.compat.sdk import conf
from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk.types import TaskInstanceKey

#: Where the api-server mounts the view (plugin.py).
URL_PREFIX = "/jetstream"


def view_url(connection_id: str, stream: str | None = None) -> str:
    """The view of ``connection_id`` (at ``stream``'s row), below ``[api] base_url`` when that is set."""
    base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
    url = f"{base}{URL_PREFIX}/connections/{quote(connection_id, safe='')}"
    return f"{url}#stream-{quote(stream, safe='')}" if stream else url


class JetStreamViewLink(BaseOperatorLink):
    """Opens the JetStream view of the task's ``nats_conn_id``, scrolled to its ``stream``.

    The URL is computed when the task ends (Airflow 3 stores it as an XCom), from the rendered
    ``nats_conn_id`` and ``stream`` fields; it is absolute when ``[api] base_url`` is set.
    """

    name = "JetStream"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        stream = getattr(operator, "stream", None)
        return view_url(operator.nats_conn_id, stream if isinstance(stream, str) else None)
