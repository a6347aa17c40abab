"""pytest fixtures for testing your own DAGs and tasks against a real ``nats-server`` (docs/testing.md).

A mock of NATS cannot tell you that a stream config is refused, a subject overlaps or a batch is partially
stored; a real server on loopback starts in well under a second. Enable them with
``pytest_plugins = ["airflow_jetstream.testing"]`` and the ``server`` extra: ``jetstream_server`` (session)
is an :class:`~airflow_jetstream.embedded.EmbeddedNatsServer` on a free loopback port, ``jetstream_conn_id``
(per test) is ``"nats_default"`` pointed at it. The provider's own code never imports this module or
``airflow_jetstream.embedded`` (a test holds that).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from airflow_jetstream.embedded import EmbeddedNatsServer

__all__ = ["jetstream_conn_id", "jetstream_server"]


def _connection_json(server: EmbeddedNatsServer, **extra: object) -> str:
    """An ``AIRFLOW_CONN_*`` value (JSON) for a ``nats`` connection to ``server``; ``extra`` are extra fields."""
    host, port = server.url.split("://", 1)[1].rsplit(":", 1)
    return json.dumps({"conn_type": "nats", "host": host, "port": int(port), "extra": extra})


@pytest.fixture(scope="session")
def jetstream_server() -> Iterator[EmbeddedNatsServer]:
    """A real nats-server with JetStream on loopback for the whole test session."""
    with EmbeddedNatsServer() as server:
        yield server


@pytest.fixture
def jetstream_conn_id(jetstream_server: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """``nats_default``, pointing at :func:`jetstream_server` for this test."""
    monkeypatch.setenv("AIRFLOW_CONN_NATS_DEFAULT", _connection_json(jetstream_server, connect_timeout=2))
    return "nats_default"
