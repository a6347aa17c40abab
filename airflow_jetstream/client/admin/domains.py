"""Reaching a stream in another JetStream domain (a leaf node) or behind another API prefix.

Take a view of the connection with :func:`api_view`; every admin function then talks to that domain::

    leaf = api_view(conn, domain="edge")
    info = await consumer_info(leaf, "ORIGIN", "AGG_SRC")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.subjects import validate_name, validate_subject

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection


def domain_api_prefix(domain: str) -> str:
    """``$JS.<domain>.API``: the API prefix of a JetStream domain."""
    validate_name(domain, what="JetStream domain")
    return f"$JS.{domain}.API"


def api_view(conn: JetStreamConnection, *, domain: str | None = None,
             api_prefix: str | None = None) -> JetStreamConnection:
    """``conn`` itself, or the same connection with its API requests sent to ``domain`` / ``api_prefix``
    (:meth:`~airflow_jetstream.client.connection.JetStreamConnection.with_api_prefix`)."""
    if domain and api_prefix:
        raise InvalidRequestError("give either a JetStream domain or an API prefix, not both")
    prefix = domain_api_prefix(domain) if domain else api_prefix
    if not prefix or prefix == conn.api_prefix:
        return conn
    validate_subject(prefix, what="JetStream API prefix")
    return conn.with_api_prefix(prefix)
