"""Fixture factories for test modules that share one nats-server: ``server`` and ``conn_id``.

    server = module_server("kv")        # one nats-server for the module, store under a tmp dir "kv..."
    conn_id = default_conn_id()         # per test: ``nats_default`` (AIRFLOW_CONN_NATS_DEFAULT) -> server
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airflow_jetstream.embedded import EmbeddedNatsServer
from tests.conftest import set_nats_connection


def module_server(store: str) -> Any:
    """A module-scoped fixture named ``server``: a nats-server with JetStream on a free loopback port."""

    @pytest.fixture(scope="module", name="server")
    def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNatsServer]:
        with EmbeddedNatsServer(store_dir=tmp_path_factory.mktemp(store)) as srv:
            yield srv

    return server


def default_conn_id(before: Callable[[], Any] | None = None) -> Any:
    """A fixture named ``conn_id``: ``nats_default`` pointing at ``server``; ``before()`` runs first (resets)."""

    @pytest.fixture(name="conn_id")
    def conn_id(monkeypatch: pytest.MonkeyPatch, server: EmbeddedNatsServer) -> str:
        if before is not None:
            before()
        set_nats_connection(monkeypatch, "nats_default", server.url)
        return "nats_default"

    return conn_id
