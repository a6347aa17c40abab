"""The operators' extra links into the JetStream view: the task's stream, and a DAG run's batch ledger row.

Airflow 3 computes a link when the task ends and stores it (an XCom), so a stored link must outlive the
deployment that made it: links are relative to the api-server (``/jetstream/...``), keeping only the
path of ``[api] base_url`` (an api-server served below ``/airflow`` gives ``/airflow/jetstream/...``),
never its scheme, host or port. A link names its stream in the query (``?stream=``), so the page shows
that stream's row whatever page of the streams table it would be on, and in the fragment
(``#stream-<name>``), so the browser scrolls to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

from airflow.providers.common.compat.sdk import conf
from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk.types import TaskInstanceKey

#: Where the api-server mounts the view (plugin.py).
URL_PREFIX = "/jetstream"


def anchor(kind: str, *names: Any) -> str:
    """The id of the row a problem or a link names (``consumer-ORDERS-worker``): the kind, then each name URL-quoted."""
    return "-".join([kind, *(quote(str(name), safe="") for name in names)])


#: Per section of the view with rows: the kind of its rows' ids and the fields that name a row.
ROW_NAMES: dict[str, tuple[str, ...]] = {"streams": ("stream", "name"), "consumers": ("consumer", "stream", "name"),
                                         "sources": ("source", "stream", "source"), "ledger": ("run", "run_id"),
                                         "advisories": ("advisory", "capture_seq")}


def row_anchor(section: str, row: Mapping[str, Any]) -> str:
    """The id of a row of ``section``: what its problems' ``anchor`` and a link's ``#...`` name."""
    kind, *names = ROW_NAMES[section]
    return anchor(kind, *(row.get(name) for name in names))


def view_url(connection_id: str, stream: str | None = None, *, run_id: str | None = None) -> str:
    """The view of ``connection_id``: at ``stream``'s row, or at ledger run ``run_id``'s row; a relative URL."""
    base = urlsplit((conf.get("api", "base_url", fallback="") or "").strip()).path.rstrip("/")
    url = f"{base}{URL_PREFIX}/connections/{quote(connection_id, safe='')}"
    if run_id:
        return f"{url}?{urlencode({'run_id': run_id})}#{anchor('run', run_id)}"
    if stream:
        return f"{url}?{urlencode({'stream': stream})}#{anchor('stream', stream)}"
    return url


def _stream(operator: Any, ti_key: Any) -> str | None:
    """The task's stream: its rendered ``stream`` field, else the ``stream`` of its result (a publish whose stream
    was found from the subject)."""
    stream = getattr(operator, "stream", None)
    if isinstance(stream, str) and stream:
        return stream
    try:
        from airflow.providers.common.compat.sdk import XCom

        result = XCom.get_value(ti_key=ti_key, key="return_value")
    except Exception:  # no result (the task failed before returning) or no XCom access here: no anchor
        return None
    found = result.get("stream") if isinstance(result, dict) else None
    return found if isinstance(found, str) and found else None


class JetStreamViewLink(BaseOperatorLink):
    """Opens the JetStream view of the task's ``nats_conn_id`` at its stream's row."""

    name = "JetStream"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        return view_url(operator.nats_conn_id, _stream(operator, ti_key))


class JetStreamLedgerRunLink(BaseOperatorLink):
    """Opens the batch ledger row of the task's DAG run (the run id a producer records, e.g. ``--run-id {{ run_id }}``
    of the example pipeline) in the JetStream view of the task's ``nats_conn_id``."""

    name = "JetStream ledger run"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        return view_url(operator.nats_conn_id, run_id=ti_key.run_id)
