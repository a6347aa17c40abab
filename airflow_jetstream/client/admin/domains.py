"""Reaching a stream in another JetStream domain (a leaf node) or behind another API prefix.

Wrap the connection with :func:`api_view`; every admin function then talks to that domain::

    leaf = api_view(conn, domain="edge")
    info = await consumer_info(leaf, "ORIGIN", "AGG_SRC")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.subjects import validate_name, validate_subject

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection


class _ApiView:
    """A connection whose JetStream API requests go to another domain or API prefix.

    Both ways of calling the API are redirected: :meth:`api_request` and ``.js`` (a nats-py
    JetStream context on the same connection with the view's prefix); the rest is the connection's.
    """

    def __init__(self, conn: JetStreamConnection, api_prefix: str) -> None:
        self._conn = conn
        self._api_prefix = api_prefix
        self.js = conn.nc.jetstream(prefix=api_prefix, timeout=conn.settings.request_timeout)

    @property
    def api_prefix(self) -> str:
        return self._api_prefix

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def api_request(self, api: str, body: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        """The connection's API request, sent to this view's prefix."""
        from airflow_jetstream.client.connection import JetStreamConnection

        return await JetStreamConnection.api_request(self, api, body, **kwargs)  # type: ignore[arg-type]


def domain_api_prefix(domain: str) -> str:
    """``$JS.<domain>.API``: the API prefix of a JetStream domain."""
    validate_name(domain, what="JetStream domain")
    return f"$JS.{domain}.API"


def api_view(conn: JetStreamConnection, *, domain: str | None = None,
             api_prefix: str | None = None) -> JetStreamConnection:
    """``conn`` itself, or a view of it whose API requests go to ``domain`` / ``api_prefix``."""
    if domain and api_prefix:
        raise InvalidRequestError("give either a JetStream domain or an API prefix, not both")
    prefix = domain_api_prefix(domain) if domain else api_prefix
    if not prefix or prefix == conn.api_prefix:
        return conn
    validate_subject(prefix, what="JetStream API prefix")
    return _ApiView(conn, prefix)  # type: ignore[return-value]
